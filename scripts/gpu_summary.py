"""Print one table of everything scripts/gpu_check.sh measured (read from its JSON files)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kernelforge.devices.hardware import ceilings_for  # noqa: E402
from kernelforge.result import format_seconds  # noqa: E402


def main(folder: str) -> int:
    rows = []
    device = "?"
    for path in sorted(Path(folder).glob("*.json")):
        data = json.loads(path.read_text())
        device = data["environment"].get("device_name", device)
        rows.extend(data["results"])
    ceilings = ceilings_for(device)
    print(f"\n== kernelforge GPU check on {device} ==")
    print(f"{'block':28} {'shape':34} {'dtype':9} {'status':8} {'median':>11} {'TFLOP/s':>8} {'TB/s':>6} {'%roof':>6} bound")
    bad = 0
    for r in rows:
        t = r.get("timing")
        median = t["median_s"] if t else None
        tflops = r["flops"] / median / 1e12 if median else None
        tbs = r["bytes"] / median / 1e12 if median else None
        roof = bound = ""
        if median and ceilings:
            roof = f"{100 * ceilings.roofline_seconds(r['flops'], r['bytes']) / median:.0f}"
            bound = ceilings.bound(r["flops"], r["bytes"])
        bad += r["status"] != "ok"
        print(f"{r['block']:28} {r['shape'][:34]:34} {r['dtype']:9} {r['status']:8} "
              f"{format_seconds(median) if median else '-':>11} {f'{tflops:.1f}' if tflops else '-':>8} "
              f"{f'{tbs:.2f}' if tbs else '-':>6} {roof:>6} {bound}")
    print(f"{len(rows)} results, {bad} not ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
