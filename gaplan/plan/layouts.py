"""Choosing how to spread a model over ranks: the layouts, their ranking, the pick, and the launch command. No torch.

``gaplan plan`` estimates every :class:`Layout` (DDP, FSDP, FSDP + checkpointing, FSDP + CPU offload, each
with the precision choices of :data:`PRECISIONS`) for one model, budget, world size and effective batch,
and this module decides which to use. The rule (:func:`pick`):

* a layout that was timed (``samples_per_s``) beats every untimed one; among timed ones, the fastest fits;
* otherwise the largest usable micro-batch wins -- the plan's micro-batch, that is ``min(B*, E / W)``
  split evenly, so the fewest accumulation steps -- since a larger micro-batch than one rank's share is
  never used;
* ties go to the more precise weights (fp32 master weights before pure bf16, whose AdamW updates
  lose small steps), then to the least memory-saving machinery (DDP, then FSDP, then FSDP +
  checkpointing, then FSDP + CPU offload: each costs time: gathers, recomputation, host
  transfers), then to gradients reduce-scattered once per step rather than every micro-step.

The effective batch is the same for every layout; only its split changes.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from gaplan.core.checkpointing import parse_checkpointing
from gaplan.core.errors import GaplanError
from gaplan.core.options import OptionError

# Machinery, from the least to the most memory-saving (and the most costly in time).
MACHINERY = ("ddp", "fsdp", "fsdp+ckpt", "fsdp+offload")
MACHINERY_LABELS = {"ddp": "DDP", "fsdp": "FSDP", "fsdp+ckpt": "FSDP + checkpointing",
                    "fsdp+offload": "FSDP + CPU offload"}


@dataclass(frozen=True)
class Precision:
    """How weights, optimizer states and compute are typed; ``unsupported`` says why gaplan cannot train it."""

    name: str
    label: str
    weights_dtype: str | None  # None: the compute dtype (``--dtype``)
    unsupported: str | None = None

    def label_for(self, dtype: str) -> str:
        """The label with ``--dtype``'s compute: fp32 master weights under fp32 compute are plain fp32 (no autocast)."""
        if dtype == "fp32" and self.weights_dtype == "fp32":
            return "fp32 weights, optimizer states and compute"
        return self.label.format(dtype=dtype)


# In preference order: the more precise weights first.
PRECISIONS = (
    Precision("fp32-master", "fp32 weights and optimizer states, {dtype} compute (autocast)", "fp32"),
    Precision("low-weights-fp32-optimizer", "{dtype} weights, fp32 optimizer states", None,
              unsupported="not supported: gaplan's optimizers keep their states in the weights' dtype (under FSDP, "
                          "fp32 weights with {dtype} compute already keep fp32 only in the shards)"),
    Precision("pure-low", "{dtype} weights, optimizer states and compute", None),
)
PRECISION_ORDER = {p.name: i for i, p in enumerate(PRECISIONS)}


@dataclass(frozen=True)
class Layout:
    """One way to train: the machinery and the precision, as workload settings."""

    machinery: str  # one of MACHINERY
    precision: str  # a Precision name
    parallel: str
    grad_checkpointing: bool
    cpu_offload: bool
    weights_dtype: str
    dtype: str
    grad_sync: str = "last"

    @property
    def label(self) -> str:
        sync = ", grad-sync every" if self.parallel == "fsdp" and self.grad_sync == "every" else ""
        return f"{MACHINERY_LABELS[self.machinery]}{sync}"

    def to_dict(self) -> dict:
        return asdict(self) | {"label": self.label}


@dataclass
class LayoutResult:
    """What the estimate said of one layout.

    ``fits`` is None for a layout that was not estimated (``note`` says why: unsupported, needs two ranks).
    ``micro_batch``/``grad_accum_steps`` are the plan's split at ``max_micro_batch`` (B*) when it fits: its largest
    micro-batch and its micro-steps; ``peak_bytes`` is the peak at that micro-batch (what the plan runs at),
    ``edge_peak_bytes`` the peak at B*.
    """

    layout: Layout
    precision_label: str
    fits: bool | None
    peak_bytes: int | None = None  # per rank at the plan's micro-batch (the traced step at B* when that is it)
    edge_peak_bytes: int | None = None  # per rank at B* (the same as peak_bytes when the plan runs at B*)
    max_micro_batch: int | None = None
    micro_batch: int | None = None
    grad_accum_steps: int | None = None
    world_size: int = 1
    needed_bytes: int | None = None  # when it does not fit: the peak at micro-batch 1 (or before any activation)
    samples_per_s: float | None = None  # measured, when the layout was timed
    note: str = ""
    command: str | None = None
    check_command: str | None = None  # the gaplan probe command that checks this layout on the hardware
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["layout"] = self.layout.to_dict()
        return data


def layouts_for(world_size: int, dtype: str = "bf16", machinery: Sequence[str] = MACHINERY,
                device_kind: str = "cuda") -> list[tuple[Layout, Precision, str]]:
    """Every (layout, precision, note) to consider, in :data:`MACHINERY` then :data:`PRECISIONS` order.

    A non-empty note says why the layout is not estimated: FSDP needs two ranks or more, CPU offload a GPU to offload
    from, and the precision choices gaplan does not train are listed with the reason, so the table says what was
    left out and why.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise OptionError(f"world_size must be a positive integer (got {world_size})", "world_size")
    if dtype not in ("fp32", "bf16", "fp16"):
        raise GaplanError(f"unknown dtype {dtype!r}; choose one of fp32, bf16, fp16")
    unknown = [m for m in machinery if m not in MACHINERY]
    if unknown or not machinery:
        raise GaplanError(f"unknown layout {unknown[0] if unknown else ''!r}; choose from {', '.join(MACHINERY)}")
    out: list[tuple[Layout, Precision, str]] = []
    for name in dict.fromkeys(machinery):
        for precision in PRECISIONS:
            weights = precision.weights_dtype or dtype
            note = ""
            if dtype == "fp32" and precision.name != "fp32-master":  # before unsupported: at fp32 it is fp32-master
                note = "the same as fp32 weights with --dtype fp32"
            elif precision.unsupported:
                note = precision.unsupported.format(dtype=dtype)
            elif name != "ddp" and world_size < 2:
                note = "needs --world-size 2 or more (FSDP shards over ranks)"
            elif name == "fsdp+offload" and device_kind == "cpu":  # gaplan train refuses --cpu-offload there
                note = "not on --device cpu: the shards and optimizer states are on the CPU already"
            elif weights == "fp16" and dtype == "fp16":
                note = ("not supported: fp16 weights cannot train with fp16 compute (the loss scaler needs fp32 or "
                        "bf16 weights)")
            layout = Layout(machinery=name, precision=precision.name, parallel="ddp" if name == "ddp" else "fsdp",
                            grad_checkpointing=name == "fsdp+ckpt", cpu_offload=name == "fsdp+offload",
                            weights_dtype=weights, dtype=dtype)
            out.append((layout, precision, note))
    return out


def sort_key(result: LayoutResult) -> tuple:
    """Better first: timed and fastest; else the fewest accumulation steps (the largest usable micro-batch); then
    the finer precision, the least machinery, the least gradient traffic."""
    timed = result.samples_per_s is not None
    return (
        0 if result.fits else 1,
        0 if timed else 1,
        -(result.samples_per_s or 0.0),
        result.grad_accum_steps if result.grad_accum_steps is not None else float("inf"),
        -(result.micro_batch or 0),
        PRECISION_ORDER.get(result.layout.precision, len(PRECISION_ORDER)),
        MACHINERY.index(result.layout.machinery),
        0 if result.layout.grad_sync == "last" else 1,
    )


def rank(results: Iterable[LayoutResult]) -> list[LayoutResult]:
    """The results, best first (:func:`sort_key`); layouts that do not fit or were not estimated last."""
    return sorted(results, key=sort_key)


def pick(results: Iterable[LayoutResult]) -> LayoutResult | None:
    """The layout to train with, or None when none fits."""
    ranked = rank(results)
    return ranked[0] if ranked and ranked[0].fits else None


def split_sizes(effective_batch: int, world_size: int, grad_accum_steps: int) -> tuple[int, ...]:
    """One rank's micro-batch sizes, largest first: its share ``E / W`` over the steps, as ``make_plan`` splits it."""
    from gaplan.plan.split import split_evenly

    return split_evenly(effective_batch // world_size, grad_accum_steps)


def format_split(sizes: Sequence[int], world_size: int) -> str:
    """The split as arithmetic that gives the effective batch: ``32 x 2 x 8`` (micro-batch x steps x ranks) when even,
    else each rank's micro-batch sizes times the ranks: ``22,21,21 x 8``, or ``(3 x 20 + 2 x 2) x 8`` past
    :data:`gaplan.plan.split.MAX_LISTED_SIZES` steps (:func:`gaplan.plan.split.split_text`)."""
    from gaplan.plan.split import MAX_LISTED_SIZES, split_text

    text = split_text(sizes)
    return f"({text}) x {world_size}" if len(set(sizes)) > 1 and len(sizes) > MAX_LISTED_SIZES else \
        f"{text} x {world_size}"


def edge_peak(result: LayoutResult) -> int | None:
    """The peak at B*: the estimate's, or for a measured layout (``plan --measure``, whose B* is the probe's) the
    timed peak when the plan ran at B*, else None (the estimate's figure was for another B*)."""
    if result.extra.get("measured"):
        return result.peak_bytes if result.micro_batch == result.max_micro_batch else None
    return result.edge_peak_bytes


NEAR_LIMIT = 0.05  # an estimated peak within this fraction of the usable memory gets a caveat


def near_limit(result: LayoutResult, usable_bytes: int) -> bool:
    """True when an estimated (not measured) layout that fits peaks within :data:`NEAR_LIMIT` of the usable memory:
    the estimate's own error is of that order, so the pick may not fit on the card."""
    return bool(result.fits and not result.extra.get("measured") and result.peak_bytes
                and result.peak_bytes >= (1 - NEAR_LIMIT) * usable_bytes)


def size_flag(count: int) -> str:
    """A byte count as ``--memory-limit`` reads it: ``40GiB``, ``160MiB``, else the bytes."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if count % size == 0:
            return f"{count // size}{unit}"
    return str(count)


def probe_command(workload: dict, effective_batch: int, world_size: int, *, device_kind: str = "cuda",
                  target: str | None = None, memory_limit: int | None = None, margin: float = 0.0) -> str:
    """The ``gaplan probe`` command that measures ``workload``'s exact B* and plan on the hardware (one
    process per rank on this machine for FSDP; the one rank's probe for DDP)."""
    words = ["gaplan", "probe", *workload_flags(workload)]
    if device_kind == "cpu":
        words += ["--device", "cpu"]
    if target:
        words += ["--target", target]
    if memory_limit is not None:
        words += ["--memory-limit", size_flag(memory_limit)]
    words += ["--world-size", str(world_size), "--effective-batch", str(effective_batch)]
    if margin:
        words += ["--margin", f"{margin:g}"]
    return " ".join(shlex.quote(word) for word in words)


def plan_split(effective_batch: int, world_size: int, micro_batch_cap: int) -> tuple[int, int]:
    """``(micro_batch, grad_accum_steps)`` of :func:`gaplan.plan.split.make_plan` for a cap (no torch, no plan object)."""
    from gaplan.plan.split import make_plan

    plan = make_plan(effective_batch, micro_batch_cap, world_size)
    return plan.micro_batch, plan.grad_accum_steps


# --- the launch command -------------------------------------------------------------------------------------------

_DEFAULTS = {"task": None, "seq_len": None, "target_len": None, "attention": None, "dtype": "fp32", "optimizer": "adamw",
             "lr": None, "weights_dtype": "fp32", "parallel": "ddp", "grad_sync": "last", "init": "auto", "lora_r": 16,
             "lora_alpha": 32.0, "lora_dropout": 0.05, "lora_targets": None, "quantize": None, "loss": "plain"}
_FLAGS = (("task", "--task"), ("seq_len", "--seq-len"), ("target_len", "--target-len"), ("attention", "--attention"),
          ("dtype", "--dtype"), ("weights_dtype", "--weights-dtype"), ("optimizer", "--optimizer"), ("lr", "--lr"),
          ("loss", "--loss"),
          ("init", "--init"), ("parallel", "--parallel"), ("grad_sync", "--grad-sync"))
_LORA_FLAGS = (("lora_r", "--lora-r"), ("lora_alpha", "--lora-alpha"), ("lora_dropout", "--lora-dropout"),
               ("lora_targets", "--lora-targets"))


def workload_flags(workload: dict) -> list[str]:
    """``gaplan train`` options that rebuild a workload (a :meth:`WorkloadSpec.to_dict`), defaults left out."""
    words = ["--model", str(workload["model"])]
    for key, flag in _FLAGS:
        value = workload.get(key)
        if value is not None and value != _DEFAULTS.get(key):
            words += [flag, str(value)]
    if workload.get("lora"):
        words.append("--lora")
        for key, flag in _LORA_FLAGS:
            value = workload.get(key)
            if value is not None and value != _DEFAULTS.get(key):
                words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    if workload.get("quantize"):  # QLoRA's, or a module:function model's frozen linear layers
        words += ["--quantize", str(workload["quantize"])]
    if workload.get("grad_checkpointing"):  # True, or the blocks chosen (every:K, layers:N)
        words += ["--grad-checkpointing", str(parse_checkpointing(workload["grad_checkpointing"]))]
    if workload.get("compile"):
        words.append("--compile")
    if workload.get("cpu_offload"):
        words.append("--cpu-offload")
    if workload.get("offload_activations"):
        words.append("--offload-activations")
    if workload.get("trust_remote_code"):
        words.append("--trust-remote-code")
    return words


def check_nodes(world_size: int, nodes: int) -> int:
    """Processes per node: the world size split evenly over ``nodes``."""
    for name, value in (("world_size", world_size), ("nodes", nodes)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise OptionError(f"{name} must be a positive integer (got {value})", name)
    if world_size % nodes:
        raise OptionError(f"world_size {world_size} does not split evenly over nodes {nodes}", "world_size", "nodes")
    return world_size // nodes


def launch_command(workload: dict, micro_batch: int, effective_batch: int, world_size: int = 1, nodes: int = 1,
                   device: str | None = None) -> str:
    """The command that trains ``workload`` with this split: ``torchrun ... -m gaplan train ...`` on several
    ranks (run on every node, with ``$NODE_RANK`` and ``$MASTER_ADDR`` set, when ``nodes`` > 1), else ``gaplan train``.
    """
    per_node = check_nodes(world_size, nodes)
    train = [*workload_flags(workload)]
    if device:
        train += ["--device", device]
    train += ["--micro-batch", str(micro_batch), "--effective-batch", str(effective_batch)]
    quoted = " ".join(shlex.quote(word) for word in train)
    if world_size == 1:
        return f"gaplan train {quoted}"
    head = "torchrun"
    if nodes > 1:
        head += (f" --nnodes {nodes} --node-rank $NODE_RANK --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500")
    return f"{head} --nproc-per-node {per_node} -m gaplan train {quoted}"


DEFAULT_GPUS_PER_NODE = 8  # an HGX / DGX node


def resolve_world(world_size: int | None, nodes: int | None, gpus_per_node: int | None) -> tuple[int, int]:
    """``(world_size, nodes)`` from what was given: ``--world-size`` alone, or ``--nodes`` x ``--gpus-per-node``
    (8 per node when only ``--nodes`` is given), or all three when they agree."""
    for name, value in (("world_size", world_size), ("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise OptionError(f"{name} must be a positive integer (got {value})", name)
    nodes = nodes or 1
    if world_size is None:
        per_node = gpus_per_node or (DEFAULT_GPUS_PER_NODE if nodes > 1 else 1)
        return nodes * per_node, nodes
    if gpus_per_node is not None and world_size != nodes * gpus_per_node:
        raise OptionError(f"world_size {world_size} is not nodes {nodes} x gpus_per_node {gpus_per_node}",
                          "world_size", "nodes", "gpus_per_node")
    check_nodes(world_size, nodes)
    return world_size, nodes


@dataclass
class LayoutComparison:
    """Every layout estimated for one model, budget, world size and effective batch, and the one picked."""

    model: str
    param_count: int | None
    seq_len: int | None
    device_kind: str
    target: str | None
    memory_limit_bytes: int
    usable_bytes: int  # per rank
    world_size: int
    nodes: int
    effective_batch: int
    dtype: str
    results: list[LayoutResult]
    seconds: float = 0.0
    measured_on: str | None = None  # the device the fitting layouts were probed and timed on (plan --measure)
    margin: float = 0.0  # fraction of the limit kept free (plan --margin): usable_bytes is what is left of it

    def sizes(self, result: LayoutResult) -> tuple[int, ...]:
        """One rank's micro-batch sizes in ``result``'s split (empty when it does not fit)."""
        if not result.fits or not result.grad_accum_steps:
            return ()
        return split_sizes(self.effective_batch, result.world_size, result.grad_accum_steps)

    def split(self, result: LayoutResult) -> str:
        """``result``'s split as :func:`format_split` writes it, ``-`` when it does not fit."""
        sizes = self.sizes(result)
        return format_split(sizes, result.world_size) if sizes else "-"

    @property
    def ranked(self) -> list[LayoutResult]:
        return rank(self.results)

    @property
    def pick(self) -> LayoutResult | None:
        return pick(self.results)

    def to_dict(self) -> dict:
        chosen = self.pick
        data = {k: v for k, v in asdict(self).items() if k != "results"}
        data["results"] = [self._result_dict(r) for r in self.ranked]
        data["pick"] = self._result_dict(chosen) if chosen is not None else None
        data["pick_near_limit"] = chosen is not None and near_limit(chosen, self.usable_bytes)
        data["command"] = chosen.command if chosen is not None else None
        data["seconds"] = round(self.seconds, 3)
        return data

    def _result_dict(self, result: LayoutResult) -> dict:
        return result.to_dict() | {"split": self.split(result), "micro_batch_sizes": list(self.sizes(result)),
                                   "edge_peak_bytes": edge_peak(result)}
