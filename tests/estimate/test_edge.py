"""gaplan.estimate.edge: the line through traced sizes and what it predicts."""

from __future__ import annotations

import pytest

from gaplan.core.errors import GaplanError
from gaplan.estimate.edge import DEFAULT_SIZES, check_sizes, predict, secant


def test_secant_goes_through_the_two_largest_sizes():
    assert secant({1: 150, 2: 200, 4: 300}) == (100.0, 50.0)


def test_predict_stays_between_one_and_the_cap():
    points = {1: 150, 2: 200}  # 100 + 50 b
    assert predict(points, 1000, 4096) == 18
    assert predict(points, 1000, 10) == 10
    assert predict(points, 10, 4096) == 1
    assert predict({1: 200, 2: 200}, 1000, 64) == 64  # a flat line: the cap


def test_check_sizes():
    assert check_sizes(None) == DEFAULT_SIZES
    assert check_sizes([4, 2, 4]) == (2, 4)
    for bad in ([2, 2], [0, 1], [1]):
        with pytest.raises(GaplanError, match="two different"):
            check_sizes(bad)
