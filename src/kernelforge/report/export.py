"""Exports of a job's winners in forms other tools load (``kernelforge export JOB --format ...``).

- ``vllm``: the MoE winners per token count in vLLM's fused_moe config layout, one file per
  (E, N): ``E={E},N={N},device_name={GPU}.json`` mapping the token count M (as a string) to
  ``{BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages}``.
  N is the expert intermediate size I of the measured shape: vLLM looks configs up with
  ``E, _, N = w2.shape`` and w2 is [E, H, I] per tensor-parallel shard, so N = I at TP 1 (2880 for
  GPT-OSS) and I / tp under tensor parallelism (a sharded deployment needs a search at that I).
  GPU is the device name torch reports with spaces replaced by underscores, as vLLM does. For
  bf16/fp16 the name has no dtype part; fp32 adds ``,dtype=float32`` (vLLM's naming).
- ``triton``: per block and winning template, a Python module holding the winning kernels (the
  rendered source) followed by a ``CONFIGS`` list of ``triton.Config`` (one per distinct winning
  point) and ``SHAPE_CONFIGS`` (shape -> index into CONFIGS).
- ``source``: every distinct winning rendered source as ``<block>__<candidate>.py``.

Every export also writes ``kernelforge-export-<format>.json`` (one per format, so exports of several
formats can share the default folder): which job, device and versions, and for each
exported (block, shape) entry (:class:`ExportEntry`) the candidate, its speedup, whether the
confirmation re-timing backed it, and the shape's baseline with its source (``baseline_source``).
Only stored data is exported: winners are the report's winners (:func:`kernelforge.report.collect.collect`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kernelforge.catalog import Catalog
from kernelforge.errors import UserError
from kernelforge.devices.hardware import timed_device_name
from kernelforge.job import Job
from kernelforge.report.collect import collect
from kernelforge.report.records import BlockReport, Report, ShapeRow
from kernelforge.result import Status
from kernelforge.report.write import write_text
from kernelforge.store.store import Store

FORMATS = ("vllm", "triton", "source")

#: The fused_moe config keys vLLM reads, in its order.
VLLM_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
#: The MoE template's GEMM2 parameters, by the GEMM1 key they mirror (BLOCK_SIZE_M is shared).
#: vLLM's config file holds one configuration for both GEMMs.
GEMM2_KEYS = {key: f"{key}2" for key in VLLM_KEYS if key != "BLOCK_SIZE_M"}


def slug(block_id: str) -> str:
    """A Python module name for a block id ("moe/gpt_oss_experts" -> "moe_gpt_oss_experts")."""
    return "".join(c if c.isalnum() else "_" for c in block_id)


def vllm_device_name(env: dict[str, Any]) -> str:
    """The device name part of a vLLM config file name: the GPU the timings measure (the recorded
    GPU for replayed timings; the interpreter's own name when nothing else applies), spaces -> _."""
    name = timed_device_name(env) or str(env.get("device_name", "unknown"))
    return name.replace(" ", "_")


def vllm_file_name(E: int, N: int, device_name: str, dtype: str) -> str:
    """``E={E},N={N},device_name={GPU}.json`` (plus ``,dtype=float32`` for fp32, as vLLM names it)."""
    suffix = ",dtype=float32" if dtype == "float32" else ""
    return f"E={E},N={N},device_name={device_name}{suffix}.json"


@dataclass(frozen=True, kw_only=True)
class ExportEntry:
    """The provenance of one exported (block, shape) in kernelforge-export-<format>.json: the file
    it went into (``token_count``: its key in a vLLM file), the winner exported, its speedup over
    the shape's baseline, and that baseline (candidate, point, source)."""

    file: str
    block: str
    shape: str
    token_count: str | None = None
    candidate: str
    template: str | None
    is_baseline: bool
    speedup: float | None
    speedup_p20: float | None
    speedup_p80: float | None
    confirmed: bool
    significant: bool
    params: dict[str, Any]
    baseline: str
    baseline_source: str
    baseline_params: dict[str, Any]


def _provenance(file: str, block: str, row: ShapeRow, token_count: str | None = None) -> ExportEntry:
    """The provenance entry of one exported shape."""
    return ExportEntry(file=file, block=block, shape=row.shape, token_count=token_count, candidate=row.winner,
                       template=row.template, is_baseline=row.winner_is_baseline, speedup=row.speedup,
                       speedup_p20=row.speedup_p20, speedup_p80=row.speedup_p80, confirmed=row.confirmed,
                       significant=row.significant, params=row.params, baseline=row.baseline,
                       baseline_source=row.baseline_source, baseline_params=row.baseline_params)


def _gemm2_split(params: dict[str, Any]) -> list[str]:
    """The GEMM2 parameters of ``params`` that differ from the GEMM1 ones they mirror."""
    return [f"{k2}={params[k2]} vs {k}={params[k]}" for k, k2 in GEMM2_KEYS.items() if k2 in params and params[k2] != params[k]]


def _fastest_shippable(store: Store, block: BlockReport, row: ShapeRow) -> ShapeRow | None:
    """``row`` with its winner replaced by the fastest candidate measured on the shape (same
    device and versions) that uses one configuration for both GEMMs, the shape's baseline when
    none beats it, or None when the baseline itself is not shippable there. Its speedup is over
    the same baseline; it is unconfirmed."""
    if row.baseline_s is None:
        return None
    params = {c.id: c for c in store.candidates(block.block)}
    best = None
    for r in store.results(block=block.block):
        c = params.get(r.candidate_id)
        if (c is None or r.shape != row.shape or r.env_key != block.env_key or r.status is not Status.OK
                or not r.median_s or (r.median_s >= row.baseline_s and c.id != row.baseline) or _gemm2_split(c.params)
                or any(k not in c.params for k in VLLM_KEYS)):
            continue
        if best is None or r.median_s < best[0].median_s:
            best = (r, c)
    if best is None:
        return None
    r, c = best
    is_baseline = c.id == row.baseline
    return dataclasses.replace(row, winner=c.id, template=c.template, params=dict(c.params),
                               best_s=row.baseline_s if is_baseline else r.median_s, best_p20_s=r.p20_s,
                               best_p80_s=r.p80_s, best_samples=r.samples,
                               speedup=1.0 if is_baseline else row.baseline_s / r.median_s, speedup_p20=None,
                               speedup_p80=None, confirmed=False, pairs=0, significant=False,
                               winner_is_baseline=is_baseline)


def vllm_configs(data: Report, catalog: Catalog, store: Store) -> tuple[dict[str, dict[str, dict[str, int]]], list[str],
                                                          list[ExportEntry]]:
    """File name -> {token count: config} for the MoE blocks of a collected report, the notes
    (what was skipped and why) and the provenance entries."""
    files: dict[str, dict[str, dict[str, int]]] = {}
    chosen: dict[tuple[str, str], dict[str, Any]] = {}
    notes: list[str] = []
    entries: list[ExportEntry] = []
    moe_blocks = [b for b in data.blocks if b.block in catalog.blocks and catalog.block(b.block).family == "moe"]
    if not moe_blocks:
        raise UserError(f"job {data.job} has no MoE block; --format vllm writes fused_moe configs "
                        "(use --format triton or --format source for other blocks)")
    for block in moe_blocks:
        device = vllm_device_name(data.env(block))
        for row in block.shapes:
            dims = row.dims or {}
            if not all(k in dims for k in ("T", "E", "I")):
                notes.append(f"{block.block} {row.shape}: no T/E/I dimensions; skipped")
                continue
            if row.best_s is None:
                notes.append(f"{block.block} {row.shape}: no timed winner stored; skipped")
                continue
            missing = [k for k in VLLM_KEYS if k not in row.params]
            if missing:
                notes.append(f"{block.block} {row.shape}: the winner's template {row.template} has no "
                             f"{', '.join(missing)}; vLLM's fused_moe kernel cannot use it; skipped")
                continue
            split = _gemm2_split(row.params)
            if split:
                shippable = _fastest_shippable(store, block, row)
                note = (f"{block.block} {row.shape}: the winner configures GEMM2 apart from GEMM1 ({', '.join(split)}); "
                        "vLLM's fused_moe config holds one configuration for both GEMMs (ship the winner with "
                        "--format triton or --format source)")
                if shippable is None:
                    notes.append(f"{note}; no single-configuration candidate was measured there: skipped")
                    continue
                row = shippable
                notes.append(f"{note}; exported the baseline's own configuration instead" if row.winner_is_baseline
                             else f"{note}; exported the fastest single-configuration candidate {row.winner} "
                                  f"({row.speedup:.3f}x over the baseline) instead")
            name = vllm_file_name(int(dims["E"]), int(dims["I"]), device, data.dtype)
            key = str(int(dims["T"]))
            previous = chosen.get((name, key))
            # vLLM keys configs by token count only: when two stored shapes share E, N and T (other
            # routings), the uniform-routing one stands for the serving case.
            if previous is not None:
                if dims.get("ROUTING", "uniform") != "uniform" or previous["routing"] == "uniform":
                    notes.append(f"{block.block} {row.shape}: same E, N and T as {previous['shape']}; kept that one")
                    continue
            chosen[(name, key)] = {"shape": row.shape, "routing": dims.get("ROUTING", "uniform")}
            files.setdefault(name, {})[key] = {k: int(row.params[k]) for k in VLLM_KEYS}
            entries.append(_provenance(name, block.block, row, token_count=key))
    if not files:
        raise UserError(f"job {data.job}: no MoE winner could be exported ({'; '.join(notes) or 'nothing stored'})")
    for name in files:
        files[name] = dict(sorted(files[name].items(), key=lambda kv: int(kv[0])))
    return files, notes, entries


def _config_expr(params: dict[str, Any], module: str = "triton") -> str:
    """``triton.Config({...}, num_warps=..., num_stages=...)`` source text of a point."""
    kwargs = {k: v for k, v in params.items() if k not in ("num_warps", "num_stages")}
    extra = "".join(f", {k}={params[k]!r}" for k in ("num_warps", "num_stages") if k in params)
    return f"{module}.Config({kwargs!r}{extra})"


def triton_modules(data: Report, store: Store) -> tuple[dict[str, str], list[ExportEntry]]:
    """Module file name -> text: per block and winning template, the winning kernels and their
    ``triton.Config`` list."""
    modules: dict[str, str] = {}
    entries: list[ExportEntry] = []
    for block in data.blocks:
        rows = [r for r in block.shapes if r.best_s is not None]
        by_template: dict[str, list[ShapeRow]] = {}
        for r in rows:
            by_template.setdefault(r.template or "?", []).append(r)
        for template, trows in by_template.items():
            # The kernels come from the winner covering the most shapes (first on a tie).
            counts: dict[str, int] = {}
            for r in trows:
                counts[r.winner] = counts.get(r.winner, 0) + 1
            lead = max(counts, key=lambda cid: counts[cid])
            cand = store.candidate(lead)
            if cand is None:
                continue
            points: list[dict[str, Any]] = []
            shape_index: dict[str, int] = {}
            for r in trows:
                if r.params not in points:
                    points.append(r.params)
                shape_index[r.shape] = points.index(r.params)
            name = slug(block.block) + ("" if len(by_template) == 1 else "__" + slug(template.rpartition("/")[2])) + ".py"
            env = data.env(block)
            header = [
                f"# kernelforge export of job {data.job} ({data.job_file}), block {block.block}, "
                f"template {template}.",
                f"# Winning kernels: candidate {lead} "
                f"({'the baseline: nothing beat it' if cand.origin == 'baseline' else cand.origin}); measured on "
                f"{env.get('device_name', '?')} (triton {env.get('triton', '?')}, torch {env.get('torch', '?')}).",
                "# CONFIGS lists the winning point of every shape (SHAPE_CONFIGS: shape -> index); the kernels",
                "# below are rendered at CONFIGS[SHAPE_CONFIGS[<a shape candidate " + lead + " won>]].",
                "",
            ]
            footer = [
                "",
                "",
                "# --- kernelforge export: winning configurations ---------------------------------------",
                "import triton as _kf_triton  # noqa: E402",
                "",
                "CONFIGS = [",
                *[f"    {_config_expr(p, '_kf_triton')}," for p in points],
                "]",
                "SHAPE_CONFIGS = {",
                *[f"    {shape!r}: {i}," for shape, i in shape_index.items()],
                "}",
                "",
            ]
            modules[name] = "\n".join(header) + cand.source.rstrip("\n") + "\n" + "\n".join(footer)
            entries.extend(_provenance(name, block.block, r) for r in trows)
    if not modules:
        raise UserError(f"job {data.job}: no timed winner stored; run the search first")
    return modules, entries


def source_files(data: Report, store: Store) -> tuple[dict[str, str], list[ExportEntry]]:
    """File name -> rendered source of every distinct winner (the baseline where nothing beat it)."""
    files: dict[str, str] = {}
    entries: list[ExportEntry] = []
    for block in data.blocks:
        for r in block.shapes:
            if r.best_s is None:
                continue
            name = f"{slug(block.block)}__{r.winner}.py"
            if name not in files:
                cand = store.candidate(r.winner)
                if cand is None:
                    continue
                files[name] = cand.source
            entries.append(_provenance(name, block.block, r))
    if not files:
        raise UserError(f"job {data.job}: no timed winner stored; run the search first")
    return files, entries


def export(job: Job, catalog: Catalog, store: Store, fmt: str, out: Path | None = None) -> tuple[list[Path], list[str]]:
    """Write the export of ``fmt`` into ``out`` (default reports/<job>/export/); returns the written
    files and notes (skipped shapes, caveats)."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    out = out or job.report_dir / "export"
    data = collect(job, catalog, store)
    notes: list[str] = []
    texts: dict[str, str]
    if fmt == "vllm":
        configs, notes, entries = vllm_configs(data, catalog, store)
        texts = {name: json.dumps(cfg, indent=4) + "\n" for name, cfg in configs.items()}
    elif fmt == "triton":
        texts, entries = triton_modules(data, store)
    else:
        texts, entries = source_files(data, store)
    for banner in data.banners:
        notes.append(f"caveat: {banner.text}")
    if any(not e.confirmed and not e.is_baseline for e in entries):
        notes.append("caveat: some exported winners were not confirmed by interleaved re-timing (see 'confirmed' "
                     f"in kernelforge-export-{fmt}.json)")
    envs = {b.env_key: data.env(b) for b in data.blocks if b.env_key}
    provenance = {"job": data.job, "job_file": data.job_file, "dtype": data.dtype, "format": fmt,
                  "environments": envs, "entries": [asdict(e) for e in entries], "notes": notes}
    if fmt == "vllm":
        provenance["N"] = ("N is the expert intermediate size I of the measured shape (vLLM: E, _, N = w2.shape, "
                           "w2 [E, H, I] per tensor-parallel shard), i.e. TP 1")
    written = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            path = out / name
            write_text(path, text)
            written.append(path)
        meta = out / f"kernelforge-export-{fmt}.json"
        write_text(meta, json.dumps(provenance, indent=1, default=str) + "\n")
        written.append(meta)
    except OSError as exc:
        raise UserError(f"cannot write the export into {out} ({exc.strerror}); choose a writable --out") from None
    return written, notes
