"""The variances of gaplan.plan.draws against every equally likely draw, enumerated: one permutation, a step across
an epoch boundary, two ranks' shares of one order, uneven weights, per-call draws, and independent draws."""

from __future__ import annotations

import itertools

import pytest

from gaplan.plan.draws import LOCAL, Drawing, inverse_sizes, step_parts

# Five samples' "gradients" (2-d), not centred: G = their mean, tr(S) = their variance divided by N.
POINTS = [(1.0, 0.0), (0.0, 2.0), (3.0, 1.0), (-1.0, 1.0), (2.0, -2.0)]
N = len(POINTS)
G = tuple(sum(p[k] for p in POINTS) / N for k in range(2))
TRACE = sum((p[0] - G[0]) ** 2 + (p[1] - G[1]) ** 2 for p in POINTS) / N


def _square(vector):
    return vector[0] ** 2 + vector[1] ** 2


def _mean(indices, weights=None):
    weights = weights or [1 / len(indices)] * len(indices)
    return tuple(sum(w * POINTS[i][k] for w, i in zip(weights, indices, strict=True)) for k in range(2))


def _by_enumeration(first: int, micro_positions: list[list[int]], weights: list[float]):
    """E|G_small|^2 (pooled over the micro-batches, by samples) and E|G_big|^2 (the micro-batches' own means weighed
    by ``weights``) over every pair of the two epochs' permutations: gaplan's order at positions ``first`` on."""
    small = big = 0.0
    orders = list(itertools.permutations(range(N)))
    count = 0
    for one, two in itertools.product(orders, orders):
        by_position = {p: (one if p // N == first // N else two)[p % N] for ps in micro_positions for p in ps}
        means = [_mean([by_position[p] for p in ps]) for ps in micro_positions]
        sizes = [len(ps) for ps in micro_positions]
        small += sum(n * _square(m) for n, m in zip(sizes, means, strict=True)) / sum(sizes)
        total = sum(weights)
        big += _square(tuple(sum(w / total * m[k] for w, m in zip(weights, means, strict=True)) for k in range(2)))
        count += 1
    return small / count, big / count


def _formula(drawing, micro_positions, weights, first, ranks=None):
    """``E|G_b|^2 = |G|^2 + tr(S) v_b`` with gaplan.plan.draws' v (one item a sample). ``ranks``: which rank holds
    each micro-batch; the shared parts are summed over them, as the meter's reduction does."""
    parts = step_parts(first, N, micro_positions)
    sizes = [len(ps) for ps in micro_positions]
    drawn = sum(sum(c * c for _, c in p) / n for p, n in zip(parts, sizes, strict=True))
    shared = [0.0, 0.0]
    for p, n, w in zip(parts, sizes, weights, strict=True):
        for key, c in p:
            shared[key] += w * c / n
    v_small, v_big = inverse_sizes(drawing, len(sizes), sum(sizes), sum(sizes), drawn, sum(weights),
                                   sum(w * w / n for w, n in zip(weights, sizes, strict=True)),
                                   sum(u * u for u in shared))
    return _square(G) + TRACE * v_small, _square(G) + TRACE * v_big


@pytest.mark.parametrize(("first", "micro_positions", "weights"), [
    (0, [[0, 1], [2, 3]], [2, 2]),  # within one epoch, the token-exact weights
    (3, [[3, 4], [5, 6]], [2, 2]),  # across the boundary: the tail of one epoch, the head of the next
    (4, [[4, 5], [6]], [2, 1]),  # a micro-batch that itself crosses it, uneven
    (2, [[2], [3, 4, 5]], [1, 1]),  # a per-batch mean divided by the steps: equal weights on uneven micro-batches
    (0, [[0, 1], [2, 3], [4]], [2, 2, 1]),  # the whole corpus: the step's mean is G itself
])
def test_the_variances_are_those_of_every_permutation_enumerated(first, micro_positions, weights):
    drawing = Drawing("epochs", N)
    expected = _by_enumeration(first, micro_positions, weights)
    assert _formula(drawing, micro_positions, weights, first) == pytest.approx(expected, rel=1e-12)


def test_two_ranks_shares_of_one_order_are_one_step_of_it():
    """Rank 0 takes positions 3-4 and rank 1 positions 5-6 of the same order (as gaplan's sampler slices a step):
    the step is the union, and the formula summed over the ranks is the enumeration of the union."""
    micro = [[3, 4], [5, 6]]
    assert _formula(Drawing("epochs", N), micro, [2, 2], 3) == pytest.approx(_by_enumeration(3, micro, [2, 2]),
                                                                              rel=1e-12)


def test_counting_the_draws_as_independent_is_what_biases_it():
    """The same step under the independent formula misses the enumeration, and the estimator that assumes it reads
    |G|^2 low by exactly tr(S)/(N - 1) and tr(S) high by N/(N - 1) (noise-scale.md)."""
    micro = [[0, 1], [2, 3]]
    small, big = _by_enumeration(0, micro, [2, 2])
    naive_small, naive_big = _formula(Drawing("independent"), micro, [2, 2], 0)
    assert naive_small > small * 1.01 and naive_big > big * 1.01
    b_small, b_big = 2, 4  # the independent estimator's two batches, on the enumerated expectations
    grad_sq = (b_big * big - b_small * small) / (b_big - b_small)
    grad_var = (small - big) / (1 / b_small - 1 / b_big)
    assert grad_sq == pytest.approx(_square(G) - TRACE / (N - 1), rel=1e-12)
    assert grad_var == pytest.approx(TRACE * N / (N - 1), rel=1e-12)


def test_per_call_draws_of_two_ranks_are_independent_parts():
    """Each rank's make_batch draws 2 of the 5 without replacement, independently: E|G_big|^2 over all pairs of
    draws, against the formula with one local part a rank (the meter adds the parts' squared weights)."""
    draws = list(itertools.permutations(range(N), 2))
    big = sum(_square(tuple((POINTS[a][k] + POINTS[b][k] + POINTS[c][k] + POINTS[d][k]) / 4 for k in range(2)))
              for (a, b), (c, d) in itertools.product(draws, draws)) / len(draws) ** 2
    # Two micro-batches of one sample each per rank, weight 1 each; rank r's part has weight 2 of 4.
    drawing = Drawing("per-call", N)
    _, v_big = inverse_sizes(drawing, 4, 4, 4, drawn=4.0, weight=4.0, weight_sq=4.0, part_sq=2.0 ** 2 + 2.0 ** 2)
    assert _square(G) + TRACE * v_big == pytest.approx(big, rel=1e-12)


def test_independent_draws_keep_one_over_n():
    v_small, v_big = inverse_sizes(Drawing("independent"), 4, 64, 64, 0.0, 4.0, 4 * 1 / 16, 0.0)
    assert (v_small, v_big) == pytest.approx((4 / 64, 1 / 64))


def test_declarations_and_the_parts_of_gaplans_order():
    assert Drawing.declared(None) == Drawing("unknown")
    assert Drawing.declared("independent") == Drawing("independent")
    assert Drawing.declared(100) == Drawing("per-call", 100)
    with pytest.raises(ValueError, match="expected 'independent'"):
        Drawing.declared("shuffled")
    with pytest.raises(ValueError, match="population of at least 2"):
        Drawing("epochs", 1)
    assert step_parts(8, 5, [range(8, 10), range(10, 13)]) == [((0, 2),), ((1, 3),)]
    assert step_parts(8, 5, [range(9, 11)]) == [((0, 1), (1, 1))]
    assert LOCAL < 0
