"""`normal_quantile` (AS 241 in numpy, on the path of ``thrifty solve`` instead of
``scipy.special.ndtri``) agrees with scipy's to a few units in the last place,
tails, ends and bad inputs included."""

import numpy as np
import pytest

from thrifty.perfmodels.normal import normal_quantile

ndtri = pytest.importorskip("scipy.special").ndtri


def test_it_agrees_with_scipy_in_the_centre_and_both_tails():
    rng = np.random.default_rng(0)
    for p in (rng.random(200_000), np.exp(-rng.random(50_000) * 700), 1 - rng.random(50_000) * 1e-12):
        np.testing.assert_allclose(normal_quantile(p), ndtri(p), rtol=4e-15, atol=0)


def test_ends_and_values_outside_zero_to_one():
    p = np.array([0.0, 1.0, 0.5, -0.1, 1.1, np.nan])
    np.testing.assert_array_equal(normal_quantile(p), ndtri(p))
    assert normal_quantile(0.975) == pytest.approx(1.959963984540054, rel=1e-15)
