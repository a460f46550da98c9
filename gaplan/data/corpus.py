"""Corpora: samples addressed by index. A built-in learnable synthetic one, or text data tokenized.

:func:`load_corpus` reads and checks text data without touching a model (the CLI calls it before
probing): the records, the tokenizer against the model's vocabulary, the labels against
``num_labels``, and long samples split or truncated, all counted in :class:`CorpusStats`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from gaplan.core.errors import GaplanError
from gaplan.core.outputs import check_path_exists
from gaplan.core.tasks import CAUSAL_LM
from gaplan.data.readers import Record, read_records
from gaplan.data.tasks.component import LABEL_FIELD, TARGET_FIELD
from gaplan.data.tasks.registry import task_component
from gaplan.data.tokenizer import Tokenizer, byte_tokenizer, has_tokenizer, load_tokenizer

LONG_SAMPLES = ("split", "truncate")
MIN_TOKENS = 2  # a causal-LM sample needs one target: two tokens
SYNTHETIC_MASK_ID = 3  # the synthetic corpus's historical mask id (its tokens are 1..250)
_STRIDES = (1, 2, 3, 5, 7, 11, 13, 17)
_ALPHABET = 250  # synthetic tokens are 1..250: small enough for a tiny model to learn in a few steps


@dataclass(frozen=True)
class Sample:
    """One example: token ids (no padding), for classification a label, for seq2seq-lm the target's token ids."""

    ids: tuple[int, ...]
    label: int = 0
    target: tuple[int, ...] = ()


class SyntheticCorpus:
    """Arithmetic sequences of varied length: token t = 1 + (a + d*t) mod 250, class = which stride d.

    Learnable (the stride shows after two tokens), with lengths from a quarter of
    ``seq_len`` to all of it, so batches really need padding. With ``target_len`` (seq2seq-lm) each sample's target is
    the sequence's continuation, from a quarter of ``target_len`` tokens to all of it.
    """

    pad_id = 0
    mask_id = SYNTHETIC_MASK_ID

    def __init__(self, seq_len: int, num_labels: int = 4, size: int = 1 << 20, seed: int = 0,
                 target_len: int | None = None) -> None:
        self.seq_len, self.num_labels, self.size, self.seed = seq_len, min(num_labels, len(_STRIDES)), size, seed
        self.target_len = target_len

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Sample:
        rng = random.Random(self.seed * 1_000_003 + index)
        length = rng.randint(max(2, self.seq_len // 4), self.seq_len)
        label = rng.randrange(self.num_labels)
        start, stride = rng.randrange(_ALPHABET), _STRIDES[label]
        targets = rng.randint(max(1, self.target_len // 4), self.target_len) if self.target_len else 0
        tokens = tuple(1 + (start + stride * t) % _ALPHABET for t in range(length + targets))
        return Sample(tokens[:length], label, tokens[length:])


@dataclass
class CorpusStats:
    """What became of the records: nothing is dropped without being counted here.

    ``read`` records; ``split`` of them longer than ``seq_len`` were cut into ``chunks`` samples (their
    final pieces shorter than two tokens, ``short_tails``, dropped); ``truncated`` were cut to
    ``seq_len``; ``too_short`` had fewer than two tokens and were dropped; ``samples`` remain.
    """

    read: int = 0
    samples: int = 0
    split: int = 0
    chunks: int = 0
    short_tails: int = 0
    truncated: int = 0
    too_short: int = 0

    def describe(self) -> str:
        """One line for the run's summary, e.g. ``120 samples from 100 records (10 split into 30, ...)``."""
        parts = []
        if self.split:
            parts.append(f"{self.split} split into {self.chunks}"
                         + (f", {self.short_tails} final pieces under {MIN_TOKENS} tokens dropped"
                            if self.short_tails else ""))
        if self.truncated:
            parts.append(f"{self.truncated} truncated")
        if self.too_short:
            parts.append(f"{self.too_short} under {MIN_TOKENS} tokens dropped")
        return f"{self.samples} samples from {self.read} records" + (f" ({'; '.join(parts)})" if parts else "")


class TextCorpus:
    """Text data as samples: records (or the file at ``path``) tokenized, long samples split or truncated.

    ``TextCorpus(path, seq_len, vocab_size, tokenizer_dir)`` is the older call: it reads ``path`` and
    uses ``tokenizer_dir``'s tokenizer when it has tokenizer files, else byte tokens (``tokenizer``
    says which). :func:`load_corpus` is the checked entry point: it never falls back to bytes.

    Keyword arguments: ``records`` (already read; else ``path`` is read with ``text_field`` and, for
    classification, ``label_field``), ``tokenizer`` (a :class:`Tokenizer`), ``task``, ``num_labels``
    (labels must lie in ``0..num_labels-1``), ``long_samples`` (``split``: ``seq_len`` chunks, a final
    chunk under two tokens dropped and counted; ``truncate``: cut). ``tokenizer`` is the tokenizer's
    description, ``text_tokenizer`` the :class:`Tokenizer`, ``pad_id``/``mask_id`` its ids for
    :func:`gaplan.data.collate`, ``stats`` the :class:`CorpusStats`.
    """

    def __init__(self, path: str | None, seq_len: int, vocab_size: int | None = None,
                 tokenizer_dir: str | None = None, *, records: Sequence[Record] | None = None,
                 tokenizer: Tokenizer | None = None, task: str = CAUSAL_LM, num_labels: int | None = None,
                 long_samples: str = "split", text_field: str = "text", label_field: str = "label",
                 target_len: int | None = None, target_field: str = "target") -> None:
        if long_samples not in LONG_SAMPLES:
            raise GaplanError(f"long samples: '{long_samples}' is not one of {', '.join(LONG_SAMPLES)}")
        if seq_len < MIN_TOKENS:
            raise GaplanError(f"text data needs a sequence length of {MIN_TOKENS} or more (got {seq_len})")
        self.source = path or "records"
        if tokenizer is None:  # the older call: the folder's tokenizer when it has one, else bytes, said so
            if tokenizer_dir and has_tokenizer(tokenizer_dir):
                tokenizer = load_tokenizer(tokenizer_dir)
            else:
                tokenizer = byte_tokenizer()
                if tokenizer_dir:
                    tokenizer = Tokenizer("bytes (the model has no tokenizer files)", tokenizer.size,
                                          tokenizer.pad_id, tokenizer.mask_id)
        tokenizer.check_fits(vocab_size, task)
        if records is None:
            if path is None:
                raise GaplanError("TextCorpus needs a path or records")
            records = read_records(path, text_field, *_second_field(task, label_field, target_field))
        if not records:
            raise GaplanError(f"--data {self.source}: no text in it")
        self.text_tokenizer, self.tokenizer = tokenizer, tokenizer.name
        self.pad_id, self.mask_id = tokenizer.pad_id, tokenizer.mask_id
        if task_component(task).has_target:
            self.stats = CorpusStats(read=len(records))
            self.samples = self._pairs(records, seq_len, target_len or seq_len, long_samples, target_field)
            self.stats.samples = len(self.samples)
            if not self.samples:
                raise GaplanError(f"--data {self.source}: every source is empty")
            return
        labels = [_label(r, self.source, num_labels) for r in records] if task_component(task).has_class_label \
            else [0] * len(records)
        self.stats = CorpusStats(read=len(records))
        self.samples = self._cut(tokenizer.encode([r.text for r in records]), labels, seq_len, long_samples)
        self.stats.samples = len(self.samples)
        if not self.samples:
            raise GaplanError(f"--data {self.source}: every sample is shorter than {MIN_TOKENS} tokens")

    def _cut(self, encoded: list[list[int]], labels: list[int], seq_len: int, long_samples: str) -> list[Sample]:
        samples, stats = [], self.stats
        for ids, label in zip(encoded, labels, strict=True):
            if len(ids) < MIN_TOKENS:
                stats.too_short += 1
            elif len(ids) <= seq_len:
                samples.append(Sample(tuple(ids), label))
            elif long_samples == "truncate":
                stats.truncated += 1
                samples.append(Sample(tuple(ids[:seq_len]), label))
            else:
                stats.split += 1
                for start in range(0, len(ids), seq_len):
                    chunk = ids[start:start + seq_len]
                    if len(chunk) < MIN_TOKENS:
                        stats.short_tails += 1
                        continue
                    stats.chunks += 1
                    samples.append(Sample(tuple(chunk), label))
        return samples

    def _pairs(self, records: Sequence[Record], seq_len: int, target_len: int, long_samples: str,
               target_field: str) -> list[Sample]:
        """Source/target pairs; a pair longer than its lengths is truncated, or refused: it cannot be split."""
        for record in records:
            if not isinstance(record.label, str) or not record.label.strip():
                raise GaplanError(f"--data {self.source}: {record.where}: the target ('{target_field}') is "
                                  f"{'empty' if isinstance(record.label, str) else type(record.label).__name__}: "
                                  "a seq2seq-lm sample needs a target text")
        sources = self.text_tokenizer.encode([r.text for r in records])
        targets = self.text_tokenizer.encode([r.label for r in records])
        samples, stats = [], self.stats
        for record, source, target in zip(records, sources, targets, strict=True):
            if not source:
                stats.too_short += 1
                continue
            if len(source) > seq_len or len(target) > target_len:
                if long_samples != "truncate":
                    side, length, limit = (("target", len(target), f"--target-len {target_len}")
                                           if len(target) > target_len else
                                           ("source", len(source), f"--source-len {seq_len}"))
                    raise GaplanError(f"--data {self.source}: {record.where}: its {side} has {length} tokens, more "
                                      f"than {limit}; a source/target pair cannot be split: pass --long-samples "
                                      "truncate to cut it, or a longer length")
                stats.truncated += 1
            samples.append(Sample(tuple(source[:seq_len]), 0, tuple(target[:target_len])))
        return samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Sample:
        return self.samples[index % len(self.samples)]

    def describe(self) -> str:
        """One line: what was read, what became of it, and which tokenizer."""
        return f"data: {self.stats.describe()} in {self.source}, tokenizer {self.tokenizer}"


def _second_field(task: str, label_field: str, target_field: str) -> tuple[str | None, str]:
    """What :func:`read_records` reads besides the text (classification's label, seq2seq's target, or nothing), and
    the option that names it."""
    reads = task_component(task).reads
    if reads == TARGET_FIELD:
        return target_field, "--target-field"
    return label_field if reads == LABEL_FIELD else None, "--label-field"


def _label(record: Record, source: str, num_labels: int | None) -> int:
    value = record.label
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise GaplanError(f"--data {source}: {record.where}: the label {value!r} is not an integer class index")
    if value < 0 or (num_labels is not None and value >= num_labels):
        bound = f"0..{num_labels - 1} (num_labels {num_labels})" if num_labels is not None else "0 or more"
        raise GaplanError(f"--data {source}: {record.where}: the label {value} is outside {bound}")
    return value


def load_corpus(path: str, *, seq_len: int, vocab_size: int | None, task: str = CAUSAL_LM,
                num_labels: int | None = None, tokenizer_dir: str | None = None, tokenizer_choice: str | None = None,
                text_field: str = "text", label_field: str = "label", long_samples: str = "split",
                trust_remote_code: bool = False, target_len: int | None = None,
                target_field: str = "target") -> TextCorpus:
    """Read and check ``--data`` without a model run: call it before probing.

    ``tokenizer_dir`` is the model folder (``None`` for a preset), ``tokenizer_choice`` the
    ``--tokenizer`` value (``None``, ``"bytes"`` or a folder; see :func:`load_tokenizer`). Every problem
    is a :class:`GaplanError` with one line: no tokenizer, a tokenizer that does not load or whose
    vocabulary exceeds ``vocab_size``, masked LM without a mask token, unreadable data, a missing
    field, a bad label, no usable text.
    """
    if long_samples not in LONG_SAMPLES:
        raise GaplanError(f"--long-samples {long_samples}: choose {' or '.join(LONG_SAMPLES)}")
    check_path_exists(path, "--data")  # the cheapest mistake first, before a tokenizer is looked for
    tokenizer = load_tokenizer(tokenizer_dir, tokenizer_choice, trust_remote_code)
    tokenizer.check_fits(vocab_size, task)  # before reading: a wrong tokenizer is found fast
    records = read_records(path, text_field, *_second_field(task, label_field, target_field))
    return TextCorpus(path, seq_len, vocab_size, records=records, tokenizer=tokenizer, task=task,
                      num_labels=num_labels, long_samples=long_samples, target_len=target_len,
                      target_field=target_field)
