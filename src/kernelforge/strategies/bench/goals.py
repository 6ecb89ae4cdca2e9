"""The bar a strategy is held to on a space: met, missed, undecided or not applicable, each with its
figures.

``auto`` exists to beat the reference (``tpe``, Optuna's default) on spaces it has never seen, so
a bench of new recorded spaces should say plainly whether it does. Per space, each strategy other
than the reference and the floor (``random``) is read against both:

1. **Fewer evaluations:** its median evaluations to 1% is at most :data:`FRACTION` (two thirds) of
   the reference's, wherever the reference needs more than :data:`QUICK` (30) evaluations; where
   the reference is quicker the goal does not apply (a few evaluations apart is noise there).
2. **As reliable:** its hit rate to 1% within the budget is at least the reference's.
3. **Never worse than random:** its median evaluations to 1% is at most random's.
4. **Early budgets:** at each of :data:`EARLY` (25, 50 and 100 evaluations) within the budget,
   its median best/optimum is no worse than the reference's.

Medians count a seed that missed 1% as ``budget + 1``, as every figure of the bench does. Where a
seed that missed is among a median's middle values, that median is only a lower bound
(:func:`~.run.median_is_bound`: a longer budget would give a larger one), and a goal that compares
it is decided only where the bound decides it: a strategy whose own median is a bound never meets
goal 1 or 3, and misses it only against an exact median; a strategy with an exact median meets it
against a bound it is within, and is otherwise *undecided* (the reference missed too often in this
budget to say; bench a longer budget). In a bench run with ``--stop`` a
checkpoint past a run's stop reads its best at the stop (within 1%, perhaps not the best it would
have found by then), so goal 4 may be decided by under 1% either way there; judge it on runs
without ``--stop``. Ask time is measured by ``benchmarks/ask_time.py``, not here (a bench's asks
run beside each other).

The transfer goals (:func:`transfer_goals`) read a warm bench of a space against a cold bench of
the same space, seeds and budget (``strategy-bench --warm-from SPACE --with-cold``): per strategy,
its warm median evaluations to 1% is at most :data:`HALF` of its cold one (the warm start halves
them) and at most its cold one (never worse), decided the same way where a median is a bound.

Every figure comes from the bench's rows (:class:`~.run.BenchRow`); this module only compares.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Sequence

from kernelforge.strategies.bench.run import (FLOOR, REFERENCE, THRESHOLDS, BenchRow, SpaceBench, evaluations_text,
                                          median_is_bound, space_label)

__all__ = ["EARLY", "FRACTION", "HALF", "QUICK", "Goal", "Verdict", "bench_goals", "goals", "tally",
           "tally_text", "transfer_goals", "transfer_pairs"]

#: Goal 1: at most this fraction of the reference's median evaluations to 1%.
FRACTION = 2 / 3
#: Goal 1 applies where the reference's median evaluations to 1% is above this.
QUICK = 30
#: Goal 4: the checkpoints (evaluations) of the early budgets.
EARLY = (25, 50, 100)
#: The transfer goal: a warm start needs at most this fraction of a cold start's evaluations to 1%.
HALF = 0.5


class Verdict(enum.Enum):
    MET = "met"
    MISSED = "missed"
    #: A median compared is only a bound, and the bound does not decide (module docstring).
    UNDECIDED = "undecided"
    NOT_APPLICABLE = "n/a"


@dataclass(frozen=True)
class Goal:
    """One goal of one strategy on one space: what it asks (``goal``), the two figures it compares
    (``value`` the strategy's; ``against`` the reference's, random's or, for a transfer goal, its
    own cold start's; both as printed) and the verdict. ``warm_from``: the warm start of the bench
    whose figures a goal of :func:`goals` reads (None: a cold bench; a transfer goal names its warm
    start in ``goal``), so a space benched both ways has its two sets of goals told apart."""

    space: str
    strategy: str
    goal: str
    value: str
    against: str
    verdict: Verdict
    warm_from: str | None = None

    @property
    def where(self) -> str:
        """The space, and the warm start its figures come from."""
        return space_label(self.space, self.warm_from)


def goals(result: SpaceBench) -> tuple[Goal, ...]:
    """Every goal of every strategy of ``result`` but the reference and the floor (module
    docstring); empty when either of those two was not benched."""
    rows = {row.strategy: row for row in result.rows}
    ref, floor = rows.get(REFERENCE), rows.get(FLOOR)
    if ref is None or floor is None:
        return ()
    out: list[Goal] = []
    for row in result.rows:
        if row.strategy not in (REFERENCE, FLOOR):
            out += [_goal(result, row, *check, warm_from=result.warm_from) for check in _checks(row, ref, floor)]
    return tuple(out)


def transfer_pairs(results: Sequence[SpaceBench]) -> list[tuple[SpaceBench, SpaceBench]]:
    """(cold, warm) for every space of ``results`` benched both cold and warm, with the same seeds
    and budget, in the warm benches' order."""
    cold = {r.name: r for r in results if r.warm_from is None}
    return [(cold[r.name], r) for r in results if r.warm_from is not None and r.name in cold
            and (cold[r.name].seeds, cold[r.name].budget) == (r.seeds, r.budget)]


def transfer_goals(cold: SpaceBench, warm: SpaceBench) -> tuple[Goal, ...]:
    """Per strategy benched both cold and warm on one space: the warm start halves its median
    evaluations to 1% (at most :data:`HALF` of the cold one), and is never worse (at most the
    cold one). A warm median that is a bound meets neither (module docstring)."""
    t = THRESHOLDS[0]
    rows = {row.strategy: row for row in cold.rows}
    out: list[Goal] = []
    for row in warm.rows:
        if row.strategy not in rows or row.strategy == FLOOR:
            continue
        cold_row = rows[row.strategy]
        for goal, factor in ((f"warm from {warm.warm_from}: evaluations to 1% at most half of cold's", HALF),
                             (f"warm from {warm.warm_from}: evaluations to 1% at most cold's", 1.0)):
            out.append(_goal(warm, row, goal, evaluations_text(row, t), evaluations_text(cold_row, t),
                             _at_most(row, factor, cold_row)))
    return tuple(out)


def bench_goals(results: Sequence[SpaceBench]) -> tuple[tuple[Goal, ...], tuple[Goal, ...]]:
    """Every goal of a bench's ``results``: the goals of each space (:func:`goals`), and the
    transfer goals of each space benched cold and warm (:func:`transfer_goals`)."""
    return (tuple(goal for result in results for goal in goals(result)),
            tuple(goal for cold, warm in transfer_pairs(results) for goal in transfer_goals(cold, warm)))


def tally(found: Sequence[Goal]) -> dict[Verdict, int]:
    """How many goals have each verdict."""
    return {verdict: sum(g.verdict is verdict for g in found) for verdict in Verdict}


def tally_text(found: Sequence[Goal]) -> str:
    """The counts as every table prints them: met, missed and not applicable, and undecided where
    any goal is."""
    counts = tally(found)
    text = (f"met {counts[Verdict.MET]}, missed {counts[Verdict.MISSED]}, not applicable "
            f"{counts[Verdict.NOT_APPLICABLE]}")
    return text + (f", undecided {counts[Verdict.UNDECIDED]}" if counts[Verdict.UNDECIDED] else "")


def _checks(row: BenchRow, ref: BenchRow, floor: BenchRow) -> list[tuple[str, str, str, Verdict]]:
    t = THRESHOLDS[0]
    theirs = ref.median_evaluations[t]
    if theirs > QUICK:
        fewer = _at_most(row, FRACTION, ref)
    else:  # tpe is quick: n/a, unless its median is a bound that may yet pass QUICK
        fewer = Verdict.UNDECIDED if median_is_bound(ref, t) else Verdict.NOT_APPLICABLE
    out = [
        (f"evaluations to 1% at most {FRACTION:.2f} of {REFERENCE}'s where {REFERENCE} needs more than {QUICK}",
         evaluations_text(row, t), evaluations_text(ref, t), fewer),
        (f"hit rate to 1% at least {REFERENCE}'s", f"{row.hit_rate[t]:.0%}", f"{ref.hit_rate[t]:.0%}",
         _verdict(row.hit_rate[t] >= ref.hit_rate[t])),
        (f"evaluations to 1% at most {FLOOR}'s", evaluations_text(row, t), evaluations_text(floor, t),
         _at_most(row, 1.0, floor)),
    ]
    for c in EARLY:
        if c in row.median_best_ratio_at and c in ref.median_best_ratio_at:
            a, b = row.median_best_ratio_at[c], ref.median_best_ratio_at[c]
            out.append((f"median best/optimum after {c} evaluations at most {REFERENCE}'s", _ratio(a), _ratio(b),
                        _verdict(math.isfinite(a) and a <= b)))
    return out


def _goal(result: SpaceBench, row: BenchRow, goal: str, value: str, against: str, verdict: Verdict, *,
          warm_from: str | None = None) -> Goal:
    return Goal(space=result.name, strategy=row.strategy, goal=goal, value=value, against=against, verdict=verdict,
                warm_from=warm_from)


def _verdict(holds: bool) -> Verdict:
    return Verdict.MET if holds else Verdict.MISSED


def _at_most(row: BenchRow, factor: float, other: BenchRow) -> Verdict:
    """Whether ``row``'s median evaluations to 1% is at most ``factor`` times ``other``'s, where either
    may be a lower bound (:func:`~.run.median_is_bound`): met only with an exact median of ``row``
    within the bound, missed only past an exact median of ``other``, else undecided."""
    t = THRESHOLDS[0]
    mine, theirs = row.median_evaluations[t], factor * other.median_evaluations[t]
    if not median_is_bound(row, t) and mine <= theirs:
        return Verdict.MET
    if not median_is_bound(other, t) and mine > theirs:
        return Verdict.MISSED
    return Verdict.UNDECIDED


def _ratio(value: float) -> str:
    return f"{value:.3f}" if math.isfinite(value) else "none found"
