"""The toy job the tests of several workers run: the toy block (tests/fixtures/kernels) in the
interpreter with the grid strategy, so every worker asks its points in the same order, and the
command line that runs it."""

from __future__ import annotations

import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kernels"
CLI = [sys.executable, "-m", "kernelforge", "--kernels", str(FIXTURES)]

def job_text(name: str, *, device: str = "interpret", dtype: str = "float16", strategy: str = "grid",
             evaluations: int = 5, block: str = "toy/axpy", shapes: str = "check", seed: int | None = None,
             tune: str | None = None, tables: str = "") -> str:
    """The text of a job file on the toy fixtures: the fields the tests vary, one block, and
    ``tables`` (TOML) appended. The one job-file template of the tests."""
    job = [f'name = "{name}"', f'device = "{device}"', f'dtype = "{dtype}"']
    job += [f'tune = "{tune}"'] if tune is not None else []
    job += [f"seed = {seed}"] if seed is not None else []
    return ("[job]\n" + "\n".join(job) + f'\n\n[strategy]\nname = "{strategy}"\nevaluations = {evaluations}\n\n'
            f'[[blocks]]\nid = "{block}"\nshapes = "{shapes}"\n' + (f"\n{tables}" if tables else ""))


def write_job(folder: Path, name: str, **fields) -> Path:
    """Write :func:`job_text` as ``folder/<name>.toml``; its path."""
    path = folder / f"{name}.toml"
    path.write_text(job_text(name, **fields))
    return path


def toy_job(tmp_path: Path, name: str, evaluations: int, device: str = "interpret", seed: int = 0) -> Path:
    """Write the toy job ``name`` (``evaluations`` per study) into ``tmp_path``; its path."""
    return write_job(tmp_path, name, device=device, evaluations=evaluations, seed=seed)
