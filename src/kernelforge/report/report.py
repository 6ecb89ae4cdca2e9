"""Reports of a search, built only from stored measurements: ``REPORT.md``, ``results.json`` and the
self-contained ``index.html`` (see :mod:`kernelforge.report.html`).

Per block and shape: the baseline's time, the winner's time, the speedup with its spread (from the
interleaved confirmation pairs when the search confirmed it, else from the two timing bands),
the winning parameters, counts by status and origin, every candidate with its origin and parent,
the search's progress, the winner's diff against the baseline source, compile resources, and where
each timing sits against the device's roofline. Then the model-level projection (TTFT/TBT) and the
device and versions. Interpreter and replayed timings are labelled as such wherever a number
appears, and interpreter timings are never placed against a GPU ceiling.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kernelforge.report import projection as proj
from kernelforge.objective import by_candidate, geomean, rank, speedup, speedup_spread
from kernelforge.catalog import Catalog
from kernelforge.errors import UserError
from kernelforge.devices.hardware import Ceilings, assess, ceilings_for, timed_device_name
from kernelforge.job import Job
from kernelforge.result import format_seconds
from kernelforge.store.store import Store, StoredResult

#: Said when a job measured none of the shapes a projection needs (e.g. the demo's smoke shapes).
NOTHING_PROJECTED = ("**Nothing is projected:** this job measured none of the GPT-OSS preset shapes the projection "
                     "needs (it ran other shapes, e.g. smoke shapes); the shapes each profile needs are listed below.")

#: Device kinds whose timings are not live GPU measurements: they get a banner everywhere.
LABELLED_DEVICES = ("interpret", "replay")


# -- collecting ---------------------------------------------------------------------------------

def _pick_env(rows: list[StoredResult], baseline_id: str) -> str | None:
    """The environment a block is reported in: the one of the most recent baseline measurement
    (the baseline is measured first in every search, so this is the latest search's device)."""
    base = [r for r in rows if r.candidate_id == baseline_id]
    if not base:
        return None
    return max(base, key=lambda r: r.created).env_key


def _banner(env: dict[str, Any]) -> dict[str, str] | None:
    """What to say above numbers that are not live GPU timings (None for a real GPU)."""
    device = str(env.get("device", ""))
    if device == "interpret" or "interpreter" in str(env.get("timing", "")):
        return {"kind": "interpret", "device_name": str(env.get("device_name", "")),
                "text": f"Interpreter timings: {env.get('timing', 'interpreter wall time')}. These are Triton "
                        "interpreter wall times on the CPU; they measure no GPU and say nothing about GPU speed. "
                        "Correctness results are real."}
    if device == "replay":
        return {"kind": "replay", "device_name": str(env.get("device_name", "")),
                "text": f"Replayed timings: {env.get('timing', 'replayed')}. The numbers were measured earlier on "
                        f"{env.get('recorded_device', '?')} and are read back from a recording, not measured now."}
    return None


def _rate_fields(point) -> dict[str, Any]:
    return {k: v for k, v in asdict(point).items()}


def _diff(base_source: str, source: str, base_id: str, cand_id: str) -> str:
    return "".join(difflib.unified_diff(
        base_source.splitlines(keepends=True), source.splitlines(keepends=True),
        fromfile=f"baseline {base_id}", tofile=f"winner {cand_id}", n=3))


def _compiles(store: Store, ids: list[str], dtype: str) -> list[dict[str, Any]]:
    """kf_compiles rows of these candidates (every target), read-only."""
    import sqlalchemy as sa

    from kernelforge.store.store import compiles_table

    if not ids:
        return []
    query = (sa.select(compiles_table).where(compiles_table.c.candidate_id.in_(ids))
             .where(compiles_table.c.dtype == dtype).order_by(compiles_table.c.target))
    with store.engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(query).mappings()]
    for r in rows:
        r["kernels"] = json.loads(r["kernels"])
    return rows


def _progress(order: list[str], table: dict[str, dict[str, StoredResult]], baseline_id: str, shapes: list[str],
              origins: dict[str, str], per_shape: bool) -> dict[str, Any]:
    """Speedup of each evaluation in stored order and the best speedup so far.

    All-shapes tuning: a candidate's speedup is its geometric mean over the block's shapes and the
    best so far is the running maximum. Per-shape tuning: every shape has its own best; the line is
    the geometric mean over shapes of the best so far per shape (the baseline, 1x, until a shape
    finds better).
    """
    base = table.get(baseline_id, {})
    points, best_line = [], []
    best_all = 0.0
    best_per_shape = {s: 1.0 for s in shapes}
    for index, cid in enumerate(order):
        rows = table[cid]
        measured = [s for s in shapes if s in rows]
        ratios = [speedup(base.get(s), rows.get(s)) for s in measured]
        ok = bool(ratios) and all(v is not None for v in ratios)
        value = geomean(ratios) if ok else None  # type: ignore[arg-type]
        status = "ok" if ok else next((rows[s].status.value for s in measured if not rows[s].ok), "ok")
        points.append({"index": index, "candidate": cid, "origin": origins.get(cid, "?"), "speedup": value,
                       "status": status,
                       "label": f"#{index} {cid} ({origins.get(cid, '?')}): "
                                + (f"{value:.3f}x" if value is not None else status)})
        if per_shape:
            if ok:
                for s, v in zip(measured, ratios):
                    best_per_shape[s] = max(best_per_shape[s], v)  # type: ignore[type-var]
            best_line.append((index, geomean(list(best_per_shape.values()))))
        else:
            if value is not None and len(measured) == len(shapes):
                best_all = max(best_all, value)
            best_line.append((index, best_all if best_all else 1.0))
    return {"points": points, "best": best_line,
            "mode": "per-shape" if per_shape else "all-shapes"}


def collect(job: Job, catalog: Catalog, store: Store) -> dict[str, Any]:
    """Everything the report shows, as plain data (this is results.json)."""
    from kernelforge.candidate import Candidate

    confirmations = store.confirmations(job.name)
    blocks = []
    environments: dict[str, dict[str, Any]] = {}
    for spec in job.blocks:
        block = catalog.block(spec.id)
        shape_objs = block.shapes(spec.shapes)
        shapes = [s.name for s in shape_objs]
        dims = {s.name: s.as_dict() for s in shape_objs}
        baseline_id = Candidate.from_template(catalog.baseline(block.id)).id
        rows = [r for r in store.results(block=block.id, dtype=job.dtype) if r.shape in shapes]
        for r in rows:
            environments.setdefault(r.env_key, r.env)
        env_key = _pick_env(rows, baseline_id)
        rows = [r for r in rows if r.env_key == env_key]
        env = rows[0].env if rows else {}
        table = by_candidate(rows)
        candidates = {c.id: c for c in store.candidates(block.id)}
        statuses: Counter = Counter()
        worst: dict[str, str] = {}
        for cid, per_shape in table.items():
            worst[cid] = next((r.status.value for r in per_shape.values() if not r.ok), "ok")
            statuses[worst[cid]] += 1
        origin_of = {cid: (candidates[cid].origin if cid in candidates else "?") for cid in table}
        origins = Counter(origin_of[cid] for cid in table if cid in candidates)
        origin_status: dict[str, dict[str, int]] = {}
        for cid in table:
            origin_status.setdefault(origin_of[cid], Counter())[worst[cid]] += 1  # type: ignore[index]
        groups = [shapes] if job.tune == "all-shapes" else [[s] for s in shapes]
        ceilings = _ceilings(env)
        shape_rows = []
        for group in groups:
            ranked = [(cid, s) for cid, s in rank(table, baseline_id, group) if cid != baseline_id]
            winner = ranked[0][0] if ranked and ranked[0][1] > 1.0 else baseline_id
            for shape in group:
                base = table.get(baseline_id, {}).get(shape)
                best = table.get(winner, {}).get(shape)
                confirmed = [c for c in confirmations if c["block"] == block.id and c["shape"] == shape
                             and c["candidate_id"] == winner and c["env_key"] == env_key]
                conf = confirmed[-1] if confirmed else None
                band = speedup_spread(base, best) if base and best else None
                shape_rows.append({
                    "shape": shape,
                    "dims": dims.get(shape, {}),
                    "baseline_s": base.median_s if base else None,
                    "best_s": best.median_s if best else None,
                    "baseline_p20_s": base.p20_s if base else None,
                    "baseline_p80_s": base.p80_s if base else None,
                    "best_p20_s": best.p20_s if best else None,
                    "best_p80_s": best.p80_s if best else None,
                    "baseline_samples": base.samples if base else None,
                    "best_samples": best.samples if best else None,
                    "baseline_j": base.joules if base else None,
                    "best_j": best.joules if best else None,
                    "winner_rel_error": best.rel_error if best else None,
                    "winner": winner,
                    "winner_is_baseline": winner == baseline_id,
                    "params": candidates[winner].params if winner in candidates else {},
                    "template": candidates[winner].template if winner in candidates else None,
                    "speedup": conf["median"] if conf else speedup(base, best),
                    "speedup_p20": conf["p20"] if conf else (band[0] if band else None),
                    "speedup_p80": conf["p80"] if conf else (band[1] if band else None),
                    "confirmed": bool(conf),
                    "pairs": len(conf["speedups"]) if conf else 0,
                    "significant": bool(conf and conf["p20"] > 1.0),
                    "flops": base.flops if base else None,
                    "bytes": base.bytes if base else None,
                    "timing_label": base.timing_label if base else None,
                    "timing_method": base.timing_method if base else None,
                    "roofline": {
                        "baseline": _rate_fields(assess(base.flops, base.bytes, base.median_s, ceilings))
                        if base and base.ok else None,
                        "winner": _rate_fields(assess(best.flops, best.bytes, best.median_s, ceilings))
                        if best and best.ok else None,
                    },
                })
        speedups = [r["speedup"] for r in shape_rows if r["speedup"]]
        order = sorted(table, key=lambda cid: (min(r.created for r in table[cid].values()),
                                               candidates[cid].created if cid in candidates else 0.0))
        cand_rows = []
        base_rows = table.get(baseline_id, {})
        for index, cid in enumerate(order):
            c = candidates.get(cid)
            measured = [s for s in shapes if s in table[cid]]
            ratios = [speedup(base_rows.get(s), table[cid].get(s)) for s in measured]
            value = geomean(ratios) if ratios and all(v is not None for v in ratios) else None  # type: ignore[arg-type]
            cand_rows.append({
                "order": index, "id": cid, "template": c.template if c else "?", "origin": origin_of[cid],
                "parent": c.parent if c else None, "status": worst[cid], "geomean_speedup": value,
                "shapes": len(measured), "params": c.params if c else {},
            })
        winners = []
        base_cand = candidates.get(baseline_id)
        for wid in dict.fromkeys(r["winner"] for r in shape_rows if not r["winner_is_baseline"]):
            c = candidates.get(wid)
            if c is None:
                continue
            winners.append({
                "id": wid, "template": c.template, "origin": c.origin, "parent": c.parent, "params": c.params,
                "shapes": [r["shape"] for r in shape_rows if r["winner"] == wid],
                "source": c.source,
                "diff": _diff(base_cand.source, c.source, baseline_id, wid) if base_cand else "",
            })
        compile_rows = _compiles(store, [baseline_id, *[w["id"] for w in winners]], job.dtype)
        for r in compile_rows:
            r["role"] = "baseline" if r["candidate_id"] == baseline_id else "winner"
        compile_rows.sort(key=lambda r: (r["target"], r["role"] != "baseline"))  # baseline first, then winners
        suspects = []
        for cid, per_shape in table.items():
            for shape, r in per_shape.items():
                if r.ok and r.median_s and ceilings and assess(r.flops, r.bytes, r.median_s, ceilings).suspect:
                    suspects.append({"candidate": cid, "shape": shape, "median_s": r.median_s,
                                     "roofline_s": ceilings.roofline_seconds(r.flops or 0.0, r.bytes or 0.0)})
        blocks.append({
            "block": block.id, "description": block.description, "shapes": shape_rows,
            "geomean_speedup": geomean(speedups) if speedups else None,
            "statuses": dict(statuses), "origins": dict(origins), "candidates": len(table),
            "origin_status": {k: dict(v) for k, v in origin_status.items()},
            "env_key": env_key, "baseline": baseline_id, "banner": _banner(env) if env else None,
            "device_name": env.get("device_name"),
            "candidate_rows": cand_rows,
            "progress": _progress(order, table, baseline_id, shapes, origin_of, job.tune == "per-shape"),
            "winners": winners, "compiles": compile_rows,
            "roofline": _roofline_meta(env, ceilings),
            "suspects": suspects,
        })
    banners = {}
    for b in blocks:
        if b["banner"]:
            banners[b["env_key"]] = b["banner"]
    return {
        "job": job.name, "job_file": str(job.path), "dtype": job.dtype, "tune": job.tune,
        "strategy": job.strategy.name, "storage": job.storage_url, "blocks": blocks,
        "environments": environments,
        "banners": list(banners.values()),
        "projection": collect_projection(blocks, catalog),
    }


def _ceilings(env: dict[str, Any]) -> Ceilings | None:
    name = timed_device_name(env)
    return ceilings_for(name) if name else None


def _roofline_meta(env: dict[str, Any], ceilings: Ceilings | None) -> dict[str, Any]:
    """Which ceilings the block's timings are placed against, and why (or why not)."""
    device = timed_device_name(env)
    if not env:
        return {"device": None, "ceilings": None, "note": "no timed results"}
    if device is None:
        return {"device": None, "ceilings": None,
                "note": "Interpreter wall time on the CPU: no GPU ceiling applies. The rates below are stored "
                        "FLOP and byte counts over interpreter time: not GPU speed, not a percent of any roofline."}
    if ceilings is None:
        return {"device": device, "ceilings": None,
                "note": f"{device}: no known ceilings in kernelforge.devices.hardware; add the device there to get "
                        "percent of roofline."}
    return {"device": device, "ceilings": asdict(ceilings),
            "note": (f"{device} ({ceilings.name}): percent of roofline against "
                     + ("measured ceilings " if ceilings.measured else "datasheet ceilings ")
                     + f"({ceilings.practical_bandwidth / 1e12:.2f} TB/s, {ceilings.practical_flops / 1e12:.0f} "
                     f"TFLOP/s; source: {ceilings.source}); suspect = faster than the datasheet roofline "
                     f"({ceilings.bandwidth / 1e12:.2f} TB/s, {ceilings.flops / 1e12:.0f} TFLOP/s).")}


def collect_projection(blocks: list[dict[str, Any]], catalog: Catalog) -> dict[str, Any]:
    """The model-level projection (see :mod:`kernelforge.report.projection`) from the collected blocks."""
    measured: dict[tuple[str, str], proj.Measured] = {}
    devices: dict[str, str] = {}
    for b in blocks:
        if b["block"] not in (proj.PREFILL_BLOCK, proj.DECODE_BLOCK, proj.MOE_BLOCK):
            continue
        devices[b["block"]] = str(b.get("device_name"))
        for r in b["shapes"]:
            if r["baseline_s"] and r["best_s"]:
                measured[(b["block"], r["shape"])] = proj.Measured(r["baseline_s"], r["best_s"], r["baseline_j"],
                                                                   r["best_j"])
    known: dict[str, set[str]] = {}
    for block_id in (proj.PREFILL_BLOCK, proj.DECODE_BLOCK, proj.MOE_BLOCK):
        if block_id in catalog.blocks:
            known[block_id] = {s.name for shapes in catalog.block(block_id).shape_sets().values() for s in shapes}
    moe_tokens: dict[str, list[int]] = {}
    for model in proj.MODELS.values():
        stored = [int(shape.rsplit("/T", 1)[1]) for (block, shape) in measured
                  if block == proj.MOE_BLOCK and shape.startswith(model.moe_set + "/T")
                  and shape.rsplit("/T", 1)[1].isdigit()]
        if not stored:
            # Nothing stored: name the presets the block defines, so "missing" names a real shape.
            stored = [int(s.rsplit("/T", 1)[1]) for s in known.get(proj.MOE_BLOCK, ())
                      if s.startswith(model.moe_set + "/T") and s.rsplit("/T", 1)[1].isdigit()]
        moe_tokens[model.name] = sorted(stored)
    projection = proj.project(measured, moe_tokens)
    profiles = []
    for pname, profile in proj.PROFILES.items():
        phases = projection.for_profile(pname)
        missing = sorted({m for p in phases for m in p.missing}, key=lambda m: (m[0], _natural(m[1])))
        listed = [{"block": b, "shape": s,
                   "why": ("not a preset of the block" if b in known and s not in known[b] and not s.endswith("*")
                           else "not measured in this job")} for b, s in missing]
        groups: dict[tuple[str, str], list[str]] = {}
        for m in listed:
            groups.setdefault((m["block"], m["why"]), []).append(m["shape"])
        profiles.append({
            "profile": pname, "input_tokens": profile.input_tokens, "output_tokens": profile.output_tokens,
            "phases": [_phase_dict(p) for p in phases if any(c.complete for c in p.components)],
            "missing": listed,
            "missing_groups": [{"block": b, "why": why, "shapes": shapes} for (b, why), shapes in groups.items()],
            "measured_any": any(c.complete for p in phases for c in p.components),
        })
    return {"profiles": profiles, "devices": devices, "not_measured": list(proj.NOT_MEASURED),
            "measured_any": any(p["measured_any"] for p in profiles),
            "models": {m.name: m.layers for m in proj.MODELS.values()}}


def _natural(text: str) -> list[Any]:
    """Sort key that orders embedded numbers by value (T8 before T64 before T4096)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _phase_dict(p: proj.Phase) -> dict[str, Any]:
    return {
        "kind": p.kind, "model": p.model, "batch": p.batch, "tokens": p.tokens, "complete": p.complete,
        "baseline_s": p.baseline_s, "winner_s": p.winner_s, "change_s": p.change_s, "speedup": p.speedup,
        "baseline_j_per_token": p.baseline_j_per_token, "winner_j_per_token": p.winner_j_per_token,
        "components": [{
            "block": c.block, "label": c.label, "complete": c.complete, "calls": c.calls_per_layer,
            "baseline_s": c.baseline_s, "winner_s": c.winner_s,
            "change_s": (c.winner_s - c.baseline_s) if c.complete else None,
            "baseline_j_per_token": c.baseline_j / p.tokens if c.baseline_j is not None else None,
            "winner_j_per_token": c.winner_j / p.tokens if c.winner_j is not None else None,
            "missing": [s for _, s in c.missing], "note": c.note,
        } for c in p.components],
    }


# -- Markdown -----------------------------------------------------------------------------------

def _speedup_text(row: dict[str, Any]) -> str:
    if row["speedup"] is None:
        return "-"
    text = f"{row['speedup']:.3f}x"
    if row["speedup_p20"] is not None:
        text += f" ({row['speedup_p20']:.3f}-{row['speedup_p80']:.3f})"
    return text


def confirmed_text(row: dict[str, Any]) -> str:
    """What the interleaved re-timing said: faster beyond noise, slower beyond noise, or neither."""
    if row["significant"]:
        return "yes, significant"
    if row.get("speedup_p80") is not None and row["speedup_p80"] < 1.0:
        return "yes, slower on this shape"
    return "yes, within noise"


def fmt_time(value: float | None) -> str:
    """A stored time for a table, or "-"."""
    return format_seconds(value) if value else "-"


def fmt_delta(value: float | None) -> str:
    """A signed change of time (negative = saved)."""
    if value is None:
        return "-"
    return ("-" if value < 0 else "+") + format_seconds(abs(value))


def fmt_rate(value: float | None, unit: str) -> str:
    """A rate with a T/G/M prefix ("4.3 TB/s"), or "-"."""
    if value is None:
        return "-"
    scale, prefix = (1e12, "T") if value >= 1e11 else (1e9, "G") if value >= 1e8 else (1e6, "M")
    return f"{value / scale:.3g} {prefix}{unit}"


def fmt_speedup(value: float | None) -> str:
    """A speedup as "1.234x", or "-"."""
    return "-" if value is None else f"{value:.3f}x"


def params_text(params: dict[str, Any]) -> str:
    """A point of a space as "NAME=value ..."."""
    return " ".join(f"{k}={v}" for k, v in params.items())


def roofline_cells(point: dict[str, Any] | None, has_ceiling: bool) -> tuple[str, str, str]:
    """(FLOP rate, bandwidth, percent of roofline) cells of one timed result."""
    if not point:
        return "-", "-", "-"
    pct = "-"
    if has_ceiling and point.get("percent") is not None:
        pct = f"{point['percent']:.1f}%"
        if point.get("suspect"):
            pct += " SUSPECT"
    return fmt_rate(point.get("achieved_flops"), "FLOP/s"), fmt_rate(point.get("achieved_bandwidth"), "B/s"), pct


def to_markdown(data: dict[str, Any]) -> str:
    """REPORT.md: per block the speedup table, candidates, winner diff, roofline and compile
    resources; then the model-level projection and the environments the numbers came from."""
    lines = [f"# kernelforge report: {data['job']}", ""]
    lines.append(f"Job `{data['job_file']}`, dtype {data['dtype']}, tuning {data['tune']}, strategy {data['strategy']}. "
                 "Every number below is read from the job's results database; speedup = baseline time / winner "
                 "time, with its p20-p80 spread (from interleaved re-timing pairs where marked confirmed).")
    lines.append("")
    for env in data["environments"].values():
        if env.get("device") in LABELLED_DEVICES or "interpreter" in str(env.get("timing", "")):
            lines.append(f"> **{env.get('timing', env.get('device'))}** ({env.get('device_name')}): "
                         "these timings are not GPU measurements of speed.")
            lines.append("")
    for block in data["blocks"]:
        lines.extend(_block_markdown(block))
    lines.extend(_projection_markdown(data.get("projection")))
    lines.append("## Environment")
    lines.append("")
    for key, env in data["environments"].items():
        lines.append(f"- `{key}`: " + ", ".join(f"{k} {v}" for k, v in sorted(env.items())))
    lines.append("")
    return "\n".join(lines)


def _block_markdown(block: dict[str, Any]) -> list[str]:
    lines = [f"## {block['block']}", ""]
    if block["description"]:
        lines.append(block["description"])
        lines.append("")
    geo = block["geomean_speedup"]
    lines.append(f"Geometric-mean speedup: **{geo:.3f}x** over {len(block['shapes'])} shape(s); "
                 f"{block['candidates']} candidates evaluated; by status: "
                 + ", ".join(f"{k} {v}" for k, v in sorted(block["statuses"].items()))
                 + "; by origin: " + ", ".join(f"{k} {v}" for k, v in sorted(block["origins"].items())) + "."
                 if geo else "No timed results.")
    lines.append("")
    lines.append("| shape | baseline | best | speedup (p20-p80) | confirmed | winner | parameters |")
    lines.append("|---|---|---|---|---|---|---|")
    for row in block["shapes"]:
        winner = "baseline" if row["winner_is_baseline"] else f"`{row['winner']}` ({row['template']})"
        confirmed = f"{confirmed_text(row)} ({row.get('pairs', 0)} pairs)" if row["confirmed"] else "no"
        lines.append(
            f"| {row['shape']} | {fmt_time(row['baseline_s'])} | {fmt_time(row['best_s'])} | {_speedup_text(row)} | "
            f"{confirmed} | {winner} | {params_text(row['params'])} |"
        )
    labels = sorted({r["timing_label"] for r in block["shapes"] if r["timing_label"]})
    if labels:
        lines.append("")
        lines.append("Timing: " + "; ".join(labels) + ".")
    lines.append("")
    if block.get("candidate_rows"):
        lines.append(f"### Candidates of {block['block']}")
        lines.append("")
        lines.append("| # | id | template | origin | parent | status | geomean speedup | parameters |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for c in block["candidate_rows"]:
            lines.append(f"| {c['order']} | `{c['id']}` | {c['template']} | {c['origin']} | "
                         f"{('`' + c['parent'] + '`') if c['parent'] else '-'} | {c['status']} | "
                         f"{fmt_speedup(c['geomean_speedup'])} | {params_text(c['params'])} |")
        lines.append("")
    for w in block.get("winners", []):
        lines.append(f"### Winner `{w['id']}` against the baseline source")
        lines.append("")
        lines.append(f"Template {w['template']}, origin {w['origin']}, parent "
                     f"{('`' + w['parent'] + '`') if w['parent'] else '-'}; chosen for {', '.join(w['shapes'])}.")
        lines.append("")
        lines.append("```diff")
        lines.append(w["diff"].rstrip("\n") or "(identical sources)")
        lines.append("```")
        lines.append("")
    if not block.get("winners") and block.get("candidate_rows"):
        lines.append("No candidate beat the baseline: the baseline stays the winner (no diff).")
        lines.append("")
    roof = block.get("roofline") or {}
    if any((r.get("roofline") or {}).get("baseline") or (r.get("roofline") or {}).get("winner") for r in block["shapes"]):
        has = roof.get("ceilings") is not None
        lines.append(f"### Roofline of {block['block']}")
        lines.append("")
        lines.append(roof.get("note", ""))
        lines.append("")
        lines.append("| shape | FLOP/byte | bound | baseline FLOP/s | baseline B/s | baseline % roof | "
                     "winner FLOP/s | winner B/s | winner % roof |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for r in block["shapes"]:
            rl = r.get("roofline") or {}
            b, w = rl.get("baseline"), rl.get("winner")
            intensity = (b or w or {}).get("intensity")
            bound = (b or w or {}).get("bound") if has else None
            lines.append(f"| {r['shape']} | {intensity:.3g} | {bound or 'n/a'} | "
                         + " | ".join(roofline_cells(b, has)) + " | " + " | ".join(roofline_cells(w, has)) + " |"
                         if intensity is not None else f"| {r['shape']} | - | - | - | - | - | - | - | - |")
        lines.append("")
    for s in block.get("suspects", []):
        lines.append(f"**Faster than physically possible — suspect:** candidate `{s['candidate']}` on {s['shape']}: "
                     f"{fmt_time(s['median_s'])} measured, the datasheet roofline allows no less than "
                     f"{fmt_time(s['roofline_s'])}.")
        lines.append("")
    if block.get("compiles"):
        lines.append(f"### Compile resources of {block['block']}")
        lines.append("")
        lines.append("| role | candidate | target | status | kernel | registers | spills st/ld (B) | shared mem (B) | warps | stages |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for c in block["compiles"]:
            for k in c["kernels"] or [{}]:
                lines.append(f"| {c['role']} | `{c['candidate_id']}` | {c['target']} | {c['status']} | "
                             f"{k.get('name', '-')} | {k.get('registers', '-')} | "
                             f"{k.get('spill_stores', '-')}/{k.get('spill_loads', '-')} | {k.get('shared_bytes', '-')} | "
                             f"{k.get('num_warps', '-')} | {k.get('num_stages', '-')} |")
        lines.append("")
    return lines


def _projection_markdown(projection: dict[str, Any] | None) -> list[str]:
    if not projection:
        return []
    lines = ["## Model-level projection (TTFT / TBT)", ""]
    models = ", ".join(f"{k} {v} layers" for k, v in projection["models"].items())
    lines.append(f"What the measured per-call times of the attention and MoE blocks mean for the whole model ({models}; "
                 "window-128 attention on half the layers, full on the other half). TTFT: prefill attention on "
                 "every layer plus the MoE experts over the prefill tokens; TBT: one decode step at batch B at the "
                 "profile's full context. Only these blocks' contribution changes; not measured and not included: "
                 + ", ".join(projection["not_measured"]) + ".")
    lines.append("")
    if projection.get("devices"):
        lines.append("Per-call times from: " + "; ".join(f"{b} on {d}" for b, d in projection["devices"].items())
                     + " (versions under Environment).")
        lines.append("")
    if not projection.get("measured_any", True):
        lines.append(NOTHING_PROJECTED)
        lines.append("")
    for p in projection["profiles"]:
        lines.append(f"### {p['profile']} ({p['input_tokens']} in / {p['output_tokens']} out)")
        lines.append("")
        if p["phases"]:
            lines.append("| phase | model | batch | baseline blocks | winner blocks | change | speedup | "
                         "J/token baseline | J/token winner | calls |")
            lines.append("|---|---|---|---|---|---|---|---|---|---|")
            for ph in p["phases"]:
                for c in ph["components"]:
                    if not c["complete"]:
                        continue
                    lines.append(f"| {ph['kind']} {c['label']} | {ph['model']} | {ph['batch'] or '-'} | "
                                 f"{fmt_time(c['baseline_s'])} | {fmt_time(c['winner_s'])} | {fmt_delta(c['change_s'])} | "
                                 f"{fmt_speedup(c['baseline_s'] / c['winner_s'] if c['winner_s'] else None)} | "
                                 f"{_joules(c['baseline_j_per_token'])} | {_joules(c['winner_j_per_token'])} | "
                                 f"{c['calls']} |")
                if ph["complete"]:
                    lines.append(f"| **{ph['kind']} total (these blocks)** | {ph['model']} | {ph['batch'] or '-'} | "
                                 f"{fmt_time(ph['baseline_s'])} | {fmt_time(ph['winner_s'])} | {fmt_delta(ph['change_s'])} | "
                                 f"{fmt_speedup(ph['speedup'])} | {_joules(ph['baseline_j_per_token'])} | "
                                 f"{_joules(ph['winner_j_per_token'])} | all parts measured |")
            notes = sorted({c["note"] for ph in p["phases"] for c in ph["components"] if c["note"] and c["complete"]})
            for n in notes:
                lines.append("")
                lines.append(f"Note: {n}.")
            lines.append("")
        if p["missing_groups"]:
            lines.append("Missing shapes (no projection is made from them):")
            lines.append("")
            for g in p["missing_groups"]:
                lines.append(f"- {g['block']}, {g['why']}: " + ", ".join(f"`{s}`" for s in g["shapes"]))
            lines.append("")
    return lines


def _joules(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g} J"


# -- writing ------------------------------------------------------------------------------------

def write_report(job: Job, catalog: Catalog, store: Store, folder: Path | None = None) -> Path:
    """Write REPORT.md, results.json and index.html into ``folder`` (default reports/<job>/);
    returns the path of REPORT.md."""
    from kernelforge.report.html import render_html

    folder = folder or job.report_dir
    data = collect(job, catalog, store)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "results.json").write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
        path = folder / "REPORT.md"
        path.write_text(to_markdown(data), encoding="utf-8")
        (folder / "index.html").write_text(render_html(data), encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write the report into {folder} ({exc.strerror}); check that the folder is writable") from None
    return path


# -- comparing two jobs -------------------------------------------------------------------------

def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The blocks and shapes of two collected reports side by side (A and B: two GPUs, two Triton
    versions, ...). Blocks and shapes present in only one are listed with the other side empty."""

    def side(data: dict[str, Any], block: str, shape: str) -> dict[str, Any] | None:
        for blk in data["blocks"]:
            if blk["block"] == block:
                for r in blk["shapes"]:
                    if r["shape"] == shape:
                        return r
        return None

    def env_of(data: dict[str, Any], block: str) -> dict[str, Any]:
        for blk in data["blocks"]:
            if blk["block"] == block and blk["env_key"]:
                return data["environments"].get(blk["env_key"], {})
        return {}

    blocks = []
    order = list(dict.fromkeys([x["block"] for x in a["blocks"]] + [x["block"] for x in b["blocks"]]))
    for block in order:
        shapes = []
        for data in (a, b):
            for blk in data["blocks"]:
                if blk["block"] == block:
                    shapes.extend(r["shape"] for r in blk["shapes"])
        rows = []
        for shape in dict.fromkeys(shapes):
            ra, rb = side(a, block, shape), side(b, block, shape)
            rows.append({
                "shape": shape, "a": ra, "b": rb,
                "winner_ratio": (ra["best_s"] / rb["best_s"]) if ra and rb and ra["best_s"] and rb["best_s"] else None,
                "baseline_ratio": (ra["baseline_s"] / rb["baseline_s"])
                if ra and rb and ra["baseline_s"] and rb["baseline_s"] else None,
            })
        geo = {}
        for name, data in (("a", a), ("b", b)):
            geo[name] = next((blk["geomean_speedup"] for blk in data["blocks"] if blk["block"] == block), None)
        blocks.append({"block": block, "rows": rows, "geomean_a": geo["a"], "geomean_b": geo["b"],
                       "env_a": env_of(a, block), "env_b": env_of(b, block)})
    return {"a": {"job": a["job"], "job_file": a["job_file"], "dtype": a["dtype"], "banners": a["banners"],
                  "environments": a["environments"]},
            "b": {"job": b["job"], "job_file": b["job_file"], "dtype": b["dtype"], "banners": b["banners"],
                  "environments": b["environments"]},
            "blocks": blocks}


def env_title(env: dict[str, Any]) -> str:
    """Device and versions of an env in one short line."""
    if not env:
        return "no results"
    parts = [str(env.get("device_name", env.get("device", "?")))]
    for key in ("triton", "torch", "cuda", "driver"):
        if env.get(key):
            parts.append(f"{key} {env[key]}")
    return ", ".join(parts)


def compare_markdown(cmp: dict[str, Any]) -> str:
    """The comparison as Markdown (printed by ``kernelforge report A --compare B``)."""
    a, b = cmp["a"], cmp["b"]
    lines = [f"# kernelforge comparison: {a['job']} (A) vs {b['job']} (B)", ""]
    lines.append(f"A: `{a['job_file']}`; B: `{b['job_file']}`. Speedups are each job's winner over its own baseline; "
                 "'A/B winner time' > 1 means B's winner is faster than A's.")
    lines.append("")
    for name, side in (("A", a), ("B", b)):
        for banner in side["banners"]:
            lines.append(f"> **{name}: {banner['text']}**")
            lines.append("")
    for blk in cmp["blocks"]:
        lines.append(f"## {blk['block']}")
        lines.append("")
        lines.append(f"A: {env_title(blk['env_a'])}. B: {env_title(blk['env_b'])}.")
        lines.append("")
        lines.append(f"Geometric-mean speedup: A {fmt_speedup(blk['geomean_a'])}, B {fmt_speedup(blk['geomean_b'])}.")
        lines.append("")
        lines.append("| shape | A baseline | A winner | A speedup | B baseline | B winner | B speedup | "
                     "A/B baseline time | A/B winner time |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for r in blk["rows"]:
            ra, rb = r["a"] or {}, r["b"] or {}
            lines.append(f"| {r['shape']} | {fmt_time(ra.get('baseline_s'))} | {fmt_time(ra.get('best_s'))} | "
                         f"{_speedup_text(ra) if ra else '-'} | {fmt_time(rb.get('baseline_s'))} | "
                         f"{fmt_time(rb.get('best_s'))} | {_speedup_text(rb) if rb else '-'} | "
                         f"{fmt_speedup(r['baseline_ratio'])} | {fmt_speedup(r['winner_ratio'])} |")
        lines.append("")
    return "\n".join(lines)


def write_compare(a: dict[str, Any], b: dict[str, Any], folder: Path = Path("reports")) -> tuple[str, Path]:
    """Write reports/compare-<a>-vs-<b>.html; returns (Markdown text, HTML path)."""
    from kernelforge.report.html import render_compare

    cmp = compare(a, b)
    path = folder / f"compare-{a['job']}-vs-{b['job']}.html"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(render_compare(cmp), encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {path} ({exc.strerror}); check that the folder is writable") from None
    return compare_markdown(cmp), path


__all__ = ["collect", "collect_projection", "compare", "compare_markdown", "to_markdown", "write_compare",
           "write_report"]
