"""``auto``'s portfolio rules: which member proposes an ask, and the order of the local member's moves.

Both are pure functions of the history, tested on their own
(:class:`~kernelforge.strategies.auto.strategy.AutoStrategy` calls them; see its module docstring, 2).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from kernelforge.strategies.base import Key

__all__ = ["MEMBERS", "basin_leaders", "member_odds", "untried_directions"]

#: The portfolio's members: the GP's expected improvement, the Parzen ratio, the local search.
MEMBERS = ("gp", "parzen", "local")


def member_odds(gains: Sequence[tuple[str, float]], floor: float) -> dict[str, float]:
    """Each member's odds of proposing the next ask, from ``gains``: (member, how much a point it
    proposed improved the best) for the recent tells. A member's rate is the sum of its gains over
    one more than the number of its tells: a member is not favoured for having been asked often,
    and the one added keeps a member told once from counting its one gain at full rate. The odds
    follow the rates, with ``floor`` of the total added to every member; even odds while no member
    has gained."""
    rates = {}
    for m in MEMBERS:
        mine = [g for who, g in gains if who == m]
        rates[m] = sum(mine) / (len(mine) + 1)
    total = sum(rates.values())
    if total <= 0:
        return {m: 1 / len(MEMBERS) for m in MEMBERS}
    return {m: (floor * total + rates[m]) / ((1 + len(MEMBERS) * floor) * total) for m in MEMBERS}


def untried_directions(parent: Key, moves: Sequence[Key], seen: Iterable[Key]) -> list[Key]:
    """Those of ``moves`` (unseen one-parameter moves of ``parent``) along the parameters least
    tried from ``parent``: the fewest of ``seen`` (the told and pending points) that differ from
    it in that parameter alone. The local member takes each parameter once before any twice."""
    def direction(key: Key) -> int | None:
        changed = [i for i, (a, b) in enumerate(zip(key, parent)) if a != b]
        return changed[0] if len(changed) == 1 else None

    tried = [0] * len(parent)
    for key in seen:
        i = direction(key)
        if i is not None:
            tried[i] += 1
    counts = [tried[direction(key)] for key in moves]
    fewest = min(counts)
    return [key for key, count in zip(moves, counts) if count == fewest]


def basin_leaders(codes: np.ndarray) -> list[int]:
    """The rows of ``codes`` (told points as value positions, one row a point, the best first) that
    no better row is one parameter away from, best first: the best point of each basin told so
    far, row 0 (the best) always among them. Once the search has stalled, the local member takes
    its parents from these, the other basins' first (:attr:`AutoStrategy.stall`)."""
    codes = np.asarray(codes)
    neighbours = (codes[:, None, :] != codes[None, :, :]).sum(axis=2) == 1
    return [i for i in range(len(codes)) if not neighbours[i, :i].any()]
