"""The probe's side of the trial worker: start :mod:`gaplan.worker.serve`, send it typed requests, read its answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from gaplan.core.errors import GaplanError
from gaplan.core.options import user_error
from gaplan.core.trial import Trial
from gaplan.devices.card import NVML_CHECK
from gaplan.devices.cpu import budget_environment, native_environment
from gaplan.worker.protocol import TrialRequest, WorkerSetup
from gaplan.workload.spec import WorkloadSpec


class WorkerProcess:
    """A :mod:`gaplan.worker.serve` child holding one workload under one budget."""

    def __init__(self, spec: WorkloadSpec, device: str, limit_bytes: int | None, threads: int | None = None,
                 seed: int = 0, warm_optimizer: bool = True, ddp: bool = False, ranks: int = 1,
                 timeout_s: float | None = None, native_allocator: bool = False, card_limit: bool = False) -> None:
        """``ranks`` above 1: every trial runs that many ranks, each under ``limit_bytes`` (a sharded workload);
        ``timeout_s``: such a trial that has not ended by then is killed (:mod:`gaplan.worker.ranks`);
        ``native_allocator``: the allocators as a user's loop has them, for trials that time and bind nothing
        (``unbounded``); else pinned as a budget needs (:mod:`gaplan.devices.cpu`); ``card_limit``: ``limit_bytes``
        is a card's memory (``--memory-limit``), which on CUDA loses the context's allowance first
        (:meth:`WorkerSetup.allocator_limit`)."""
        env = native_environment(os.environ) if native_allocator else budget_environment(os.environ)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        if device != "cpu":  # the worker forks its trials: nothing in it may start the driver (gaplan.devices.card)
            env.setdefault(NVML_CHECK, "1")
        # The worker must import this very gaplan, installed or not.
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        self._stderr_lines: list[str] = []
        started = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gaplan.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env, bufsize=1)
        self._send(WorkerSetup(spec.to_dict(), device, limit_bytes, threads, seed, warm_optimizer, ddp, ranks,
                               timeout_s, card_limit).to_dict())
        self._started = started
        self._info: dict | None = None
        self.start_seconds: dict = {}

    @property
    def info(self) -> dict:
        """The worker's ready message (device, budget, static bytes), waited for on first use: the caller may work
        meanwhile (a probe traces its estimate while the worker imports torch)."""
        if self._info is None:
            self._info = self._receive()
            # How long the caller waited for the worker, and the worker's own parts of it (the probe's profile).
            self.start_seconds = {"start to ready": round(time.perf_counter() - self._started, 4),
                                  **(self._info.pop("phase_seconds", None) or {})}
        return self._info

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
            raise user_error(message)
        if message.get("error") == "crash":
            raise RuntimeError("the trial worker failed:\n" + message["message"])
        return message

    def trial(self, micro_batch: int, micro_steps: int = 2, optimizer_steps: int = 1,
              sizes: list[int] | None = None, unbounded: bool = False) -> Trial:
        """One trial in a fresh child; ``sizes`` is one step's uneven split, ``unbounded`` lifts the budget."""
        self.info  # noqa: B018 - the ready message comes first
        self._send(TrialRequest(micro_batch, micro_steps, optimizer_steps, sizes, unbounded).to_dict())
        return Trial.from_dict(self._receive())

    def breakdown(self, micro_batch: int) -> dict:
        """Peak bytes by category of one steady-state step (:mod:`gaplan.training.breakdown`), measured without the budget."""
        self.info  # noqa: B018 - the ready message comes first
        self._send(TrialRequest(micro_batch, unbounded=True, breakdown=True).to_dict())
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
