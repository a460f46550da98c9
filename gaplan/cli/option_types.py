"""The click types of gaplan's typed options: each parses its text once, at the edge, into the value the library
holds (a :class:`Checkpointing` or ``auto``, bytes, a batch range, micro-batch sizes, a batch schedule). The same
type reads a config file's value (``--config``), and a value already typed passes through (what ``--print-config``
wrote, a default).

A bad value raises the parser's own :class:`OptionError`, named by its field: the command line shows it as one line
naming the flag (exit 2), a config file as one line naming the key. No torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from gaplan.core.checkpointing import parse_checkpointing_choice
from gaplan.core.lora_targets import parse_lora_targets
from gaplan.core.loss_choice import parse_loss
from gaplan.core.outputs import absolute_if_here
from gaplan.core.units import parse_bytes
from gaplan.data.source import tokenizer_path
from gaplan.plan.schedule import parse_schedule
from gaplan.workflows.parse_options import parse_batch_range, parse_sizes
from gaplan.workload.spec import model_path


class Parsed(click.ParamType):
    """A click type that is one parser: ``parse(value)`` gives the typed value or raises its one-line error."""

    def __init__(self, name: str, parse: Callable[[Any], Any], holds: type | None = None) -> None:
        self.name = name
        self._parse = parse
        self.holds = holds  # the one kind of value a config file may give it (None: the parser reads several)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return self._parse(value)


CHECKPOINTING = Parsed("checkpointing", parse_checkpointing_choice)  # Checkpointing, or "auto"
BYTES = Parsed("size", parse_bytes)  # bytes (an int) from 2GiB, 800MB, 1073741824
BATCH_RANGE = Parsed("range", parse_batch_range)  # (low, high) from LOW:HIGH
SIZES = Parsed("sizes", parse_sizes)  # micro-batch sizes from B1,B2,...
SCHEDULE = Parsed("schedule", parse_schedule)  # a ScheduleChoice from fixed, adaptive, warmup:STEPS
LOSS = Parsed("loss", parse_loss)  # a LossChoice from plain, chunked, chunked:TOKENS
LORA_TARGETS = Parsed("modules", parse_lora_targets)  # a LoraTargets from all-linear, M1,M2
LOCAL_PATH = Parsed("path", absolute_if_here, holds=str)  # --data: absolute when it names something here
TOKENIZER = Parsed("tokenizer", tokenizer_path, holds=str)  # --tokenizer: a folder made absolute, bytes its own
MODEL = Parsed("model", model_path, holds=str)  # --model: a model folder here made absolute, a preset's name its own


# A new typed option's click type goes here too.
TYPES = (CHECKPOINTING, BYTES, BATCH_RANGE, SIZES, SCHEDULE, LOSS, LORA_TARGETS, LOCAL_PATH, TOKENIZER, MODEL)


def click_type(parse: Callable[[Any], Any]) -> Parsed:
    """The click type of a field's parser (``option(parse=...)``): the one of :data:`TYPES` that holds it, so a typed
    option has one type on every command."""
    return next(kind for kind in TYPES if kind._parse is parse)
