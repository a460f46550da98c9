"""How a torch ``DataLoader`` draws its samples, for the noise scale (:mod:`gaplan.plan.draws`).

gaplan's :class:`~gaplan.data.plan_sampler.PlanBatchSampler`, torch's ``RandomSampler`` without replacement (a new
permutation each epoch; accelerate's ``SeedableRandomSampler`` is one) and a shuffling ``DistributedSampler`` (each
rank a slice of one permutation) all draw a step's samples without replacement from the dataset's ``N``, as long as
a step ends with its epoch, as the HF Trainer's and Lightning's do. Any other sampler (the dataset's order, weights,
a sampler of the user's own) is an unknown drawing.
"""

from __future__ import annotations

from gaplan.data.plan_sampler import PlanBatchSampler
from gaplan.plan.draws import Drawing


def loader_drawing(loader: object) -> Drawing:
    """The drawing of ``loader`` (a ``DataLoader``, or accelerate's and Lightning's wrappers of one): ``epochs`` with
    the dataset's size where its sampler draws each epoch's permutation, else unknown."""
    from torch.utils.data import DistributedSampler, RandomSampler

    for found in _samplers(loader):
        if isinstance(found, PlanBatchSampler):
            return found.drawing
        if isinstance(found, RandomSampler) and not found.replacement:
            size = len(found.data_source)  # type: ignore[arg-type]
            if found.num_samples == size and size > 1:
                return Drawing("epochs", size)
        if isinstance(found, DistributedSampler) and found.shuffle and len(found.dataset) > 1:  # type: ignore[arg-type]
            return Drawing("epochs", len(found.dataset))  # type: ignore[arg-type]
    return Drawing()


def _samplers(loader: object) -> list[object]:
    """What may draw for ``loader``: its batch samplers, nested as accelerate wraps them, and their samplers."""
    found: list[object] = []
    level = loader
    for _ in range(4):  # DataLoaderShard -> BatchSamplerShard -> BatchSampler -> its sampler, and the like
        if level is None:
            break
        found.append(level)
        sampler = getattr(level, "sampler", None)
        if sampler is not None and sampler is not level:
            found.append(sampler)
        level = getattr(level, "batch_sampler", None)
    return found
