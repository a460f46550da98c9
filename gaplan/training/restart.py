"""Out of memory where no in-step vote reaches the peers: redo the work smaller through torchrun's restart.

Under DDP a rank that runs out of memory reaches its peers at the next vote and the step is redone with half
the micro-batch, except in the last micro-step's backward, which DDP synchronizes. Under FSDP every forward and
backward all-gathers. In both the peers wait inside a collective the failing rank will never join: nothing can
reach them mid-step. What can is a restart. With ``torchrun
--max-restarts N``, the failing rank writes what it ran out of memory at (``oom-restart.rank<R>.json`` in the
run folder: the halved micro-batch or token budget) and exits; torchrun stops and restarts every rank; the new
ranks agree (the smallest over every rank, so each node may hold its own markers) and go on from the last
checkpoint, or from the start when there is none, with the smaller size. The step's samples are the same and
the loss is token-exact for any split, so the run trains the weights it would have trained at the smaller size.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field

from gaplan.core.atomic_write import atomic_write_text
from gaplan.parallel.process_group import Distributed

MARKER_PREFIX = "oom-restart.rank"
_NONE = 1 << 62  # "no marker" in the ranks' minimum


def restarts_left() -> bool:
    """True under torchrun with a restart still to come (``--max-restarts`` above the restarts so far)."""
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > int(os.environ.get("TORCHELASTIC_RESTART_COUNT",
                                                                                     "0"))


def write_marker(run_dir: str, rank: int, *, micro_batch: int | None, token_budget: int | None, message: str) -> None:
    """What this rank ran out of memory at, for the ranks torchrun starts next."""
    os.makedirs(run_dir, exist_ok=True)
    atomic_write_text(os.path.join(run_dir, f"{MARKER_PREFIX}{rank}.json"),
                      json.dumps({"micro_batch": micro_batch, "token_budget": token_budget, "message": message}))


@dataclass
class Restart:
    """What the ranks agreed on after an out-of-memory restart: the size limits and the failures' messages."""

    micro_batch: int | None = None
    token_budget: int | None = None
    messages: list[str] = field(default_factory=list)


def agree_on_restart(run_dir: str, dist: Distributed) -> Restart | None:
    """The restart this run is (None when no rank of any node holds a marker). A collective; the markers are
    removed once every rank has read them."""
    markers = []
    for path in sorted(glob.glob(os.path.join(run_dir, f"{MARKER_PREFIX}*.json"))):
        try:
            with open(path) as handle:
                markers.append(json.load(handle))
        except (OSError, ValueError):
            continue  # half a marker: the atomic write makes this a file another node removed
    micro = dist.min(min((m["micro_batch"] for m in markers if m.get("micro_batch")), default=_NONE))
    budget = dist.min(min((m["token_budget"] for m in markers if m.get("token_budget")), default=_NONE))
    if micro == _NONE and budget == _NONE:
        return None
    dist.barrier()  # every rank has read the markers of its node
    if dist.local_rank == 0:
        for path in glob.glob(os.path.join(run_dir, f"{MARKER_PREFIX}*.json")):
            os.remove(path)
    return Restart(None if micro == _NONE else micro, None if budget == _NONE else budget,
                   [m["message"] for m in markers if m.get("message")])
