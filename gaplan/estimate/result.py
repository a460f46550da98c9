"""What an estimate returns: the traced rows, the edge, the plan and the assumptions, all serializable."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from gaplan.estimate.assumptions import Assumption
from gaplan.estimate.trust import Trust

PHASES = ("micro-steps", "optimizer-step", "step")


@dataclass(frozen=True)
class TracedRow:
    """One traced peak, by category (:data:`gaplan.core.constants.BREAKDOWN_CATEGORIES`, as
    :class:`gaplan.training.breakdown.MemoryBreakdown`).

    ``phase`` is ``micro-steps`` (forward and backward with gradients and optimizer states held),
    ``optimizer-step`` (the optimizer step alone) or ``step`` (both: the whole steady-state step).
    ``peak_bytes`` is ``tracked_total`` plus what the device holds besides tensors; it is what is
    compared with the usable memory. A size whose micro-steps were traced already is checked as a
    ``composed`` step: the larger of its micro-steps row and the optimizer-step row (the two phases
    never overlap, so that is exactly what tracing the whole step gives).
    """

    micro_batch: int
    phase: str
    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    other: int
    tracked_total: int
    peak_bytes: int
    composed: bool = False  # a ``step`` row made of this size's micro-steps row and the optimizer-step row
    # False: the micro-step of a step without accumulation, traced alone (under FSDP with --grad-sync last it holds
    # no unsharded gradients from an earlier micro-step); True: one of several accumulated micro-steps.
    accumulated: bool = True
    # A sharded (FSDP) trace's own categories (gaplan.estimate.sharded.FSDP_CATEGORIES, plus host_bytes: what
    # --cpu-offload keeps in host memory); empty for one process.
    detail: dict = field(default_factory=dict)
    # On cuda (gaplan.estimate.allocator): what the segments holding live blocks held beyond them at the peak (in
    # ``other`` and the peak), and the wholly free cached segments a run with room keeps reserved besides (not in the
    # peak: an out-of-memory retry gives them back; max_memory_reserved and nvidia-smi show them).
    unfilled_segment_bytes: int = 0
    cached_segment_bytes: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class EstimateResult:
    """What an estimate found: the largest micro-batch, the plan, and how it got there."""

    workload: dict
    device_kind: str
    target: str | None
    memory_limit_bytes: int  # the device's memory (a target's total) or the given limit
    usable_bytes: int  # what tensors may take: the limit less the reserve
    rows: list[TracedRow]
    line: tuple[float, float]  # (intercept, slope) of the micro-steps' peak bytes over micro-batch
    max_micro_batch: int  # B*, the largest micro-batch predicted to fit
    capped: bool  # True when the search cap itself fits: the real edge may be larger
    peak_bytes: int  # traced peak of the whole step at max_micro_batch
    plan: dict  # Plan.to_dict()
    assumptions: list[Assumption]  # the budget's first, then the trace's and the device model's
    trace_seconds: float
    param_count: int
    static_bytes: int  # weights + gradients + optimizer states (a rank's shards under FSDP)
    task: str
    seq_len: int | None
    trace_count: int = 0
    extra: dict = field(default_factory=dict)
    world_size: int = 1  # ranks; every byte figure is per rank
    nodes: int = 1
    launch_command: str | None = None  # the gaplan train (or torchrun) command of the plan
    # Traced peak of the whole step at the plan's micro-batch (its largest, at most B*); None when not traced.
    plan_peak_bytes: int | None = None
    trust: Trust | None = None  # the zoo's measured error for the model's family (gaplan.estimate.trust)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["rows"] = [row.to_dict() for row in self.rows]
        data["line"] = {"intercept": self.line[0], "slope": self.line[1]}
        data["assumptions"] = [a.to_dict() for a in self.assumptions]
        data["trace_seconds"] = round(self.trace_seconds, 3)
        data["trust"] = self.trust.to_dict() if self.trust is not None else None
        return data
