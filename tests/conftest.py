"""Test set-up: every test runs with Triton's interpreter on (CPU tensors), with the bf16 fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelforge import interpreter

interpreter.enable()

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def catalog():
    from kernelforge.catalog import Catalog

    return Catalog.discover(REPO / "kernels")
