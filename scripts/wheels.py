"""Fill a folder with the wheels the GPU image lacks (run by scripts/prepare_wheels.sh).

The GPU image (Python 3.12, no network) has torch, triton, jinja2, click, rich, numpy and many more
(scripts/gpu_image_packages.txt), but not optuna, sqlalchemy, alembic or openai. This walks
kernelforge's dependencies (pyproject.toml) and theirs, read from each downloaded wheel's METADATA
with markers evaluated for the image (CPython 3.12 on x86-64 Linux), skips what the image has, and
downloads one wheel of every other package: CPython 3.12 manylinux or pure Python. A package is
pinned to the version installed in this interpreter when that version fits every requirement seen
(so the GPU runs what the tests here ran), else pip picks the newest that fits.

The wheels are staged in a temporary folder and replace the destination's *.whl only when every one
was found, so the folder always holds one version of each (two versions stop `pip install`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
except ImportError:  # pip always carries a copy
    from pip._vendor.packaging.markers import Marker  # type: ignore[no-redef]
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.specifiers import SpecifierSet  # type: ignore[no-redef]

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
IMAGE_LIST = Path(__file__).with_name("gpu_image_packages.txt")

#: The marker environment of the GPU image's python3 (KINDS.md: Python 3.12.3 on x86-64 Linux).
IMAGE_ENV = {
    "python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
    "implementation_version": "3.12.3", "platform_python_implementation": "CPython", "os_name": "posix",
    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "extra": "",
}
#: The device README's platform list, then the extra glibc levels it suggests when none matches.
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]
EXTRA_PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (24, 31, 34, 35, 39)]


def normalise(name: str) -> str:
    """PEP 503 name: lower case, runs of -_. as one dash."""
    return re.sub(r"[-_.]+", "-", name).lower()


class WheelError(Exception):
    """A wheel could not be found or read; the message names the package and the fix."""


@dataclass
class Wanted:
    """One package to fetch: every specifier seen for it and who asked."""

    name: str
    specifier: SpecifierSet = field(default_factory=SpecifierSet)
    wanted_by: list[str] = field(default_factory=list)


def image_packages(path: Path = IMAGE_LIST) -> set[str]:
    """Normalised names of the packages the GPU image already holds (one a line, # comments)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return {normalise(line) for line in lines if line}


def applies(req: Requirement) -> bool:
    """Whether a requirement (no extra asked) holds on the GPU image."""
    return req.marker is None or Marker(str(req.marker)).evaluate(IMAGE_ENV)


def project_requirements(pyproject: Path) -> list[Requirement]:
    """kernelforge's own runtime dependencies (not its extras) that hold on the image."""
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    return [r for r in map(Requirement, data["project"]["dependencies"]) if applies(r)]


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """The Requires-Dist lines of a wheel's METADATA that hold on the image with no extra."""
    with zipfile.ZipFile(wheel) as z:
        meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        if meta is None:
            raise WheelError(f"{wheel.name}: no .dist-info/METADATA inside; delete it and run again")
        text = z.read(meta).decode("utf-8", "replace")
    lines = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]
    return [r for r in map(Requirement, lines) if applies(r)]


def pin(want: Wanted) -> str:
    """``name==installed`` when this interpreter's version fits, else ``name<specifier>``."""
    try:
        version = importlib.metadata.version(want.name)
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version is not None and want.specifier.contains(version, prereleases=True):
        return f"{want.name}=={version}"
    return f"{want.name}{want.specifier}"


def download(specs: list[str], dest: Path, platforms: list[str]) -> subprocess.CompletedProcess:
    """One `pip download` of CPython 3.12 wheels (the device README's command) into ``dest``."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", *[a for p in platforms for a in ("--platform", p)], "-d", str(dest), *specs]
    return subprocess.run(cmd, capture_output=True, text=True)


def fetch(specs: list[str], dest: Path) -> None:
    """Download ``specs``; on a failure retry each alone, then with the extra glibc levels."""
    if download(specs, dest, PLATFORMS).returncode == 0:
        return
    for spec in specs:
        if download([spec], dest, PLATFORMS).returncode == 0:
            continue
        done = download([spec], dest, PLATFORMS + EXTRA_PLATFORMS)
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[-3:])
            raise WheelError(
                f"no CPython 3.12 manylinux or pure-Python wheel of {spec} on pip's index "
                f"(platforms {', '.join(PLATFORMS + EXTRA_PLATFORMS)}).\npip said: {tail}\n"
                f"Fix: install a version of it that has such a wheel into this interpreter (it is pinned "
                f"to the installed one), or check `pip config list` for the index.")


def wheel_of(folder: Path, name: str) -> Path:
    """The one wheel of ``name`` in ``folder``."""
    found = [w for w in folder.glob("*.whl") if normalise(w.name.split("-", 1)[0]) == name]
    if len(found) != 1:
        raise WheelError(f"expected one wheel of {name} in {folder}, found {len(found)}: {[w.name for w in found]}")
    return found[0]


def resolve(pyproject: Path, staging: Path, on_image: set[str]) -> dict[str, tuple[Wanted, Path]]:
    """Fetch the missing closure level by level; name -> (what asked for it, its wheel)."""
    wanted: dict[str, Wanted] = {}
    done: dict[str, tuple[Wanted, Path]] = {}

    def ask(reqs: list[Requirement], by: str) -> list[str]:
        new = []
        for r in reqs:
            name = normalise(r.name)
            if name in on_image:
                continue
            w = wanted.setdefault(name, Wanted(name))
            w.specifier &= r.specifier
            w.wanted_by.append(by)
            if name in done:
                version = done[name][1].name.split("-")[1]
                if not r.specifier.contains(version, prereleases=True):
                    raise WheelError(f"{by} needs {r}, but {done[name][1].name} was already chosen; "
                                     f"install versions that agree into this interpreter and run again")
            elif name not in new:
                new.append(name)
        return new

    level = ask(project_requirements(pyproject), "kernelforge")
    while level:
        level = [n for n in level if n not in done]
        fetch([pin(wanted[n]) for n in level], staging)
        following: list[str] = []
        for name in level:
            wheel = wheel_of(staging, name)
            done[name] = (wanted[name], wheel)
        for name in level:
            following += [n for n in ask(wheel_requirements(done[name][1]), name) if n not in following]
        level = following
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl", help="output folder (default: .whl/)")
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    args = parser.parse_args(argv)
    on_image = image_packages()
    with tempfile.TemporaryDirectory(prefix="kf-wheels-") as tmp:
        try:
            chosen = resolve(args.pyproject, Path(tmp), on_image)
        except WheelError as exc:
            print(f"prepare_wheels: {exc}", file=sys.stderr)
            return 1
        args.dest.mkdir(parents=True, exist_ok=True)
        for old in args.dest.glob("*.whl"):
            old.unlink()  # one version of each package: stale wheels would stop the install
        total = 0
        print(f"{'package':22} {'wheel':76} {'KiB':>6}  wanted by")
        for name, (want, wheel) in sorted(chosen.items()):
            shutil.move(str(wheel), args.dest / wheel.name)
            size = (args.dest / wheel.name).stat().st_size
            total += size
            print(f"{name:22} {wheel.name:76} {size // 1024:>6}  {', '.join(dict.fromkeys(want.wanted_by))}")
    print(f"{len(chosen)} wheels, {total / 2**20:.1f} MiB in {args.dest} (for CPython 3.12 on x86-64 Linux; "
          f"packages on the GPU image skipped: {IMAGE_LIST.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
