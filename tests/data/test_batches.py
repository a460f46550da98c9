"""Every corpus size is shuffled, by seed, one permutation per epoch; collation keeps its defaults."""

import time

import numpy as np
import pytest
import torch

from gaplan.core.tasks import CAUSAL_LM, CLASSIFICATION, IGNORE_INDEX, MASKED_LM
from gaplan.data import PAD_ID, Sample, SyntheticCorpus, collate, permuted_index, step_indices


def epoch_order(size: int, seed: int, epoch: int) -> np.ndarray:
    return np.array(step_indices(epoch, size, size, seed))  # an effective batch of the whole corpus: step e is epoch e


@pytest.mark.parametrize("size", [1, 2, 3, 7, 100, 1000, 2**16 + 1, 2**20])
def test_each_epoch_is_a_permutation_and_depends_on_seed_and_epoch(size):
    orders = {(seed, epoch): epoch_order(size, seed, epoch) for seed in (0, 1) for epoch in (0, 1)}
    identity = np.arange(size)
    for order in orders.values():
        assert np.array_equal(np.sort(order), identity)
    assert np.array_equal(epoch_order(size, 0, 0), orders[0, 0])  # deterministic
    if size >= 7:
        assert not np.array_equal(orders[0, 0], identity)  # shuffled, large corpora included
        assert len({order.tobytes() for order in orders.values()}) == 4  # another seed or epoch: another order


def test_a_synthetic_sized_corpus_is_shuffled_and_cheap():
    size, batch = 2**20, 256
    started = time.perf_counter()
    steps = [step_indices(step, batch, size, seed=3) for step in range(20)]
    seconds = time.perf_counter() - started
    seen = [i for step in steps for i in step]
    assert len(set(seen)) == len(seen) and all(0 <= i < size for i in seen)  # within an epoch: no repeats
    assert seen != list(range(len(seen)))
    assert max(seen) > size // 2  # spread over the whole corpus, not the first indices
    assert seconds < 1.0, seconds  # about 5 ms a step of 256 on a shared core


def test_steps_are_consecutive_slices_of_the_epoch_and_cross_epochs_cleanly():
    size, batch = 10, 4
    flat = [i for step in range(5) for i in step_indices(step, batch, size, seed=7)]
    assert flat == [*epoch_order(size, 7, 0).tolist(), *epoch_order(size, 7, 1).tolist()]
    assert [permuted_index(p, size, 7, 1) for p in range(size)] == epoch_order(size, 7, 1).tolist()


def test_collate_defaults_are_unchanged_for_existing_callers():
    samples = [SyntheticCorpus(8)[i] for i in range(3)]
    causal = collate(samples, CAUSAL_LM)
    padded = causal["attention_mask"] == 0
    assert (causal["input_ids"][padded] == PAD_ID).all() and (causal["labels"][padded] == IGNORE_INDEX).all()
    masked = collate(samples, MASKED_LM, seed=1)
    assert (masked["input_ids"][masked["labels"] != IGNORE_INDEX] == 3).all()
    assert torch.equal(masked["input_ids"], collate(samples, MASKED_LM, seed=1)["input_ids"])  # seeded
    assert collate([Sample((5, 6), 2), Sample((7, 8, 9), 1)], CLASSIFICATION)["labels"].tolist() == [2, 1]
    with pytest.raises(ValueError, match="mask"):
        collate(samples, MASKED_LM, mask_id=None)
