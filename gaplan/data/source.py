"""Where the training data comes from and how it is read: ``--data`` and its reading options. No torch."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import ClassVar

from gaplan.core.options import DATA, OptionError, flag, option, option_name
from gaplan.core.outputs import absolute_if_here
from gaplan.data.tasks.component import LABEL_FIELD, TARGET_FIELD
from gaplan.data.tasks.registry import task_component, tasks_taking
from gaplan.data.tokenizer import BYTES

LONG_SAMPLE_CHOICES = ("split", "truncate")
# What a field left out (None) reads as.
READ_DEFAULTS = {"text_field": "text", "label_field": "label", "target_field": "target", "long_samples": "split"}


def tokenizer_path(value: str | None) -> str | None:
    """``--tokenizer`` as a run records it: a folder here made absolute; ``bytes`` is byte tokens, a folder of that
    name or not."""
    return value if value == BYTES else absolute_if_here(value)


def reads_as(name: str, value: object) -> object:
    """What a data field reads as: its default's value for None (a field outside :data:`READ_DEFAULTS` as given); a
    path as a run records it today (a checkpoint of an older gaplan kept ``data.txt`` as given)."""
    if name in ("path", "tokenizer") and isinstance(value, str):
        return tokenizer_path(value) if name == "tokenizer" else absolute_if_here(value)
    return READ_DEFAULTS.get(name, value) if value is None else value

WITH_DATA = "with `--data`"  # where the options that say how data is read apply


@dataclass(frozen=True)
class DataSource:
    """``--data`` (``path``; None: the built-in synthetic corpus) and how it is read. A resumed run keeps all of it:
    a step's samples depend on every field."""

    CONFIG_TABLE: ClassVar[str] = "data"  # its options' table in a config file: [COMMAND.data]

    # The fields default to None, "not given", so one given where it does not apply is refused (check_applies);
    # text_name, label_name and target_name are the names read. Each field's help is its command-line option's.
    path: str | None = option(None, resume="fixed", name="data", section=DATA, parse=absolute_if_here, metavar="PATH", help=(
        "Text file (a sample a line), JSONL, a datasets folder (save_to_disk) or a .parquet file."))
    text_field: str | None = option(None, resume="fixed", section=DATA, applies=WITH_DATA, help=(
        "The text field of JSONL, datasets or parquet data.  [default: text]"))
    label_field: str | None = option(None, resume="fixed", section=DATA,
                                     applies=WITH_DATA + ", task `classification`", help=(
        "The label field (classification only).  [default: label]"))
    target_field: str | None = option(None, resume="fixed", section=DATA,
                                      applies=WITH_DATA + ", task `seq2seq-lm`", help=(
        "The target text's field (seq2seq-lm only; --text-field is the source's).  [default: target]"))
    long_samples: str | None = option(None, resume="fixed", section=DATA, choices=LONG_SAMPLE_CHOICES, applies=WITH_DATA, help=(
        "Samples longer than --seq-len: split into seq-len chunks, or truncate them.  [default: split]"))
    tokenizer: str | None = option(None, resume="fixed", section=DATA, parse=tokenizer_path, metavar="bytes|DIR",
                                   applies=WITH_DATA, help=(
        "Tokenizer for --data: the model folder's own by default; 'bytes' for byte tokens; or a folder."))

    @property
    def text_name(self) -> str:
        return self.text_field or READ_DEFAULTS["text_field"]

    @property
    def label_name(self) -> str:
        return self.label_field or READ_DEFAULTS["label_field"]

    @property
    def target_name(self) -> str:
        return self.target_field or READ_DEFAULTS["target_field"]

    @property
    def long_sample_rule(self) -> str:
        return self.long_samples or READ_DEFAULTS["long_samples"]

    def check_applies(self, task: str | None) -> None:
        """Refuse, in one line, a field given where it does not apply: any without ``data``; the label's outside
        classification; the target's outside seq2seq-lm (``task``: the model's, known once it is read)."""
        given = [name for name in ("text_field", "label_field", "target_field", "long_samples", "tokenizer")
                 if getattr(self, name) is not None]
        if self.path is None and given:
            raise OptionError(f"{given[0]} applies to data (it says how data is read): give data, or leave it out",
                              given[0], "data")
        for name in (LABEL_FIELD, TARGET_FIELD):
            if getattr(self, name) is not None and task is not None and name not in task_component(task).options:
                raise OptionError(f"{name} applies to task {' or '.join(tasks_taking(name))}, and this model's task "
                                  f"is {task}", name, "task")

    def flags(self) -> list[str]:
        """The command-line options that give this source again (``--data PATH --tokenizer bytes``), those not
        given left out."""
        return [word for f in fields(self) if getattr(self, f.name) is not None
                for word in (flag(option_name(f)), str(getattr(self, f.name)))]

    def without_defaults(self) -> DataSource:
        """The same reading with a field at its default's own value as not given: an older ``train.json`` holds
        every field's value for every run (resume reads it so, so its run is not refused a field it never took)."""
        return replace(self, **{name: None for name, default in READ_DEFAULTS.items() if getattr(self, name) == default})

    def __post_init__(self) -> None:
        # What a run records, read from any directory: the Python API's edge and a saved run's text.
        object.__setattr__(self, "path", absolute_if_here(self.path))
        object.__setattr__(self, "tokenizer", tokenizer_path(self.tokenizer))
        # A field given at its default's own value is still given ("--target-field target" on a causal LM is one
        # line, not ignored): only the resume of an older run takes such values as not given (without_defaults).
        if self.long_samples is not None and self.long_samples not in LONG_SAMPLE_CHOICES:
            raise OptionError(f"long_samples must be one of {', '.join(LONG_SAMPLE_CHOICES)} "
                              f"(got {self.long_samples!r})", "long_samples")
