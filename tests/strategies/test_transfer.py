"""The order warm points are taken in (``strategies/transfer.py``'s ``spread``): best first, spread
over the source's good regions, filled up by rank where the ranking offers too few such points."""

from __future__ import annotations

from kernelforge.strategies.transfer import APART, spread

# Ranked best first: a region of three one-parameter neighbours, then other regions.
RANKED = [(32, 1, 2), (64, 1, 2), (32, 1, 4), (128, 2, 2), (128, 2, 4), (256, 4, 1), (32, 2, 2)]


def test_the_best_of_each_region_comes_before_the_neighbours_of_a_point_taken():
    assert APART == 2
    # 64,1,2 and 32,1,4 are one parameter from 32,1,2; 128,2,4 is one from 128,2,2.
    assert spread(RANKED, 3) == [(32, 1, 2), (128, 2, 2), (256, 4, 1)]
    assert spread(RANKED, 1) == [(32, 1, 2)]


def test_too_few_spread_points_fill_up_in_rank_order():
    # 32,2,2 is one from 32,1,2: only three points are two apart; the best others fill up.
    assert spread(RANKED, 5) == [(32, 1, 2), (128, 2, 2), (256, 4, 1), (64, 1, 2), (32, 1, 4)]
    assert spread(RANKED, 20) == [(32, 1, 2), (128, 2, 2), (256, 4, 1), (64, 1, 2), (32, 1, 4), (128, 2, 4), (32, 2, 2)]
    assert spread([], 4) == [] and spread(RANKED, 0) == []


def test_items_are_compared_by_their_key_and_returned_whole():
    points = [{"bx": k[0], "by": k[1], "t": k[2], "name": f"p{i}"} for i, k in enumerate(RANKED)]
    taken = spread(points, 3, key=lambda p: (p["bx"], p["by"], p["t"]))
    assert [p["name"] for p in taken] == ["p0", "p3", "p5"]
    # With apart=1 every distinct point counts as spread: plain rank order.
    assert spread(RANKED, 4, apart=1) == RANKED[:4]
