"""Training data: a built-in learnable synthetic corpus, or a text/JSONL file, and padding collation.

Samples are addressed by index, and optimizer step ``s`` always takes the same
samples, so a resumed run sees exactly the data an uninterrupted one would.
"""

from __future__ import annotations

import functools
import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gaplan.errors import GaplanError, one_line
from gaplan.loss import CAUSAL_LM, CLASSIFICATION, IGNORE_INDEX, MASKED_LM

PAD_ID = 0
_STRIDES = (1, 2, 3, 5, 7, 11, 13, 17)
_ALPHABET = 250  # synthetic tokens are 1..250: small enough for a tiny model to learn in a few steps


@dataclass(frozen=True)
class Sample:
    """One example: token ids (no padding) and, for classification, a label."""

    ids: tuple[int, ...]
    label: int = 0


class SyntheticCorpus:
    """Arithmetic sequences of varied length: token t = 1 + (a + d*t) mod 250, class = which stride d.

    Learnable (the stride shows after two tokens), with lengths from a quarter of
    ``seq_len`` to all of it, so batches really need padding.
    """

    def __init__(self, seq_len: int, num_labels: int = 4, size: int = 1 << 20, seed: int = 0) -> None:
        self.seq_len, self.num_labels, self.size, self.seed = seq_len, min(num_labels, len(_STRIDES)), size, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Sample:
        rng = random.Random(self.seed * 1_000_003 + index)
        length = rng.randint(max(2, self.seq_len // 4), self.seq_len)
        label = rng.randrange(self.num_labels)
        start, stride = rng.randrange(_ALPHABET), _STRIDES[label]
        return Sample(tuple(1 + (start + stride * t) % _ALPHABET for t in range(length)), label)


class TextCorpus:
    """Lines of a text file, or the ``text`` field of a JSONL file, tokenized and cut to ``seq_len``.

    The model directory's tokenizer when it has tokenizer files (one that fails to load is an error),
    else bytes; ``tokenizer`` says which.
    """

    tokenizer: str = "bytes"

    def __init__(self, path: str, seq_len: int, vocab_size: int, tokenizer_dir: str | None = None) -> None:
        try:
            with open(path, encoding="utf-8") as handle:
                lines = handle.read().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise GaplanError(f"--data {path}: cannot read it ({exc.__class__.__name__}: {exc})") from None
        texts = [self._text(line, path, n) for n, line in enumerate(lines, 1) if line.strip()]
        if not texts:
            raise GaplanError(f"--data {path}: no text in it")
        encode = self._encoder(tokenizer_dir, vocab_size)
        self.samples = [Sample(tuple(ids[:seq_len])) for ids in map(encode, texts) if len(ids) >= 2]
        if not self.samples:
            raise GaplanError(f"--data {path}: every line is shorter than two tokens")

    @staticmethod
    def _text(line: str, path: str, number: int) -> str:
        if not path.endswith((".jsonl", ".json")):
            return line
        try:
            record = json.loads(line)
            return str(record["text"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise GaplanError(f"--data {path}: line {number} is not a JSON object with a 'text' field") from None

    def _encoder(self, tokenizer_dir: str | None, vocab_size: int):
        if tokenizer_dir and has_tokenizer(tokenizer_dir):
            from transformers import AutoTokenizer

            try:
                tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
            except Exception as exc:  # noqa: BLE001 - whatever broke, the user must hear it, not get bytes
                raise GaplanError(f"the tokenizer in {tokenizer_dir} cannot be loaded "
                                  f"({exc.__class__.__name__}: {one_line(exc)})") from None
            self.tokenizer = f"{tokenizer_dir} ({tokenizer.__class__.__name__})"
            return lambda text: tokenizer(text)["input_ids"]
        self.tokenizer = "bytes (the model has no tokenizer files)" if tokenizer_dir else "bytes"
        if vocab_size < 257:
            raise GaplanError(f"the byte-level tokenizer needs a vocabulary of 257 or more (the model has {vocab_size})")
        return lambda text: [1 + b for b in text.encode("utf-8")]  # 0 stays the padding id

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Sample:
        return self.samples[index % len(self.samples)]


# Files that mean a directory holds a tokenizer (fast, SentencePiece, WordPiece, BPE).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "spiece.model", "vocab.txt",
                   "vocab.json", "merges.txt")


def has_tokenizer(directory: str) -> bool:
    """True when ``directory`` holds any tokenizer file."""
    return os.path.isdir(directory) and any(os.path.isfile(os.path.join(directory, n)) for n in TOKENIZER_FILES)


def step_indices(step: int, effective_batch: int, corpus_size: int, seed: int = 0) -> list[int]:
    """The sample indices of optimizer step ``step``: consecutive slices of a seeded permutation per epoch."""
    start = step * effective_batch
    indices = []
    for position in range(start, start + effective_batch):
        epoch, offset = divmod(position, corpus_size)
        if corpus_size > 1 << 16:  # synthetic corpora are already random: no permutation needed
            indices.append(offset)
            continue
        indices.append(_permutation(corpus_size, seed * 7919 + epoch)[offset])
    return indices


@functools.lru_cache(maxsize=4)
def _permutation(size: int, seed: int) -> tuple[int, ...]:
    order = list(range(size))
    random.Random(seed).shuffle(order)
    return tuple(order)


def collate(samples: Sequence[Sample], task: str, seed: int = 0, mask_id: int = 3) -> dict[str, torch.Tensor]:
    """Pad to the longest sample; padded label positions are -100. Masked LM masks 15% (seeded per sample)."""
    longest = max(len(s.ids) for s in samples)
    ids = torch.full((len(samples), longest), PAD_ID, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, sample in enumerate(samples):
        ids[row, : len(sample.ids)] = torch.tensor(sample.ids)
        attention[row, : len(sample.ids)] = 1
    batch = {"input_ids": ids, "attention_mask": attention}
    if task == CAUSAL_LM:
        batch["labels"] = ids.masked_fill(attention == 0, IGNORE_INDEX)
    elif task == MASKED_LM:
        labels = torch.full_like(ids, IGNORE_INDEX)
        inputs = ids.clone()
        for row, sample in enumerate(samples):
            rng = random.Random(seed * 31 + hash(sample.ids) % 1_000_003)
            picks = [i for i in range(len(sample.ids)) if rng.random() < 0.15] or [0]
            for i in picks:
                labels[row, i] = ids[row, i]
                inputs[row, i] = mask_id
        batch["input_ids"], batch["labels"] = inputs, labels
    elif task == CLASSIFICATION:
        batch["labels"] = torch.tensor([s.label for s in samples])
    return batch
