"""The archive of elites the LLM generator picks its parents from (MAP-Elites): one cell per
(template family, behaviour descriptor), each keeping its fastest verified candidate.

A candidate's family is the human template it descends from (:mod:`kernelforge.llm.lineage`);
its descriptor is what a kernel engineer tells kernels apart by: the tile (the product of its
``BLOCK*``/``TILE*`` parameters) and, when the run compiles ahead of time, the shared memory and
registers its kernels use, each bucketed in powers of two. Verified and ranked exactly as the
standings are (:func:`kernelforge.objective.rank`: geometric-mean speedup over the baseline on
every shape of the block), so the elite of a cell is the fastest candidate the prompt could show.

The archive is rebuilt from the store for every choice (the store is the truth: a resumed job sees
the same archive). :class:`ParentPicker` chooses, deterministically from the job's seed and the
number of earlier choices, either the exploitation parent (as before: the least-used of the
:data:`~kernelforge.llm.context.PARENT_POOL` fastest) or, for diversity, the elite of the least-used
cell (ties drawn from the seed), so parents are not only the fastest four. How often a candidate
was a parent is counted from the stored requests of earlier runs plus this run's.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from kernelforge.llm.context import PARENT_POOL
from kernelforge.llm.lineage import Ancestry
from kernelforge.objective import by_candidate, rank
from kernelforge.search.plan import block_spec
from kernelforge.space import is_integer

if TYPE_CHECKING:
    from kernelforge.llm.context import PromptContext
    from kernelforge.store.store import Store

#: The share of choices that take the exploitation parent (the rest explore the cells).
EXPLOIT_SHARE = 0.5
#: Parameters whose product is a candidate's tile (BLOCK, BLOCK_M, BLOCK_SIZE_K, TILE_N, ...).
TILE_PREFIXES = ("BLOCK", "TILE")


def bucket(value: float | None) -> int | None:
    """Powers of two: 0 for nothing (value < 1), k for a value in [2^(k-1), 2^k); None stays None."""
    if value is None:
        return None
    return 0 if value < 1 else int(math.floor(math.log2(value))) + 1


@dataclass(frozen=True)
class Descriptor:
    """A candidate's behaviour, bucketed (see :func:`bucket`): ``tile`` from its tile parameters
    (None without any), ``shared`` and ``registers`` the most any of its kernels uses (None without
    compile facts: a run that does not compile ahead of time tells candidates apart by tile only)."""

    tile: int | None
    shared: int | None = None
    registers: int | None = None

    @property
    def label(self) -> str:
        def power(name: str, b: int | None, unit: str = "") -> str:
            return f"{name} -" if b is None else f"{name} 0" if b == 0 else f"{name} >={2 ** (b - 1)}{unit}"
        return ", ".join((power("tile", self.tile), power("smem", self.shared, " B"),
                          power("regs", self.registers)))


def descriptor(params: Mapping[str, Any], kernels: Iterable[Mapping[str, Any]] | None = None) -> Descriptor:
    """The descriptor of a candidate's point and (optionally) its compiled kernels' resources."""
    tiles = [v for k, v in params.items()
             if k.upper().startswith(TILE_PREFIXES) and is_integer(v) and v > 0]
    tile = bucket(math.prod(tiles)) if tiles else None
    if kernels is None:
        return Descriptor(tile)
    kernels = list(kernels)

    def most(key: str) -> int | None:
        values = [k[key] for k in kernels if isinstance(k.get(key), int)]
        return bucket(max(values)) if values else None
    return Descriptor(tile, most("shared_bytes"), most("registers"))


@dataclass(frozen=True)
class Cell:
    """One niche of the archive: a family (human template id) and a descriptor."""

    family: str
    descriptor: Descriptor


@dataclass(frozen=True)
class Elite:
    """The fastest verified candidate of a cell. ``rank``: its place in the block's standings (0:
    the fastest); ``members``: every verified candidate of the cell, fastest first."""

    cell: Cell
    candidate_id: str
    template_id: str
    speedup: float
    rank: int
    members: tuple[str, ...]


@dataclass(frozen=True)
class Archive:
    """The elites of one block, fastest first, and the standings they come from."""

    block: str
    ranked: tuple[tuple[str, float], ...]  # (candidate id, speedup), fastest first
    elites: tuple[Elite, ...]

    @classmethod
    def build(cls, store: "Store", block: str, *, shapes: list[str], dtype: str, env_key: str, baseline_id: str,
              target: str | None = None) -> "Archive":
        """The archive of ``block`` from what ``store`` holds: candidates verified on every one of
        ``shapes`` under ``env_key`` and ``dtype``, ranked against ``baseline_id``; compile facts of
        ``target`` (None: none) in the descriptors."""
        table = by_candidate(r for r in store.results(block=block, dtype=dtype) if r.env_key == env_key)
        ranked = tuple(rank(table, baseline_id, shapes))
        candidates = {c.id: c for c in store.candidates(block)}
        kernels: dict[str, tuple] = {}
        if target:
            kernels = {c.candidate_id: c.kernels for c in store.compiles([cid for cid, _ in ranked], dtype)
                       if c.target == target}
        ancestry = Ancestry.from_store(store, block)
        cells: dict[Cell, list[tuple[int, str, float]]] = {}
        for place, (cid, value) in enumerate(ranked):
            stored = candidates.get(cid)
            if stored is None:
                continue
            cell = Cell(ancestry.family(stored.template),
                        descriptor(stored.params, kernels.get(cid) if target else None))
            cells.setdefault(cell, []).append((place, cid, value))
        elites = sorted((Elite(cell, rows[0][1], candidates[rows[0][1]].template, rows[0][2], rows[0][0],
                               tuple(cid for _, cid, _ in rows)) for cell, rows in cells.items()),
                        key=lambda e: e.rank)
        return cls(block, ranked, tuple(elites))

    def cell_of(self, candidate_id: str) -> Cell | None:
        """The cell of a verified candidate (None when it is not verified)."""
        return next((e.cell for e in self.elites if candidate_id in e.members), None)

    def best_by_template(self) -> dict[str, float]:
        """template id -> the best speedup of its verified candidates (for the lineage)."""
        best: dict[str, float] = {}
        for elite in self.elites:
            best[elite.template_id] = max(best.get(elite.template_id, 0.0), elite.speedup)
        return best


def archive_for(context: "PromptContext", block_id: str) -> Archive:
    """The archive of a block of the running search (its shapes, dtype, environment, baseline and
    compile target)."""
    run = context.view.run
    shapes = run.catalog.block(block_id).shapes(block_spec(run.job, block_id).shapes)
    return Archive.build(run.store, block_id, shapes=[s.name for s in shapes], dtype=run.dtype_name,
                         env_key=run.env_key, baseline_id=run.first_baseline(block_id).id, target=run.target)


class ParentMode(str, Enum):
    EXPLOIT = "exploit"  # the least-used of the fastest few
    EXPLORE = "explore"  # the elite of the least-used cell

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ParentChoice:
    """The parent of a new request (None: nothing verified yet), how it was chosen and its cell."""

    parent: str | None
    mode: ParentMode
    cell: Cell | None = None


class ParentPicker:
    """Chooses parents from archives (see the module docstring) and counts each candidate's
    children. Deterministic: the same seed, stored requests and archives give the same choices."""

    def __init__(self, seed: int, children: Mapping[str, int] | None = None,
                 choices: Mapping[str, int] | None = None):
        self.seed = seed
        #: candidate id -> how many new requests named it as their parent
        self.children: Counter[str] = Counter(children or {})
        #: block id -> how many parents were chosen for it (the draw's position)
        self.choices: Counter[str] = Counter(choices or {})

    @classmethod
    def from_store(cls, store: "Store", job: str, seed: int) -> "ParentPicker":
        """A picker that goes on after the new requests ``job`` stored in earlier runs."""
        calls = [c for c in store.llm_calls(job, final_only=True) if c.purpose == "new"]
        return cls(seed, Counter(c.parent for c in calls if c.parent), Counter(c.block for c in calls))

    def choose(self, archive: Archive) -> ParentChoice:
        """The parent of the next new request of ``archive.block`` (counted as one more child)."""
        draw = random.Random(f"{self.seed}:{archive.block}:{self.choices[archive.block]}")
        self.choices[archive.block] += 1
        if not archive.elites:
            return ParentChoice(None, ParentMode.EXPLOIT)
        if draw.random() < EXPLOIT_SHARE:
            # Best-first with diversity: among the best few, the one with the fewest children
            # (ties: the faster), so one lucky candidate does not absorb every request.
            top = [cid for cid, _ in archive.ranked[:PARENT_POOL]]
            parent = min(top, key=lambda cid: (self.children[cid], top.index(cid)))
            mode = ParentMode.EXPLOIT
        else:
            # A cell's use counts every member's children: a cell whose elite changed is not new.
            use = {e.cell: sum(self.children[m] for m in e.members) for e in archive.elites}
            least = min(use.values())
            parent = draw.choice([e for e in archive.elites if use[e.cell] == least]).candidate_id
            mode = ParentMode.EXPLORE
        self.children[parent] += 1
        return ParentChoice(parent, mode, archive.cell_of(parent))


__all__ = ["EXPLOIT_SHARE", "Archive", "Cell", "Descriptor", "Elite", "ParentChoice", "ParentMode", "ParentPicker",
           "archive_for", "bucket", "descriptor"]
