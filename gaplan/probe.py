"""The probe: real steady-state trials at growing micro-batches, searched to the exact edge.

Trials run in a worker process under the memory budget (:mod:`gaplan.worker`);
the search (:mod:`gaplan.search`) decides which sizes to try; the plan
(:mod:`gaplan.plan`) turns the edge into accumulation steps.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from gaplan.devices import DEFAULT_CPU_BUDGET, resolve_device
from gaplan.devices.cpu import MMAP_THRESHOLD_ENV
from gaplan.errors import DoesNotFit, GaplanError
from gaplan.plan import Plan, make_plan
from gaplan.search import find_edge
from gaplan.units import format_bytes
from gaplan.workload import WorkloadSpec

DEFAULT_MAX_MICRO_BATCH = 4096


@dataclass(frozen=True)
class Trial:
    """One trial as reported: micro-batch, fits or OOM, peak bytes, seconds."""

    micro_batch: int
    fits: bool
    peak_bytes: int | None
    seconds: float
    error: str | None = None
    completed_steps: int = 0  # optimizer steps finished (an OOM at step 2 shows as 1)
    micro_steps_peak_bytes: int | None = None  # peak of the forward/backward passes, before the optimizer step


@dataclass(frozen=True)
class Observed:
    """What the search sees of a trial."""

    fits: bool
    peak_bytes: int | None


_TRIAL_FIELDS = set(Trial.__dataclass_fields__)


@dataclass
class ProbeResult:
    """Everything a probe learned; saved as ``plan.json`` and read back by ``gaplan train``."""

    workload: WorkloadSpec
    device: str
    memory_limit_bytes: int
    margin: float
    probe_limit_bytes: int
    budget_is_default: bool
    max_micro_batch: int
    capped: bool
    trials: list[Trial]
    plan: Plan
    param_count: int
    static_bytes: int
    task: str
    seq_len: int | None
    wall_seconds: float
    tuner: dict | None = None  # the tuner's decision (gaplan.tuner.TunerDecision) when it chose the split
    command: str | None = None  # the command line that made this run, to reproduce it
    created: str = field(default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))

    @property
    def planning_micro_batch(self) -> int:
        """The micro-batch cap to plan with: the tuner's choice when it made one, else B*."""
        return int(self.tuner["micro_batch"]) if self.tuner else self.max_micro_batch

    def to_dict(self) -> dict[str, Any]:
        import torch

        from gaplan import __version__

        return {
            "gaplan_version": __version__,
            "torch_version": torch.__version__,
            "created": self.created,
            "workload": self.workload.to_dict(),
            "device": self.device,
            "memory_limit_bytes": self.memory_limit_bytes,
            "margin": self.margin,
            "probe_limit_bytes": self.probe_limit_bytes,
            "budget_is_default": self.budget_is_default,
            "max_micro_batch": self.max_micro_batch,
            "capped": self.capped,
            "trials": [asdict(t) for t in self.trials],
            "trial_count": len(self.trials),
            "plan": self.plan.to_dict(),
            "param_count": self.param_count,
            "static_bytes": self.static_bytes,
            "task": self.task,
            "seq_len": self.seq_len,
            "wall_seconds": round(self.wall_seconds, 3),
            "tuner": self.tuner,
            "command": self.command,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        try:
            return cls(
                workload=WorkloadSpec(**data["workload"]),
                device=data["device"],
                memory_limit_bytes=int(data["memory_limit_bytes"]),
                margin=float(data.get("margin", 0.0)),
                probe_limit_bytes=int(data.get("probe_limit_bytes", data["memory_limit_bytes"])),
                budget_is_default=bool(data.get("budget_is_default", False)),
                max_micro_batch=int(data["max_micro_batch"]),
                capped=bool(data.get("capped", False)),
                trials=[Trial(**{k: v for k, v in t.items() if k in _TRIAL_FIELDS}) for t in data.get("trials", [])],
                plan=Plan.from_dict(data["plan"]),
                param_count=int(data.get("param_count", 0)),
                static_bytes=int(data.get("static_bytes", 0)),
                task=data.get("task", "?"),
                seq_len=data.get("seq_len"),
                wall_seconds=float(data.get("wall_seconds", 0.0)),
                tuner=data.get("tuner"),
                command=data.get("command"),
                created=data.get("created", ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GaplanError(f"not a gaplan plan file: missing or bad field {exc}") from None


def save_probe(result: ProbeResult, path: str) -> None:
    """Write ``plan.json`` atomically (temp file + rename): a reader never sees half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temp = f"{path}.tmp.{os.getpid()}"
    with open(temp, "w") as handle:
        json.dump(result.to_dict(), handle, indent=2)
        handle.write("\n")
    os.replace(temp, path)


def load_probe(path: str) -> ProbeResult:
    """Read a ``plan.json`` written by :func:`save_probe`."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise GaplanError(f"plan file {path} does not exist") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise GaplanError(f"cannot read plan file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise GaplanError(f"{path} is not a gaplan plan file")
    return ProbeResult.from_dict(data)


class WorkerProcess:
    """A :mod:`gaplan.worker` child holding one workload under one budget."""

    def __init__(self, spec: WorkloadSpec, device: str, limit_bytes: int | None, threads: int | None = None,
                 seed: int = 0, warm_optimizer: bool = True) -> None:
        env = dict(os.environ, **MMAP_THRESHOLD_ENV)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        # The worker must import this very gaplan, installed or not.
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        self._stderr_lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gaplan.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env, bufsize=1)
        self._send({"workload": spec.to_dict(), "device": device, "limit_bytes": limit_bytes,
                    "threads": threads, "seed": seed, "warm_optimizer": warm_optimizer})
        self.info = self._receive()

    def _send(self, message: dict) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def _receive(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            err = self.process.stderr.read() if self.process.stderr else ""
            tail = " | ".join(err.strip().splitlines()[-3:])
            raise GaplanError(f"the trial worker died (exit {self.process.returncode}): {tail}")
        message = json.loads(line)
        if message.get("error") == "user":
            raise GaplanError(message["message"])
        if message.get("error") == "crash":
            raise RuntimeError("the trial worker failed:\n" + message["message"])
        return message

    def trial(self, micro_batch: int, micro_steps: int = 2, optimizer_steps: int = 1,
              sizes: list[int] | None = None, unbounded: bool = False) -> dict:
        """One trial in a fresh child; ``sizes`` is one step's uneven split, ``unbounded`` lifts the budget."""
        self._send({"micro_batch": micro_batch, "micro_steps": micro_steps, "optimizer_steps": optimizer_steps,
                    "sizes": sizes, "unbounded": unbounded})
        return self._receive()

    def breakdown(self, micro_batch: int) -> dict:
        """Peak bytes by category of one steady-state step (:mod:`gaplan.breakdown`), measured without the budget."""
        self._send({"micro_batch": micro_batch, "breakdown": True, "unbounded": True})
        return self._receive()

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_ready(info: dict, spec: WorkloadSpec, limit_bytes: int) -> None:
    if info.get("error") == "does-not-fit" or info.get("static_bytes", 0) > info.get("limit_bytes", limit_bytes):
        needed = info.get("static_bytes")
        what = f"needs at least {format_bytes(needed)} " if needed else "needs more memory than that "
        raise DoesNotFit(f"{spec.model} does not fit in {format_bytes(info.get('limit_bytes', limit_bytes))}: "
                         f"it {what}for weights, gradients and optimizer states", needed)


def probe(
    spec: WorkloadSpec | None = None,
    device: str = "auto",
    memory_limit: int | None = None,
    margin: float = 0.0,
    effective_batch: int = 256,
    world_size: int = 1,
    start: int = 1,
    max_micro_batch: int = DEFAULT_MAX_MICRO_BATCH,
    threads: int | None = None,
    optimizer_steps: int = 2,
    on_trial: Callable[[Trial], None] | None = None,
) -> ProbeResult:
    """Find the largest micro-batch that fits ``device`` at steady state, and plan ``effective_batch``.

    Args:
        spec: the workload (default: the built-in small causal LM).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        memory_limit: the budget in bytes (CPU default :data:`DEFAULT_CPU_BUDGET`; CUDA: the card).
        margin: fraction of the budget kept free as headroom (trials run under ``(1 - margin) * budget``).
        optimizer_steps: accumulated optimizer steps per trial (each in a fresh process); two by
            default, so the answer is checked past the first step, not only at it.
        on_trial: called after each trial, for progress display.

    Raises:
        DoesNotFit: when even micro-batch 1 does not fit.
    """
    spec = (spec or WorkloadSpec()).validate()
    if not 0 <= margin < 1:
        raise GaplanError(f"--margin must be a fraction in [0, 1) (got {margin})")
    if memory_limit is not None and memory_limit <= 0:
        raise GaplanError(f"--memory-limit must be larger than zero (got {memory_limit})")
    make_plan(effective_batch, 1, world_size)  # reject a bad effective batch before any work
    device = resolve_device(device)
    budget_is_default = memory_limit is None
    if device == "cpu" and memory_limit is None:
        memory_limit = DEFAULT_CPU_BUDGET
    started = time.perf_counter()
    probe_limit = None if memory_limit is None else int(memory_limit * (1 - margin))
    trials: list[Trial] = []
    with WorkerProcess(spec, device, probe_limit, threads=threads) as worker:
        info = worker.info
        memory_limit = memory_limit or info["limit_bytes"]
        probe_limit = info["limit_bytes"]
        _check_ready(info, spec, probe_limit)

        def measure(micro_batch: int) -> Observed:
            outcome = worker.trial(micro_batch, optimizer_steps=optimizer_steps)
            trial = Trial(micro_batch, outcome["fits"], outcome["peak_bytes"], round(outcome["seconds"], 3),
                          outcome["error"], outcome["completed_steps"], outcome["micro_steps_peak_bytes"])
            trials.append(trial)
            if on_trial is not None:
                on_trial(trial)
            # The search's memory line is drawn through the forward/backward peaks: they grow with b.
            return Observed(trial.fits, trial.micro_steps_peak_bytes)

        result = find_edge(measure, probe_limit, start=start, max_batch=max_micro_batch)
    edge = result.edge
    if edge == 0:
        raise DoesNotFit(f"{spec.model} does not fit in {format_bytes(probe_limit)} even at micro-batch 1 "
                         f"(weights, gradients and optimizer states alone take {format_bytes(info['static_bytes'])})",
                         info["static_bytes"])
    return ProbeResult(
        workload=spec, device=device, memory_limit_bytes=int(memory_limit), margin=margin,
        probe_limit_bytes=int(probe_limit), budget_is_default=budget_is_default,
        max_micro_batch=edge, capped=result.capped, trials=trials,
        plan=make_plan(effective_batch, edge, world_size), param_count=info["param_count"],
        static_bytes=info["static_bytes"], task=info["task"], seq_len=info["seq_len"],
        wall_seconds=time.perf_counter() - started,
    )


def check_in_fresh_process(spec: WorkloadSpec, device: str, limit_bytes: int | None, micro_batch: int,
                           optimizer_steps: int = 2, threads: int | None = None) -> bool:
    """Train ``optimizer_steps`` accumulated steps at ``micro_batch`` in a new process; True if it fits."""
    with WorkerProcess(spec, resolve_device(device), limit_bytes, threads=threads) as worker:
        if worker.info.get("error") == "does-not-fit":
            return False
        return bool(worker.trial(micro_batch, optimizer_steps=optimizer_steps)["fits"])
