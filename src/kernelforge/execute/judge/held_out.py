"""Which held-out shapes a candidate is verified on: drawn by the trusted side, per run.

Held-out shapes are the block's ``check`` shapes (odd sizes, ragged lengths, skewed routing) that
are not among the timed ones (else its ``smoke`` shapes): a kernel hard-coded to the timed shapes
fails there (EVALUATION.md #8). On a GPU every one of them is verified (milliseconds each). In the
interpreter a poisoned call costs 0.1-0.5 s on the shipped blocks' check shapes, so
:data:`INTERPRETER_HELD_OUT` of them are drawn per verification.

The draw comes from a seed of the run (:class:`HeldOutDraw`, ``secrets`` by default), never from
anything the candidate wrote: an earlier version hashed the source, and a nonce comment steered it
to a shape a hard-coded kernel handled. Each verification, and each confirmation, takes a new draw
from the run's generator. The seed is part of the executor's ``describe()`` (``held_out_seed``),
which every stored result keeps in its environment, without changing its ``env_key``.
"""

from __future__ import annotations

import random
import secrets
from typing import Sequence

from kernelforge.block import Block, Shape
from kernelforge.errors import UserError

#: Held-out shapes verified per verification (and per confirmation) in the interpreter.
INTERPRETER_HELD_OUT = 2


def held_out_pool(block: Block, timed: Sequence[Shape]) -> list[Shape]:
    """Every shape a candidate may be verified on besides ``timed``: the ``check`` shapes not
    among them, else the ``smoke`` shapes not among them (empty: none)."""
    names = {s.name for s in timed}
    for set_name in ("check", "smoke"):
        try:
            pool = [s for s in block.shapes(set_name) if s.name not in names]
        except UserError:
            pool = []
        if pool:
            return pool
    return []


class HeldOutDraw:
    """The held-out draws of one run: a generator seeded with ``seed`` (default: 63 random bits
    from ``secrets``), so a candidate cannot know or choose what it is verified on."""

    def __init__(self, seed: int | None = None):
        self.seed = secrets.randbits(63) if seed is None else seed
        self._rng = random.Random(self.seed)

    def draw(self, block: Block, timed: Sequence[Shape], *, whole_pool: bool) -> list[Shape]:
        """The held-out shapes of one verification of a candidate timed on ``timed``: the whole
        pool with ``whole_pool`` (a device that measures hardware: a GPU runs them all in moments),
        else a fresh draw of :data:`INTERPRETER_HELD_OUT` (a simulator such as the interpreter)."""
        pool = held_out_pool(block, timed)
        if whole_pool or len(pool) <= INTERPRETER_HELD_OUT:
            return pool
        return self._rng.sample(pool, INTERPRETER_HELD_OUT)
