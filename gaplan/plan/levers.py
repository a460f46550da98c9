"""The memory levers one device can pull, and which combinations of them ``gaplan plan`` compares. No torch.

A :class:`Lever` is one workload setting changed from the user's (``--optimizer``, ``--loss``,
``--grad-checkpointing``, ``--offload-activations``): adding a lever value is one line of :data:`LEVERS`. The rows compared
(:func:`lever_rows`) are not the cartesian product of the levers, which grows as the product of their values
and is mostly rows no one would pick. They are:

* the base: the user's workload as given;
* each lever alone, so the table says what each one buys in B* and costs in time;
* the memory levers together (one value of each kind: the chunked loss, checkpointing, offloading): what fits the
  largest micro-batch without changing the optimizer;
* each other optimizer named in ``--levers`` with those memory levers together: an optimizer swap is a change of
  training semantics, so it is compared only when asked, and then at its most memory-saving.

A lever that does nothing on a CPU (``offload``: the host is the device) is left out of a CPU's table, with the
reason. ``compile`` is compared only when ``--levers`` names it, and alone: its row compiles the model for the trace
(about a minute on 2 cores), and it joins no "together" row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gaplan.core.checkpointing import OFF, ON, Checkpointing
from gaplan.core.errors import GaplanError
from gaplan.core.loss_choice import PLAIN, LossChoice

OPTIMIZER_SWAP = ("changes the optimizer: the loss curve is not the {base} one (other update rule and states; "
                  "retune the learning rate)")


@dataclass(frozen=True)
class Lever:
    """One setting of the workload, by the :class:`~gaplan.workload.spec.WorkloadSpec` field it sets.

    ``recompute_blocks`` is the fraction of the transformer blocks whose forward runs again in backward
    (checkpointing); ``recompute_head`` is 1 when the LM head's forward runs again (the chunked loss).
    ``cuda_only`` says why it cannot run on the CPU (it is then estimated, never measured there); ``gpu_only``
    why it does nothing there (it is then not compared for a CPU).
    """

    name: str  # as --levers names it
    kind: str  # optimizer | loss | checkpointing | offload | compile: one lever of each kind in a row
    field: str | None
    value: object
    tradeoff: str
    recompute_blocks: float = 0.0
    recompute_head: float = 0.0
    cuda_only: str = ""
    gpu_only: str = ""


# In the order of the table; within a kind the most memory-saving first (the one "together" rows take).
LEVERS = (
    Lever("adamw", "optimizer", "optimizer", "adamw", OPTIMIZER_SWAP),
    Lever("adamw-fused", "optimizer", "optimizer", "adamw-fused",
          "the same AdamW update and states in one fused kernel per step (torch.optim.AdamW(fused=True)): no "
          "step temporaries"),
    Lever("adamw-forloop", "optimizer", "optimizer", "adamw-forloop",
          "the same AdamW update and states, one parameter at a time (foreach=False): temporaries of one "
          "parameter's size (up to three copies of the largest), more kernel launches"),
    Lever("adamw-8bit", "optimizer", "optimizer", "adamw-8bit",
          OPTIMIZER_SWAP + "; 8-bit moments, block-quantized (bitsandbytes)"),
    Lever("paged-adamw-8bit", "optimizer", "optimizer", "paged-adamw-8bit",
          OPTIMIZER_SWAP + "; 8-bit moments in CUDA unified memory, paged to the host under pressure",
          cuda_only="bitsandbytes pages its states in CUDA unified memory"),
    Lever("adafactor", "optimizer", "optimizer", "adafactor",
          OPTIMIZER_SWAP + "; factored second moment, no first moment"),
    Lever("lion", "optimizer", "optimizer", "lion", OPTIMIZER_SWAP + "; sign updates (use a 3-10x smaller lr)"),
    Lever("sgd", "optimizer", "optimizer", "sgd", OPTIMIZER_SWAP + "; no adaptive step"),
    Lever("chunked", "loss", "loss", "chunked",
          "the LM head's forward runs again in backward, a chunk of positions at a time", recompute_head=1.0),
    Lever("ckpt", "checkpointing", "grad_checkpointing", ON,
          "every block's forward runs again in backward", recompute_blocks=1.0),
    Lever("ops", "checkpointing", "grad_checkpointing", Checkpointing("ops"),
          "every block recomputes in backward all but its matmul outputs (every second one recomputed too) and its "
          "attention outputs (op-level, torchtitan's policy)", recompute_blocks=0.5),
    Lever("every:2", "checkpointing", "grad_checkpointing", Checkpointing("every", 2),
          "every other block's forward runs again in backward", recompute_blocks=0.5),
    Lever("offload", "offload", "offload_activations", True,
          "every tensor saved for backward crosses PCIe twice, to pinned host memory in forward and back in "
          "backward (torch's save_on_cpu; host memory holds one micro-batch's activations; the copies are in the "
          "modelled time, not overlapped with compute)",
          gpu_only="on a CPU the host memory is the device's: nothing moves"),
    Lever("compile", "compile", "compile", True,
          "torch.compile (inductor): what its kernels save for backward is traced as inductor partitions the step; "
          "the modelled time is the eager kernels' (its speed is measured with --measure), and each process compiles "
          "first"),
)
BY_NAME = {lever.name: lever for lever in LEVERS}
OPTIMIZER_LEVERS = tuple(lever.name for lever in LEVERS if lever.kind == "optimizer")
# Without --levers: every lever but the optimizers (the user's --optimizer is kept: a swap changes the training) and
# compile (its trace compiles the model: a minute a row).
DEFAULT_LEVERS = tuple(lever.name for lever in LEVERS if lever.kind not in ("optimizer", "compile"))


def parse_levers(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """``--levers a,b,c`` as lever names in :data:`LEVERS` order; ``all`` is every lever, ``optimizers`` every
    optimizer, ``none`` no lever (no lever table); None or empty is :data:`DEFAULT_LEVERS`.

    Raises:
        GaplanError: an unknown name, in one line naming the flag and the choices.
    """
    if text is None:
        return DEFAULT_LEVERS
    parts = [p.strip() for p in (text.split(",") if isinstance(text, str) else text) if p.strip()]
    if not parts:
        return DEFAULT_LEVERS
    if parts == ["none"]:
        return ()
    names: set[str] = set()
    for part in parts:
        if part == "all":
            names.update(BY_NAME)
        elif part == "optimizers":
            names.update(OPTIMIZER_LEVERS)
        elif part in BY_NAME:
            names.add(part)
        else:
            raise GaplanError(f"--levers: unknown lever {part!r}; choose from {', '.join(BY_NAME)} (or all, "
                              "optimizers, none)")
    return tuple(lever.name for lever in LEVERS if lever.name in names)


@dataclass(frozen=True)
class Base:
    """The user's workload, as far as the levers read it."""

    optimizer: str = "adamw"
    loss: LossChoice = PLAIN
    grad_checkpointing: Checkpointing = OFF
    offload_activations: bool = False
    compile: bool = False

    def has(self, lever: Lever) -> bool:
        """True when the workload already has this lever's setting (so the lever adds nothing)."""
        if lever.field == "optimizer":
            return self.optimizer == lever.value
        if lever.field == "loss":
            return self.loss.kind == lever.value
        if lever.field == "grad_checkpointing":
            return self.grad_checkpointing in (ON, lever.value)
        return bool(getattr(self, lever.field))  # offloading, compile: on or off


def lever_rows(selected: Iterable[str], base: Base = Base(), device_kind: str = "cuda") -> list[tuple[str, ...]]:
    """The rows to compare, each the names of the levers applied to ``base`` (``()`` is the base), in order: the
    base, each lever alone, the memory levers together, each other optimizer with them (see the module); for
    ``device_kind`` ``cpu``, without the levers that do nothing there."""
    levers = [BY_NAME[name] for name in selected if not _why_not(BY_NAME[name], base, device_kind)]
    rows: list[tuple[str, ...]] = [()]
    rows += [(lever.name,) for lever in levers]
    memory: dict[str, str] = {}
    for lever in levers:
        if lever.kind not in ("optimizer", "compile"):  # compile alone: each row of it compiles the model
            memory.setdefault(lever.kind, lever.name)
    together = tuple(memory.values())
    if len(together) > 1:
        rows.append(together)
    if together:
        rows += [(lever.name, *together) for lever in levers if lever.kind == "optimizer"]
    return list(dict.fromkeys(rows))


def not_compared(selected: Iterable[str], base: Base = Base(), device_kind: str = "cuda") -> list[tuple[str, str]]:
    """``(lever, why)`` for each selected lever that is not in any row: already the base's, or doing
    nothing on ``device_kind``."""
    return [(name, why) for name in selected if (why := _why_not(BY_NAME[name], base, device_kind))]


def _why_not(lever: Lever, base: Base, device_kind: str) -> str:
    if base.has(lever):
        return "the workload already has it (the base row)"
    return lever.gpu_only if device_kind == "cpu" else ""


def row_settings(row: Sequence[str]) -> dict:
    """The workload fields a row sets (``{"optimizer": "lion", "loss": "chunked"}``)."""
    return {BY_NAME[name].field: BY_NAME[name].value for name in row}


def row_label(row: Sequence[str]) -> str:
    """``base``, or the levers joined by ``+``."""
    return "+".join(row) if row else "base"


def row_tradeoffs(row: Sequence[str], base: Base = Base()) -> list[str]:
    """What each lever of the row costs or changes, one sentence each."""
    return [BY_NAME[name].tradeoff.format(base=base.optimizer) for name in row]


def cuda_only(row: Sequence[str]) -> str:
    """Why the row cannot run on the CPU ("" when it can)."""
    return "; ".join(BY_NAME[name].cuda_only for name in row if BY_NAME[name].cuda_only)


def row_recompute(row: Sequence[str], base: Base = Base()) -> tuple[float, float]:
    """``(blocks, head)``: the fraction of the blocks and of the LM head whose forward runs again in backward, by the
    row's levers or the base's own settings (full checkpointing, a chunked loss)."""
    levers = [BY_NAME[name] for name in row]
    blocks = max([lever.recompute_blocks for lever in levers] + [1.0 if base.grad_checkpointing else 0.0])
    head = max([lever.recompute_head for lever in levers] + [1.0 if base.loss.chunked else 0.0])
    return blocks, head
