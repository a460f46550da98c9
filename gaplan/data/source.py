"""Where the training data comes from and how it is read: ``--data`` and its reading options. No torch."""

from __future__ import annotations

from dataclasses import dataclass

from gaplan.core.options import OptionError, option

LONG_SAMPLE_CHOICES = ("split", "truncate")


@dataclass(frozen=True)
class DataSource:
    """``--data`` (``path``; None: the built-in synthetic corpus) and how it is read. A resumed run keeps all of it:
    a step's samples depend on every field."""

    path: str | None = option(None, resume="fixed", name="data")
    text_field: str = option("text", resume="fixed")
    label_field: str = option("label", resume="fixed")
    target_field: str = option("target", resume="fixed")  # seq2seq-lm: the target text's field
    long_samples: str = option("split", resume="fixed")  # or "truncate"
    tokenizer: str | None = option(None, resume="fixed")  # None: the model folder's own; "bytes"; or a folder

    def __post_init__(self) -> None:
        if self.long_samples not in LONG_SAMPLE_CHOICES:
            raise OptionError(f"long_samples must be one of {', '.join(LONG_SAMPLE_CHOICES)} "
                              f"(got {self.long_samples!r})", "long_samples")
