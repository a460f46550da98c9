"""What a probe learned, as saved in a run folder's ``plan.json`` and read back by train, bench and report. No torch."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from gaplan.core.errors import GaplanError
from gaplan.core.trial import Trial
from gaplan.plan.split import Plan
from gaplan.runs.schema import TRIAL_COLUMNS, check_plan, read_plan_json, write_plan_json
from gaplan.workload.spec import WorkloadSpec

# The CUDA caching allocator's settings: torch reads both (PYTORCH_ALLOC_CONF, the newer name, since 2.9).
ALLOCATOR_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def allocator_setting(environ: dict | None = None) -> dict[str, str]:
    """The CUDA allocator's variables set in ``environ`` (default this process's); empty: torch's defaults.

    ``expandable_segments``, ``garbage_collection_threshold`` and ``max_split_size_mb`` change the reserved peak,
    so B*: a probe's trials inherit this process's setting, and its plan records it."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in ALLOCATOR_VARIABLES if environ.get(name)}


def describe_allocator(setting: dict[str, str] | None) -> str:
    """``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, or that none is set (torch's defaults), or unknown."""
    if setting is None:
        return "allocator setting not recorded"
    if not setting:
        return "PYTORCH_CUDA_ALLOC_CONF unset (torch's defaults)"
    return ", ".join(f"{name}={value}" for name, value in setting.items())


@dataclass
class ProbeResult:
    """Everything a probe learned, and the plan made from it.

    ``max_micro_batch`` is B*, the largest micro-batch that fits (or the ``--micro-batch`` given when
    ``probed`` is False: then no trial ran, and the budget and static bytes are unknown, None).
    """

    workload: WorkloadSpec
    device: str
    memory_limit_bytes: int | None
    margin: float
    probe_limit_bytes: int | None
    budget_is_default: bool
    max_micro_batch: int
    capped: bool
    trials: list[Trial]
    plan: Plan
    param_count: int
    static_bytes: int | None
    task: str
    seq_len: int | None
    wall_seconds: float
    tuner: dict | None = None  # the tuner's decision (gaplan.benchmark.tuner.TunerDecision) when it chose the split
    command: str | None = None  # the command line that made this run, to reproduce it
    probed: bool = True
    ddp: bool = False  # the trials ran under DistributedDataParallel (a plan for several ranks)
    # The world size the probe was made for (FSDP's shards, so its B*, depend on it), and the ranks each trial
    # ran: the world size for a sharded workload (workload.parallel "fsdp"), else 1 (DDP's trials run one process).
    world_size: int = 1
    trial_ranks: int = 1
    created: str = field(default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    # A probe taken from the cache instead of run (gaplan.probing.cache): its file, cache key and when it was made.
    reused_probe: dict[str, str] | None = None
    # The CUDA allocator's setting the trials ran under (:func:`allocator_setting` when the plan was made; {}:
    # torch's defaults; None: a plan from before gaplan recorded it).
    allocator: dict[str, str] | None = field(default_factory=allocator_setting)
    # This run's worker start, in seconds: "start to ready" (as the caller waited) and the worker's own parts.
    # The probe's profile (examples/profile_probe.py); not saved in plan.json.
    worker_seconds: dict[str, float] | None = None
    # A train by tokens: its micro-batches were packed within this many padded tokens a rank, each step anew, so the
    # plan's micro-batch is no size it trained (its plan.json is no micro-batch plan for --plan).
    token_budget: int | None = None

    @property
    def plan_cap(self) -> int:
        """The largest micro-batch the plan may use: the tuner's choice when it made one, else B*."""
        return int(self.tuner["micro_batch"]) if self.tuner else self.max_micro_batch

    def to_dict(self) -> dict[str, Any]:
        from gaplan.core.version import __version__

        return {
            "gaplan_version": __version__,
            "torch_version": _torch_version(),
            "created": self.created,
            "probed": self.probed,
            "ddp": self.ddp,
            "world_size": self.world_size,
            "trial_ranks": self.trial_ranks,
            "workload": self.workload.to_dict(),
            "device": self.device,
            "memory_limit_bytes": self.memory_limit_bytes,
            "margin": self.margin,
            "probe_limit_bytes": self.probe_limit_bytes,
            "budget_is_default": self.budget_is_default,
            "max_micro_batch": self.max_micro_batch,
            "capped": self.capped,
            "trials": [{key: value for key, value in t.to_dict().items() if key in TRIAL_COLUMNS} for t in self.trials],
            "trial_count": len(self.trials),
            "plan": self.plan.to_dict(),
            "param_count": self.param_count,
            "static_bytes": self.static_bytes,
            "task": self.task,
            "seq_len": self.seq_len,
            "wall_seconds": round(self.wall_seconds, 3),
            "tuner": self.tuner,
            "command": self.command,
            "allocator_setting": self.allocator,
            **({"reused_probe": self.reused_probe} if self.reused_probe else {}),
            **({"token_budget": self.token_budget} if self.token_budget else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: str = "plan file") -> ProbeResult:
        """Read back what :meth:`to_dict` wrote, checked by :func:`gaplan.runs.schema.check_plan` first."""
        data = check_plan(data, path)
        try:
            return cls(
                workload=WorkloadSpec.from_dict(data["workload"]),
                device=data["device"],
                memory_limit_bytes=_optional_int(data["memory_limit_bytes"]),
                margin=float(data.get("margin", 0.0)),
                probe_limit_bytes=_optional_int(data.get("probe_limit_bytes", data["memory_limit_bytes"])),
                budget_is_default=bool(data.get("budget_is_default", False)),
                max_micro_batch=int(data["max_micro_batch"]),
                capped=bool(data.get("capped", False)),
                trials=[Trial.from_dict(t) for t in data.get("trials", [])],
                plan=Plan.from_dict(data["plan"]),
                param_count=int(data.get("param_count") or 0),
                static_bytes=_optional_int(data.get("static_bytes")),
                task=str(data.get("task") or data["workload"].get("task") or ""),
                seq_len=data.get("seq_len"),
                wall_seconds=float(data.get("wall_seconds", 0.0)),
                tuner=data.get("tuner"),
                command=data.get("command"),
                probed=bool(data.get("probed", True)),
                ddp=bool(data.get("ddp", False)),
                world_size=int(data.get("world_size") or data["plan"].get("world_size") or 1),
                trial_ranks=int(data.get("trial_ranks") or 1),
                created=data.get("created", ""),
                reused_probe=data.get("reused_probe"),
                allocator=_allocator_from(data.get("allocator_setting"), path),
                token_budget=_optional_int(data.get("token_budget")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GaplanError(f"{path} is not a gaplan plan file: missing or bad field {exc}") from None


def allocator_warning(probed: ProbeResult, device: str, environ: dict | None = None) -> str | None:
    """One line when this process's CUDA allocator setting is not the one ``probed``'s trials ran under, else None
    (the same; not a CUDA run, where torch's allocator reads neither variable; or a plan that did not record it)."""
    now = allocator_setting(environ)
    if not device.startswith("cuda") or probed.allocator is None or now == probed.allocator:
        return None
    return (f"warning: this run's CUDA allocator setting ({describe_allocator(now)}) is not the plan's "
            f"({describe_allocator(probed.allocator)}): B* was measured under the plan's and may not fit under this "
            "one; set the plan's, or probe again")


def save_probe(result: ProbeResult, path: str) -> None:
    """Write ``plan.json`` atomically: a reader never sees half a file."""
    write_plan_json(path, result.to_dict())


def load_probe(path: str) -> ProbeResult:
    """Read a ``plan.json`` written by :func:`save_probe`."""
    return ProbeResult.from_dict(read_plan_json(path), path)


def _allocator_from(value: Any, path: str) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise GaplanError(f"{path}: allocator_setting must be a JSON object of strings (got {value!r})")
    return {str(k): v for k, v in value.items()}


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _torch_version() -> str | None:
    # From the installed package's metadata: recording it must not import torch.
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def plan_without_probe(spec: WorkloadSpec, device: str, memory_limit: int | None, plan: Plan, param_count: int,
                       task: str, seq_len: int | None, command: str | None = None,
                       token_budget: int | None = None) -> ProbeResult:
    """The plan.json of a run planned with ``--micro-batch``, or batched by tokens within ``token_budget``: what is
    known, and that no probe ran."""
    return ProbeResult(workload=spec, device=device, memory_limit_bytes=memory_limit, margin=0.0,
                       probe_limit_bytes=memory_limit, budget_is_default=False, max_micro_batch=plan.micro_batch_cap,
                       capped=False, trials=[], plan=plan, param_count=param_count, static_bytes=None, task=task,
                       seq_len=seq_len, wall_seconds=0.0, command=command, probed=False, token_budget=token_budget)
