"""Which samples each step takes, and how samples become a padded batch.

Samples are addressed by index, and optimizer step ``s`` always takes the same samples, so a resumed
run sees exactly the data an uninterrupted one would. Every epoch is a seeded permutation of the whole
corpus, whatever its size: a Feistel network with cycle walking maps a position to an index in O(1)
time and memory, so the synthetic corpus of 2**20 samples costs nothing to shuffle.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

from gaplan.data.corpus import SYNTHETIC_MASK_ID, Sample
from gaplan.data.tasks.registry import task_component

PAD_ID = 0
_M64 = (1 << 64) - 1
_ROUNDS = 6


def _mix(x: int) -> int:
    """splitmix64's finalizer: a 64-bit integer hash, the same on every platform and Python."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


@functools.lru_cache(maxsize=64)
def _round_keys(seed: int, epoch: int) -> tuple[int, ...]:
    base = _mix(_mix(seed & _M64) ^ (epoch & _M64) * 0xD1B54A32D192ED03 & _M64)
    return tuple(_mix(base + r) for r in range(_ROUNDS))


def _mix_array(x: np.ndarray) -> np.ndarray:
    """:func:`_mix` on a uint64 array (numpy's uint64 arithmetic wraps, as the masks above do)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def permuted_indices(positions: np.ndarray | Sequence[int], size: int, seed: int = 0, epoch: int = 0) -> np.ndarray:
    """The indices at ``positions`` (each in ``0..size-1``) of epoch ``epoch``'s seeded permutation of ``range(size)``.

    A balanced Feistel network on the smallest even number of bits that holds ``size`` is a bijection
    of ``0..2**bits-1``; re-applying it until the value falls below ``size`` (cycle walking) restricts
    it to a bijection of ``0..size-1``. ``2**bits < 4*size``, so that takes under 4 rounds on average.
    Vectorized: a whole epoch of 2**20 positions takes well under a second.
    """
    positions = np.asarray(positions, dtype=np.uint64)
    if size <= 1:
        return np.zeros(positions.shape, dtype=np.int64)
    half = (max(2, (size - 1).bit_length()) + 1) // 2
    shift, mask = np.uint64(half), np.uint64((1 << half) - 1)
    keys = [np.uint64(k) for k in _round_keys(seed, epoch)]
    result = np.empty(positions.shape, dtype=np.int64)
    todo, value = np.arange(positions.size), positions.reshape(-1)
    while todo.size:
        left, right = value >> shift, value & mask
        for key in keys:
            left, right = right, left ^ (_mix_array(right ^ key) & mask)
        value = (left << shift) | right
        inside = value < np.uint64(size)
        result.reshape(-1)[todo[inside]] = value[inside]
        todo, value = todo[~inside], value[~inside]
    return result


def permuted_index(position: int, size: int, seed: int = 0, epoch: int = 0) -> int:
    """The index at ``position`` of epoch ``epoch``'s permutation (see :func:`permuted_indices`)."""
    return int(permuted_indices([position], size, seed, epoch)[0])


def step_indices(step: int, effective_batch: int, corpus_size: int, seed: int = 0, first: int | None = None
                 ) -> list[int]:
    """The sample indices of optimizer step ``step``: consecutive slices of a seeded permutation per epoch.

    ``first``: the step's first position in that order (default ``step * effective_batch``; a schedule whose
    effective batch changes gives the sum of the earlier steps' batches)."""
    start = step * effective_batch if first is None else first
    positions = np.arange(start, start + effective_batch, dtype=np.int64)
    epochs, offsets = np.divmod(positions, corpus_size)
    indices = np.empty_like(positions)
    for epoch in np.unique(epochs).tolist():
        where = epochs == epoch
        indices[where] = permuted_indices(offsets[where], corpus_size, seed, epoch)
    return indices.tolist()


def collate(samples: Sequence[Sample], task: str, seed: int = 0, mask_id: int | None = SYNTHETIC_MASK_ID,
            pad_id: int = PAD_ID) -> dict[str, torch.Tensor]:
    """Pad to the longest sample with ``pad_id``; padded label positions are -100. The task's component adds the
    labels (:meth:`~gaplan.data.tasks.component.TaskComponent.add_labels`).

    Masked LM replaces 15% of each sample's tokens (at least one, seeded per sample) by ``mask_id``:
    the tokenizer's mask token (:attr:`TextCorpus.mask_id`); the default suits the synthetic corpus.
    seq2seq-lm: the labels are the targets padded with -100 to the longest target; the model's own shift makes the
    decoder's inputs from them (:func:`gaplan.workload.seq2seq.decoder_inputs`).
    """
    longest = max(len(s.ids) for s in samples)
    ids = torch.full((len(samples), longest), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, sample in enumerate(samples):
        ids[row, : len(sample.ids)] = torch.tensor(sample.ids)
        attention[row, : len(sample.ids)] = 1
    batch = {"input_ids": ids, "attention_mask": attention}
    task_component(task).add_labels(batch, samples, seed, mask_id)
    return batch
