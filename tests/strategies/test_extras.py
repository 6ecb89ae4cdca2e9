"""The optional samplers' packages are declared as extras, and a strategy whose package is missing
says which extra to install, in one line (a UserError, never an ImportError traceback)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kernelforge.errors import UserError
from kernelforge.space import Space
from kernelforge.strategies.names import STRATEGIES, make_strategy

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the project's tomli fallback
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SPACE = Space.build({"BLOCK": [16, 32, 64], "num_warps": [1, 2, 4]}, [], where="test")


def _without(monkeypatch, *missing: str) -> None:
    """Make ``missing`` look uninstalled to importlib.util.find_spec (whether or not they are)."""
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name in missing else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_extras_declare_the_optional_sampler_packages():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert extras["gp"] == ["scipy"] and extras["cmaes"] == ["cmaes"]
    # Optional: neither is a core dependency nor forced on every developer install.
    names = " ".join(project["dependencies"] + extras["dev"])
    assert "scipy" not in names and "cmaes" not in names
    # Every optional package a strategy names is covered by an extra or the core dependencies.
    declared = " ".join(project["dependencies"] + [p for ps in extras.values() for p in ps])
    for entry in STRATEGIES.values():
        for package in entry.packages:
            assert package in declared, (entry.name, package)


@pytest.mark.parametrize("name, package, extra", [("cmaes", "cmaes", "cmaes"), ("gp", "scipy", "gp")])
def test_missing_sampler_package_names_the_extra(monkeypatch, name, package, extra):
    _without(monkeypatch, package)
    with pytest.raises(UserError) as info:
        make_strategy(name, SPACE, seed=0, baseline=None)
    message = str(info.value)
    assert f"'{package}'" in message and f"pip install 'kernelforge[{extra}]'" in message
    assert "\n" not in message
