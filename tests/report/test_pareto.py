"""The time-energy Pareto front on hand-built points: dominance, ties and unmeasured energies."""

from __future__ import annotations

from kernelforge.report.pareto import ParetoPoint, dominates, pareto_front


def test_front_keeps_exactly_the_non_dominated_points():
    front = pareto_front("all", [
        ("fast", 1.0, 10.0),     # fastest
        ("frugal", 3.0, 2.0),    # least energy
        ("middle", 2.0, 5.0),    # a trade-off between the two
        ("worse", 2.5, 6.0),     # dominated by middle
        ("slow", 3.0, 2.5),      # dominated by frugal (same time, more energy)
    ])
    assert [p.candidate for p in front.front] == ["fast", "middle", "frugal"]
    assert {p.candidate for p in front.points if not p.on_front} == {"worse", "slow"}


def test_ties_are_all_on_the_front_and_unmeasured_energy_is_left_out():
    front = pareto_front("s1", [("a", 1.0, 1.0), ("b", 1.0, 1.0), ("c", 0.5, None), ("d", 2.0, 2.0)])
    assert {p.candidate for p in front.front} == {"a", "b"}
    assert front.unmeasured == 1 and "c" not in {p.candidate for p in front.points}


def test_dominance_needs_a_strict_gain_and_two_energies():
    assert dominates(ParetoPoint("a", 1.0, 1.0), ParetoPoint("b", 1.0, 2.0))
    assert not dominates(ParetoPoint("a", 1.0, 1.0), ParetoPoint("b", 1.0, 1.0))
    assert not dominates(ParetoPoint("a", 1.0, None), ParetoPoint("b", 2.0, 2.0))
