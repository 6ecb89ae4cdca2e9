"""scripts/wheels.py (behind scripts/prepare_wheels.sh): which wheels the GPU image needs, without
the network (pip's download is replaced by a fake index of tiny wheels)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("wheels", ROOT / "scripts" / "wheels.py")
wheels = importlib.util.module_from_spec(spec)
sys.modules["wheels"] = wheels  # dataclasses look their module up there
spec.loader.exec_module(wheels)


def make_wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    meta = "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                      *[f"Requires-Dist: {r}" for r in requires]])
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", meta)
    return path


#: A fake index: name -> (version, Requires-Dist lines).
INDEX = {
    "optuna": ("9.0", ["alembic>=1.5", "sqlalchemy>=1.4", "numpy", "colorlog", "pytest; extra == 'test'"]),
    "alembic": ("1.9", ["sqlalchemy>=1.4", "mako", "tomli; python_version < '3.11'"]),
    "sqlalchemy": ("2.5", ["typing-extensions>=4", "greenlet>=1; extra == 'asyncio'"]),
    "mako": ("1.3", ["MarkupSafe>=0.9.2"]),
    "colorlog": ("6.0", ["colorama; sys_platform == 'win32'"]),
}


@pytest.fixture
def fake_pip(monkeypatch):
    asked: list[list[str]] = []

    def fetch(specs, dest):
        asked.append(list(specs))
        for s in specs:
            name = wheels.Requirement(s).name
            if name not in INDEX:
                raise wheels.WheelError(f"no CPython 3.12 manylinux or pure-Python wheel of {s}")
            make_wheel(dest, name, INDEX[name][0], INDEX[name][1])

    monkeypatch.setattr(wheels, "fetch", fetch)
    return asked


def project(tmp_path: Path, deps: list[str]) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text("[project]\nname = 'x'\ndependencies = [%s]\n" % ", ".join(repr(d) for d in deps))
    return path


def test_the_closure_skips_the_image_extras_and_other_platforms(tmp_path, fake_pip):
    on_image = {"numpy", "typing-extensions", "markupsafe", "torch", "jinja2"}
    chosen = wheels.resolve(project(tmp_path, ["torch>=2.4", "optuna>=4", "jinja2", "tomli; python_version < '3.11'"]),
                            tmp_path, on_image)
    # greenlet (an extra), tomli (Python < 3.11), colorama (Windows), pytest (an extra) and what the
    # image has are not fetched; every other package once, sqlalchemy although two ask for it.
    assert sorted(chosen) == ["alembic", "colorlog", "mako", "optuna", "sqlalchemy"]
    assert chosen["sqlalchemy"][0].wanted_by == ["optuna", "alembic"]
    # Level by level, one pip call each, pinned to this interpreter's optuna.
    assert fake_pip[0] == [f"optuna=={importlib.metadata.version('optuna')}"]
    assert len(fake_pip) == 3 and sorted(s.split("=")[0] for s in fake_pip[1]) == ["alembic", "colorlog", "sqlalchemy"]


def test_a_missing_wheel_is_a_clear_error(tmp_path, fake_pip):
    with pytest.raises(wheels.WheelError, match="nosuchpkg"):
        wheels.resolve(project(tmp_path, ["nosuchpkg>=1"]), tmp_path, set())


def test_main_reports_a_missing_wheel_without_a_traceback(tmp_path, fake_pip, monkeypatch, capsys):
    monkeypatch.setattr(wheels, "image_packages", lambda: set())
    code = wheels.main(["--dest", str(tmp_path / "whl"), "--pyproject", str(project(tmp_path, ["nosuchpkg"]))])
    assert code == 1 and "prepare_wheels: no CPython 3.12" in capsys.readouterr().err


def test_main_replaces_stale_wheels(tmp_path, fake_pip, monkeypatch):
    dest = tmp_path / "whl"
    dest.mkdir()
    make_wheel(dest, "mako", "0.1", [])  # an older version left from an earlier run
    monkeypatch.setattr(wheels, "image_packages", lambda: {"markupsafe"})
    assert wheels.main(["--dest", str(dest), "--pyproject", str(project(tmp_path, ["mako"]))]) == 0
    assert [p.name for p in dest.glob("*.whl")] == ["mako-1.3-py3-none-any.whl"]


def test_the_pin_is_the_installed_version_when_it_fits():
    installed = importlib.metadata.version("click")
    assert wheels.pin(wheels.Wanted("click", wheels.SpecifierSet(">=1"))) == f"click=={installed}"
    assert wheels.pin(wheels.Wanted("click", wheels.SpecifierSet(">=999"))) == "click>=999"


def test_the_image_list_has_what_the_issue_says_and_lacks_what_it_lacks():
    on_image = wheels.image_packages()
    assert {"torch", "triton", "jinja2", "click", "rich", "numpy", "pytest"} <= on_image
    assert not {"optuna", "sqlalchemy", "alembic", "greenlet"} & on_image
