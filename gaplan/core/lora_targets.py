"""``--lora-targets``' value, typed: every linear layer (``all-linear``) or module names (``q_proj,v_proj``), peft's
``target_modules``. No torch.

One parser, :func:`parse_lora_targets`, reads the text (the command line's, a config file's, an adapter config's,
a saved workload's, a Python caller's); past it the value is a :class:`LoraTargets` (None: peft's own targets for the
architecture).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gaplan.core.options import OptionError

ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class LoraTargets:
    """The modules that get adapters: ``names``, or every linear layer (``all-linear``, peft's own word for it)."""

    names: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.names or not all(isinstance(name, str) and name for name in self.names):
            raise OptionError("lora_targets names no module: give all-linear or names such as q_proj,v_proj",
                              "lora_targets")
        if ALL_LINEAR in self.names and len(self.names) > 1:
            raise OptionError(f"lora_targets {','.join(self.names)}: all-linear is every linear layer, so it takes no "
                              "names beside it", "lora_targets")

    @property
    def target_modules(self) -> str | list[str]:
        """peft's ``target_modules``: ``"all-linear"`` or the names."""
        return ALL_LINEAR if self.names == (ALL_LINEAR,) else list(self.names)

    def __str__(self) -> str:  # the text it is parsed from: what plan files, caches and launch commands hold
        return ",".join(self.names)


def parse_lora_targets(value: str | Sequence[str] | LoraTargets | None) -> LoraTargets | None:
    """``all-linear`` or ``M1,M2`` (or a list of names, as an adapter config or a config file holds them) -> a
    :class:`LoraTargets` (one passes through; None stays None); a value naming no module is a one-line error."""
    if value is None or isinstance(value, LoraTargets):
        return value
    parts = value.split(",") if isinstance(value, str) else list(value)
    return LoraTargets(tuple(str(part).strip() for part in parts if str(part).strip()))
