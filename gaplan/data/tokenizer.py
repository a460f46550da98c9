"""The tokenizer for text data: the model folder's own, an explicit ``bytes``, or another tokenizer folder.

No silent fallback: a model folder without tokenizer files is an error that suggests ``--tokenizer
bytes``; a tokenizer that fails to load is an error with the reason. A :class:`Tokenizer` carries
what batching needs: its padding id and mask id.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gaplan.core.errors import GaplanError, one_line
from gaplan.data.tasks.registry import task_component

BYTES = "bytes"
BYTE_VOCAB = 257  # id = byte + 1; 0 is padding
BYTE_MASK_ID = 257  # the first id past the bytes: masked LM on bytes needs a vocabulary of 258
_ENCODE_CHUNK = 1000

# Files that mean a directory holds a tokenizer (fast, SentencePiece, WordPiece, BPE).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "spiece.model", "vocab.txt",
                   "vocab.json", "merges.txt")


def has_tokenizer(directory: str) -> bool:
    """True when ``directory`` holds any tokenizer file."""
    return os.path.isdir(directory) and any(os.path.isfile(os.path.join(directory, n)) for n in TOKENIZER_FILES)


@dataclass(frozen=True)
class Tokenizer:
    """Text to token ids, with the ids batching needs.

    ``size`` is the number of ids it can produce (``len(tokenizer)``; 257 for bytes); ``pad_id`` the
    tokenizer's pad token, else its EOS, else 0; ``mask_id`` its mask token (``None`` when it has none).
    ``hf`` is the transformers tokenizer (``None`` for bytes), e.g. to save it with a fine-tuned model.
    """

    name: str
    size: int
    pad_id: int
    mask_id: int | None
    hf: Any = None

    @property
    def is_bytes(self) -> bool:
        return self.hf is None

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (the tokenizer's special tokens included, no truncation)."""
        if self.hf is None:
            return [[1 + b for b in text.encode("utf-8")] for text in texts]
        ids: list[list[int]] = []
        for start in range(0, len(texts), _ENCODE_CHUNK):
            chunk = list(texts[start:start + _ENCODE_CHUNK])
            # verbose=False: no "longer than the model's maximum length" warning; long samples are split later.
            ids.extend(self.hf(chunk, add_special_tokens=True, verbose=False, return_attention_mask=False)["input_ids"])
        return ids

    def vocab_needed(self, task: str) -> int:
        """The smallest model vocabulary these ids fit: its size, or past the mask id for masked LM."""
        if task_component(task).needs_mask_token and self.mask_id is not None:
            return max(self.size, self.mask_id + 1)
        return self.size

    def check_fits(self, vocab_size: int | None, task: str) -> None:
        """Raise unless the model can embed every id this tokenizer produces, and masked LM has a mask token."""
        if task_component(task).needs_mask_token and self.mask_id is None:
            raise GaplanError(f"masked LM needs a mask token and the tokenizer {self.name} has none; "
                              f"use a tokenizer with one (--tokenizer DIR)")
        if vocab_size is None:
            return
        needed = self.vocab_needed(task)
        if needed <= vocab_size:
            return
        if self.is_bytes:
            raise GaplanError(f"the byte-level tokenizer needs a vocabulary of {needed} or more"
                              f"{' (masked LM: 256 bytes, padding and a mask id)' if needed > BYTE_VOCAB else ''} "
                              f"(the model has {vocab_size}); give --tokenizer DIR with the model's own tokenizer")
        raise GaplanError(f"the tokenizer {self.name} has {needed} tokens but the model's vocab_size is {vocab_size}: "
                          f"ids from {vocab_size} up have no embedding; use the model's own tokenizer (--tokenizer DIR)")


def byte_tokenizer() -> Tokenizer:
    """Explicit byte tokens: id = byte + 1, 0 is padding, 257 the mask id."""
    return Tokenizer(BYTES, BYTE_VOCAB, 0, BYTE_MASK_ID)


def load_tokenizer(model_dir: str | None, choice: str | None = None, trust_remote_code: bool = False) -> Tokenizer:
    """The tokenizer for text data.

    ``choice`` ``None``: the tokenizer files of ``model_dir`` (an error when it has none, or when there
    is no model folder); ``"bytes"``: byte tokens; anything else: a tokenizer folder. Loaded with
    ``AutoTokenizer.from_pretrained(..., local_files_only=True)``: nothing is downloaded.
    """
    if choice == BYTES:
        return byte_tokenizer()
    if choice is not None:
        if not os.path.isdir(choice):
            raise GaplanError(f"--tokenizer {choice}: no such folder (give a tokenizer folder, or bytes)")
        if not has_tokenizer(choice):
            raise GaplanError(f"--tokenizer {choice}: no tokenizer files in it (looked for "
                              f"{', '.join(TOKENIZER_FILES)})")
        return _load_hf(choice, trust_remote_code)
    if model_dir is None or not os.path.isdir(model_dir):
        raise GaplanError("text data needs a tokenizer and the model has no folder with one: give --tokenizer DIR "
                          "(a tokenizer folder) or --tokenizer bytes (byte tokens)")
    if not has_tokenizer(model_dir):
        raise GaplanError(f"the model folder {model_dir} has no tokenizer files for the text data: give "
                          f"--tokenizer DIR (a tokenizer folder) or --tokenizer bytes (byte tokens)")
    return _load_hf(model_dir, trust_remote_code)


def _load_hf(directory: str, trust_remote_code: bool = False) -> Tokenizer:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True, trust_remote_code=trust_remote_code)
        size = len(tokenizer)
    except Exception as exc:  # noqa: BLE001 - whatever broke, the user must hear it, not get bytes
        raise GaplanError(f"the tokenizer in {directory} cannot be loaded "
                          f"({exc.__class__.__name__}: {one_line(exc)})") from None
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return Tokenizer(f"{directory} ({tokenizer.__class__.__name__})", int(size), int(pad) if pad is not None else 0,
                     tokenizer.mask_token_id, tokenizer)
