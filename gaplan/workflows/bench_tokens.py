"""``--batch-by tokens`` for ``gaplan bench``, as a library function.

:func:`run_token_bench` probes T* (:func:`gaplan.workflows.probe_tokens.run_token_probe`), then trains the token plan
(T*) and the samples plan (B* at the longest length) on the same steps of the same data, each run a fresh
process under the enforced budget (CPU), rounds interleaved, and writes ``throughput.csv`` and the report.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gaplan.core.constants import DEFAULT_EFFECTIVE_BATCH, SAMPLES_PLAN_KIND, TOKEN_PLAN_KIND
from gaplan.core.errors import one_line
from gaplan.core.options import OptionError, from_saved, to_flat
from gaplan.core.progress import Say, quiet
from gaplan.core.trial import Trial
from gaplan.data.source import DataSource
from gaplan.plan.tokens import DEFAULT_GRANULE, LengthProfile
from gaplan.workflows.probe_tokens import TokenProbeRun, run_token_probe
from gaplan.workload.spec import WorkloadSpec


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
                    threads: int | None = None, command: str | None = None, say: Say = quiet,
                    on_trial: Callable[[Trial], None] | None = None,
                    on_profile: Callable[[LengthProfile], None] | None = None,
                    on_run: Callable[[str, int, dict[str, Any]], None] | None = None) -> TokenBenchResult:
    """Probe T* (:func:`run_token_probe`), then train the token plan and the samples plan on the same data.

    Each round trains each plan once, in a fresh process, ``warmup + repeats`` optimizer steps of
    ``effective_batch`` samples from step 0 (so both see the same samples), under the enforced budget on
    CPU; the order alternates between rounds. A run's rates are over its timed steps (warm-up excluded);
    a plan's are the medians over the rounds.
    """
    from gaplan.devices.backend import resolve_device
    from gaplan.report.write import write_report
    from gaplan.runs.schema import THROUGHPUT, write_table

    if warmup < 0 or repeats < 1 or rounds < 1:
        raise OptionError(f"warmup must be 0 or more, repeats and rounds 1 or more "
                          f"(got {warmup}, {repeats}, {rounds})", "warmup", "repeats", "rounds")
    device = resolve_device(device)
    probe = run_token_probe(spec, out, data, device=device, memory_limit=memory_limit, granule=granule,
                            effective_batch=effective_batch, threads=threads, command=command, say=say,
                            on_trial=on_trial, on_profile=on_profile)
    edge, budget = probe.long_probe.max_micro_batch, probe.budget.token_budget
    limit = probe.long_probe.memory_limit_bytes
    common = dict(effective_batch=effective_batch, steps=warmup + repeats, seed=0, threads=threads,
                  enforce_memory_limit=device == "cpu", **to_flat(data))
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
    from gaplan.devices.cpu import budget_environment
    from gaplan.runs.schema import TRAIN_LOG, read_table

    with tempfile.TemporaryDirectory(prefix="gaplan-bench-run-") as run_dir:
        request = {"workload": spec.to_dict(), "options": options, "run_dir": run_dir, "device": device,
                   "memory_limit": memory_limit}
        completed = subprocess.run([sys.executable, "-c", "from gaplan.workflows.bench_tokens import bench_child_main; "
                                                          "bench_child_main()"],
                                   input=json.dumps(request), capture_output=True, text=True,
                                   env=budget_environment(os.environ))
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
    from gaplan.workflows.train import TrainOptions, run_train

    request = json.load(sys.stdin)
    run = run_train(WorkloadSpec.from_dict(request["workload"]), request["run_dir"], from_saved(TrainOptions, request["options"]),
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
