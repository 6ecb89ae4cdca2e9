"""The bootstrap interval of a strategy's evaluations-to-1% as a fraction of tpe's: seeded, honest
about spread, and printed and stored beside the fraction."""

from __future__ import annotations

import statistics

import pytest

from kernelforge.strategies.bench.run import LEVEL, fraction_interval

# A two-mode strategy, like auto on convolution: half its runs find the optimum's basin early, the
# others sit in another one for a hundred evaluations first.
TWO_MODES = [30, 35, 40, 45, 50, 140, 160, 180, 200, 220]
STEADY = [70, 75, 80, 85, 90, 95, 100, 105, 110, 115]


def test_the_interval_is_the_same_every_time():
    assert fraction_interval(TWO_MODES, STEADY) == fraction_interval(TWO_MODES, STEADY)
    assert fraction_interval(TWO_MODES, STEADY, seed=1) != fraction_interval(TWO_MODES, STEADY)


def test_no_spread_gives_the_fraction_itself():
    assert fraction_interval([10] * 7, [30] * 5) == pytest.approx((1 / 3, 1 / 3))


def test_the_interval_holds_the_fraction_and_is_wide_for_two_modes():
    low, high = fraction_interval(TWO_MODES, STEADY)
    fraction = statistics.median(TWO_MODES) / statistics.median(STEADY)
    assert low <= fraction <= high
    # Ten seeds of a two-mode strategy cannot tell half of tpe's evaluations from twice them.
    assert low < 0.67 and high > 1.5


def test_more_seeds_narrow_it():
    few = fraction_interval(TWO_MODES, STEADY)
    many = fraction_interval(TWO_MODES * 8, STEADY * 8)
    assert few[0] < many[0] <= many[1] < few[1]


def test_a_clear_difference_excludes_one():
    low, high = fraction_interval([20, 22, 25, 27, 30] * 4, [60, 70, 80, 90, 100] * 4)
    assert high < 0.67 and low > 0.2


def test_a_side_with_no_runs_is_an_error():
    with pytest.raises(ValueError):
        fraction_interval([], STEADY)


def test_a_narrower_level_gives_a_narrower_interval():
    wide = fraction_interval(TWO_MODES, STEADY, level=LEVEL)
    narrow = fraction_interval(TWO_MODES, STEADY, level=0.5)
    assert wide[0] <= narrow[0] <= narrow[1] <= wide[1] and narrow != wide
