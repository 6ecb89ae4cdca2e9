"""Which part of a transfer helps: ``auto`` on each recorded convolution space with only the warm
points of the other GPU's recording, then with only its rank input (issue 34).

    PYTHONPATH=src python benchmarks/transfer_parts.py [--seeds 10] [--budget 200] [--fix NAME[=V1,V2]] \
        [--jobs 2] [--json FILE]

Replays the recorded spaces (no device): evaluations to within 1% of the optimum per seed, each
run stopped there, and their median (a miss counts as budget + 1). The full transfer (both parts)
and the cold start are the strategy bench's own runs (``strategy-bench --warm-from``). With
``--fix`` the targets are the slices of each recording that the strategy bench's ``--fix`` names,
each warm-started from the other GPU's whole recording, as ``strategy-bench --fix ... --warm-from``
does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from functools import partial  # noqa: E402

from kernelforge.strategies.bench.run import run_one  # noqa: E402
from kernelforge.strategies.bench.recorded import load_kernel_tuner_cache  # noqa: E402
from kernelforge.strategies.bench.slices import parse_fix, sliced  # noqa: E402
from kernelforge.strategies.transfer import rank_scores, warm_points  # noqa: E402

SPACES = REPO.parent / "shared" / "data" / "tuning-spaces"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--budget", type=int, default=200)
    parser.add_argument("--fix", action="append", default=[], metavar="NAME[=V1,V2]")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    a4000 = load_kernel_tuner_cache(SPACES / "convolution_A4000.json.gz")
    w7800 = load_kernel_tuner_cache(SPACES / "convolution_W7800.json.gz")
    fixes = [parse_fix(text) for text in args.fix]
    out = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        for whole, source in ((w7800, a4000), (a4000, w7800)):
            for target in sliced([whole], fixes):
                for part in ("points", "ranks"):
                    first = warm_points(source, target) if part == "points" else ()
                    transfer = rank_scores(source, target) if part == "ranks" else None
                    run = partial(_reached, target, budget=args.budget, first=first, transfer=transfer)
                    reached = list(pool.map(run, range(args.seeds)))
                    out[f"{target.name} {part}"] = reached
                    median = statistics.median(n if n is not None else args.budget + 1 for n in reached)
                    print(target.name, part, reached, median, flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(out) + "\n")
    return 0


def _reached(target, seed: int, *, budget: int, first, transfer) -> int | None:
    """Evaluations to within 1% of one run of ``auto`` (None: it never got there)."""
    return run_one(target, "auto", seed, budget, stop=True, first=first, transfer=transfer).reached[0.01]


if __name__ == "__main__":
    raise SystemExit(main())
