"""Deliberately wrong templates (tests/mutants/<block>/*.py.j2) must all be reported as wrong.

Each mutant is a copy of a baseline with one classic bug (mask off by one, sink dropped, window
wrong, an expert skipped, ...). A verifier that passes any of them cannot be trusted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.execute.runner import load_candidate
from kernelforge.result import Status
from kernelforge.template import Template
from kernelforge.execute.judge.verify import verify
from kernel_helpers import check_dtype

pytestmark = pytest.mark.interpreter

TESTS = Path(__file__).resolve().parents[1]
MUTANTS = sorted((TESTS / "mutants").glob("*/*/*.py.j2"))
CATALOG = Catalog.discover(TESTS.parent / "kernels")


def _block_id(path: Path) -> str:
    return path.parent.relative_to(TESTS / "mutants").as_posix()


def test_every_block_has_mutants():
    assert {_block_id(p) for p in MUTANTS} >= set(CATALOG.blocks)


@pytest.mark.parametrize("path", MUTANTS, ids=lambda p: f"{_block_id(p)}/{p.stem}")
def test_mutant_is_reported_wrong(path):
    block_id = _block_id(path)
    block = CATALOG.block(block_id)
    template = Template.from_file(path, block_id)
    module, failure = load_candidate(Candidate.from_template(template).source, f"mutant_{path.stem}")
    assert failure is None
    results = verify(block, module.run, block.shapes("smoke") + block.shapes("check"), check_dtype(block), "cpu")
    final = results[-1][1]
    assert final.status is Status.WRONG, f"{path.name} slipped through: {[v.status.value for _, v in results]}"
