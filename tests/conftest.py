"""Test set-up: tests run with Triton's interpreter on (CPU tensors), with the bf16 fix, except
when KERNELFORGE_TEST_DEVICE=cuda (scripts/gpu_check.sh runs the GPU tests that way)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from kernelforge.devices import interpreter

if os.environ.get("KERNELFORGE_TEST_DEVICE", "interpret") != "cuda":
    interpreter.enable()

# The suite runs as 2 xdist workers on 2 cores: torch's own intra-op threads on top of that made
# small reference ops hundreds of times slower under load (measured 737 ms instead of 0.95 ms).
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def catalog():
    from kernelforge.catalog import Catalog

    return Catalog.discover(REPO / "kernels")
