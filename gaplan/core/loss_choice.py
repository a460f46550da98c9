"""``--loss``'s value, typed: the plain loss, or the chunked one (the LM head and cross-entropy a chunk of positions at
a time, :mod:`gaplan.workload.chunked_loss`). No torch.

One parser, :func:`parse_loss`, reads the text (``plain``, ``chunked``, ``chunked:TOKENS``: the command line's, a
config file's, a saved workload's, a Python caller's); past it the value is a :class:`LossChoice`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gaplan.core.options import OptionError

LOSS_CHOICES = "plain|chunked[:TOKENS]"
_CHOOSE = "choose plain, chunked or chunked:TOKENS (a positive number of positions a chunk, e.g. chunked:1024)"


@dataclass(frozen=True)
class LossChoice:
    """``chunk_tokens``: None for the plain loss; for the chunked one the positions a chunk, 0 for its default."""

    chunk_tokens: int | None = None

    def __post_init__(self) -> None:
        tokens = self.chunk_tokens
        if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0):
            raise OptionError(f"loss chunked:{tokens} is not valid; {_CHOOSE}", "loss")

    @property
    def chunked(self) -> bool:
        return self.chunk_tokens is not None

    @property
    def kind(self) -> str:
        """``plain`` or ``chunked`` (a lever's value)."""
        return "chunked" if self.chunked else "plain"

    def __str__(self) -> str:  # the text it is parsed from: what plan files, caches and launch commands hold
        return f"chunked:{self.chunk_tokens}" if self.chunk_tokens else self.kind


PLAIN = LossChoice()


def parse_loss(value: str | LossChoice) -> LossChoice:
    """``plain``, ``chunked`` or ``chunked:TOKENS`` -> a :class:`LossChoice` (one passes through); else a one-line
    error naming ``loss``."""
    if isinstance(value, LossChoice):
        return value
    name, colon, tokens = str(value).partition(":")
    if name == "plain" and not colon:
        return PLAIN
    if name == "chunked" and (not colon or (tokens.isdigit() and int(tokens) >= 1)):
        return LossChoice(int(tokens) if colon else 0)
    raise OptionError(f"unknown loss {value!r}; {_CHOOSE}", "loss")
