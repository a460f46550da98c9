"""The worst-case batch of a dataset gaplan did not make: its largest samples, collated as the loader collates."""

from dataclasses import dataclass

import pytest
import torch

from gaplan.data.longest import LargestBatches, largest_first, sample_size


@dataclass
class Row:
    ids: tuple
    label: int


@pytest.mark.parametrize("sample, size", [
    (torch.zeros(3, 4), 12), ("abcd", 4), ([1, 2, 3], 3), ({"a": torch.zeros(5), "b": [1, 2]}, 7),
    ((torch.zeros(2), torch.zeros(3)), 5), (Row((1, 2, 3), 0), 4), (7, 1),
])
def test_a_sample_holds_its_elements(sample, size):
    assert sample_size(sample) == size


def test_the_largest_come_first_ties_in_order_and_a_batch_repeats_them_past_the_scan():
    data = [torch.zeros(n) for n in (3, 9, 5, 9, 1)]
    order = largest_first(data, scan=4)  # the fifth is not scanned
    assert order == [1, 3, 2, 0]
    batch = LargestBatches(data, lambda s: torch.stack([x[:1] for x in s]), order)(6)
    assert batch.shape == (6, 1)
    assert LargestBatches(data, None, order)(2)[1].numel() == 9


@pytest.mark.parametrize("dataset, error", [([], ValueError), (iter([1, 2]), TypeError)])
def test_what_cannot_be_scanned_says_why(dataset, error):
    with pytest.raises(error):
        largest_first(dataset)
