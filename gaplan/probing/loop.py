"""The exact edge of a loop you bring: :func:`probe_loop` runs your own setup, forward/backward and optimizer step in
each trial, under the same budget and search as ``gaplan probe``.

    result = gaplan.probe_loop(setup, make_batch, micro_step, device="cpu", memory_limit="1GiB", effective_batch=256)
    result.max_micro_batch, result.trials, result.plan

Each trial is a fresh process forked from this one (closures and lambdas work: the child has them), which takes
the budget at once (:func:`gaplan.devices.cpu.cpu_budget`'s semantics), calls ``setup()``, then trains two optimizer
steps of two or more micro-steps as your loop does (your optimizer makes its states at its first step, as in your
loop; the second is the steady state): B* fits there and B*+1 does not, past the first step.
On CUDA this process stays fork-safe: it asks the card its questions in a child
(:mod:`gaplan.devices.card`) and never starts the driver itself. A process whose CUDA was initialized before the
probe (a model moved to the GPU, ``TrainingArguments`` built) cannot fork; there each trial is spawned instead and
the functions go pickled (module-level functions and picklable objects, your script's own included), else one line
says which one a new process cannot have.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gaplan.core.constants import DEFAULT_CPU_BUDGET, DEFAULT_EFFECTIVE_BATCH
from gaplan.core.errors import DoesNotFit, GaplanError
from gaplan.core.fork import failure_line, run_in_child
from gaplan.core.options import check_positive_ints
from gaplan.core.trial import Trial
from gaplan.core.units import format_bytes, parse_bytes
from gaplan.devices.card import cuda_initialized
from gaplan.plan.search import find_edge
from gaplan.plan.split import Plan, default_search_cap, make_plan
from gaplan.probing.progress import TrialBar
from gaplan.worker.loop_trial import LoopFunctions, loop_trial

log = logging.getLogger(__name__)
TRIAL_HEADER = "--- gaplan trial:"  # the line the trials' log has before each trial's own output


@dataclass(frozen=True)
class LoopProbeResult:
    """What a route found and what it runs: B*, every trial, gaplan's plan at B* for the effective batch, and
    ``split``, the split the route will actually train (``plan`` itself unless the route can only feed equal
    micro-batches and traded B* for a divisor of the effective batch; it says so in a warning then)."""

    max_micro_batch: int
    capped: bool  # the search cap fitted: more may fit
    trials: list[Trial]
    plan: Plan
    device: str
    memory_limit_bytes: int | None
    wall_seconds: float
    spawned: bool = False  # trials ran as new interpreters (CUDA was initialized here), not forks
    notes: list[str] = field(default_factory=list)
    split: Plan | None = None  # None: the plan itself (set so in __post_init__)

    def __post_init__(self) -> None:
        if self.split is None:
            object.__setattr__(self, "split", self.plan)

    @property
    def uses_plan(self) -> bool:
        """Whether the route trains gaplan's plan at B* (not a smaller, even split)."""
        return self.split == self.plan

    def describe(self) -> str:
        """One line for people: B*, the trials, the plan, and the split used when it is another."""
        tried = " ".join(f"{t.micro_batch}{'' if t.fits else 'x'}" for t in self.trials)
        line = f"B* = {self.max_micro_batch}{'+' if self.capped else ''} (tried {tried}); {self.plan.describe()}"
        if not self.uses_plan:
            assert self.split is not None
            line += f"; trains {self.split.describe()}"
        return line

    def to_dict(self) -> dict[str, Any]:
        assert self.split is not None
        return {"max_micro_batch": self.max_micro_batch, "capped": self.capped, "plan": self.plan.to_dict(),
                "split": self.split.to_dict(), "trials": [t.to_dict() for t in self.trials], "device": self.device,
                "memory_limit_bytes": self.memory_limit_bytes, "wall_seconds": round(self.wall_seconds, 2),
                "spawned": self.spawned, "notes": self.notes}


def probe_loop(setup: Callable[[], tuple[Any, Any]] | str, make_batch: Callable[[int], Any] | str,
               micro_step: Callable[[Any, Any], Any] | str, optimizer_step: Callable[[Any, Any], Any] | str | None = None,
               *, device: str = "cpu", memory_limit: int | str | None = None,
               effective_batch: int = DEFAULT_EFFECTIVE_BATCH, world_size: int = 1, search_cap: int | None = None,
               micro_steps: int = 2, optimizer_steps: int = 2, threads: int | None = None,
               on_trial: Callable[[Trial], None] | None = None, start: str = "auto",
               progress: bool = True) -> LoopProbeResult:
    """The largest micro-batch your loop trains at steady state under ``memory_limit``, and the plan.

    Args:
        setup: ``() -> (model, optimizer)``, built on ``device`` (called in each trial, under the budget).
        make_batch: ``(b) -> batch``, a micro-batch of ``b`` samples at your longest length (the worst case).
        micro_step: ``(model, batch) -> None``, your forward and backward (scaled as your loop scales it).
        optimizer_step: ``(model, optimizer) -> None``; default ``optimizer.step()`` then
            ``optimizer.zero_grad(set_to_none=True)``.
        device: ``cpu`` or ``cuda[:N]`` (``auto``: CUDA when there is one).
        memory_limit: the budget, bytes or text (``"1GiB"``); default on CPU the budget this process bound
            itself to with ``gaplan.cpu_budget``, else 1 GiB; the whole card on CUDA.
        effective_batch, world_size: what the plan splits; the search stops at a device's share.
        micro_steps, optimizer_steps: per trial (at least 2 each: the edge holds past the first step).
        on_trial: called after each trial, for progress.
        progress: a bar of the trials on stderr (as a trainer shows its steps).
        start: how trials start: ``fork`` (closures work), ``spawn`` (new interpreters, pickled functions), or
            ``auto``: fork, unless this process has initialized CUDA (then it cannot).

    Raises:
        DoesNotFit: when even micro-batch 1 does not fit. GaplanError: bad input, or a trial of your loop failed
        for another reason than memory (its last line).
    """
    from gaplan.devices.backend import resolve_device

    functions = LoopFunctions(setup, make_batch, micro_step, optimizer_step)
    if micro_steps < 2 or optimizer_steps < 2:
        raise GaplanError(f"micro_steps and optimizer_steps must be 2 or more: the edge is measured past the first "
                          f"step, with gradients held across micro-steps (got {micro_steps}, {optimizer_steps})")
    make_plan(effective_batch, default_search_cap(effective_batch, world_size), world_size)  # a bad batch fails here
    check_positive_ints(search_cap=search_cap, threads=threads)  # 2.5 or 0 would run a trial "at micro-batch 2.5"
    cap = search_cap if search_cap is not None else default_search_cap(effective_batch, world_size)
    trial_start(start, False)  # a bad start fails here, before the device is resolved
    device = resolve_device(device)
    limit = resolve_budget(device, memory_limit)
    cuda = cuda_initialized()
    spawned, why = trial_start(start, cuda)
    notes = [why] if why else []
    if not spawned and threads != 1 and not forks_start_threads():
        # OpenMP's pool was started here: a forked child that enters a parallel region waits on threads it does
        # not have, forever. One thread per trial instead (its stacks and arenas are not counted either way).
        threads = 1
        notes.append("this process had run parallel torch ops before the probe, so each forked trial runs one "
                     "thread (OpenMP cannot start threads after a fork); probe before training for your thread count")
    output = None
    if not spawned:
        # Your code's own output in the trials (prints, progress bars, warnings), once in a file, not once per trial.
        output = os.path.join(tempfile.mkdtemp(prefix="gaplan-probe-loop-"), "trials.log")
        notes.append(f"the trials' own output (your code's prints and warnings) is in {output}")
    run = _spawner(functions, device, limit, micro_steps, threads, cuda) if spawned else \
        _forker(functions.resolved(), device, limit, micro_steps, threads, output)
    started = time.perf_counter()
    log.info("probe_loop: probing your loop on %s under %s (effective batch %d, search cap %d)", device,
             format_bytes(limit or 0), effective_batch, cap)

    def measure(micro_batch: int, steps: int = optimizer_steps) -> Trial:
        trial = run(micro_batch, steps)
        # A trial that failed says at which of its steps (its completed steps are the ones before).
        log.info("probe_loop: micro-batch %d %s (%.1f s)", micro_batch,
                 (f"fits, peak {format_bytes(trial.peak_bytes)}" if trial.peak_bytes else "fits") +
                 f" in {trial.completed_steps} optimizer step(s)" if trial.fits else
                 f"does not fit: {trial.error} at optimizer step {trial.completed_steps + 1}", trial.seconds)
        bar.trial("micro-batch", micro_batch, trial.fits)
        if on_trial is not None:
            on_trial(trial)
        return trial

    # Frozen, this process's objects are out of the collector's reach in the forked trials: each of their full
    # collections (at the budget, after each step) would walk every object of your process otherwise.
    gc.freeze()
    try:
        with TrialBar("your loop", show=progress) as bar:
            result = find_edge(measure, limit, max_batch=cap, sketch=lambda micro_batch: measure(micro_batch, 1))
    finally:
        gc.unfreeze()
        if output is not None and not _printed_anything(output):
            shutil.rmtree(os.path.dirname(output), ignore_errors=True)  # the trials printed nothing: no file to read
            notes = [note for note in notes if output not in note]
    if result.edge == 0:
        raise DoesNotFit(f"your loop does not fit in {format_bytes(limit or 0)} even at micro-batch 1 "
                         f"({result.trials[-1].error})")
    found = LoopProbeResult(result.edge, result.capped, result.trials,
                            make_plan(effective_batch, result.edge, world_size), device, limit,
                            time.perf_counter() - started, spawned, notes)
    log.info("probe_loop: %s", found.describe())
    return found


SPAWNED_NOTE = ("this process had initialized CUDA before the probe, so each trial ran as a new process with your "
                "functions pickled, not as a fork; probe before anything touches the GPU to keep closures usable")


def trial_start(start: str, cuda_context: bool) -> tuple[bool, str | None]:
    """Whether the trials are spawned, and the note that says why when the caller did not ask for it.

    ``cuda_context``: this process has initialized CUDA (:func:`gaplan.devices.card.cuda_initialized`), so a
    forked trial could not use the card. ``auto`` then spawns, and says so once (the note); ``fork`` is refused."""
    if start not in ("auto", "fork", "spawn"):
        raise GaplanError(f"start must be 'auto', 'fork' or 'spawn' (got {start!r})")
    if start == "fork" and cuda_context:
        raise GaplanError("start='fork': this process has initialized CUDA, and a forked trial could not use it; "
                          "use start='spawn' (or 'auto') with picklable functions, or probe before touching the GPU")
    if start == "auto" and cuda_context:
        return True, SPAWNED_NOTE
    return start == "spawn", None


def resolve_budget(device: str, memory_limit: int | str | None) -> int | None:
    """The trials' budget in bytes: ``memory_limit`` (bytes or text) checked, else on CPU the budget this process
    bound itself to (``gaplan.cpu_budget``) or 1 GiB, and the card on CUDA.

    On CUDA a given limit is a card's memory, as ``gaplan probe --memory-limit`` takes it: the allocator's cap is
    that less the context's allowance (:data:`gaplan.devices.reserve.CONTEXT_BYTES`), which the allocator never
    holds. The whole card (the default) is the physical one, its context already off it."""
    from gaplan.devices.backend import cuda_total_bytes
    from gaplan.devices.cpu import bound_budget
    from gaplan.devices.reserve import CONTEXT_BYTES
    from gaplan.probing.edge import check_cpu_budget

    limit = parse_bytes(memory_limit) if memory_limit is not None else None
    if device == "cpu":
        limit = limit or bound_budget() or DEFAULT_CPU_BUDGET
        check_cpu_budget(limit)
    elif limit is None:
        limit = cuda_total_bytes(device)
    elif limit <= CONTEXT_BYTES:
        raise GaplanError(f"memory_limit {format_bytes(limit)} on CUDA is a card's memory: it leaves nothing after "
                          f"the CUDA context's allowance ({format_bytes(CONTEXT_BYTES)})")
    else:
        limit -= CONTEXT_BYTES
    return limit


def forks_start_threads(seconds: int = 3) -> bool:
    """Whether a child forked from this process can start torch's intra-op threads (it hangs when this process
    started OpenMP's pool already: the child is killed by an alarm after ``seconds`` then)."""
    if "torch" not in sys.modules:
        return True

    def check() -> dict:
        import signal

        from gaplan.devices.cpu import start_intra_op_threads

        signal.alarm(seconds)  # SIGALRM's default action ends a child that hangs in OpenMP
        start_intra_op_threads()
        signal.alarm(0)
        return {"ok": True}

    return bool(run_in_child(check).get("ok"))


def trial_from(message: dict, micro_batch: int, output: str | None = None) -> Trial:
    """The trial a child sent back; a failure for another reason than memory raises, its own output logged (the
    last lines of ``output``, the trials' output file) and the file named."""
    if "error" in message and "micro_batch" not in message:
        last = failure_line(message)
        if message["error"] == "killed":  # the kernel's OOM killer: past the machine's memory, not the budget
            return Trial(micro_batch, False, error=last)
        where = ""
        if output is not None:
            from gaplan.core.fork import output_tail

            tail = output_tail(output)
            if tail:
                log.warning("the failed trial's own output (last lines of %s):\n%s", output, tail)
            where = f" (its output: {output})"
        raise GaplanError(f"a trial of your loop failed at micro-batch {micro_batch} for another reason than memory: "
                          f"{last}{where}")
    return Trial.from_dict(message)


def _forker(functions: dict[str, Callable], device: str, limit: int | None, micro_steps: int,
            threads: int | None, output: str | None = None) -> Callable[[int, int], Trial]:
    if "torch" in sys.modules:  # imported once here, the trials forked from this process inherit it
        from gaplan.devices.cpu import import_lazy_torch_code

        import_lazy_torch_code()

    def run(micro_batch: int, steps: int) -> Trial:
        message = run_in_child(lambda: loop_trial(functions, device, limit, micro_batch, micro_steps, steps, threads),
                               output, f"{TRIAL_HEADER} micro-batch {micro_batch}, {steps} optimizer step(s)\n")
        return trial_from(message, micro_batch, output)

    return run


def _spawner(functions: LoopFunctions, device: str, limit: int | None, micro_steps: int,
             threads: int | None, cuda: bool) -> Callable[[int, int], Trial]:
    from gaplan.devices.card import NVML_CHECK
    from gaplan.devices.cpu import budget_environment
    from gaplan.worker.loop_trial import spawn_request

    # A one-line error here, before any trial, for a function a new process cannot have (``cuda``: why they are new
    # processes, this process having initialized CUDA, as the caller found it; else the caller asked for spawn).
    if cuda:
        functions.pickled()
    else:
        functions.pickled("start='spawn' runs each trial in a new process")
    env = dict(budget_environment(os.environ), **{NVML_CHECK: "1"})

    def run(micro_batch: int, steps: int) -> Trial:
        request = spawn_request(functions, device=device, limit_bytes=limit, micro_batch=micro_batch,
                                micro_steps=micro_steps, optimizer_steps=steps, threads=threads)
        completed = subprocess.run([sys.executable, "-m", "gaplan.worker.loop_trial"], input=request,
                                   capture_output=True, env=env)
        lines = completed.stdout.decode(errors="replace").strip().splitlines()
        if completed.returncode != 0 or not lines:
            message = completed.stderr.decode(errors="replace") or "no output"
            return trial_from({"error": "crash", "message": message}, micro_batch)
        return trial_from(json.loads(lines[-1]), micro_batch)

    return run


def _printed_anything(output: str) -> bool:
    """Whether the trials' log holds a line of your code's (not only the line gaplan writes before each trial)."""
    try:
        with open(output, encoding="utf-8", errors="replace") as handle:
            return any(line.strip() and not line.startswith(TRIAL_HEADER) for line in handle)
    except FileNotFoundError:
        return False
