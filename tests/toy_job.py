"""The toy job the tests of several workers run: the toy block (tests/fixtures/kernels) in the
interpreter with the grid strategy, so every worker asks its points in the same order, and the
command line that runs it."""

from __future__ import annotations

import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kernels"
CLI = [sys.executable, "-m", "kernelforge", "--kernels", str(FIXTURES)]

JOB = """
[job]
name = "{name}"
device = "{device}"
dtype = "float16"
seed = {seed}

[strategy]
name = "grid"
evaluations = {evaluations}

[[blocks]]
id = "toy/axpy"
shapes = "check"
"""


def toy_job(tmp_path: Path, name: str, evaluations: int, device: str = "interpret", seed: int = 0) -> Path:
    """Write the toy job ``name`` (``evaluations`` per study) into ``tmp_path``; its path."""
    path = tmp_path / f"{name}.toml"
    path.write_text(JOB.format(name=name, device=device, evaluations=evaluations, seed=seed))
    return path
