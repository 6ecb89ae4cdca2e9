"""Evaluations per minute with 1, 2 and 3 workers of one job, side by side in one run, on the
waiting replay device (``replay:PATH?wait=F``: each evaluation sleeps its recorded device time
times F, a stand-in for a busy GPU). Not a test: a measurement for issue 13's acceptance (3 workers
at least 2.5x one).

    python benchmarks/workers_throughput.py [--workers 1,2,3] [--budget 8] [--wait-s 0.75]
                                            [--kernels tests/fixtures/kernels --block toy/axpy --shapes check]

First it records: a per-shape grid search of the block in Triton's interpreter into a temporary
SQLite file (the grid asks the same candidates again, so the replay finds each of them). Then, for
each worker count, the same job on ``replay:RECORDING?wait=F`` into a fresh database with
``kernelforge search --workers N`` (budget: ``--budget`` per shape, e.g. 8 x 3 shapes = 24
evaluations), F chosen so an evaluation waits about ``--wait-s`` seconds. Evaluations per minute
are counted over the search: from the last ``baseline`` event (the baselines are measured once, by
one worker, while the others wait for them: a fixed cost of the job, the same for any number of
workers) to the last ``evaluated``. The span from the first ``start`` (baselines included) and the
wall time of the whole command (process start-up included) are shown too.
The recorded times are interpreter wall times on the CPU: here they only set how long each
evaluation waits, they say nothing about GPU speed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

JOB = """
[job]
name = "{name}"
device = "{device}"
dtype = "float16"
seed = 7
tune = "per-shape"

[strategy]
name = "grid"
evaluations = {budget}

[[blocks]]
id = "{block}"
shapes = "{shapes}"
"""


def kernelforge(kernels: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelforge", "--kernels", str(kernels), *args], cwd=cwd,
                          capture_output=True, text=True)


def record(folder: Path, kernels: Path, block: str, shapes: str, budget: int) -> Path:
    """The recording: a grid search of ``block`` in the interpreter (the baseline and ``budget``
    candidates per shape, plus one to spare for the grid's order)."""
    job = folder / "record.toml"
    job.write_text(JOB.format(name="record", device="interpret", budget=budget + 1, block=block, shapes=shapes))
    db = folder / "record.db"
    done = kernelforge(kernels, "search", str(job), "--storage", f"sqlite:///{db}", "--progress", "quiet",
                       "--no-report", "--no-compile", cwd=folder)
    if done.returncode != 0:
        sys.exit(f"recording failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return db


def wait_factor(recording: Path, seconds: float) -> float:
    """F such that an evaluation of the recording waits about ``seconds`` on average (the job is
    tuned per shape: an evaluation is one candidate on one shape, one recorded row)."""
    from kernelforge.store.store import Store

    store = Store(f"sqlite:///{recording}", create=False)
    try:
        waits = [r.median_s * (r.samples or 0) for r in store.results() if r.ok and r.median_s is not None]
    finally:
        store.close()
    mean = sum(waits) / max(1, len(waits))
    if mean <= 0:
        sys.exit("the recording holds no timed result")
    return seconds / mean


def run(folder: Path, kernels: Path, device: str, block: str, shapes: str, budget: int, workers: int) -> dict:
    name = f"replay{workers}"
    job = folder / f"{name}.toml"
    job.write_text(JOB.format(name=name, device=device, budget=budget, block=block, shapes=shapes))
    start = time.perf_counter()
    done = kernelforge(kernels, "search", str(job), "--storage", f"sqlite:///{folder / (name + '.db')}",
                       "--workers", str(workers), "--no-report", "--progress", "jsonl", cwd=folder)
    wall = time.perf_counter() - start
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    evaluated = [e for e in events if e["event"] == "evaluated" and e.get("status") != "resumed"]
    starts = [e["time"] for e in events if e["event"] == "start"]
    baselines = [e["time"] for e in events if e["event"] == "baseline"]
    last = max(e["time"] for e in evaluated) if evaluated else 0.0
    span = (last - min(starts)) if evaluated and starts else 0.0
    search = (last - max(baselines)) if evaluated and baselines else 0.0
    error = "" if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[0][:100]
    return {"workers": workers, "evaluations": len(evaluated), "wall": wall, "span": span, "search": search,
            "per_min": 60 * len(evaluated) / search if search > 0 else 0.0, "rc": done.returncode, "error": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,3", help="worker counts, comma-separated")
    parser.add_argument("--budget", type=int, default=8, help="evaluations per shape (the grid's candidates)")
    parser.add_argument("--wait-s", type=float, default=0.75, help="seconds an evaluation waits, on average")
    parser.add_argument("--kernels", type=Path, default=REPO / "tests" / "fixtures" / "kernels")
    parser.add_argument("--block", default="toy/axpy")
    parser.add_argument("--shapes", default="check")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    with tempfile.TemporaryDirectory(prefix="kf-workers-") as tmp:
        folder = Path(tmp)
        recording = record(folder, args.kernels.resolve(), args.block, args.shapes, args.budget)
        factor = wait_factor(recording, args.wait_s)
        device = f"replay:{recording}?wait={factor:.6g}"
        print(f"recording: {args.block} ({args.shapes}) grid in the interpreter; replay wait factor {factor:.4g} "
              f"(about {args.wait_s:g} s per evaluation)")
        rows = [run(folder, args.kernels.resolve(), device, args.block, args.shapes, args.budget, n) for n in counts]
    base = next((r["per_min"] for r in rows if r["workers"] == 1 and r["rc"] == 0), 0.0)
    print(f"{'workers':>7}  {'evaluations':>11}  {'wall s':>7}  {'span s':>7}  {'search s':>8}  {'evals/min':>9}  "
          f"{'ratio':>6}  status")
    for r in rows:
        ratio = f"{r['per_min'] / base:6.2f}" if base and r["rc"] == 0 else "     -"
        status = "ok" if r["rc"] == 0 else f"exit {r['rc']}: {r['error']}"
        print(f"{r['workers']:>7}  {r['evaluations']:>11}  {r['wall']:>7.1f}  {r['span']:>7.1f}  {r['search']:>8.1f}  "
              f"{r['per_min']:>9.1f}  {ratio}  {status}")


if __name__ == "__main__":
    main()
