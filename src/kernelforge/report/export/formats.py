"""Exports of a job's winners in forms other tools load (``kernelforge export JOB --format ...``).

- ``vllm``: the MoE winners per token count as fused_moe config files, one per (E, N), for vLLM
  (``--layout vllm``, the default: ``E={E},N={N},device_name={GPU}.json`` with a ``triton_version``
  key) or SGLang (``--layout sglang``: ``configs/triton_<version>/E=...json``; ``--split-down`` adds
  the GEMM2 ``..._down.json``). The naming rules and their sources are in
  :mod:`kernelforge.report.export.vllm_configs`.
- ``triton``: per block, every distinct winner's stored source as ``<block>__<candidate>.py`` and
  the dispatcher ``<block>.py``, whose ``run`` forwards each call to the winner tuned for the
  call's token count (vLLM's nearest-count rule); see :mod:`kernelforge.report.export.triton_folder`.
- ``source``: every distinct winning rendered source as ``<block>__<candidate>.py``.

Every export also writes ``kernelforge-export-<format>.json`` (one per format, so exports of several
formats can share the default folder): which job, device and versions, and for each
exported (block, shape) entry (:class:`ExportEntry`) the candidate, its speedup, whether the
confirmation re-timing backed it, and the shape's baseline with its source (``baseline_source``).
Only stored data is exported: winners are the report's winners (:func:`kernelforge.report.collect.collect`).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from kernelforge.catalog import Catalog
from kernelforge.errors import UserError
from kernelforge.job import Job
from kernelforge.report.collect import collect
from kernelforge.report.export.entry import ExportEntry, provenance, shipped, slug, winner_files
from kernelforge.report.export.triton_folder import triton_modules
from kernelforge.report.export.vllm_configs import (GEMM2_KEYS, VLLM_KEYS, Layout, space_of, vllm_configs, vllm_device_name,
                                            vllm_file_name)
from kernelforge.report.records import Report
from kernelforge.report.write import write_text
from kernelforge.store.store import Store

FORMATS = ("vllm", "triton", "source")

__all__ = ["FORMATS", "GEMM2_KEYS", "VLLM_KEYS", "ExportEntry", "Layout", "export", "slug", "source_files",
           "triton_modules", "vllm_configs", "vllm_device_name", "vllm_file_name"]

def source_files(data: Report, store: Store) -> tuple[dict[str, str], list[ExportEntry]]:
    """File name -> rendered source of every distinct winner (the baseline where nothing beat it)."""
    files: dict[str, str] = {}
    entries: list[ExportEntry] = []
    for block in data.blocks:
        entries.extend(provenance(name, block.block, r) for r, name in winner_files(block, store, files))
    if not files:
        raise UserError(f"job {data.job}: no timed winner stored; run the search first")
    return files, entries


def export(job: Job, catalog: Catalog, store: Store, fmt: str, out: Path | None = None, layout: str = "vllm",
           split_down: bool = False) -> tuple[list[Path], list[str]]:
    """Write the export of ``fmt`` into ``out`` (default reports/<job>/export/); returns the written
    files and notes (skipped shapes, caveats). ``layout`` and ``split_down`` apply to ``vllm``
    (:mod:`kernelforge.report.export.vllm_configs`)."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    if layout not in [m.value for m in Layout]:
        raise UserError(f"--layout {layout!r} is not one of {', '.join(m.value for m in Layout)}")
    if fmt != "vllm" and (layout != "vllm" or split_down):
        raise UserError("--layout and --split-down apply to --format vllm only")
    out = out or job.report_dir / "export"
    data, notes = shipped(collect(job, catalog, store), store)
    texts: dict[str, str]
    if fmt == "vllm":
        configs, skipped, entries = vllm_configs(data, catalog, store, Layout(layout), split_down)
        notes += skipped
        texts = {name: json.dumps(cfg, indent=4) + "\n" for name, cfg in configs.items()}
    elif fmt == "triton":
        texts, entries = triton_modules(data, store, catalog)
    else:
        texts, entries = source_files(data, store)
    for banner in data.banners:
        notes.append(f"caveat: {banner.text}")
    if any(not e.confirmed and not e.is_baseline for e in entries):
        notes.append("caveat: some exported winners were not confirmed by interleaved re-timing (see 'confirmed' "
                     f"in kernelforge-export-{fmt}.json)")
    envs = {b.env_key: data.env(b) for b in data.blocks if b.env_key}
    meta_json = {"job": data.job, "job_file": data.job_file, "dtype": data.dtype, "format": fmt,
                  "environments": envs, "entries": [asdict(e) for e in entries], "notes": notes}
    if fmt == "vllm":
        meta_json["layout"] = layout
        meta_json["N"] = ("N is the expert intermediate size I of the measured shape (vLLM: E, _, N = w2.shape, "
                           "w2 [E, H, I] per tensor-parallel shard), i.e. TP 1")
        meta_json["space"] = space_of(entries)  # which space the configurations come from, and what they were tuned on
        notes[:0] = [f"{block}: configurations from {', '.join(info['templates'])}, {info['space']}; {info['tuned_on']}"
                     for block, info in meta_json["space"].items()]
        meta_json["notes"] = notes
    meta = out / f"kernelforge-export-{fmt}.json"
    stale = [name for name in _written_before(meta, out) if name not in texts]
    if stale:  # a loader reads every file of the folder: an earlier winner's file must not stay beside the new
        notes.append(f"removed {len(stale)} file(s) the earlier {fmt} export wrote here and this one does not: "
                     + ", ".join(stale))
    meta_json["files"] = sorted(texts)
    written = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in stale:
            (out / name).unlink(missing_ok=True)
        for name, text in texts.items():
            path = out / name
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text(path, text)
            written.append(path)
        write_text(meta, json.dumps(meta_json, indent=1, default=str) + "\n")
        written.append(meta)
    except OSError as exc:
        raise UserError(f"cannot write the export into {out} ({exc.strerror}); choose a writable --out") from None
    return written, notes


def _written_before(meta: Path, out: Path) -> list[str]:
    """The files an earlier export of this format wrote into ``out``, as its ``meta`` file lists them
    (``files``; an older one's entries), those still there and inside ``out`` only."""
    try:
        earlier = json.loads(meta.read_text(encoding="utf-8"))
        names = earlier.get("files") or sorted({entry["file"] for entry in earlier.get("entries", [])})
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []  # none, or not ours to read: nothing is removed
    root = out.resolve()
    return [name for name in names if isinstance(name, str) and (out / name).is_file()
            and (out / name).resolve().is_relative_to(root) and (out / name).resolve() != meta.resolve()]
