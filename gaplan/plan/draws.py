"""How a step's samples were drawn, and the variance that gives a weighted mean of their gradients. No torch.

The two-batch estimator of the gradient noise scale (:mod:`gaplan.training.noise_scale`) solves
``E|G_b|^2 = |G|^2 + tr(S) * v_b`` for two batches; ``v_b`` is the variance a batch's mean gradient has per unit of
``tr(S)``. Independent draws give ``v = 1/n``. Draws without replacement from ``N`` samples do not: with ``tr(S)``
the population's variance (divided by ``N``, what independent draws from the same samples would see), samples of
one permutation have covariance ``-tr(S)/(N - 1)`` with one another, and a mean with sample weights ``u_i`` has

    v = N/(N-1) * sum_i u_i^2 - 1/(N-1) * sum_P (sum_{i in P} u_i)^2

where ``P`` runs over the independent draws the samples come from (two permutations for a step that crosses an
epoch boundary: their parts do not covary). For a plain mean of ``n`` samples of one permutation this is the
finite-population correction ``(N - n) / (n (N - 1))``. Counting ``1/n`` there reads ``|G|^2`` low by
``tr(S)/(N - 1)`` (``tr(S)`` right to a factor ``N/(N - 1)``), so the noise scale high by about
``1 / (1 - B_noise/N)``.

The kinds of drawing:

* ``independent``: with replacement, or fresh samples from a distribution (a ``module:function`` workload that
  declares so): ``v = 1/n``, the estimator as McCandlish et al. give it.
* ``epochs``: gaplan's own order: each epoch a seeded permutation of the ``N`` samples, each step the next
  consecutive samples, every rank's share a slice of the same order. The ranks' samples covary, so the sums over a
  part are taken over all ranks.
* ``per-call``: each call of a ``module:function`` workload's ``make_batch`` takes its samples without replacement
  from ``N``, independently of every other call (and so of the other ranks' calls).
* ``unknown``: nothing was declared; the reading assumes independent draws and says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

KINDS = ("independent", "epochs", "per-call", "unknown")
SHARED_PARTS = 2  # a step of gaplan's order spans at most two epochs when it is no larger than the dataset
LOCAL = -1  # the part key of a draw of this rank's own (a make_batch call), which no other rank's samples share


@dataclass(frozen=True)
class Drawing:
    """How the samples a noise-scale reading averages were drawn (``population``: ``N``, without replacement)."""

    kind: str = "unknown"
    population: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"drawing kind {self.kind!r}: expected one of {', '.join(KINDS)}")
        if self.without_replacement and (self.population is None or self.population < 2):
            raise ValueError(f"a {self.kind} drawing needs a population of at least 2 samples (got {self.population})")

    @property
    def without_replacement(self) -> bool:
        return self.kind in ("epochs", "per-call")

    @property
    def known(self) -> bool:
        return self.kind != "unknown"

    def factors(self) -> tuple[float, float]:
        """``(kappa, lam)`` of ``v = kappa * sum u^2 - lam * sum_P U_P^2``: ``(1, 0)`` for independent draws."""
        if not self.without_replacement:
            return 1.0, 0.0
        n = float(self.population)  # type: ignore[arg-type]
        return n / (n - 1), 1 / (n - 1)

    def describe(self) -> str:
        """A few words for the log: how the reading took the draws."""
        if self.kind == "epochs":
            return (f"samples drawn without replacement, a permutation of the {self.population} samples each epoch: "
                    "corrected for it (finite population)")
        if self.kind == "per-call":
            return (f"each batch drawn without replacement from {self.population} samples: corrected for it "
                    "(finite population)")
        if self.kind == "independent":
            return "samples drawn independently (declared)"
        return ("how the samples are drawn is unknown: the reading assumes independent draws; drawn without "
                "replacement from N samples it reads high, by about 1/(1 - B_noise/N)")

    @classmethod
    def declared(cls, draws: str | int | None) -> Drawing:
        """A ``module:function`` workload's declaration (``CustomWorkload.draws``): ``"independent"``, an int ``N``
        (each ``make_batch`` call without replacement from ``N`` samples), or None (unknown)."""
        if draws is None:
            return cls()
        if draws == "independent":
            return cls("independent")
        if isinstance(draws, int) and not isinstance(draws, bool):
            return cls("per-call", draws)
        raise ValueError(f"draws={draws!r}: expected 'independent', a number of samples N (each make_batch call "
                         "draws without replacement from N), or None")


def inverse_sizes(drawing: Drawing, count: float, items: float, samples: float, drawn: float, weight: float,
                  weight_sq: float, part_sq: float) -> tuple[float, float]:
    """``(v_small, v_big)`` per item, summed over the ranks: the variance of the pooled small batches' and of the
    step's mean gradient per unit of ``tr(S)`` per item.

    ``count`` micro-batches of ``items`` items and ``samples`` samples in all; ``drawn = sum_m sum_P s_mP^2 / s_m``
    (each micro-batch's own samples per part); ``weight = sum_m w_m`` and ``weight_sq = sum_m w_m^2 / n_m``, with
    ``w_m`` micro-batch ``m``'s (unnormalized) weight in ``.grad`` and ``n_m`` its items; ``part_sq = sum_P
    (sum_m w_m s_mP / s_m)^2``. A sample's items are taken as the step's mean (exact when every sample has as
    many)."""
    kappa, lam = drawing.factors()
    per_sample = items / samples if samples > 0 else 1.0
    v_small = (kappa * count - lam * drawn) / items
    v_big = (kappa * weight_sq - lam * part_sq / per_sample) / (weight * weight)
    return v_small, v_big


def step_parts(first: int, population: int, micro_positions: Sequence[Iterable[int]]
               ) -> list[tuple[tuple[int, int], ...]]:
    """Each micro-batch's samples per epoch of gaplan's order, as ``((epoch offset, samples), ...)``: a micro-batch
    holds the positions ``micro_positions[m]`` of the endless order (epoch after epoch), the offset counted from
    the epoch of the step's first position ``first``."""
    base = first // population
    parts = []
    for positions in micro_positions:
        counts = Counter(position // population - base for position in positions)
        parts.append(tuple(sorted(counts.items())))
    return parts


def unknown_drawing(loop: str, size: int | None = None) -> str:
    """What an integration says of its readings when its loader's sampler is of a kind gaplan does not read
    (:mod:`gaplan.data.loader_drawing`): they assume independent draws, and read high where that sampler in fact
    draws without replacement and the noise scale nears the dataset's size."""
    data = f"its {size} samples" if size else "the dataset's N samples"
    bound = f"1/(1 - B_noise/{size})" if size else "1/(1 - B_noise/N)"
    return (f"{loop} draws the samples with a sampler gaplan does not read: the reading assumes independent draws. "
            f"If it draws without replacement from {data}, the reading is high, by about {bound}, which matters "
            "where the noise scale nears that size (a shuffle each epoch, gaplan's PlanBatchSampler and "
            "DistributedSampler are read and corrected for)")
