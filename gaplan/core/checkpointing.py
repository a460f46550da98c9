"""Which transformer blocks recompute their activations in backward: off, on, every:K, layers:N or ops. No torch.

A checkpointed block keeps only its input through the forward and runs again in backward; the others keep every
activation they save. ``every:K`` checkpoints blocks 0, K, 2K, ... (``every:1`` is ``on``, as transformers'
``every_n_layers`` counts them); ``layers:N`` the first N blocks, in the model's module order (a T5's encoder
blocks come before its decoder's). ``ops`` checkpoints every block at the op level, as torchtitan's selective
activation checkpointing does (:mod:`gaplan.workload.op_checkpointing`): a block keeps its matmuls' outputs (all but
every second one) and its attention's, and recomputes the rest in backward.

One parser, :func:`parse_checkpointing`, reads the text a user gives (the command line's and a config file's value,
at the edge) and the forms a saved file holds (a bool: what plan files and probe caches wrote before every:K; None:
off); past the edge the value is a :class:`Checkpointing`, or :data:`AUTO` where a probe may decide it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gaplan.core.options import OptionError

KINDS = ("off", "on", "every", "layers", "ops")
AUTO = "auto"  # --grad-checkpointing auto: the probe times both and keeps the faster (probe and bench only)
CHECKPOINTING_CHOICES = "off|on|every:K|layers:N|ops"
_FIX = ("choose off, on, every:K (every K-th block, K >= 1), layers:N (the first N blocks, N >= 1) or ops (every block "
        "at the op level: matmul and attention outputs kept)")


@dataclass(frozen=True)
class Checkpointing:
    """Activation checkpointing per block: ``kind`` off | on | every | layers, ``count`` its K or N (0 for off/on)."""

    kind: str = "off"
    count: int = 0

    def __post_init__(self) -> None:
        counted = self.kind in ("every", "layers")
        if self.kind not in KINDS or not isinstance(self.count, int) or isinstance(self.count, bool) or (
                counted and self.count < 1) or (not counted and self.count != 0):
            raise OptionError(f"grad_checkpointing {self.kind}:{self.count} is not valid; {_FIX}", "grad_checkpointing")
        if self.kind == "every" and self.count == 1:  # every block: the same as on, one spelling
            object.__setattr__(self, "kind", "on")
            object.__setattr__(self, "count", 0)

    def __str__(self) -> str:
        return f"{self.kind}:{self.count}" if self.count else self.kind

    @property
    def enabled(self) -> bool:
        """Whether any block is checkpointed."""
        return self.kind != "off"

    def __bool__(self) -> bool:  # ``if spec.grad_checkpointing:`` reads as "is any block checkpointed"
        return self.enabled

    @property
    def selective(self) -> bool:
        """Whether only some blocks are (every:K with K > 1, layers:N)."""
        return self.count > 0

    @property
    def op_level(self) -> bool:
        """Whether each block keeps some of its ops' outputs and recomputes the others (``ops``)."""
        return self.kind == "ops"

    def spec_value(self) -> bool | str:
        """What a plan file holds: False, True, or ``every:K``/``layers:N``/``ops``.

        off and on stay bools, so a plan file or cache written before every:K reads the same as one written now.
        """
        return str(self) if self.selective or self.op_level else self.enabled

    def blocks(self, total: int) -> list[bool]:
        """For each of ``total`` blocks, whether it is checkpointed; a one-line error when K or N exceeds ``total``."""
        if self.selective and self.count > total:
            raise OptionError(f"grad_checkpointing {self} asks for more blocks than the model's {total}; give "
                              f"{self.kind}:{total} at most, or on", "grad_checkpointing")
        if self.kind == "every":
            return [i % self.count == 0 for i in range(total)]
        if self.kind == "layers":
            return [i < self.count for i in range(total)]
        return [self.enabled] * total

    def checkpointed(self, total: int) -> int:
        """How many of ``total`` blocks are checkpointed."""
        return sum(self.blocks(total))


OFF = Checkpointing()
ON = Checkpointing("on")


def parse_checkpointing(value: object) -> Checkpointing:
    """``value`` as a :class:`Checkpointing`: a string (off, on, every:K, layers:N), a bool, None (off), or one already.

    Raises:
        OptionError: anything else, naming ``grad_checkpointing`` (``--grad-checkpointing`` on the command line).
    """
    if isinstance(value, Checkpointing):
        return value
    if value is None or value is False:
        return OFF
    if value is True:
        return ON
    if isinstance(value, str):
        kind, colon, count = value.strip().lower().partition(":")
        if not colon and kind in ("off", "on", "ops"):
            return Checkpointing(kind)
        if colon and kind in ("every", "layers") and count.isdigit() and int(count) >= 1:
            return Checkpointing(kind, int(count))
    raise OptionError(f"grad_checkpointing {value!r} is not valid; {_FIX}", "grad_checkpointing")


def saved_choice(choice: Checkpointing | str | None) -> bool | str | None:
    """A choice as a run's saved options hold it (``train.json``): a plan file's form, or ``auto``, or None; what
    :func:`parse_checkpointing_choice` reads back."""
    return choice.spec_value() if isinstance(choice, Checkpointing) else choice


def parse_checkpointing_choice(value: object) -> Checkpointing | str:
    """``value`` as :func:`parse_checkpointing` reads it, or :data:`AUTO` (``"auto"``): what ``--grad-checkpointing``
    takes where a probe may decide it."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    return parse_checkpointing(value)


def check_typed(value: object, *, auto: bool = False, unset: bool = False) -> None:
    """``grad_checkpointing`` past the edge: a :class:`Checkpointing` (or :data:`AUTO` where ``auto``, None where
    ``unset``); text is refused, with how to parse it, since every parse is at the edge."""
    if isinstance(value, Checkpointing) or (auto and value == AUTO) or (unset and value is None):
        return
    others = [repr(AUTO)] * auto + ["None"] * unset
    raise OptionError(f"grad_checkpointing must be a Checkpointing{''.join(', ' + o for o in others)}, e.g. "
                      f"parse_checkpointing('on') (got {value!r})", "grad_checkpointing")


def check_choice(choice: object, plan_file: str | None) -> None:
    """A run's ``grad_checkpointing`` as given: None (not given), a :class:`Checkpointing`, or :data:`AUTO` with the
    ``plan_file`` of the probe that decided it (gaplan probe times both; a run does not)."""
    check_typed(choice, auto=True, unset=True)
    if choice == AUTO and plan_file is None:
        raise OptionError("grad_checkpointing auto is decided by gaplan probe; give its plan_file, or on/off",
                          "grad_checkpointing", "plan_file")
