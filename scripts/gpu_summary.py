"""Make the reports of a GPU-proof run from its returned databases, and print one summary.

    python3 scripts/gpu_summary.py FOLDER        # FOLDER: reports/<gpu>-<date>/ (scripts/gpu_check.py)

Runs on any CPU (the GPU run makes no report: its device time goes to measuring). For every job
the run searched (jobs.tsv, db/<job>.db) it writes the job's report into FOLDER/<job>/ with
``kernelforge report``, rooflines against the run's own measured ceilings (ceilings.json through
KERNELFORGE_CEILINGS). Then it prints the measured ceilings, the timing cross-check (each baseline
by kernelforge's method, do_bench and do_bench_cudagraph; ratios outside the agreement range
FLAGGED), the sandbox probe, and per block and shape the speedup over the human baseline and over
the library reference, with percent of the measured roofline and energy per call. Exits 1 when the
probe failed, a report could not be made, or no search result was found.

A dry run (any result timed in the interpreter) is labelled as interpreter wall time on the CPU on
every table that shows a time: it says nothing about GPU speed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernelforge.devices.hardware import ceilings_for  # noqa: E402
from kernelforge.result import format_seconds  # noqa: E402

DRY_BANNER = ("DRY RUN in the Triton interpreter on the CPU: every time below is interpreter wall time, "
              "not GPU speed; no percent of roofline or energy applies")


def seconds(value: float | None) -> str:
    return format_seconds(value) if value else "-"


def joules(value: float | None) -> str:
    return f"{value:.3g} J" if value else "-"


def percent(value: float | None) -> str:
    return f"{value:.0f}%" if value is not None else "-"


def check_rows(folder: Path) -> tuple[list[dict[str, Any]], str]:
    """The results of every check/*.json, and the device name they report."""
    rows: list[dict[str, Any]] = []
    device = "?"
    for path in sorted((folder / "check").glob("*.json"), key=lambda p: (len(p.stem), p.stem)):
        data = json.loads(path.read_text(encoding="utf-8"))
        device = data["environment"].get("device_name", device)
        rows.extend(data["results"])
    return rows, device


def search_reports(folder: Path) -> list[dict[str, Any]]:
    """Every */results.json of the run's jobs (one folder per job)."""
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*/results.json"))]


def print_checks(rows: list[dict[str, Any]], device: str, interpreted: bool) -> int:
    """Print the baseline table; return the number of results that did not pass. Rates over
    interpreter time are left out: they are no hardware's rates."""
    ceilings = ceilings_for(device)
    print(f"\n-- baseline checks through the sandboxed worker ({device}) --")
    print(f"{'block':26} {'shape':30} {'status':8} {'median':>11} {'TFLOP/s':>8} {'TB/s':>6} {'%roof':>6} "
          f"{'energy/call':>11} timing")
    bad = 0
    for r in rows:
        t = r.get("timing") or {}
        median = t.get("median_s")
        rated = median and not interpreted
        tflops = f"{r['flops'] / median / 1e12:.1f}" if rated else "-"
        tbs = f"{r['bytes'] / median / 1e12:.2f}" if rated else "-"
        roof = None
        if median and ceilings:
            roof = 100 * ceilings.roofline_seconds(r["flops"], r["bytes"]) / median
        bad += r["status"] != "ok"
        print(f"{r['block']:26} {r['shape'][:30]:30} {r['status']:8} {seconds(median):>11} {tflops:>8} {tbs:>6} "
              f"{percent(roof):>6} {joules(t.get('joules_per_call')):>11} {t.get('label', '-')}")
    return bad


def verdict(shape: dict[str, Any]) -> str:
    """"win" when the confirmation pairs' 20th percentile is above 1 (the search's winner rule),
    "no win" when pairs ran but it is not, "-" when nothing was confirmed."""
    if not shape.get("confirmed"):
        return "-"
    won = shape["significant"] if "significant" in shape else (shape.get("speedup_p20") or 0) > 1
    return "win" if won else "no win"


def print_searches(reports: list[dict[str, Any]]) -> int:
    """Print the search table; return the number of shapes with a timed baseline."""
    print("\n-- searches (speedup over the per-shape human baseline; p20-p80 of the confirmation pairs; "
          "vs lib: the library reference's time over the best) --")
    print(f"{'job':22} {'block':26} {'shape':28} {'baseline':>10} {'best':>10} {'speedup':>8} {'p20-p80':>11} "
          f"{'verdict':9} {'vs lib':>7} {'%roof b->w':>11} {'J/call b->w':>17} evals")
    found = 0
    sources: dict[str, str] = {}
    for rep in reports:
        for block in rep["blocks"]:
            evals = block.get("candidates", "-")
            library = {line["shape"]: line for line in block.get("library") or []}
            for s in block["shapes"]:
                if s.get("baseline_source"):
                    sources.setdefault(f"{block['block']} {s['shape']}", s["baseline_source"])
                lib = library.get(s["shape"])
                vs_lib = f"{lib['median_s'] / s['best_s']:.2f}x" if lib and s.get("best_s") else "-"
                found += bool(s.get("baseline_s"))  # a shape listed without any timing is no result
                roof = s.get("roofline") or {}
                base_pct = (roof.get("baseline") or {}).get("percent")
                best_pct = (roof.get("winner") or {}).get("percent")
                spread = (f"{s['speedup_p20']:.2f}-{s['speedup_p80']:.2f}"
                          if s.get("speedup_p20") and s.get("speedup_p80") else "-")
                speedup = f"{s['speedup']:.2f}x" if s.get("speedup") else "-"
                energy = f"{joules(s.get('baseline_j'))}->{joules(s.get('best_j'))}"
                print(f"{rep['job'][:22]:22} {block['block']:26} {s['shape'][:28]:28} {seconds(s.get('baseline_s')):>10} "
                      f"{seconds(s.get('best_s')):>10} {speedup:>8} {spread:>11} "
                      f"{verdict(s):9} {vs_lib:>7} {percent(base_pct) + '->' + percent(best_pct):>11} "
                      f"{energy:>17} {evals}")
                if lib:
                    print(f"{'':22} {'  library: ' + lib.get('implementation', '?'):26} {'':28} "
                          f"{seconds(lib['median_s']):>10}")
    if sources:
        print("\nbaseline sources:")
        for where, source in sources.items():
            print(f"  {where}: {source}")
    return found


def make_reports(folder: Path) -> int:
    """``kernelforge report`` of every job of the run into FOLDER/<job>/; the number that failed."""
    import os
    import shutil
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    if (folder / "ceilings.json").exists():
        env["KERNELFORGE_CEILINGS"] = str((folder / "ceilings.json").resolve())
    failed = 0
    jobs = folder / "jobs.tsv"
    for line in jobs.read_text(encoding="utf-8").splitlines() if jobs.exists() else []:
        name, job_file = line.split("\t")
        db = (folder / "db" / f"{name}.db").resolve()
        if not db.exists():
            print(f"{name}: no database ({db}): the search step made none")
            failed += 1
            continue
        shutil.rmtree(ROOT / "reports" / name, ignore_errors=True)
        done = subprocess.run([sys.executable, "-m", "kernelforge", "report", job_file, "--storage", f"sqlite:///{db}"],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{name}: the report failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
            failed += 1
            continue
        shutil.rmtree(folder / name, ignore_errors=True)
        shutil.move(str(ROOT / "reports" / name), str(folder / name))
    return failed


def print_ceilings(folder: Path) -> None:
    path = folder / "ceilings.json"
    if not path.exists():
        print("\n-- measured ceilings: none (not measured in this run; rooflines use the table's figures) --")
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    print(f"\n-- measured ceilings ({data['device_name']}): copy {data['bandwidth'] / 1e12:.2f} TB/s, "
          f"bf16 matmul {data['flops'] / 1e12:.0f} TFLOP/s --\n   {data['method']}")


def print_crosscheck(folder: Path, interpreted: bool) -> int:
    """The cross-check table; the number of flagged rows."""
    path = folder / "crosscheck.json"
    if not path.exists():
        print("\n-- timing cross-check: none (crosscheck.json is missing) --")
        return 0
    data = json.loads(path.read_text(encoding="utf-8"))
    low, high = data["agreement"]
    print(f"\n-- timing cross-check: each baseline three ways (ratios to kernelforge's; {low}-{high} agree)"
          f"{' (interpreter wall time, not GPU speed)' if interpreted else ''} --")
    print(f"{'block':26} {'shape':28} {'kernelforge':>11} {'method':12} {'do_bench':>10} {'cudagraph':>10} "
          f"{'ratio':>6} {'graph':>6} {'launch':>9}")
    flagged = 0
    for row in data["rows"]:
        ratios = row["ratios"]
        flagged += row["flagged"]
        print(f"{row['block']:26} {row['shape'][:28]:28} {seconds(row['kernelforge_s']):>11} "
              f"{row['kernelforge_method'][:12]:12} {seconds(row['do_bench_s']):>10} {seconds(row['cudagraph_s']):>10} "
              f"{ratio(ratios['do_bench']):>6} {ratio(ratios['cudagraph']):>6} {seconds(row.get('host_launch_s')):>9}"
              f"{'  FLAGGED' if row['flagged'] else ''}{'  ' + row['note'] if row.get('note') else ''}")
    return flagged


def ratio(value: float | None) -> str:
    return f"{value:.2f}" if value else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Make the reports of a GPU-proof run and summarise it.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--no-reports", action="store_true", help="only summarise the reports already made")
    args = parser.parse_args(argv)
    report_failures = 0 if args.no_reports else make_reports(args.folder)
    rows, device = check_rows(args.folder)
    reports = search_reports(args.folder)
    interpreted = any((r.get("timing") or {}).get("method") == "interpreter-wall" for r in rows) or any(
        env.get("device") == "interpret" for rep in reports for env in rep.get("environments", {}).values())
    title = "DRY RUN (interpreter)" if interpreted else "GPU proof"
    print(f"== kernelforge {title} on {device}: {args.folder} ==")
    if interpreted:
        print(DRY_BANNER)
    fallback = args.folder / "sandbox-fallback.txt"
    if fallback.exists():
        print(f"SANDBOX: {fallback.read_text(encoding='utf-8').strip()}")
    print_ceilings(args.folder)
    flagged = print_crosscheck(args.folder, interpreted)
    bad = print_checks(rows, device, interpreted)
    found = print_searches(reports)
    if interpreted:
        print(f"\n{DRY_BANNER}")
    print(f"\n{len(rows)} baseline checks, {bad} not ok; {flagged} cross-check rows flagged; {found} searched shapes "
          f"in {len(reports)} jobs; {report_failures} reports failed")
    if not found:
        print("no search result was found (*/results.json)")
    return 1 if bad or report_failures or not found else 0


if __name__ == "__main__":
    sys.exit(main())
