"""The trial worker: a process that imports the libraries once and runs every trial in a fresh child.

The probe runs its trials here, not in the caller's process: the budget
(RLIMIT_DATA on CPU, a memory fraction on CUDA) must not constrain the caller,
and glibc's mmap threshold must be pinned before the interpreter allocates.

Each trial is a ``fork()`` of this worker, which has imported torch and
transformers but built nothing and touched no device: the child sets the budget,
builds the workload, runs the trial and reports. A long-lived trial process is
not an honest test: heap freed by earlier trials (and by an OOM) stays counted
against RLIMIT_DATA, so its edge drifts by a few samples. A fork costs
milliseconds where a new interpreter costs seconds, and every trial then sees
exactly what a fresh training process sees.

A sharded workload (``WorkerSetup.ranks`` above 1, ``--parallel fsdp``) forks one child per rank for
every trial: they join a process group of their own, each sets its budget, builds and shards the model
and trains; the first rank to fail ends the trial and the others are killed (:mod:`gaplan.worker.ranks`).
A replicated workload timed over its ranks (``gaplan plan --measure``) runs the same way, each rank in DDP.

It speaks JSON lines: the first request names the workload, device and budget;
each later one asks for a trial. Run by :class:`gaplan.worker.client.WorkerProcess`;
``python -m gaplan.worker`` by hand is for debugging.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable

from gaplan.core.fork import die_with_parent, run_in_child
from gaplan.core.options import error_reply
from gaplan.core.trial import Trial
from gaplan.worker.protocol import TrialRequest, WorkerSetup
from gaplan.worker.ranks import merge_ready, merge_trials, run_ranks

# A multi-rank trial that has not ended after this long is killed (a hang, not an answer): see gaplan.worker.ranks.
DEFAULT_RANK_TIMEOUT_S = 1800.0


def rank_device(device: str, rank: int | None) -> str:
    """Where a rank of a multi-rank trial runs: ``cuda:RANK`` on CUDA (as torchrun's LOCAL_RANK), else the CPU."""
    if rank is None or not device.startswith("cuda"):
        return device
    return f"cuda:{rank}"


def _lap(phases: dict[str, float] | None, name: str, since: float) -> float:
    """Record the seconds since ``since`` as phase ``name`` (for the probe's profile); returns now."""
    now = time.perf_counter()
    if phases is not None:
        phases[name] = round(now - since, 4)
    return now


def _build_under_budget(setup: WorkerSetup, enforce: bool = True, rank: int | None = None,
                        phases: dict[str, float] | None = None):
    """In a trial child: impose the budget, then build the workload (weights and optimizer state count).

    ``enforce=False`` measures without the budget (a reference run that is known not to fit).
    ``rank``: this child is that rank of a sharded trial (its process group joined already): the model is
    sharded with FSDP2 after it is built, as ``gaplan train --parallel fsdp`` does, under the budget.
    ``phases``: filled with the seconds each part took (budget, build, optimizer states).
    """
    import torch

    from gaplan.devices.backend import make_backend
    from gaplan.worker.trial import materialize_optimizer_state
    from gaplan.workload.build import build_workload
    from gaplan.workload.spec import WorkloadSpec

    device = rank_device(setup.device, rank)
    started = time.perf_counter()
    if setup.threads:
        torch.set_num_threads(setup.threads)
    if setup.ddp and rank is None:  # formed before the budget, as a run forms its group before its model: gloo's
        _one_process_group(device)  # threads' stacks took 24 MiB of a CPU budget (B* 11 where a 2-rank run trains 17)
    backend = make_backend(device)
    backend.activate(setup.allocator_limit(backend.name), enforce=enforce)
    started = _lap(phases, "budget", started)
    # Weights don't change memory: trials build from the config, directly on the device, and read no checkpoint.
    spec = WorkloadSpec.from_dict(setup.workload)
    if rank is not None and spec.parallel == "fsdp":  # as gaplan train --parallel fsdp builds it: meta, shard, fill
        from gaplan.parallel.build import build_sharded_workload

        workload = build_sharded_workload(spec, device, seed=setup.seed, load_weights=False,
                                          cpu_offload=spec.cpu_offload).workload
    else:
        workload = build_workload(spec, device, seed=setup.seed, load_weights=False)
        if setup.ddp or rank is not None:  # a rank of a DDP trial: replicated over the rank group
            workload = _wrapped_in_ddp(workload, device)
    started = _lap(phases, "model build", started)
    if setup.warm_optimizer:
        materialize_optimizer_state(workload)
    _lap(phases, "optimizer states", started)
    return backend, workload


def _join_group(setup: WorkerSetup, rank: int, store_path: str) -> None:
    """In a rank's child, before its budget (as under torchrun): join this trial's own process group.

    A new FileStore per trial: no port to find, nothing shared with another trial.
    """
    import datetime

    import torch
    import torch.distributed as dist

    from gaplan.parallel.process_group import process_group_backend

    device = rank_device(setup.device, rank)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    # The parent kills a stuck rank first; the group's own timeout is a second line.
    timeout = datetime.timedelta(seconds=setup.timeout_s or DEFAULT_RANK_TIMEOUT_S)
    dist.init_process_group(process_group_backend(device), store=dist.FileStore(store_path, setup.ranks),
                            rank=rank, world_size=setup.ranks, timeout=timeout)


def _in_ranks(setup: WorkerSetup, body: Callable[[int | None], dict]) -> list[dict]:
    """``body(rank)`` in every rank of a fresh process group (:func:`gaplan.worker.ranks.run_ranks`)."""
    store_dir = tempfile.mkdtemp(prefix="gaplan-ranks-")

    def work(rank: int) -> dict:
        die_with_parent()
        _join_group(setup, rank, os.path.join(store_dir, "store"))
        return body(rank)

    try:
        return run_ranks(setup.ranks, work, setup.timeout_s or DEFAULT_RANK_TIMEOUT_S)
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)


def _static_bytes(workload) -> int:
    """Weights, gradients and optimizer states this process holds: of a sharded model, its shards only."""
    if workload.spec.parallel != "fsdp":
        return workload.static_bytes()
    from torch.distributed.tensor import DTensor

    params = list(workload.model.parameters())
    local = [(p.to_local() if isinstance(p, DTensor) else p, p.requires_grad) for p in params]
    weights = sum(t.numel() * t.element_size() for t, _ in local)
    trained = sum(t.numel() * t.element_size() for t, requires_grad in local if requires_grad)
    states = 2 * trained if workload.spec.optimizer == "adamw" else 0  # as gaplan.workload.build.static_bytes counts
    return weights + trained + states


def _wrapped_in_ddp(workload, device: str):
    """The workload with its model in DistributedDataParallel: over a rank trial's group, or in a one-process
    group of this trial child.

    DDP adds its gradient buckets (a flat copy of the gradients, reduced in 25 MiB buckets) and its
    reducer's state: a trial for a plan of several ranks must count them, or B* is the edge of a run
    that will not be the one trained. One process is enough: the buckets do not depend on the world size.
    """
    import dataclasses

    from torch.nn.parallel import DistributedDataParallel

    _one_process_group(device)
    return dataclasses.replace(workload, model=DistributedDataParallel(workload.model))


def _one_process_group(device: str) -> None:
    """A process group of this trial child alone, where it has none (a rank trial joined its own)."""
    import torch.distributed as dist

    from gaplan.parallel.process_group import process_group_backend

    if not dist.is_initialized():
        dist.init_process_group(process_group_backend(device), store=dist.HashStore(), rank=0, world_size=1)


def _describe(setup: WorkerSetup, static: int | None, rank: int | None = None) -> dict:
    """The ready message: the workload built once under the budget, or why it does not fit."""
    from gaplan.devices.backend import is_out_of_memory, make_backend

    try:
        backend, workload = _build_under_budget(setup, rank=rank)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        backend = make_backend(rank_device(setup.device, rank))
        backend.activate(setup.allocator_limit(backend.name))
        return {"error": "does-not-fit", "limit_bytes": backend.limit_bytes, "static_bytes": static}
    return {
        "ready": True,
        "device": setup.device if rank is not None else backend.name,
        "limit_bytes": backend.limit_bytes,
        "param_count": workload.param_count,
        "static_bytes": _static_bytes(workload),
        "task": workload.task,
        "seq_len": workload.seq_len,
        "model_type": workload.info.get("model_type"),
        "setup_bytes": backend.current_bytes(),
    }


def _trial(setup: WorkerSetup, request: TrialRequest, rank: int | None = None, asked: float | None = None) -> dict:
    """One request in a trial child (or in one rank of it): a trial (optionally unbounded, with uneven sizes)
    or a breakdown. ``asked``: when the worker forked for it (the trial's ``phase_seconds`` start there)."""
    from gaplan.devices.backend import is_out_of_memory
    from gaplan.worker.trial import run_trial

    phases: dict[str, float] = {}
    if asked is not None:
        _lap(phases, "fork", asked)
    try:
        backend, workload = _build_under_budget(setup, enforce=not request.unbounded, rank=rank, phases=phases)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        return Trial(request.micro_batch, False, error="the model itself does not fit").to_dict()
    if request.breakdown:
        from gaplan.training.breakdown import measure_breakdown

        return measure_breakdown(workload, request.micro_batch, micro_steps=request.micro_steps).to_dict()
    trial = run_trial(workload, backend, request.micro_batch, micro_steps=request.micro_steps,
                      optimizer_steps=request.optimizer_steps, sizes=request.sizes)
    phases.update({f"step {n}": round(s, 4) for n, s in enumerate(trial.step_seconds, start=1)})
    return dataclasses.replace(trial, phase_seconds=phases).to_dict()


def _serve(requests, reply) -> None:
    setup = WorkerSetup.from_dict(json.loads(requests.readline()))
    started = time.perf_counter()
    phases: dict[str, float] = {}
    # Import once here; every trial child inherits the loaded libraries for free.
    import torch  # noqa: F401
    import transformers  # noqa: F401

    if setup.device == "auto":
        # Resolved in a child: asking CUDA whether it is there can initialize it, and a process that has
        # initialized CUDA cannot fork trials that use it.
        setup = dataclasses.replace(setup, device=run_in_child(_resolved_device)["device"])

    from gaplan.core.errors import GaplanError
    from gaplan.workload.build import load_model_code
    from gaplan.workload.spec import WorkloadSpec

    try:
        spec = WorkloadSpec.from_dict(setup.workload)
        # None for a user's function (built in the child), and where importing the model's libraries would
        # initialize CUDA in this process (then no trial could fork): the children import them.
        built = None if _imports_initialize_cuda(setup.device, spec) else load_model_code(spec)
    except GaplanError as exc:
        reply(error_reply(exc))
        return
    from gaplan.devices.card import cuda_initialized

    if setup.device.startswith("cuda") and cuda_initialized():
        reply({"error": "user", "message": "the probe's worker initialized CUDA before forking its trials, so no "
                                           "trial could use the card (a library imported with the model's code did)"})
        return
    static = None if built is None else built.static_bytes()
    started = _lap(phases, "imports (torch, transformers, the model's code)", started)
    # Every object alive now (the libraries, the model's code) moves to the permanent generation: a trial child's
    # gc.collect() then skips them, and does not write to (and so copy) every page of the inherited heap. Without
    # this each trial's collections took ~0.6 s on a small model, more than its steps (issue 14's profile).
    gc.collect()
    gc.freeze()
    if static is not None and setup.ranks > 1 and setup.workload.get("parallel") == "fsdp":
        static = -(-static // setup.ranks)  # each rank holds its shards (the ranks measure theirs exactly)
    if static is not None and setup.limit_bytes and static > setup.limit_bytes:
        reply({"error": "does-not-fit", "limit_bytes": setup.limit_bytes, "static_bytes": static})
        return
    if setup.ranks > 1:
        ready = merge_ready(_in_ranks(setup, functools.partial(_describe, setup, static)))
    elif built is not None and setup.device == "cpu":
        # All the ready message says is known from the meta build: no child builds the model just to say it
        # (~0.5 s of a cheap probe). A model that does not fit once built fails its first trial instead.
        ready = _meta_ready(setup, built)
    else:  # a user's function, or CUDA (whose budget needs the card, which this process must not touch)
        ready = run_in_child(lambda: _describe(setup, static))
    _lap(phases, "ready message", started)
    reply(dict(ready, phase_seconds=phases))
    if not ready.get("ready"):
        return
    for line in requests:
        request = TrialRequest.from_dict(json.loads(line))
        if setup.ranks > 1 and request.breakdown:
            reply({"error": "user", "message": "the memory breakdown by category measures one process: it does "
                                               "not run the ranks of a sharded (--parallel fsdp) trial"})
            continue
        asked = time.perf_counter()
        if setup.ranks > 1:
            outcome = merge_trials(request.micro_batch, _in_ranks(setup, functools.partial(_trial, setup, request)))
        else:
            outcome = run_in_child(functools.partial(_trial, setup, request, asked=asked))
        if isinstance(outcome.get("phase_seconds"), dict):
            _lap(outcome["phase_seconds"], "in the worker", asked)  # fork to reply: the child's whole life
        if outcome.get("error") == "killed":  # no Python error to catch: the kernel ended it for memory
            outcome = Trial(request.micro_batch, False, error=outcome["message"]).to_dict()
        reply(outcome)


def _imports_initialize_cuda(device: str, spec) -> bool:
    """True when building ``spec`` here would initialize CUDA (:func:`gaplan.devices.card.imports_initialize_cuda`:
    bitsandbytes, imported by peft for LoRA, by QLoRA and by the 8-bit optimizers)."""
    from gaplan.devices.card import imports_initialize_cuda

    return imports_initialize_cuda(device, spec)


def _resolved_device() -> dict:
    from gaplan.devices.backend import resolve_device

    return {"device": resolve_device("auto")}


def _meta_ready(setup: WorkerSetup, built) -> dict:
    """The ready message of a CPU worker, from the workload built on meta (``_describe`` builds it for real)."""
    from gaplan.core.constants import DEFAULT_CPU_BUDGET

    return {"ready": True, "device": "cpu", "limit_bytes": setup.limit_bytes or DEFAULT_CPU_BUDGET,
            "param_count": built.param_count, "static_bytes": built.static_bytes(), "task": built.task,
            "seq_len": built.seq_len, "model_type": built.info.get("model_type")}


def main() -> None:
    die_with_parent()  # a probe that is killed takes its worker (and so the trial child) with it
    # Keep the protocol channel private: anything a library prints goes to stderr.
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def reply(message: dict) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    try:
        _serve(sys.stdin, reply)
    except Exception:  # noqa: BLE001 - report, then die: the parent turns it into an error
        reply({"error": "crash", "message": traceback.format_exc(limit=5)})
        sys.exit(1)


if __name__ == "__main__":
    main()
