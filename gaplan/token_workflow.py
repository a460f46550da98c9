"""``--batch-by tokens`` for ``gaplan probe`` and ``gaplan bench``, as library functions.

* :func:`run_token_probe` reads the data, profiles its token lengths, probes T* (the exact sample edges at
  the shortest and the longest length, :func:`gaplan.token_probe.probe_token_budget`) and writes the run
  folder: ``plan.json`` (the probe at the longest length, with a samples plan), ``tokens.json`` (the
  profile and T*) and ``lengths.png``.
* :func:`run_token_bench` then trains the token plan (T*) and the samples plan (B* at the longest length)
  on the same steps of the same data, each run a fresh process under the enforced budget (CPU), rounds
  interleaved, and writes ``throughput.csv`` and the report.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gaplan.constants import DEFAULT_EFFECTIVE_BATCH, SAMPLES_PLAN_KIND, TOKEN_PLAN_KIND
from gaplan.errors import GaplanError, one_line
from gaplan.probe_result import ProbeResult
from gaplan.run_folder import LENGTHS_PNG, PLAN_JSON, TOKENS_JSON, path_in
from gaplan.schema import TRIAL_COLUMNS
from gaplan.token_budget import DEFAULT_GRANULE, LengthProfile, TokenBudget, check_granule
from gaplan.trial import Trial
from gaplan.workload_spec import WorkloadSpec

Say = Callable[[str], None]


def _quiet(text: str) -> None:
    pass


@dataclass(frozen=True)
class DataSource:
    """``--data`` and how it is read (the options ``gaplan train`` takes)."""

    path: str
    text_field: str = "text"
    label_field: str = "label"
    long_samples: str = "split"
    tokenizer: str | None = None

    def train_options(self) -> dict[str, Any]:
        """As :class:`gaplan.train_workflow.TrainOptions` fields."""
        return {"data": self.path, "text_field": self.text_field, "label_field": self.label_field,
                "long_samples": self.long_samples, "tokenizer": self.tokenizer}


def read_lengths(spec: WorkloadSpec, data: DataSource, say: Say = _quiet):
    """The samples' token lengths as ``gaplan train`` reads the data (tokenizer, labels, long samples), from the
    length cache when this file and tokenizer were read before (:func:`gaplan.train_workflow.read_data_lengths`)."""
    from gaplan.train_workflow import TrainOptions, read_data_lengths

    return read_data_lengths(spec, TrainOptions(**data.train_options()), say)


def length_counts(lengths: Sequence[int]) -> list[list[int]]:
    """``[[length, samples], ...]`` by increasing length: the whole distribution, for the histogram chart."""
    return [[length, count] for length, count in sorted(Counter(lengths).items())]


@dataclass
class TokenProbeRun:
    """What :func:`run_token_probe` did: the profile, T*, both probes, what it wrote."""

    profile: LengthProfile
    budget: TokenBudget
    long_probe: ProbeResult  # at the longest length, its plan for the effective batch: plan.json
    short_probe: ProbeResult | None  # at the shortest length (None when all samples have one length)
    record: dict[str, Any]  # tokens.json
    out: str
    files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """What ``gaplan probe --batch-by tokens --json`` prints."""
        return {"run_dir": self.out, "token_budget": self.budget.to_dict(), "describe": self.budget.describe(),
                "profile": self.profile.to_dict(), "data": self.record["data"],
                "longest": _probe_summary(self.long_probe), "shortest": _probe_summary(self.short_probe),
                "plan": self.long_probe.plan.to_dict(), "device": self.long_probe.device,
                "memory_limit_bytes": self.long_probe.memory_limit_bytes,
                "plan_file": path_in(self.out, PLAN_JSON), "tokens_file": path_in(self.out, TOKENS_JSON),
                "files": self.files}


def _probe_summary(probed: ProbeResult | None) -> dict[str, Any] | None:
    if probed is None:
        return None
    return {"seq_len": probed.workload.seq_len, "max_micro_batch": probed.max_micro_batch, "capped": probed.capped,
            "wall_seconds": round(probed.wall_seconds, 3),
            "trials": [{k: v for k, v in t.to_dict().items() if k in TRIAL_COLUMNS} for t in probed.trials]}


def run_token_probe(spec: WorkloadSpec, out: str, data: DataSource, *, device: str = "auto",
                    memory_limit: int | None = None, granule: int = DEFAULT_GRANULE,
                    effective_batch: int = DEFAULT_EFFECTIVE_BATCH, threads: int | None = None,
                    command: str | None = None, say: Say = _quiet, on_trial: Callable[[Trial], None] | None = None,
                    on_profile: Callable[[LengthProfile], None] | None = None) -> TokenProbeRun:
    """Read ``data``, profile its lengths, probe T*, and write plan.json, tokens.json and lengths.png into ``out``.

    The two probes are :func:`gaplan.plan_cache.probe_for`'s: a cached probe of the same workload at that
    length, device, budget and threads is reused (as ``gaplan train --batch-by tokens`` does).
    """
    from gaplan.devices import resolve_device
    from gaplan.plan import make_plan
    from gaplan.probe_result import save_probe
    from gaplan.token_probe import probe_token_budget

    check_granule(granule)
    device = resolve_device(device)
    corpus = read_lengths(spec, data, say)  # the lengths, the records' fate and the tokenizer: all a profile needs
    lengths = corpus.lengths
    profile = LengthProfile.of(lengths)
    say(f"lengths: {profile.describe()}")
    if on_profile is not None:
        on_profile(profile)
    budget, long_probe, short_probe = probe_token_budget(spec, profile, device, memory_limit, granule,
                                                         threads=threads, say=say, on_trial=on_trial)
    long_probe = dataclasses.replace(long_probe, plan=make_plan(effective_batch, long_probe.plan_cap, 1),
                                     command=command)
    record = token_record(spec, long_probe, short_probe, data, corpus, lengths, profile, budget, threads,
                          effective_batch, command)
    os.makedirs(out, exist_ok=True)
    save_probe(long_probe, path_in(out, PLAN_JSON))
    from gaplan.schema import write_tokens_json

    write_tokens_json(path_in(out, TOKENS_JSON), record)
    from gaplan.report.charts import lengths_figure, write_charts

    write_charts(out, [(LENGTHS_PNG, lengths_figure(record, spec.model))])
    return TokenProbeRun(profile, budget, long_probe, short_probe, record, out, [PLAN_JSON, TOKENS_JSON, LENGTHS_PNG])


def token_record(spec: WorkloadSpec, long_probe: ProbeResult, short_probe: ProbeResult | None, data: DataSource,
                 corpus: Any, lengths: Sequence[int], profile: LengthProfile, budget: TokenBudget,
                 threads: int | None, effective_batch: int, command: str | None) -> dict[str, Any]:
    """``tokens.json``: the workload, budget and data it was probed for, the length profile, T* and both probes."""
    from gaplan import __version__

    return {
        "gaplan_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "workload": spec.to_dict(),
        "device": long_probe.device,
        "memory_limit_bytes": long_probe.memory_limit_bytes,
        "budget_is_default": long_probe.budget_is_default,
        "threads": threads,
        "effective_batch": effective_batch,
        "data": {"path": data.path, "text_field": data.text_field, "label_field": data.label_field,
                 "long_samples": data.long_samples, "tokenizer": getattr(corpus, "tokenizer", data.tokenizer),
                 **dataclasses.asdict(corpus.stats)},
        "profile": profile.to_dict(),
        "length_counts": length_counts(lengths),
        "token_budget": budget.to_dict(),
        "probes": {"longest": _probe_summary(long_probe), "shortest": _probe_summary(short_probe)},
    }


def token_budget_from_plan(path: str, spec: WorkloadSpec, device: str | None = None,
                           memory_limit: int | None = None) -> TokenBudget:
    """T* from a ``tokens.json``, refused when it was probed for another workload, device or budget."""
    from gaplan.plan_cache import same_workload
    from gaplan.schema import read_tokens_json

    record = read_tokens_json(path)
    try:
        probed = WorkloadSpec(**record["workload"])
        budget = TokenBudget(**record["token_budget"])
    except (TypeError, ValueError) as exc:
        raise GaplanError(f"{path} is not a gaplan token plan: {one_line(exc)}") from None
    if not same_workload(probed, spec):
        raise GaplanError(f"--token-plan {path} was probed for {probed.model} (seq len {probed.seq_len}, "
                          f"{probed.dtype}), not this workload")
    if device is not None and record.get("device") and record["device"] != device:
        raise GaplanError(f"--token-plan {path} was probed on {record['device']}, not {device}")
    recorded = record.get("memory_limit_bytes")
    if memory_limit is not None and recorded is not None and int(recorded) != memory_limit:
        raise GaplanError(f"--token-plan {path} was probed under a budget of {int(recorded)} bytes, not {memory_limit}: "
                          "probe again for this budget")
    return budget


# ---------------------------------------------------------------------------------------------------------------------
# bench --batch-by tokens


@dataclass
class TokenBenchResult:
    """The token plan's and the samples plan's rows (throughput.csv), their real tokens/s ratio, and the probe."""

    probe: TokenProbeRun
    rows: list[dict[str, Any]]
    ratio: float | None  # real tokens/s, token plan / samples plan
    files: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"run_dir": self.probe.out, "token_budget": self.probe.budget.to_dict(),
                "samples_plan_micro_batch": self.probe.long_probe.max_micro_batch, "rows": self.rows,
                "tokens_ratio": self.ratio, "profile": self.probe.profile.to_dict(), "report": self.files}


def run_token_bench(spec: WorkloadSpec, out: str, data: DataSource, *, device: str = "auto",
                    memory_limit: int | None = None, granule: int = DEFAULT_GRANULE,
                    effective_batch: int = DEFAULT_EFFECTIVE_BATCH, warmup: int = 1, repeats: int = 3, rounds: int = 3,
                    threads: int | None = None, command: str | None = None, say: Say = _quiet,
                    on_trial: Callable[[Trial], None] | None = None,
                    on_profile: Callable[[LengthProfile], None] | None = None,
                    on_run: Callable[[str, int, dict[str, Any]], None] | None = None) -> TokenBenchResult:
    """Probe T* (:func:`run_token_probe`), then train the token plan and the samples plan on the same data.

    Each round trains each plan once, in a fresh process, ``warmup + repeats`` optimizer steps of
    ``effective_batch`` samples from step 0 (so both see the same samples), under the enforced budget on
    CPU; the order alternates between rounds. A run's rates are over its timed steps (warm-up excluded);
    a plan's are the medians over the rounds.
    """
    from gaplan.devices import resolve_device
    from gaplan.report import write_report
    from gaplan.schema import THROUGHPUT, write_table

    if warmup < 0 or repeats < 1 or rounds < 1:
        raise GaplanError(f"--warmup must be 0 or more, --repeats and --rounds 1 or more "
                          f"(got {warmup}, {repeats}, {rounds})")
    device = resolve_device(device)
    probe = run_token_probe(spec, out, data, device=device, memory_limit=memory_limit, granule=granule,
                            effective_batch=effective_batch, threads=threads, command=command, say=say,
                            on_trial=on_trial, on_profile=on_profile)
    edge, budget = probe.long_probe.max_micro_batch, probe.budget.token_budget
    limit = probe.long_probe.memory_limit_bytes
    common = dict(effective_batch=effective_batch, steps=warmup + repeats, seed=0, threads=threads,
                  enforce_memory_limit=device == "cpu", **data.train_options())
    plans = {TOKEN_PLAN_KIND: dict(common, batch_by="tokens", token_budget=budget, granule=granule),
             SAMPLES_PLAN_KIND: dict(common, micro_batch=edge)}
    say(f"timing the token plan (T* = {budget} tokens) against the samples plan (B* = {edge} samples): {rounds} "
        f"round(s), each a fresh process per plan training {warmup} warm-up + {repeats} timed steps of "
        f"{effective_batch} samples" + (" under the enforced budget" if device == "cpu" else "") + " ...")
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in plans}
    for round_index in range(rounds):
        order = list(plans) if round_index % 2 == 0 else list(plans)[::-1]
        for kind in order:
            measured = _train_run(spec, plans[kind], device, limit, warmup)
            runs[kind].append(measured)
            if on_run is not None:
                on_run(kind, round_index + 1, measured)
    rows = [_bench_row(TOKEN_PLAN_KIND, f"T* = {budget} tokens", runs[TOKEN_PLAN_KIND], effective_batch, budget,
                       device),
            _bench_row(SAMPLES_PLAN_KIND, f"B* = {edge} samples", runs[SAMPLES_PLAN_KIND], effective_batch, None,
                       device)]
    baseline = rows[1]["tokens_per_s"]
    for row in rows:
        row["tokens_ratio"] = round(row["tokens_per_s"] / baseline, 4) if row["tokens_per_s"] and baseline else None
    write_table(out, THROUGHPUT, rows)
    files = write_report(out).files
    return TokenBenchResult(probe, rows, rows[0]["tokens_ratio"], files)


def _train_run(spec: WorkloadSpec, options: dict[str, Any], device: str, memory_limit: int | None,
               warmup: int) -> dict[str, Any]:
    """One training run in a fresh process (:func:`bench_child_main`); its timed steps and summary."""
    from gaplan.devices.cpu import MMAP_THRESHOLD_ENV
    from gaplan.schema import TRAIN_LOG, read_table

    with tempfile.TemporaryDirectory(prefix="gaplan-bench-run-") as run_dir:
        request = {"workload": spec.to_dict(), "options": options, "run_dir": run_dir, "device": device,
                   "memory_limit": memory_limit}
        completed = subprocess.run([sys.executable, "-c", "from gaplan.token_workflow import bench_child_main; "
                                                          "bench_child_main()"],
                                   input=json.dumps(request), capture_output=True, text=True,
                                   env=dict(os.environ, **MMAP_THRESHOLD_ENV))
        if completed.returncode != 0:
            lines = [line for line in completed.stderr.strip().splitlines() if line.strip()]
            return {"error": one_line(lines[-1] if lines else f"exit status {completed.returncode}")}
        summary = json.loads(completed.stdout.strip().splitlines()[-1])
        log = read_table(run_dir, TRAIN_LOG)
    timed = log[log["step"] > warmup] if log is not None else None
    if timed is None or timed.empty:
        return {"error": "no timed steps"}
    seconds = timed["seconds"].astype(float).tolist()
    tokens = (timed["tokens_per_s"].astype(float) * timed["seconds"].astype(float)).tolist()
    return {"step_seconds": seconds, "samples_per_s": options["effective_batch"] * len(seconds) / sum(seconds),
            "tokens_per_s": sum(tokens) / sum(seconds), "micro_steps": timed["grad_accum_steps"].astype(int).tolist(),
            "micro_batch": timed["micro_batch"].astype(int).tolist(),
            "peak_bytes": None if log["peak_bytes"].isna().all() else int(log["peak_bytes"].max()),
            "padding_fraction": summary.get("padding_fraction"), "oom_fallbacks": summary.get("oom_fallbacks") or []}


def bench_child_main() -> None:
    """A bench run: ``gaplan train`` in this fresh process from a JSON request on stdin; the summary on stdout."""
    from gaplan.train_workflow import TrainOptions, run_train

    request = json.load(sys.stdin)
    run = run_train(WorkloadSpec(**request["workload"]), request["run_dir"], TrainOptions(**request["options"]),
                    device=request["device"], memory_limit=request["memory_limit"])
    print(json.dumps(run.summary), flush=True)


def _bench_row(kind: str, split: str, runs: list[dict[str, Any]], effective_batch: int, token_budget: int | None,
               device: str) -> dict[str, Any]:
    """One throughput.csv row from a plan's runs: medians over the rounds, step times over every timed step."""
    good = [run for run in runs if "error" not in run]
    errors = [run["error"] for run in runs if "error" in run]
    enforced = device == "cpu"
    if not good:
        return {"split": split, "kind": kind, "micro_batch": 0, "grad_accum_steps": 0,
                "effective_batch": effective_batch, "samples_per_s": None, "tokens_per_s": None, "repeats": 0,
                "fits_budget": False, "bounded": enforced, "note": f"failed: {errors[0]}",
                "batch_by": "tokens" if kind == TOKEN_PLAN_KIND else "samples", "token_budget": token_budget}
    steps = [s for run in good for s in run["step_seconds"]]
    micro_steps = [m for run in good for m in run["micro_steps"]]
    fallbacks = [f for run in good for f in run["oom_fallbacks"]]
    peaks = [run["peak_bytes"] for run in good if run["peak_bytes"] is not None]
    paddings = [run["padding_fraction"] for run in good if run["padding_fraction"] is not None]
    notes = []
    if fallbacks:
        notes.append(f"{len(fallbacks)} OOM fallback(s): {fallbacks[0]}")
    if errors:
        notes.append(f"{len(errors)} of {len(runs)} runs failed: {errors[0]}")
    notes.append(f"median of {len(good)} fresh run(s)" + (" under the enforced budget" if enforced else ""))
    return {
        "split": split, "kind": kind, "micro_batch": max(m for run in good for m in run["micro_batch"]),
        "grad_accum_steps": round(statistics.fmean(micro_steps)), "effective_batch": effective_batch,
        "samples_per_s": statistics.median(run["samples_per_s"] for run in good),
        "tokens_per_s": statistics.median(run["tokens_per_s"] for run in good),
        "repeats": len(steps), "step_seconds_median": statistics.median(steps), "step_seconds_min": min(steps),
        "step_seconds_max": max(steps), "peak_bytes": max(peaks) if peaks else None,
        "fits_budget": not fallbacks and not errors, "bounded": enforced,
        "ratio_to_large_batch": None, "note": "; ".join(notes),
        "batch_by": "tokens" if kind == TOKEN_PLAN_KIND else "samples", "token_budget": token_budget,
        "micro_steps_mean": round(statistics.fmean(micro_steps), 3),
        "padding_fraction": round(statistics.median(paddings), 4) if paddings else None,
    }
