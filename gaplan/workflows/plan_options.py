"""``gaplan plan``'s command line as one object: the workload's spec, the layouts to compare, the ranks, the GPU
(``target``) or budget, the levers to compare on one device, and ``measure``'s settings, checked once at construction
(:meth:`PlanCommand.__post_init__`); :func:`gaplan.workflows.run_commands.run_plan_command` estimates (and with
``measure`` probes and times) the layouts and the lever rows, and writes the report. The CLI parses text into it
(:func:`gaplan.workflows.parse_options.command_from_options`) and prints what it raises; a Python caller gets the same
refusals, word for word.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from gaplan.core.constants import DEFAULT_EFFECTIVE_BATCH
from gaplan.core.errors import GaplanError
from gaplan.core.options import MEMORY, OUTPUT, PLAN, TIMING, OptionError, check_applies, check_positive_ints, option
from gaplan.core.units import parse_bytes
from gaplan.plan.layouts import MACHINERY, resolve_world
from gaplan.plan.levers import BY_NAME
from gaplan.runs.folder import default_run_dir
from gaplan.workflows.parse_options import check_command_fields
from gaplan.workflows.plan_levers import lever_selection
from gaplan.workload.spec import WorkloadSpec

DTYPES = ("auto", "bf16", "fp16", "fp32")  # plan's --dtype: auto is the card's
MEASURE, CPU = "`--measure`", "`--device cpu`"  # where the measuring and the CPU's options apply


@dataclass(frozen=True)
class PlanCommand:
    """One ``gaplan plan``: the ``machinery`` layouts of ``spec``'s model compared over ``world_size`` ranks (or
    ``nodes`` x ``gpus_per_node``) for ``target`` (or ``memory_limit`` bytes per rank); with ``measure``, each that
    fits then probed and timed here (``repeats`` timed steps). The compute ``dtype`` replaces the spec's (auto: bf16,
    or fp16 on a ``target`` without bf16)."""

    # The spec is checked for no device (plan models them); plan's --grad-sync (auto|last|every) is a choice per
    # layout, not the spec's, and its --dtype (auto) is the card's: the spec takes it in __post_init__.
    SPEC_OPTIONS: ClassVar[dict] = {"device": False, "grad_sync": "last", "dtype": "bf16"}

    spec: WorkloadSpec
    machinery: str = option(",".join(MACHINERY), section=PLAN, flag="--layouts", metavar="L1,L2", help=(
        "The layouts to compare: " + ", ".join(MACHINERY) + "."))
    # A choice per FSDP layout (the spec's is last).
    grad_sync: str = option("auto", section=MEMORY, choices=("auto", "last", "every"),
                            applies="the FSDP layouts of `--layouts`", help=(
        "FSDP gradient reduce-scatter: on the last micro-step, on every one, or auto (the last unless every lets a "
        "larger micro-batch fit)."))
    dtype: str = option("auto", section=MEMORY, choices=DTYPES, help=(
        "Compute dtype; the layouts try fp32 weights with it (autocast) and pure low-precision weights. auto: bf16, "
        "or fp16 on a card that has no bf16 (compute capability below 8.0: V100, T4)."))
    device: str = option("cuda", section=MEMORY, choices=("cuda", "cpu"), help=(
        "cuda: plan for GPUs (--target or --memory-limit); cpu: CPU processes (compare with gaplan probe)."))
    target: str | None = option(None, section=MEMORY, metavar="GPU", applies="`--device cuda`, without `--measure`",
                                help=("A GPU from gaplan estimate --list-targets (default h100-80gb when no --memory-limit is "
                                      "given)."))
    memory_limit: int | None = option(None, section=MEMORY, parse=parse_bytes, metavar="SIZE", help=(
        "Memory per rank, e.g. 40GiB (instead of a target; with one, the smaller)."))
    world_size: int | None = option(None, section=PLAN, help="Ranks (default 1, or --nodes x --gpus-per-node).")
    nodes: int | None = option(None, section=PLAN, help="Machines the ranks run on (default 1).")
    gpus_per_node: int | None = option(None, section=PLAN, help=(
        "Ranks per machine when --world-size is not given (default 8 with --nodes)."))
    effective_batch: int = option(DEFAULT_EFFECTIVE_BATCH, section=PLAN, help=(
        "Samples per optimizer step, the same for every layout."))
    margin: float = option(0.0, section=MEMORY, help=(
        "Fraction of the limit kept free, as gaplan probe --margin (e.g. 0.05 against the estimate's error)."))
    threads: int | None = option(None, section=MEMORY, applies=CPU,
                                 help="CPU threads of the modelled process (--device cpu).")
    measure: bool = option(False, section=PLAN, help=(
        "Then probe and time every layout that fits on this machine's device (W local GPUs, or W CPU processes with "
        "--device cpu): the table gets the measured B*, peak and samples/s, and the pick is the fastest. Minutes per "
        "layout."))
    repeats: int = option(3, section=TIMING, applies=MEASURE,
                          help="Timed optimizer steps per layout or lever row (--measure).")
    # As given (None: the default levers; one device only).
    levers: str | None = option(None, section=PLAN, metavar="L1,L2", help=(
        "On one device (--world-size 1): the memory levers to compare, of " + ", ".join(BY_NAME) + " (or all, "
        "optimizers, none); default: all but the optimizers (yours is kept) and compile (a minute a row)."))
    out: str | None = option(None, section=OUTPUT, metavar="DIR", help=(
        "Folder for layouts.csv/json, layouts.png, report.md/html (default reports/plan-<model>-<time>)."))
    overwrite: bool = False  # replace the plan (or run) that ``out`` holds (its files only), else that is refused
    layouts: tuple[str, ...] = field(default=(), init=False)  # machinery, parsed
    lever_names: tuple[str, ...] = field(default=(), init=False)  # levers, parsed (() with more than one rank)
    ranks: int = field(default=1, init=False)
    machines: int = field(default=1, init=False)

    def __post_init__(self) -> None:
        check_command_fields(self, device=False)  # cuda or cpu: its choices
        check_positive_ints(effective_batch=self.effective_batch, threads=self.threads, repeats=self.repeats)
        if self.dtype not in DTYPES:
            raise OptionError(f"dtype must be one of {', '.join(DTYPES)} (got {self.dtype!r})", "dtype")
        ranks, machines = resolve_world(self.world_size, self.nodes, self.gpus_per_node)
        object.__setattr__(self, "ranks", ranks)
        object.__setattr__(self, "machines", machines)
        layouts = tuple(part.strip() for part in self.machinery.split(",") if part.strip())
        unknown = [m for m in layouts if m not in MACHINERY]
        if unknown or not layouts:
            raise GaplanError(f"--layouts: unknown layout {(unknown or [''])[0]!r}; choose from {', '.join(MACHINERY)}")
        object.__setattr__(self, "layouts", layouts)
        object.__setattr__(self, "lever_names", lever_selection(self.levers, ranks))
        if self.grad_sync != "auto" and not any(layout.startswith("fsdp") for layout in layouts):
            raise GaplanError(f"--grad-sync applies to the FSDP layouts of --layouts ("
                              f"{', '.join(m for m in MACHINERY if m.startswith('fsdp'))}): none is compared here")
        if self.device == "cpu" and self.target:
            raise GaplanError("--target is a GPU: it does not go with --device cpu")
        if self.measure and self.target:
            raise GaplanError("--measure probes this machine's device: give --memory-limit per rank (or nothing: the "
                              "whole card), not --target")
        if self.measure and machines > 1:
            raise GaplanError("--measure runs every rank on this machine: it does not go with --nodes")
        if not self.measure:
            check_applies(self, MEASURE)
        if self.device != "cpu":
            check_applies(self, CPU)
        if self.out is None:  # named once, so what is printed after names what was written
            object.__setattr__(self, "out", default_run_dir("plan", self.spec.model))
        object.__setattr__(self, "spec", replace(self.spec, dtype=self.compute_dtype))

    @property
    def compute_dtype(self) -> str:
        """``dtype``, with auto the card's: bf16, or fp16 on a ``target`` without bf16 (the default target, and a
        budget without one, take bf16)."""
        if self.dtype != "auto":
            return self.dtype
        from gaplan.estimate.targets import lookup_target

        return "fp16" if self.target and not lookup_target(self.target).has_bf16 else "bf16"
