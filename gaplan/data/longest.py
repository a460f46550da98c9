"""The worst-case micro-batch of a dataset you bring: its ``b`` largest samples, collated as your loader collates.

A probe must see the longest batch training will meet (B* that fits a short batch fails on a long one). For a
dataset gaplan did not make, the size of a sample is what it holds: the elements of its tensors, the length of
its lists and strings, summed over the fields of a dict, a tuple or a dataclass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

DEFAULT_SCAN = 10_000  # samples measured to find the largest: the whole of most fine-tuning sets, seconds at most


def sample_size(sample: Any) -> int:
    """What a sample holds: tensor elements, list and string lengths, summed over its fields."""
    if hasattr(sample, "numel") and callable(sample.numel):
        return int(sample.numel())
    if isinstance(sample, (str, bytes)):
        return len(sample)
    if isinstance(sample, Mapping):
        return sum(sample_size(value) for value in sample.values())
    if dataclasses.is_dataclass(sample) and not isinstance(sample, type):
        return sum(sample_size(getattr(sample, f.name)) for f in dataclasses.fields(sample))
    if isinstance(sample, Sequence):
        if sample and all(isinstance(item, (int, float)) for item in sample):
            return len(sample)
        return sum(sample_size(item) for item in sample)
    return 1  # a number, a label


def largest_first(dataset: Any, scan: int = DEFAULT_SCAN) -> list[int]:
    """The indices of the first ``scan`` samples of a map-style ``dataset``, largest first (ties in its order)."""
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise TypeError(f"{type(dataset).__name__} is not a map-style dataset (len() and [i]): give make_batch")
    count = min(len(dataset), scan)
    if count == 0:
        raise ValueError("the training dataset is empty")
    sizes = [sample_size(dataset[i]) for i in range(count)]
    return sorted(range(count), key=lambda i: -sizes[i])


@dataclasses.dataclass(frozen=True)
class LargestBatches:
    """``(b) -> batch``: the first ``b`` samples of ``order`` (:func:`largest_first`; repeated when ``b`` is more
    than it holds), collated by ``collate`` (a list of samples as it is, without one). Picklable with its dataset
    and collate function, for a trial in a new process."""

    dataset: Any
    collate: Callable[[list], Any] | None
    order: list[int]

    def __call__(self, size: int) -> Any:
        samples = [self.dataset[self.order[i % len(self.order)]] for i in range(size)]
        return self.collate(samples) if self.collate is not None else samples

