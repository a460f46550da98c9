"""Running out of memory mid-step: what the ranks agree on, and the smaller size the step is redone with.

Under DDP (or one process) the ranks vote at the points where none waits in a collective and every rank redoes
the step at half the micro-batch (:class:`OomAgreement`, :func:`halved_sizes`). Under FSDP, and in the backward
DDP synchronizes, no vote can reach ranks that wait inside a collective: the failing rank stops, leaving the
halved size for torchrun's restart when one is to come (:func:`stranded_out_of_memory`,
:mod:`gaplan.training.restart`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gaplan.core.errors import GaplanError
from gaplan.parallel.process_group import RESTARTABLE_LAUNCH, Distributed
from gaplan.plan.split import Plan, make_plan
from gaplan.training.micro_batches import longest_sample
from gaplan.training.restart import restarts_left, write_marker


class PeerOutOfMemory(RuntimeError):
    """Another rank ran out of memory in this step: every rank redoes it with the smaller micro-batch."""


class OomAgreement:
    """Votes per rank and attempt on whether any rank ran out of memory, at the points where DDP does not wait.

    The ranks vote before the last micro-batch (whose backward DDP synchronizes) and again between its
    forward and its backward. A rank that fails votes ``True`` from its ``except`` block at the next
    vote the others will cast; they raise :class:`PeerOutOfMemory` there. So an OOM in any micro-step's
    forward or backward, or in the last one's forward, switches every rank to the smaller split
    together. (An OOM inside the last backward happens while the peers wait in DDP's all-reduce: that
    one goes through torchrun's restart, :func:`stranded_out_of_memory`.)
    """

    VOTES = 2  # before the last micro-batch, and before its backward

    def __init__(self, dist: Distributed) -> None:
        self.dist = dist
        self.cast = 0  # votes this rank took part in, this attempt
        self.settled = False  # a vote found a failure: every rank knows

    def _vote(self, failed: bool) -> None:
        self.cast += 1
        if self.dist.any(failed):
            self.settled = True
            if not failed:
                raise PeerOutOfMemory("another rank ran out of memory in this step")

    def before_last(self) -> None:
        self._vote(False)

    def before_last_backward(self) -> None:
        self._vote(False)

    def report_own_failure(self) -> None:
        if not self.settled and self.cast < self.VOTES:
            self._vote(True)


@dataclass(frozen=True)
class Halved:
    """The sizes to redo a step with after running out of memory, and both said in words."""

    plan: Plan
    token_budget: int | None
    was: str
    now: str


def halved_sizes(plan: Plan, token_budget: int | None, micro_batches: list) -> Halved:
    """Half the micro-batch, or by tokens half the budget but never below the step's longest sample (a
    micro-batch holds at least one)."""
    if token_budget:
        smaller = max(token_budget // 2, longest_sample(micro_batches))
        return Halved(plan, smaller, f"{token_budget} tokens per micro-batch", f"{smaller} tokens per micro-batch")
    smaller_plan = make_plan(plan.effective_batch, max(1, plan.micro_batch // 2), plan.world_size)
    return Halved(smaller_plan, None, f"micro-batch {plan.micro_batch}",
                   f"micro-batch {smaller_plan.micro_batch} x {smaller_plan.grad_accum_steps} accumulation steps")


def stranded_out_of_memory(exc: BaseException, step: int, plan: Plan, token_budget: int | None,
                           micro_batches: list, dist: Distributed, run_dir: str | None, sharded: bool) -> GaplanError:
    """An OOM where the other ranks wait inside a collective this rank will never join: under FSDP (every
    forward and backward all-gathers) anywhere, under DDP in the backward it synchronizes (its gradient
    all-reduce). No vote can reach them and the step cannot be redone smaller in this process. Stop this rank
    (torchrun then stops the others). With a torchrun restart to come, leave the smaller size for the restarted
    ranks (:mod:`gaplan.training.restart`); else say how to get one."""
    where = getattr(exc, "gaplan_phase", "the optimizer step")
    halved = halved_sizes(plan, token_budget, micro_batches)
    layout = "FSDP" if sharded else "DDP"
    failure = f"rank {dist.rank} ran out of memory at step {step + 1}, in {where}, at {halved.was} under {layout}"
    waiting = ("where the other ranks wait inside a collective" if sharded else
               "where the other ranks wait inside its gradient all-reduce")
    if run_dir and restarts_left():
        write_marker(run_dir, dist.rank, micro_batch=None if token_budget else halved.plan.micro_batch,
                     token_budget=halved.token_budget,
                     message=f"step {step + 1}: {failure}; redone with {halved.now} after torchrun's restart")
        return GaplanError(f"{failure}, {waiting}: torchrun restarts every rank (--max-restarts) and they go on "
                           f"from the last checkpoint with {halved.now}")
    return GaplanError(f"{failure}, {waiting}: no smaller retry is possible mid-step. Launch with "
                       f"{RESTARTABLE_LAUNCH} to redo it from the last checkpoint at half the size, or train with a "
                       "smaller --micro-batch (" + ("gaplan probe --parallel fsdp finds" if sharded else
                                                    "the run's own probe, without --micro-batch, finds")
                       + " the largest that fits)")
