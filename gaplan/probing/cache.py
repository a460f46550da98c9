"""Where ``gaplan train`` and ``bench`` get their probe: ``--plan``'s file, the cache, or a new probe.

A probe is cached per workload, device, budget and thread count (and, for a model folder, the
content of its config files) under ``~/.cache/gaplan/plans/`` or ``$GAPLAN_CACHE_DIR/plans/``; the key holds the
device's identity too (:mod:`gaplan.devices.identity`: the card's model, memory, compute capability and driver, or
the CPU's model and memory; torch's, transformers', peft's and bitsandbytes' versions; on CUDA the allocator's
setting), so a cache on a shared home never hands one card's B* to another. The line that reuses one says what
matched.
"""

from __future__ import annotations

import dataclasses
import datetime
import glob
import hashlib
import json
import os
import shlex
from collections.abc import Callable

from gaplan.core.cache import cache_root
from gaplan.core.checkpointing import AUTO, Checkpointing
from gaplan.core.errors import GaplanError
from gaplan.core.trial import Trial
from gaplan.core.units import format_bytes
from gaplan.devices.identity import MachineIdentity, machine_identity
from gaplan.runs.probe_result import ProbeResult, allocator_warning, load_probe, save_probe
from gaplan.workload.spec import WorkloadSpec, model_source_kind

# Part of the key: a change in how trials measure must not reuse older answers.
PROBE_METHOD = "fork-per-trial, 2 optimizer steps, anonymous peak, MKL fast memory manager off"
_SAME_WORKLOAD_FIELDS = WorkloadSpec.probe_key_fields()
_KEYED_WHEN_SET = {"compile": False, "offload_activations": False}  # field -> the default that leaves it out of a key


def plan_cache_path(spec: WorkloadSpec, device: str, memory_limit: int | None, threads: int | None = None,
                    ddp: bool = False, world_size: int = 1, machine: MachineIdentity | None = None) -> str:
    """The cache file of a probe of this workload, device, budget and thread count (and DDP wrapper or not).

    The workload includes its layout (``parallel``, ``cpu_offload``, ``grad_sync``); a sharded one's key also
    holds the world size, since each rank holds 1/W of the model. ``machine``: the device's identity (default:
    :func:`~gaplan.devices.identity.machine_identity` of ``device`` here and now).
    """
    # The learning rate, where the weights come from and remote code change no memory.
    # A field added later, at its default, is left out too: the caches written before it keep their keys.
    workload = {k: v for k, v in spec.to_dict().items() if k not in ("lr", "init", "trust_remote_code")
                and not (k in _KEYED_WHEN_SET and v == _KEYED_WHEN_SET[k])}
    sharded = spec.parallel == "fsdp"
    machine = machine or machine_identity(device)
    key = json.dumps({"workload": workload, "model_files": _model_files_digest(spec.model), "device": device,
                      "memory_limit": memory_limit, "threads": threads, "probe": PROBE_METHOD,
                      "machine": machine.key(),
                      **({"ddp": True} if ddp and not sharded else {}),
                      **({"world_size": world_size} if sharded else {})}, sort_keys=True)
    return os.path.join(cache_root(), "plans", hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")


def reuse_line(cache: str, probed: ProbeResult, machine: MachineIdentity, memory_limit: int | None,
               threads: int | None) -> str:
    """The line that says a cached probe is reused, and what matched to reuse it."""
    budget = format_bytes(memory_limit) if memory_limit else "the default"
    return (f"using the cached probe {cache}: largest micro-batch {probed.max_micro_batch} (matched: the workload, "
            f"budget {budget}, threads {threads or 'default'}; {machine.describe()})")


def same_workload(a: WorkloadSpec, b: WorkloadSpec) -> bool:
    """True when a probe of ``a`` holds for ``b`` (everything but the learning rate matches)."""
    return all(getattr(a, k) == getattr(b, k) for k in _SAME_WORKLOAD_FIELDS)


def check_same_workload(probed: WorkloadSpec, spec: WorkloadSpec, what: str) -> None:
    """Refuse ``what`` (``--plan FILE``, ``--token-plan FILE``), made for ``probed``, for another workload: one line
    naming each field that differs (there, here) and the flags of its own workload."""
    if same_workload(probed, spec):
        return
    from gaplan.plan.layouts import workload_flags

    def shown(value: object) -> object:
        return "the default" if value is None else value

    differ = "; ".join(f"--{k.replace('_', '-')} {shown(getattr(probed, k))} there, {shown(getattr(spec, k))} here"
                       for k in _SAME_WORKLOAD_FIELDS if getattr(probed, k) != getattr(spec, k))
    raise GaplanError(f"{what} was made for another workload ({differ}): give its workload, "
                      f"{shlex.join(workload_flags(probed.to_dict()))}")


def probe_for(
    spec: WorkloadSpec,
    device: str,
    memory_limit: int | None,
    needed_micro_batch: int,
    plan_file: str | None = None,
    grad_checkpointing: Checkpointing | str | None = None,
    threads: int | None = None,
    ddp: bool = False,
    write_cache: bool = True,
    say: Callable[[str], None] = lambda text: None,
    on_trial: Callable[[Trial], None] | None = None,
    world_size: int | None = None,
) -> tuple[WorkloadSpec, ProbeResult]:
    """The probe to plan from: ``plan_file``, else the cached probe of this workload, else a new probe.

    ``ddp``: the run trains under DistributedDataParallel, so the trials do too (its buckets count).
    ``world_size``: the ranks of a sharded run (``spec.parallel == "fsdp"``), whose every trial runs them all;
    default: torchrun's ``WORLD_SIZE``. A plan file made for another world size is refused.
    ``needed_micro_batch`` is one rank's share of the step: the search goes no higher, and a
    cached probe that stopped at a smaller cap is not reused. Returns the workload spec too: a
    plan's tuner may have chosen gradient checkpointing (``grad_checkpointing`` None or AUTO: not given; AUTO
    without a plan is refused by :class:`gaplan.workflows.train_options.TrainOptions`).
    """
    from gaplan.probing.edge import probe

    sharded = spec.parallel == "fsdp"
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if plan_file:
        probed = load_probe(plan_file)
        if probed.token_budget:  # a train by tokens' record: its plan's micro-batch is no size it trained
            raise GaplanError(f"--plan {plan_file} records a run batched by tokens (micro-batches packed within "
                              f"{probed.token_budget} padded tokens): it holds no micro-batch to train; batch by tokens "
                              f"again (--batch-by tokens --token-budget {probed.token_budget})")
        if grad_checkpointing in (None, AUTO):
            spec = dataclasses.replace(spec, grad_checkpointing=probed.workload.grad_checkpointing)
        check_same_workload(probed.workload, spec, f"--plan {plan_file}")
        if sharded and probed.world_size != world_size:
            raise GaplanError(f"--plan {plan_file} was probed for FSDP over {probed.world_size} ranks, not "
                              f"{world_size}: each rank's shard, so B*, depends on the world size")
        warning = allocator_warning(probed, device)  # a cached probe's key holds the setting: only a plan file differs
        if warning:
            say(warning)
        return spec, probed
    machine = machine_identity(device)
    cache = plan_cache_path(spec, device, memory_limit, threads, ddp, world_size, machine)
    if os.path.isfile(cache):
        try:
            probed = load_probe(cache)
        except GaplanError as exc:  # a cache is gaplan's own, and optional: a damaged entry is probed again
            say(f"the cached probe cannot be read ({exc}): probing again, and replacing it")
        else:
            if not probed.capped or probed.max_micro_batch >= needed_micro_batch:
                say(reuse_line(cache, probed, machine, memory_limit, threads))
                return spec, reused(probed, cache)
    say("probing the largest micro-batch that fits first ...")
    if sharded:  # every trial runs the world's ranks; needed_micro_batch is one rank's share already
        probed = probe(spec, device=device, memory_limit=memory_limit, effective_batch=needed_micro_batch * world_size,
                       world_size=world_size, search_cap=needed_micro_batch, threads=threads, on_trial=on_trial)
    else:
        probed = probe(spec, device=device, memory_limit=memory_limit, effective_batch=needed_micro_batch,
                       threads=threads, ddp=ddp, on_trial=on_trial)
    if write_cache:
        try:
            save_probe(probed, cache)
        except GaplanError as exc:  # the run has its probe: only a later run's reuse is lost
            say(f"the probe is not cached ({exc}); set GAPLAN_CACHE_DIR to a writable folder to keep it")
    return spec, probed


def reused(probed: ProbeResult, cache: str) -> ProbeResult:
    """A cached probe as this run records it: dated now, with the probe's own date, key and file named, so a
    report says its trials came from an earlier run."""
    key = os.path.splitext(os.path.basename(cache))[0]
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return dataclasses.replace(probed, created=now,
                               reused_probe={"path": cache, "key": key, "created": probed.created})


def _model_files_digest(model: str) -> str | None:
    """A digest of a model folder's JSON files (config and friends): a changed config is a new workload."""
    if model_source_kind(model) != "directory":
        return None
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(model, "*.json"))):
        digest.update(os.path.basename(path).encode())
        with open(path, "rb") as handle:
            digest.update(handle.read())
    return digest.hexdigest()[:16]
