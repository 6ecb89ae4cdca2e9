"""Where a bench writes its results (``--json``, ``--markdown``): checked before any run starts.

A bench of a folder of recordings can take an hour, and it writes its files after every space, so a
path that cannot be written must fail at once, in one line, not after the first space (or the
last) with a traceback. Nor may a result file take the place of what the bench reads: an output
that names one of its recordings (the benched spaces, the ``--warm-from`` source) would write over
a GPU's measurements, and a ``.json`` written into the benched folder would be read as a recording
by the next bench of that folder. Two options naming one file would leave only the last.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from kernelforge.errors import UserError
from kernelforge.strategies.bench.recorded import CACHE_SUFFIXES

__all__ = ["check_outputs", "write_output"]


def check_outputs(outputs: Mapping[str, str | None], inputs: Sequence[Path], folder: Path | None = None) -> None:
    """Raise UserError naming the option when an output path (option -> path; None: not asked) is
    empty or a folder, has no folder, names one of ``inputs`` (the recordings the bench reads) or
    the same file as another option, lies in ``folder`` (the benched folder, if any) with a cache
    file's suffix, or cannot be written. Writes nothing that was not there (a probe of a new file
    is removed)."""
    read = {path.resolve() for path in inputs}
    seen: dict[Path, str] = {}
    for option, text in outputs.items():
        if text is None:
            continue
        if not text.strip():
            raise UserError(f"{option}: the file name is empty; give a file to write, e.g. {option} bench-results")
        path = Path(text).resolve()
        if path.is_dir():
            raise UserError(f"{option} {text}: is a folder; give a file name in it")
        if not path.parent.is_dir():
            raise UserError(f"{option} {text}: its folder does not exist; create it or choose another path")
        if path in read:
            raise UserError(f"{option} {text}: is a recording this bench reads; the results would take its place, "
                            "so choose another file")
        if folder is not None and path.parent == folder.resolve() and path.name.endswith(CACHE_SUFFIXES):
            raise UserError(f"{option} {text}: lies in {folder}, whose every *.json and *.json.gz the bench reads as a "
                            "recording; write it elsewhere")
        if path in seen:
            raise UserError(f"{seen[path]} and {option} name the same file {text}; give each its own")
        seen[path] = option
        _probe(option, text, path)


def write_output(option: str, path: str | Path, text: str) -> None:
    """Write ``text`` to ``path``; UserError naming ``option`` and the path when it cannot be written."""
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{option} {path}: cannot write it ({exc.strerror or exc}); choose a writable path") from None


def _probe(option: str, text: str, path: Path) -> None:
    existed = path.exists()
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UserError(f"{option} {text}: cannot write it ({exc.strerror or exc}); choose a writable path") from None
    if not existed:
        path.unlink(missing_ok=True)
