"""A run's checkpoint: model, optimizer, scheduler, scaler, every rank's RNG, the step and the plan.

Written atomically and flushed (a cut-off write never replaces a good checkpoint); a sharded model's weights go
through torch's distributed checkpoint, one folder of shards that ``checkpoint.pt`` names. Restoring it puts a run
back exactly where it was, so ``--resume`` reaches the uninterrupted run's weights (bitwise on CPU).

A checkpoint is data, not code: it holds tensors, numbers, strings and plain containers alone, and is read with
``torch.load(weights_only=True)``, so a checkpoint from someone else cannot run anything on ``--resume``; one that
needs more is refused in one line.

On another number of ranks than it was written with, every rank's random state is derived from the seed, the rank
and the step (:func:`derived_rng_seed`): reproducible, but not the draws the uninterrupted run would have made.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import random
from dataclasses import dataclass
from typing import Any

import torch

from gaplan.core.atomic_write import atomic_write
from gaplan.core.disk import WriteFailed, ensure_room
from gaplan.core.errors import GaplanError, one_line
from gaplan.data.source import reads_as
from gaplan.parallel.fsdp import is_sharded
from gaplan.parallel.process_group import Distributed
from gaplan.parallel.state import (
    ensure_shard_room,
    load_full_state_into_sharded,
    load_sharded_state,
    remove_stale_sharded_states,
    save_sharded_state,
)
from gaplan.plan.split import Plan
from gaplan.runs.claim import remove_temporary_writes
from gaplan.runs.folder import CHECKPOINT
from gaplan.training.train_log import truncate_log
from gaplan.workload.build import Workload, optimizer_state_bytes
from gaplan.workload.quantize import is_quantized, trainable_state
from gaplan.workload.spec import SPLIT_ONLY_FIELDS, WorkloadSpec
from gaplan.workload.state_size import tensor_bytes


def save_checkpoint(path: str, state: dict[str, Any]) -> None:
    """Write atomically and flushed to disk: a cut-off write never replaces a good checkpoint. Its size is checked
    against the disk first; a disk fault is a one-line :class:`WriteFailed`."""
    atomic_write(path, lambda temp: torch.save(state, temp), fsync=True, size=tensor_bytes(state), what=CHECKPOINT)


def expected_checkpoint_bytes(workload: Workload) -> int:
    """The checkpoint's bytes once the optimizer's states exist: the model's state and the optimizer's. A sharded
    model's: this rank's shards, every entry (as distributed checkpoint writes them)."""
    model, sharded = workload.model, is_sharded(workload.model)
    return (tensor_bytes(model_state(model), shared_once=not sharded)
            + optimizer_state_bytes(model, workload.spec.optimizer, this_rank=sharded))


def model_state(model: torch.nn.Module) -> dict[str, Any]:
    """The model's part of a checkpoint: its state dict; of a QLoRA model, the trainable tensors alone (its frozen
    4-bit base is rebuilt from its source on resume, as deterministic as that source)."""
    return trainable_state(model) if is_quantized(model) else model.state_dict()


def load_model_state(model: torch.nn.Module, state: dict[str, Any]) -> None:
    """Load :func:`model_state`'s dict: all of it, and into a QLoRA model every trainable tensor."""
    if not is_quantized(model):
        model.load_state_dict(state)
        return
    expected = set(trainable_state(model))
    wrong = sorted(expected - set(state)) or sorted(set(state) - expected)
    if wrong:
        raise GaplanError(f"the checkpoint's adapters are not this model's: {', '.join(wrong[:3])} "
                          f"{'missing' if wrong[0] in expected else 'not in the model'}")
    model.load_state_dict(state, strict=False)


def load_checkpoint(run_dir: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The run folder's checkpoint, its tensors on ``map_location`` (this rank's device, not the saver's)."""
    path = os.path.join(run_dir, CHECKPOINT)
    if not os.path.isfile(path):
        raise GaplanError(f"--resume {run_dir}: no {CHECKPOINT} in it")
    try:
        # weights_only: the safe unpickler, which builds no object but tensors and plain containers and calls
        # nothing the file names (a pickle can name any callable: os.system among them).
        state = torch.load(path, weights_only=True, map_location=map_location)
    except pickle.UnpicklingError as exc:
        if "GLOBAL" not in str(exc):  # not a name the safe unpickler refused: a damaged or foreign file
            raise GaplanError(f"--resume {run_dir}: the checkpoint cannot be read (not a torch checkpoint the safe "
                              f"unpickler reads: {_named_global(exc)})") from None
        raise GaplanError(f"--resume {run_dir}: {CHECKPOINT} holds more than tensors, numbers, strings and plain "
                          f"containers, and is refused unread (it could run code: {_named_global(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint is the user's to know about
        raise GaplanError(f"--resume {run_dir}: the checkpoint cannot be read "
                          f"({exc.__class__.__name__}: {one_line(exc)})") from None
    return _checked_shape(run_dir, state)


def _named_global(exc: Exception) -> str:
    """The line of torch's message that says what the safe unpickler stopped at ("Trying to load unsupported GLOBAL
    posix.system ..."), without its advice to load the file unsafely."""
    for line in str(exc).splitlines():
        line = line.replace("WeightsUnpickler error:", "").strip()
        if line and not line.startswith(("Weights only load failed", "Please file an issue", "Check the documentation")):
            return line.rstrip(".")
    return one_line(exc)[:120]


def _checkpoint_header(run_dir: str) -> dict[str, Any]:
    """The checkpoint's dict with its tensors memory-mapped, not read (its step and plan are what is wanted)."""
    try:
        state = torch.load(os.path.join(run_dir, CHECKPOINT), weights_only=True, map_location="cpu", mmap=True)
    except Exception:  # noqa: BLE001 - read in full by load_checkpoint, which says in one line why it cannot be
        return load_checkpoint(run_dir)
    return _checked_shape(run_dir, state)


# What every checkpoint gaplan writes holds, by type ("sharded_state" in place of "model" and "optimizer").
_SHAPE = {"step": int, "plan": dict, "rng": (list, dict), "scheduler": dict}
_OPTIONAL = {"workload": dict, "data": dict, "loop_state": dict, "scaler": dict}  # None, or absent in an older one


def _checked_shape(run_dir: str, state: Any) -> dict[str, Any]:
    """``state`` when it has the shape of a gaplan checkpoint, else one line (a state dict of your own named
    checkpoint.pt, an edited file), before the run folder is written or anything is loaded."""
    def refuse(what: str) -> GaplanError:
        return GaplanError(f"--resume {run_dir}: {CHECKPOINT} is not a gaplan checkpoint ({what}), so the run cannot "
                           f"go on from it; without it, gaplan train --resume {run_dir} trains the run again from its "
                           "start")

    if not isinstance(state, dict):
        raise refuse(f"a {type(state).__name__}, not the dict gaplan writes")
    weights = {"sharded_state": str} if state.get("sharded_state") else {"model": dict, "optimizer": dict}
    for name, kind in {**_SHAPE, **weights}.items():
        if name not in state:
            raise refuse(f"no {name!r} in it")
        if not isinstance(state[name], kind) or (name == "step" and (isinstance(state[name], bool) or state[name] < 0)):
            raise refuse(f"its {name!r} is {type(state[name]).__name__} {str(state[name])[:40]!r}")
    for name, kind in _OPTIONAL.items():
        if state.get(name) is not None and not isinstance(state[name], kind):
            raise refuse(f"its {name!r} is {type(state[name]).__name__} {str(state[name])[:40]!r}")
    return state


def checkpoint_position(run_dir: str) -> tuple[int, Plan]:
    """The step a run folder's checkpoint holds and the plan of that step."""
    header = _checkpoint_header(run_dir)
    return int(header["step"]), Plan.from_dict(header["plan"])


# What a checkpoint's workload record may differ in from the run's: how a step is split (a resume may change it),
# and what does not change the trained state (where the starting weights came from, whether a folder's code runs).
_RECORD_FREE = (*SPLIT_ONLY_FIELDS, "init", "trust_remote_code")


def _as_written_today(record: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's workload record in the form today's spec writes its fields (an older gaplan kept a typed
    option's text as given: ``--lora-targets "q_proj, v_proj"``); a record that does not read as a spec is left as it
    is, and compared as it is."""
    known = {name: value for name, value in record.items() if name in spec}
    try:
        written = WorkloadSpec.from_dict({**spec, **known}).to_dict()
    except (GaplanError, TypeError):
        return record
    return {**record, **{name: written[name] for name in known}}


def check_checkpoint_record(run_dir: str, spec: dict[str, Any], data: dict[str, Any]) -> None:
    """The checkpoint's own record of its workload (model, task, sequence length, dtype, optimizer, adapters) and
    its data (the file, the tokenizer, the fields read) against the run's (``spec`` and ``data``, from train.json):
    a checkpoint of another run is one line, before anything is written. A field an older checkpoint does not
    record is not compared; a data field is compared by what it reads as (None: its default)."""
    header = _checkpoint_header(run_dir)
    record, read = _as_written_today(header.get("workload") or {}, spec), header.get("data") or {}
    differ = [(name, record[name], value) for name, value in spec.items()
              if name not in _RECORD_FREE and name in record and record[name] != value]
    differ += [("data" if name == "path" else name, reads_as(name, read[name]), reads_as(name, value))
               for name, value in data.items() if name in read and reads_as(name, read[name]) != reads_as(name, value)]
    if differ:
        name, saved, value = differ[0]
        raise GaplanError(f"--resume {run_dir}: {CHECKPOINT} is not this run's: its {name} is {saved!r}, "
                          f"train.json's {value!r} (a checkpoint of another run, copied in?)")


def check_checkpoint_fits(run_dir: str, workload: Workload) -> None:
    """The checkpoint's tensors against the model built for the run and its optimizer: every name and shape, and
    the optimizer's parameter count and state shapes, checked before anything is written or loaded. (A sharded
    checkpoint's shards are checked by torch's distributed checkpoint as it loads them.)"""
    header = _checkpoint_header(run_dir)
    if header.get("sharded_state"):
        return
    expected = {name: tuple(value.shape) for name, value in model_state(workload.model).items()
                if isinstance(value, torch.Tensor)}
    saved = {name: tuple(value.shape) for name, value in (header.get("model") or {}).items()
             if isinstance(value, torch.Tensor)}
    where = f"--resume {run_dir}: {CHECKPOINT} does not fit the model train.json names"
    missing, extra = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
    if missing or extra:
        name = (missing or extra)[0]
        count = len(missing or extra)
        raise GaplanError(f"{where}: {name}{f' and {count - 1} more' if count > 1 else ''} "
                          f"{'missing from it' if missing else 'in it, not in the model'}")
    for name, shape in expected.items():
        if saved[name] != shape:
            raise GaplanError(f"{where}: {name} is {list(saved[name])} in it, {list(shape)} in the model")
    _check_optimizer_fits(header.get("optimizer") or {}, workload.optimizer, where)


def _check_optimizer_fits(saved: dict[str, Any], optimizer: torch.optim.Optimizer, where: str) -> None:
    """The saved optimizer's groups hold as many parameters as this one's, and its per-weight states (moments,
    momentum) have the weights' shapes."""
    groups = saved.get("param_groups") or []
    counts = [len(group.get("params", [])) for group in groups]
    mine = [len(group["params"]) for group in optimizer.param_groups]
    if counts != mine:
        raise GaplanError(f"{where}: its optimizer holds {sum(counts)} parameters in {len(counts)} groups, this "
                          f"run's {sum(mine)} in {len(mine)}")
    params = [param for group in optimizer.param_groups for param in group["params"]]
    ids = [index for group in groups for index in group.get("params", [])]
    for index, param in zip(ids, params, strict=True):
        for key, value in (saved.get("state") or {}).get(index, {}).items():
            if key in ("exp_avg", "exp_avg_sq", "momentum_buffer") and isinstance(value, torch.Tensor) \
                    and tuple(value.shape) != tuple(param.shape):
                raise GaplanError(f"{where}: its optimizer's {key} of parameter {index} is {list(value.shape)}, "
                                  f"the parameter {list(param.shape)}")


@dataclass
class RunState:
    """What a checkpoint holds of a running loop (the plan changes when an OOM halves it)."""

    workload: Workload
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None
    shards: bool  # FSDP2: each rank writes its own shards
    dist: Distributed
    run_dir: str | None
    saved_step: int | None = None  # the step the run folder's checkpoint holds (None: none of this run)
    loop_state: dict[str, Any] | None = None  # what the loop keeps besides (a batch schedule, the noise scale's EMAs)
    replanned: bool = False  # restored onto the caller's plan (a new split), not the checkpoint's
    data: dict[str, Any] | None = None  # the data source's fields, recorded beside the workload's

    def save(self, step: int, plan: Plan, loop_state: dict[str, Any] | None = None) -> None:
        """Checkpoint ``step`` (a collective), with the loop's own ``loop_state``. A disk fault on any rank is
        :class:`WriteFailed` on every rank, with the folder's last good checkpoint (``saved_step``) as it was."""
        if not self.run_dir:
            return
        workload, optimizer, dist = self.workload, self.workload.optimizer, self.dist
        rng = _gather_rng(dist)
        shard_folder = save_sharded_state(self.run_dir, step, workload.model, optimizer, dist) if self.shards else None
        failure = None
        if dist.rank == 0:
            weights = ({"sharded_state": shard_folder} if self.shards else
                       {"model": model_state(workload.model), "optimizer": optimizer.state_dict()})
            try:
                save_checkpoint(os.path.join(self.run_dir, CHECKPOINT), {
                    **weights, "scheduler": self.scheduler.state_dict(),
                    "scaler": self.scaler.state_dict() if self.scaler else None,
                    "rng": rng, "step": step, "plan": plan.to_dict(), "workload": workload.spec.to_dict(),
                    "data": self.data,
                    "loop_state": loop_state,
                })
            except WriteFailed as exc:
                failure = exc
            if self.shards:  # the new shards without a checkpoint.pt that names them are stale too
                remove_stale_sharded_states(self.run_dir, keep=shard_folder if failure is None else self._kept())
        # Rank 0's outcome, known to every rank: none trains on while rank 0 has stopped.
        dist.fail_together(failure, f"rank 0 could not write {CHECKPOINT} to {self.run_dir} (its line says why)")
        self.saved_step = step

    def check_room(self) -> None:
        """Before training: the checkpoint must fit on the run folder's disk (a collective), else no step could be
        kept. Its size then: the weights, and the optimizer's states as they will be (AdamW: two per weight)."""
        if not self.run_dir:
            return
        note = " (checked before training: no step of this run could be kept)"
        if self.shards:  # each rank's shards, as they will be
            ensure_shard_room(os.path.join(self.run_dir, ".shards.tmp"), expected_checkpoint_bytes(self.workload),
                              "the shards of the first checkpoint", self.dist, note)
            return
        failure = None
        if self.dist.rank == 0:
            try:
                ensure_room(os.path.join(self.run_dir, CHECKPOINT), expected_checkpoint_bytes(self.workload),
                            CHECKPOINT)
            except WriteFailed as exc:
                failure = WriteFailed(f"{exc}{note}", exc.code)
        self.dist.fail_together(failure, f"rank 0 has no room for {CHECKPOINT} in {self.run_dir} (its line says why)")

    def _kept(self) -> str | None:
        """The shard folder the run folder's checkpoint.pt names now (None without one)."""
        path = os.path.join(self.run_dir or ".", CHECKPOINT)
        if not os.path.isfile(path):
            return None
        try:
            return torch.load(path, weights_only=True, map_location="cpu", mmap=True).get("sharded_state")
        except Exception:  # noqa: BLE001 - unreadable: keep nothing named by it
            return None

    def restore(self, plan: Plan, seed: int, new_split: bool = False) -> tuple[int, Plan]:
        """Load the run folder's checkpoint into the loop; the step to go on from and the plan to go on with.

        The saved plan wins (it holds an out-of-memory fallback's smaller micro-batch) unless the split is new:
        ``new_split`` (another device, budget, micro-batch or memory setting) or another world size, where the
        caller's plan, made for the new setting, is taken."""
        run_dir = self.run_dir or "."
        workload, optimizer, dist = self.workload, self.workload.optimizer, self.dist
        state = load_checkpoint(run_dir, map_location=workload.device)
        if state.get("sharded_state"):
            load_sharded_state(run_dir, state["sharded_state"], workload.model, optimizer)
        elif self.shards:  # written by one process or DDP, resumed under FSDP
            load_full_state_into_sharded(workload.model, optimizer, state["model"], state["optimizer"])
        else:
            load_model_state(workload.model, state["model"])
            optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        start_step = int(state["step"])
        saved_ranks = len(state["rng"]) if isinstance(state["rng"], list) else 1
        if saved_ranks == dist.world_size:
            _set_rng_state(state["rng"][dist.rank] if isinstance(state["rng"], list) else state["rng"])
        else:
            _seed_rng(derived_rng_seed(seed, dist.rank, start_step))
        self.saved_step = start_step
        self.loop_state = state.get("loop_state")  # None in a checkpoint of an older gaplan
        self.replanned = state["plan"]["world_size"] != dist.world_size or new_split
        plan = plan if self.replanned else Plan.from_dict(state["plan"])
        truncate_log(self.run_dir, start_step)
        if dist.rank == 0:  # the checkpoint is known good now: what a write cut off by a kill left beside it goes
            remove_temporary_writes(run_dir)
        return start_step, plan


def derived_rng_seed(seed: int, rank: int, step: int) -> int:
    """The seed of rank ``rank``'s random state when a run resumes at ``step`` on another number of ranks: the first
    8 bytes of SHA-256 of ``gaplan-rng:{seed}:{rank}:{step}`` (the same on every machine and Python)."""
    digest = hashlib.sha256(f"gaplan-rng:{seed}:{rank}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _seed_rng(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)


def _rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])


def _gather_rng(dist: Distributed) -> Any:
    state = _rng_state()
    if not dist.active:
        return state
    gathered: list[Any] = [None] * dist.world_size
    dist.dist.all_gather_object(gathered, state)
    return gathered
