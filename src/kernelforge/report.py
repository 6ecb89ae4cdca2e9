"""Reports of a search, built only from stored measurements: ``REPORT.md`` and ``results.json``.

Per block and shape: the baseline's time, the winner's time, the speedup with its spread (from the
interleaved confirmation pairs when the search confirmed it, else from the two timing bands),
the winning parameters, counts by status and origin, and the device and versions. Interpreter and
replayed timings are labelled as such wherever a number appears.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from .analysis import by_candidate, geomean, rank, speedup, speedup_spread
from .catalog import Catalog
from .errors import UserError
from .job import Job
from .result import format_seconds
from .store import Store


def collect(job: Job, catalog: Catalog, store: Store) -> dict[str, Any]:
    """Everything the report shows, as plain data (this is results.json)."""
    from .candidate import Candidate

    confirmations = store.confirmations(job.name)
    blocks = []
    environments: dict[str, dict[str, Any]] = {}
    for spec in job.blocks:
        block = catalog.block(spec.id)
        shapes = [s.name for s in block.shapes(spec.shapes)]
        baseline_id = Candidate.from_template(catalog.baseline(block.id)).id
        rows = [r for r in store.results(block=block.id, dtype=job.dtype) if r.shape in shapes]
        for r in rows:
            environments.setdefault(r.env_key, r.env)
        env_keys = sorted({r.env_key for r in rows if r.candidate_id == baseline_id})
        env_key = env_keys[-1] if env_keys else None
        rows = [r for r in rows if r.env_key == env_key]
        table = by_candidate(rows)
        candidates = {c.id: c for c in store.candidates(block.id)}
        statuses = Counter()
        for cid, per_shape in table.items():
            worst = next((r.status.value for r in per_shape.values() if not r.ok), "ok")
            statuses[worst] += 1
        origins = Counter(candidates[cid].origin for cid in table if cid in candidates)
        groups = [shapes] if job.tune == "all-shapes" else [[s] for s in shapes]
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
                    "baseline_s": base.median_s if base else None,
                    "best_s": best.median_s if best else None,
                    "winner": winner,
                    "winner_is_baseline": winner == baseline_id,
                    "params": candidates[winner].params if winner in candidates else {},
                    "template": candidates[winner].template if winner in candidates else None,
                    "speedup": conf["median"] if conf else speedup(base, best),
                    "speedup_p20": conf["p20"] if conf else (band[0] if band else None),
                    "speedup_p80": conf["p80"] if conf else (band[1] if band else None),
                    "confirmed": bool(conf),
                    "significant": bool(conf and conf["p20"] > 1.0),
                    "flops": base.flops if base else None,
                    "bytes": base.bytes if base else None,
                    "timing_label": base.timing_label if base else None,
                })
        speedups = [r["speedup"] for r in shape_rows if r["speedup"]]
        blocks.append({
            "block": block.id, "description": block.description, "shapes": shape_rows,
            "geomean_speedup": geomean(speedups) if speedups else None,
            "statuses": dict(statuses), "origins": dict(origins), "candidates": len(table),
            "env_key": env_key, "baseline": baseline_id,
        })
    return {
        "job": job.name, "job_file": str(job.path), "dtype": job.dtype, "tune": job.tune,
        "strategy": job.strategy.name, "storage": job.storage_url, "blocks": blocks,
        "environments": environments,
    }


def _speedup_text(row: dict[str, Any]) -> str:
    if row["speedup"] is None:
        return "-"
    text = f"{row['speedup']:.3f}x"
    if row["speedup_p20"] is not None:
        text += f" ({row['speedup_p20']:.3f}-{row['speedup_p80']:.3f})"
    return text


def to_markdown(data: dict[str, Any]) -> str:
    """REPORT.md: a table per block, then the environments the numbers came from."""
    lines = [f"# kernelforge report: {data['job']}", ""]
    lines.append(f"Job `{data['job_file']}`, dtype {data['dtype']}, tuning {data['tune']}, strategy {data['strategy']}. "
                 "Every number below is read from the job's results database; speedup = baseline time / winner "
                 "time, with its p20-p80 spread (from interleaved re-timing pairs where marked confirmed).")
    lines.append("")
    for env in data["environments"].values():
        if env.get("device") in ("interpret", "replay") or "interpreter" in str(env.get("timing", "")):
            lines.append(f"> **{env.get('timing', env.get('device'))}** ({env.get('device_name')}): "
                         "these timings are not GPU measurements of speed.")
            lines.append("")
    for block in data["blocks"]:
        lines.append(f"## {block['block']}")
        lines.append("")
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
            params = " ".join(f"{k}={v}" for k, v in row["params"].items())
            winner = "baseline" if row["winner_is_baseline"] else f"`{row['winner']}` ({row['template']})"
            confirmed = ("yes, significant" if row["significant"] else "yes, within noise") if row["confirmed"] else "no"
            lines.append(
                f"| {row['shape']} | {format_seconds(row['baseline_s']) if row['baseline_s'] else '-'} | "
                f"{format_seconds(row['best_s']) if row['best_s'] else '-'} | {_speedup_text(row)} | {confirmed} | "
                f"{winner} | {params} |"
            )
        labels = sorted({r["timing_label"] for r in block["shapes"] if r["timing_label"]})
        if labels:
            lines.append("")
            lines.append("Timing: " + "; ".join(labels) + ".")
        lines.append("")
    lines.append("## Environment")
    lines.append("")
    for key, env in data["environments"].items():
        lines.append(f"- `{key}`: " + ", ".join(f"{k} {v}" for k, v in sorted(env.items())))
    lines.append("")
    return "\n".join(lines)


def write_report(job: Job, catalog: Catalog, store: Store, folder: Path | None = None) -> Path:
    """Write REPORT.md and results.json into ``folder`` (default reports/<job>/); returns REPORT.md."""
    folder = folder or job.report_dir
    data = collect(job, catalog, store)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "results.json").write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
        path = folder / "REPORT.md"
        path.write_text(to_markdown(data), encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write the report into {folder} ({exc.strerror}); check that the folder is writable") from None
    return path
