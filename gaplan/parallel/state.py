"""A sharded model's weights and optimizer states: saved and loaded by torch's distributed checkpoint.

Each rank writes its own shards (no rank ever holds the whole model). A checkpoint's shards go to a
folder named by its step, written under a temp name and renamed once every rank has finished; the
run's ``checkpoint.pt`` (written after, atomically) names the folder it goes with, so a crash at any
point leaves a ``checkpoint.pt`` whose folder is complete. Folders no checkpoint names are removed.
"""

from __future__ import annotations

import os
import shutil

from torch import nn
from torch.optim import Optimizer

from gaplan.core.disk import WriteFailed, describe, disk_errno, ensure_room
from gaplan.core.errors import GaplanError, mark_rank_own
from gaplan.parallel.process_group import Distributed
from gaplan.runs.folder import SHARDED_STATE_PREFIX


def save_sharded_state(run_dir: str, step: int, model: nn.Module, optimizer: Optimizer, dist: Distributed) -> str:
    """Write this rank's shards of model and optimizer (a collective); returns the folder's name."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from gaplan.workload.state_size import tensor_bytes

    name = f"{SHARDED_STATE_PREFIX}{step:08d}"
    final, temp = os.path.join(run_dir, name), os.path.join(run_dir, f".{name}.tmp")
    if dist.rank == 0:
        shutil.rmtree(temp, ignore_errors=True)
    dist.barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    mine = tensor_bytes(state, shared_once=False)  # tied weights are written once per entry
    what = f"the shards of {name}"
    ensure_shard_room(temp, mine, what, dist)
    elsewhere = f"another rank could not write {what} to {run_dir} (its line says why)"
    failure = None
    try:
        dcp.save(state, checkpoint_id=temp)
    except BaseException as exc:  # CheckpointException (a BaseException) holds every failed rank's, on every rank
        failure = _shard_write_failure(exc, dist.rank, temp, mine, what)
    # The shards written so far are removed: no folder of them is ever taken for complete.
    dist.fail_together(failure, elsewhere, cleanup=lambda: shutil.rmtree(temp, ignore_errors=True))
    dist.barrier()  # every rank's files are in the temp folder
    if dist.rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(temp, final)
    dist.barrier()
    return name


def ensure_shard_room(folder: str, mine: int, what: str, dist: Distributed, note: str = "") -> None:
    """Every rank's shards go to one folder: the room for all of them is checked on every rank (its file-size limit
    against its own file, ``mine`` bytes), and all ranks stop together (a collective) before any shard is written."""
    failure = None
    try:
        ensure_room(folder, int(dist.sum(mine)), what, file_bytes=mine)
    except WriteFailed as exc:
        failure = WriteFailed(f"{exc}{note}", exc.code)
    dist.fail_together(failure, f"another rank could not write {what} to {os.path.dirname(folder)} "
                                f"(its line says why){note}")


def _shard_write_failure(exc: BaseException, rank: int, temp: str, mine: int, what: str) -> WriteFailed:
    """The line for a failed ``dcp.save``: this rank's own disk fault, or which ranks had one; a bug is raised."""
    code = disk_errno(exc, temp, mine)  # None for a bug and for KeyboardInterrupt / SystemExit
    if code is None:
        raise exc
    failed = getattr(exc, "failures", None)
    if isinstance(failed, dict) and failed and rank not in failed:
        ranks = ", ".join(str(r) for r in sorted(failed))
        failure = WriteFailed(f"rank {ranks} could not write {what} to {os.path.dirname(temp)} (its line says why)",
                              code)
    else:
        failure = WriteFailed(describe(temp, code, mine, what), code)
        if isinstance(failed, dict) and 0 not in failed:  # rank 0's line points here
            mark_rank_own(failure)
    failure.__cause__ = exc  # the writer's own exception, for --debug
    return failure


def load_sharded_state(run_dir: str, name: str, model: nn.Module, optimizer: Optimizer) -> None:
    """Read this rank's shards back into the sharded model and its optimizer (a collective). A model that is not
    sharded (one process, DDP) reads the whole tensors: distributed checkpoint reshards to any layout."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    folder = os.path.join(run_dir, name)
    if not os.path.isdir(folder):
        raise GaplanError(f"--resume {run_dir}: the sharded state {name} that checkpoint.pt names is missing")
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def load_full_state_into_sharded(model: nn.Module, optimizer: Optimizer, model_state: dict,
                                 optimizer_state: dict) -> None:
    """A one-process or DDP checkpoint (the whole model's state dict, the optimizer's by parameter index) into a
    sharded model and its optimizer: each rank keeps its shards of the full tensors (a collective). The index of a
    parameter in the saved optimizer is its place among the optimizer's parameters, which the same workload builds
    in the same order; distributed checkpoint's state-dict API takes them by name."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

    if not optimizer_state["state"]:  # a stateless optimizer (SGD without momentum): its hyperparameters alone
        set_model_state_dict(model, model_state, options=StateDictOptions(full_state_dict=True))
        optimizer.load_state_dict(optimizer_state)
        return
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    ordered = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    by_name = {"state": {ordered[index]: value for index, value in optimizer_state["state"].items()},
               "param_groups": [{**group, "params": [ordered[index] for index in group["params"]]}
                                for group in optimizer_state["param_groups"]]}
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=by_name,
                   options=StateDictOptions(full_state_dict=True))


def remove_stale_sharded_states(run_dir: str, keep: str | None) -> None:
    """Remove the shard folders no checkpoint names any more (called once ``checkpoint.pt`` names ``keep``)."""
    for entry in os.listdir(run_dir):
        bare = entry.lstrip(".")
        if bare.startswith(SHARDED_STATE_PREFIX) and entry != keep:
            shutil.rmtree(os.path.join(run_dir, entry), ignore_errors=True)


def full_model_state(model: nn.Module) -> dict:
    """The whole model's state dict on CPU: gathered from every rank for a sharded model (a collective)."""
    from gaplan.parallel.fsdp import is_sharded

    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
