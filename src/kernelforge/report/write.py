"""Write a job's report files (REPORT.md, results.json, index.html) and the compare page of two
jobs: collect from the store, render, write. Only stored measurements are read.

Every file of the report package is written through :func:`write_text`, which masks registered
secrets (:mod:`kernelforge.redact`) in the final text: what the store holds is redacted already,
and this is the last boundary before the disk.
"""

from __future__ import annotations

import os
from pathlib import Path

from kernelforge.catalog import Catalog
from kernelforge.errors import StorageError, UserError
from kernelforge.job import Job
from kernelforge.redact import redact
from kernelforge.report.collect import collect
from kernelforge.report.compare import compare, compare_markdown
from kernelforge.report.html import render_compare, render_html
from kernelforge.report.markdown import results_json, to_markdown
from kernelforge.report.records import Report
from kernelforge.store.store import Store


def write_report(job: Job, catalog: Catalog, store: Store, folder: Path | None = None) -> Path:
    """Write REPORT.md, results.json and index.html into ``folder`` (default reports/<job>/);
    returns the path of REPORT.md. Raises StorageError when the folder cannot be written."""
    folder = folder or job.report_dir
    report = collect(job, catalog, store)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_text(folder / "results.json", results_json(report))
        path = folder / "REPORT.md"
        write_text(path, to_markdown(report))
        write_text(folder / "index.html", render_html(report))
    except OSError as exc:
        raise StorageError(f"cannot write the report into {folder} ({exc.strerror}); check that the folder is "
                           "writable (or has room), then rerun `kernelforge report`: the results are stored") from None
    return path


def write_compare(a: Report, b: Report, folder: Path = Path("reports")) -> tuple[str, Path]:
    """Write ``folder``/compare-<a>-vs-<b>.html; returns (the comparison's Markdown, the HTML path)."""
    cmp = compare(a, b)
    path = folder / f"compare-{a.job}-vs-{b.job}.html"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_text(path, render_compare(cmp))
    except OSError as exc:
        raise StorageError(f"cannot write {path} ({exc.strerror}); check that the folder is writable (or has room)") from None
    return redact(compare_markdown(cmp)), path


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as UTF-8 with every registered secret masked (raises OSError):
    into a temporary file beside it, then renamed over it, so a full disk or a stop mid-write
    leaves the previous file whole, never a truncated one."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(redact(text), encoding="utf-8")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
