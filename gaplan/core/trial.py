"""One probe trial as measured: the single record every part uses (worker, probe, search, plan.json). No torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class Trial:
    """A steady-state trial at ``micro_batch``: did it fit, its peak bytes (above the pre-budget baseline), its time."""

    micro_batch: int
    fits: bool
    peak_bytes: int | None = None
    seconds: float = 0.0
    error: str | None = None  # why it failed, one line (the allocator's message for an OOM)
    completed_steps: int = 0  # optimizer steps finished before the end (an OOM at step 2 shows as 1)
    # The peak of the forward/backward passes alone. The optimizer step's own temporaries do not
    # grow with the micro-batch; at small sizes they set the peak and would bend the memory line.
    micro_steps_peak_bytes: int | None = None
    step_seconds: list[float] = field(default_factory=list)  # wall time of each finished optimizer step
    tokens_per_step: int = 0  # attention-mask tokens in one step's batches (0 when batches have no mask)
    before_bytes: int = 0  # memory held before the trial, and after its clean-up: equal when nothing leaked
    after_bytes: int = 0
    rank_peak_bytes: list[int] | None = None  # each rank's peak, in a trial of several ranks (peak_bytes: the largest)
    # Where the trial's time went (fork, budget, model build, optimizer states, each step, in the worker): the
    # probe's profile. Not in plan.json's trial table.
    phase_seconds: dict[str, float] | None = None
    # CPU time of the process in each step (all its threads): far below the wall time, it waited for a core.
    step_cpu_seconds: list[float] = field(default_factory=list)

    @property
    def line_peak_bytes(self) -> int | None:
        """The peak the search draws its memory line through: forward/backward when known, else the whole step."""
        return self.micro_steps_peak_bytes if self.micro_steps_peak_bytes is not None else self.peak_bytes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trial:
        """Read a trial back; keys this version does not know are ignored (files from newer versions)."""
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})
