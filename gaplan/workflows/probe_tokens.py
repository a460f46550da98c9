"""``--batch-by tokens`` for ``gaplan probe``, as a library function.

:func:`run_token_probe` reads the data, profiles its token lengths, probes T* (the exact sample edges at
the shortest and the longest length, :func:`gaplan.probing.tokens.probe_token_budget`) and writes the run
folder: ``plan.json`` (the probe at the longest length, with a samples plan), ``tokens.json`` (the
profile and T*) and ``lengths.png``. ``gaplan bench --batch-by tokens`` is :mod:`gaplan.workflows.bench_tokens`.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import shlex
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gaplan.core.constants import DEFAULT_EFFECTIVE_BATCH
from gaplan.core.errors import GaplanError, one_line
from gaplan.core.progress import Say, quiet
from gaplan.core.trial import Trial
from gaplan.data.source import DataSource
from gaplan.plan.tokens import DEFAULT_GRANULE, LengthProfile, TokenBudget, check_granule
from gaplan.runs.folder import LENGTHS_PNG, PLAN_JSON, TOKENS_JSON, path_in
from gaplan.runs.probe_result import ProbeResult
from gaplan.runs.schema import TRIAL_COLUMNS
from gaplan.workload.spec import WorkloadSpec


def read_lengths(spec: WorkloadSpec, data: DataSource, say: Say = quiet):
    """The samples' token lengths as ``gaplan train`` reads the data (tokenizer, labels, long samples), from the
    length cache when this file and tokenizer were read before (:func:`gaplan.workflows.train_data.read_data_lengths`)."""
    from gaplan.workflows.train_data import read_data_lengths

    return read_data_lengths(spec, data, say)


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
    source: DataSource | None = None  # the data it profiled, as given

    @property
    def train_command(self) -> str:
        """The ``gaplan train`` that trains this workload on this data with this T*, as a shell command."""
        from gaplan.plan.layouts import workload_flags

        return shlex.join(["gaplan", "train", *workload_flags(self.record["workload"]),
                           *(self.source.flags() if self.source else []), "--batch-by", "tokens", "--token-plan",
                           path_in(self.out, TOKENS_JSON)])

    def to_dict(self) -> dict[str, Any]:
        """What ``gaplan probe --batch-by tokens --json`` prints."""
        return {"run_dir": self.out, "token_budget": self.budget.to_dict(), "describe": self.budget.describe(),
                "profile": self.profile.to_dict(), "data": self.record["data"],
                "longest": _probe_summary(self.long_probe), "shortest": _probe_summary(self.short_probe),
                "plan": self.long_probe.plan.to_dict(), "device": self.long_probe.device,
                "memory_limit_bytes": self.long_probe.memory_limit_bytes,
                "plan_file": path_in(self.out, PLAN_JSON), "tokens_file": path_in(self.out, TOKENS_JSON),
                "files": self.files, "train_command": self.train_command}


def _probe_summary(probed: ProbeResult | None) -> dict[str, Any] | None:
    if probed is None:
        return None
    return {"seq_len": probed.workload.seq_len, "max_micro_batch": probed.max_micro_batch, "capped": probed.capped,
            "wall_seconds": round(probed.wall_seconds, 3),
            "trials": [{k: v for k, v in t.to_dict().items() if k in TRIAL_COLUMNS} for t in probed.trials]}


def run_token_probe(spec: WorkloadSpec, out: str, data: DataSource, *, device: str = "auto",
                    memory_limit: int | None = None, granule: int = DEFAULT_GRANULE,
                    effective_batch: int = DEFAULT_EFFECTIVE_BATCH, threads: int | None = None,
                    command: str | None = None, say: Say = quiet, on_trial: Callable[[Trial], None] | None = None,
                    on_profile: Callable[[LengthProfile], None] | None = None) -> TokenProbeRun:
    """Read ``data``, profile its lengths, probe T*, and write plan.json, tokens.json and lengths.png into ``out``.

    The two probes are :func:`gaplan.probing.cache.probe_for`'s: a cached probe of the same workload at that
    length, device, budget and threads is reused (as ``gaplan train --batch-by tokens`` does).
    """
    from gaplan.devices.backend import resolve_device
    from gaplan.plan.split import make_plan
    from gaplan.probing.tokens import probe_token_budget
    from gaplan.runs.probe_result import save_probe

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
    from gaplan.runs.schema import write_tokens_json

    write_tokens_json(path_in(out, TOKENS_JSON), record)
    from gaplan.report.charts import lengths_figure, write_charts

    write_charts(out, [(LENGTHS_PNG, lengths_figure(record, spec.model))])
    return TokenProbeRun(profile, budget, long_probe, short_probe, record, out, [PLAN_JSON, TOKENS_JSON, LENGTHS_PNG],
                         data)


def token_record(spec: WorkloadSpec, long_probe: ProbeResult, short_probe: ProbeResult | None, data: DataSource,
                 corpus: Any, lengths: Sequence[int], profile: LengthProfile, budget: TokenBudget,
                 threads: int | None, effective_batch: int, command: str | None) -> dict[str, Any]:
    """``tokens.json``: the workload, budget and data it was probed for, the length profile, T* and both probes."""
    from gaplan.core.version import __version__

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
        "data": {"path": data.path, "text_field": data.text_name, "label_field": data.label_name,
                 "long_samples": data.long_sample_rule, "tokenizer": getattr(corpus, "tokenizer", data.tokenizer),
                 **dataclasses.asdict(corpus.stats)},
        "profile": profile.to_dict(),
        "length_counts": length_counts(lengths),
        "token_budget": budget.to_dict(),
        "probes": {"longest": _probe_summary(long_probe), "shortest": _probe_summary(short_probe)},
    }


def token_budget_from_plan(path: str, spec: WorkloadSpec, device: str | None = None,
                           memory_limit: int | None = None) -> TokenBudget:
    """T* from a ``tokens.json``, refused when it was probed for another workload, device or budget."""
    from gaplan.probing.cache import check_same_workload
    from gaplan.runs.schema import read_tokens_json

    record = read_tokens_json(path)
    try:
        probed = WorkloadSpec.from_dict(record["workload"])
        budget = TokenBudget(**record["token_budget"])
    except (TypeError, ValueError) as exc:
        raise GaplanError(f"{path} is not a gaplan token plan: {one_line(exc)}") from None
    check_same_workload(probed, spec, f"--token-plan {path}")
    if device is not None and record.get("device") and record["device"] != device:
        raise GaplanError(f"--token-plan {path} was probed on {record['device']}, not {device}")
    recorded = record.get("memory_limit_bytes")
    if memory_limit is not None and recorded is not None and int(recorded) != memory_limit:
        raise GaplanError(f"--token-plan {path} was probed under a budget of {int(recorded)} bytes, not {memory_limit}: "
                          "probe again for this budget")
    return budget


# ---------------------------------------------------------------------------------------------------------------------
# bench --batch-by tokens
