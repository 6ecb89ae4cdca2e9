"""Issue 32's reproducible installs: constraints.txt pins every package pyproject.toml asks for,
every pip install of the Makefile goes through it, and `make demo` installs only what the main job
needs (no dev extra) and prints the search's summary, not the whole REPORT.md."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def test_constraints_pin_every_dependency_and_the_dev_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [r for r in project["dependencies"] + project["optional-dependencies"]["dev"]
              if "python_version < '3.11'" not in r]
    pins = _pins()
    missing = [_name(r) for r in wanted if _name(r) not in pins]
    assert not missing, f"constraints.txt lacks {missing}: run `make lock`"
    makefile = (ROOT / "Makefile").read_text()
    assert pins["torch"] in makefile and pins["triton"] in makefile  # TORCH_SPEC / TRITON_SPEC agree


def _dry_run(target: str, tmp_path: Path) -> list[str]:
    done = subprocess.run(["make", "-n", "-B", target, f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    return done.stdout.splitlines()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_installs_through_the_constraints_and_demo_skips_the_dev_extra(tmp_path):
    demo = _dry_run("demo", tmp_path)
    installs = [line for line in demo if "pip install" in line]
    assert installs and all("-c constraints.txt" in line for line in installs)
    assert not any("[dev]" in line for line in demo)
    assert not any("kernelforge report" in line for line in demo)  # the search prints the summary and the path
    test = _dry_run("test", tmp_path)
    dev = [line for line in test if "pip install" in line and "[dev]" in line]
    assert dev and all("-c constraints.txt" in line for line in dev)
