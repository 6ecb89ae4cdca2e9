"""What the bound on ``auto``'s hyperparameter refits saves at 400 told trials (issue 34): the
ask times of two settings of ``AutoStrategy.refit_steps`` / ``fit_subsample``, taken in turn in
one process under the same host load.

    PYTHONPATH=src python benchmarks/refit_cost.py [--seeds 3] [--set 40,120 --set 15,80] SPACE.json.gz [...]

For each space and seed, each setting gets a fresh ``auto`` told the same 380 recorded
configurations (drawn at random, seeded; as a resumed search tells its history), then 20 asks,
each told its recorded outcome: the asks made with 380 to 399 trials told, the window of
``benchmarks/ask_time.py --history 380 --checkpoints 400``. Printed per setting: the median, 95th
percentile and slowest of those asks pooled over seeds, in ms of wall-clock time on this host (CPU
work, not GPU time), and the host's load average. Settings alternate seed by seed, so a change of
load falls on both.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from kernelforge.strategies.auto.strategy import AutoStrategy  # noqa: E402
from kernelforge.strategies.bench.stats import percentile  # noqa: E402
from kernelforge.strategies.bench.recorded import load_kernel_tuner_cache  # noqa: E402


def window(space, seed: int, steps: int, subsample: int, history: int = 380, asks: int = 20) -> list[float]:
    strategy = AutoStrategy(space.space, seed=seed)
    strategy.refit_steps, strategy.fit_subsample = steps, subsample
    keys = list(space.records)
    random.Random(seed).shuffle(keys)
    for key in keys[:history]:
        point = dict(zip(space.space.names, key))
        strategy.tell(point, space.lookup(point))
    out = []
    for _ in range(asks):
        before = time.perf_counter()
        point = strategy.ask()
        out.append((time.perf_counter() - before) * 1000)
        strategy.tell(point, space.lookup(point))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spaces", nargs="+", type=Path)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--set", action="append", default=None, metavar="STEPS,SUBSAMPLE")
    args = parser.parse_args(argv)
    settings = [tuple(int(v) for v in s.split(",")) for s in (args.set or ["40,120", "15,80"])]
    for path in args.spaces:
        space = load_kernel_tuner_cache(path)
        times: dict[tuple[int, ...], list[float]] = {s: [] for s in settings}
        load = os.getloadavg()[0]
        for seed in range(args.seeds):
            for steps, subsample in settings:
                times[(steps, subsample)] += window(space, seed, steps, subsample)
        for (steps, subsample), ms in times.items():
            ms = sorted(ms)
            print(f"{path.name:30s} refit_steps {steps:3d} fit_subsample {subsample:4d}: asks at 380-399 told, "
                  f"median {statistics.median(ms):6.1f} p95 {percentile(ms, 0.95):6.1f} max {ms[-1]:6.1f} ms "
                  f"(load {load:.1f} to {os.getloadavg()[0]:.1f})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
