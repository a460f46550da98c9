"""The data's token lengths, cached per data file and tokenizer: a second probe or bench does not tokenize again.

``gaplan probe --batch-by tokens`` and ``gaplan bench --batch-by tokens`` need only the lengths of the samples
(and what became of the records). They are kept in ``$GAPLAN_CACHE_DIR/lengths/`` (default
``~/.cache/gaplan/lengths/``), one JSON file per key: the data (absolute path, size and modification time of
the file, or of every file in a ``datasets`` folder), the tokenizer (``bytes``, or the name and a digest of
the tokenizer files of its folder) and what changes the samples (sequence length, task, fields, long samples).
A file that changed, another tokenizer or another sequence length is another key: read and tokenized again.
Written atomically, so a cut-off write is never read. ``gaplan train`` tokenizes anyway (it needs the ids)
and writes the lengths it read, so a probe after it hits the cache too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from gaplan.core.atomic_write import atomic_write_text
from gaplan.core.cache import cache_root
from gaplan.data.corpus import CorpusStats
from gaplan.data.tokenizer import BYTES, TOKENIZER_FILES

LENGTHS_DIR = "lengths"
_FORMAT = 1  # part of the key: a change in what is stored must not read older files


@dataclass(frozen=True)
class DataLengths:
    """What a profile needs of the data: every sample's tokens, what became of the records, the tokenizer's name."""

    lengths: list[int]
    stats: CorpusStats
    tokenizer: str
    source: str
    cached: bool = False  # read from the cache (nothing tokenized)

    def describe(self) -> str:
        """As :meth:`gaplan.data.TextCorpus.describe`, saying when the lengths came from the cache."""
        return (f"data: {self.stats.describe()} in {self.source}, tokenizer {self.tokenizer}"
                + (" (lengths from the cache)" if self.cached else ""))


def _data_identity(path: str) -> dict[str, Any]:
    """The data's absolute path, and size and modification time of it (or of each file of a folder)."""
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        status = os.stat(path)
        return {"path": path, "size": status.st_size, "mtime_ns": status.st_mtime_ns}
    files = []
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            status = os.stat(os.path.join(root, name))
            files.append([os.path.relpath(os.path.join(root, name), path), status.st_size, status.st_mtime_ns])
    return {"path": path, "files": files}


def _tokenizer_identity(tokenizer_dir: str | None, choice: str | None) -> dict[str, Any]:
    """``bytes``, or the tokenizer folder (``--tokenizer DIR``, else the model's) and a digest of its tokenizer files."""
    if choice == BYTES:
        return {"tokenizer": BYTES}
    folder = os.path.abspath(choice or tokenizer_dir or "")
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES + ("special_tokens_map.json", "added_tokens.json"):
        file = os.path.join(folder, name)
        if os.path.isfile(file):
            digest.update(name.encode())
            with open(file, "rb") as handle:
                digest.update(handle.read())
    return {"tokenizer": folder, "files": digest.hexdigest()[:16]}


def lengths_cache_path(data: str, *, seq_len: int, task: str, tokenizer_dir: str | None, tokenizer_choice: str | None,
                       text_field: str, label_field: str, long_samples: str) -> str:
    """The cache file of this data read with this tokenizer and these options."""
    key = json.dumps({"format": _FORMAT, "data": _data_identity(data),
                      "tokenizer": _tokenizer_identity(tokenizer_dir, tokenizer_choice), "seq_len": seq_len,
                      "task": task, "text_field": text_field, "label_field": label_field,
                      "long_samples": long_samples}, sort_keys=True)
    return os.path.join(cache_root(), LENGTHS_DIR, hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")


def load_lengths(path: str, source: str) -> DataLengths | None:
    """The cached lengths in ``path``, or None when there are none (or the file cannot be read: it is then rewritten)."""
    try:
        with open(path, encoding="utf-8") as handle:
            saved = json.load(handle)
        return DataLengths([int(n) for n in saved["lengths"]], CorpusStats(**saved["stats"]), str(saved["tokenizer"]),
                           source, cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_lengths(path: str, lengths: DataLengths) -> None:
    """Write the lengths atomically (readers see the old file or the new one, never half)."""
    atomic_write_text(path, json.dumps({"lengths": list(lengths.lengths), "stats": dataclasses.asdict(lengths.stats),
                                        "tokenizer": lengths.tokenizer}) + "\n")
