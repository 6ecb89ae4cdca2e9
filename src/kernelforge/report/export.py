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
exported entry the candidate, its speedup and whether the confirmation re-timing backed it.
Only stored data is exported: winners are the report's winners (:func:`kernelforge.report.collect.collect`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kernelforge.catalog import Catalog
from kernelforge.errors import UserError
from kernelforge.devices.hardware import timed_device_name
from kernelforge.job import Job
from kernelforge.report.collect import collect
from kernelforge.report.records import Report, ShapeRow
from kernelforge.report.write import write_text
from kernelforge.store.store import Store

FORMATS = ("vllm", "triton", "source")

#: The fused_moe config keys vLLM reads, in its order.
VLLM_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


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


def _provenance(row: ShapeRow) -> dict[str, Any]:
    """The provenance entry of one exported shape (kernelforge-export-<format>.json)."""
    return {"shape": row.shape, "candidate": row.winner, "template": row.template,
            "is_baseline": row.winner_is_baseline, "speedup": row.speedup,
            "speedup_p20": row.speedup_p20, "speedup_p80": row.speedup_p80,
            "confirmed": row.confirmed, "significant": row.significant, "params": row.params}


def vllm_configs(data: Report, catalog: Catalog) -> tuple[dict[str, dict[str, dict[str, int]]], list[str], list[dict]]:
    """File name -> {token count: config} for the MoE blocks of a collected report, the notes
    (what was skipped and why) and the provenance entries."""
    files: dict[str, dict[str, dict[str, int]]] = {}
    chosen: dict[tuple[str, str], dict[str, Any]] = {}
    notes: list[str] = []
    entries: list[dict] = []
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
            entries.append({"file": name, "token_count": key, **_provenance(row)})
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


def triton_modules(data: Report, store: Store) -> tuple[dict[str, str], list[dict]]:
    """Module file name -> text: per block and winning template, the winning kernels and their
    ``triton.Config`` list."""
    modules: dict[str, str] = {}
    entries: list[dict] = []
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
            entries.extend({"file": name, "block": block.block, **_provenance(r)} for r in trows)
    if not modules:
        raise UserError(f"job {data.job}: no timed winner stored; run the search first")
    return modules, entries


def source_files(data: Report, store: Store) -> tuple[dict[str, str], list[dict]]:
    """File name -> rendered source of every distinct winner (the baseline where nothing beat it)."""
    files: dict[str, str] = {}
    entries: list[dict] = []
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
            entries.append({"file": name, "block": block.block, **_provenance(r)})
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
        configs, notes, entries = vllm_configs(data, catalog)
        texts = {name: json.dumps(cfg, indent=4) + "\n" for name, cfg in configs.items()}
    elif fmt == "triton":
        texts, entries = triton_modules(data, store)
    else:
        texts, entries = source_files(data, store)
    for banner in data.banners:
        notes.append(f"caveat: {banner.text}")
    if any(not e["confirmed"] and not e["is_baseline"] for e in entries):
        notes.append("caveat: some exported winners were not confirmed by interleaved re-timing (see 'confirmed' "
                     f"in kernelforge-export-{fmt}.json)")
    envs = {b.env_key: data.env(b) for b in data.blocks if b.env_key}
    provenance = {"job": data.job, "job_file": data.job_file, "dtype": data.dtype, "format": fmt,
                  "environments": envs, "entries": entries, "notes": notes}
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
