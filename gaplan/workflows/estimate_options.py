"""``gaplan estimate``'s command line as one object: the workload's spec, the GPU (``target``) or budget, the effective
batch, the ranks and the sizes traced, checked once at construction (:meth:`EstimateCommand.__post_init__`);
:func:`gaplan.workflows.run_commands.run_estimate_command` runs it. The CLI parses text into it
(:func:`gaplan.workflows.parse_options.command_from_options`) and prints what it raises; a Python caller gets the same
refusals, word for word.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from gaplan.core.constants import DEFAULT_EFFECTIVE_BATCH, EFFECTIVE_BATCH_HELP
from gaplan.core.errors import GaplanError
from gaplan.core.options import MEMORY, PLAN, check_positive_ints, option
from gaplan.plan.layouts import resolve_world
from gaplan.workflows.parse_options import check_command_fields, check_sizes, parse_sizes
from gaplan.workload.spec import WorkloadSpec


@dataclass(frozen=True)
class EstimateCommand:
    """One ``gaplan estimate``: ``spec`` traced on fake tensors for ``target`` (or ``memory_limit`` bytes), at
    ``effective_batch`` over ``world_size`` ranks (or ``nodes`` x ``gpus_per_node``)."""

    SPEC_OPTIONS: ClassVar[dict] = {"auto_checkpointing": False}  # a trace times nothing: auto is refused

    spec: WorkloadSpec
    target: str | None = option(None, section=MEMORY, metavar="GPU", applies="a GPU (not `--device cpu`)", help=(
        "A GPU from --list-targets (default h100-80gb when no --memory-limit is given; with one, the smaller of the "
        "two)."))
    memory_limit: int | None = None
    effective_batch: int = option(DEFAULT_EFFECTIVE_BATCH, section=PLAN, help=EFFECTIVE_BATCH_HELP)
    sizes: tuple[int, ...] | None = option(None, section=PLAN, parse=parse_sizes, metavar="B1,B2", help=(
        "Micro-batches whose micro-steps draw the memory line (default 1,2)."))
    world_size: int | None = option(None, section=PLAN, help=(
        "Ranks the effective batch is split over (default 1, or --nodes x --gpus-per-node); every figure is per rank. "
        "With --parallel fsdp, one rank of a W-way FSDP2 step is traced."))
    nodes: int | None = option(None, section=PLAN, help=(
        "Machines the ranks run on (for the torchrun command; default 1)."))
    gpus_per_node: int | None = option(None, section=PLAN, help=(
        "Ranks per machine when --world-size is not given (default 8 with --nodes, an HGX node)."))
    search_cap: int | None = None  # None: ceil(E / W); its option is gaplan probe's (ProbeOptions.search_cap)
    device: str = "auto"  # cpu models a CPU process; anything else a CUDA card
    threads: int | None = None
    ranks: int = field(default=1, init=False)  # the world size, resolved
    machines: int = field(default=1, init=False)  # the nodes, resolved

    def __post_init__(self) -> None:
        check_command_fields(self)
        from gaplan.estimate.sharded import check_world_size

        check_positive_ints(effective_batch=self.effective_batch, search_cap=self.search_cap, threads=self.threads)
        ranks, machines = resolve_world(self.world_size, self.nodes, self.gpus_per_node)
        object.__setattr__(self, "ranks", ranks)
        object.__setattr__(self, "machines", machines)
        check_world_size(self.spec, ranks)
        if self.sizes is not None:
            object.__setattr__(self, "sizes", tuple(self.sizes) or None)
        if self.sizes is not None:
            check_sizes(self.sizes, self.sizes)
        if self.device_kind == "cpu" and self.target:
            raise GaplanError("--target is a GPU: it does not go with --device cpu")

    @property
    def device_kind(self) -> str:
        return "cpu" if self.device == "cpu" else "cuda"
