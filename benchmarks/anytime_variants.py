"""The development loop for ``auto``'s anytime curve (issue 34): variants of its class constants,
each run over seeds on recorded spaces, the median best/optimum after 10, 25, 50 and 100
evaluations per space, the area under that curve and the evaluations to 1%.

    PYTHONPATH=src python benchmarks/anytime_variants.py SPACE.json.gz [...] --seeds 20 --budget 100 \
        [--strategy auto] [--set start=8 --set ...] [--fix NAME[=V1,V2]] [--warm-from SPACE.json.gz] \
        [--shuffle-source SEED] [--stop] [--jobs 2] [--json FILE]

Replays the recorded spaces (no device), with the strategy bench's own loop
(:func:`kernelforge.strategies.bench.run.run_one`, no stop): a variant is ``auto`` with some of its
class attributes (``AutoStrategy.start``, ...) set for the run, so a variant is measured exactly
as the bench measures the shipped strategy. ``--json`` appends one record per space (variant,
seeds, per-seed best/optimum at each checkpoint and after every evaluation, evaluations to 1%,
the area and its 95% interval) to FILE, one JSON object per line. ``--fix`` runs the slices the
strategy bench's ``--fix`` names instead of the whole spaces; ``--warm-from`` warm-starts every run
on each space from another GPU's recording of its kernel, as the strategy bench's does (the spaces
that are not one are left out; a slice is never warmed from its own whole space), so a variant of
the warm start is measured against the cold one with one command; ``--shuffle-source SEED`` first
permutes the source's recorded times among its successful configurations (seeded; its failures
stay): a recording of the kernel that says nothing about this GPU, so what a useless warm start
costs is measured the same way; ``--stop`` ends each run within 1%
(as the bench's; a checkpoint past the stop reads the best at the stop); ``--jobs`` runs the seeds
in parallel processes, each with the variant's settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from functools import partial  # noqa: E402

from kernelforge.errors import UserError  # noqa: E402
from kernelforge.strategies.auto.strategy import AutoStrategy  # noqa: E402
from kernelforge.strategies.bench import anytime  # noqa: E402
from kernelforge.strategies.bench.recorded import RecordedSpace, load_kernel_tuner_cache  # noqa: E402
from kernelforge.strategies.bench.run import run_one  # noqa: E402
from kernelforge.strategies.bench.slices import parse_fix, sliced  # noqa: E402
from kernelforge.strategies.transfer import other_recordings, warm_start  # noqa: E402

CHECKS = (10, 25, 50, 100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spaces", nargs="+", type=Path)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--budget", type=int, default=100)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="an AutoStrategy class attribute for this run (a Python literal)")
    parser.add_argument("--fix", action="append", default=[], metavar="NAME[=V1,V2]")
    parser.add_argument("--warm-from", type=Path, default=None, metavar="SPACE")
    parser.add_argument("--shuffle-source", type=int, default=None, metavar="SEED")
    parser.add_argument("--stop", action="store_true")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    settings = {}
    for item in args.set:
        name, _, value = item.partition("=")
        if not hasattr(AutoStrategy, name):
            parser.error(f"--set {item}: AutoStrategy has no attribute {name!r}")
        settings[name] = json.loads(value)
    label = args.strategy + "".join(f" {k}={v}" for k, v in settings.items())
    spaces = [load_kernel_tuner_cache(path) for path in args.spaces]
    source = load_kernel_tuner_cache(args.warm_from) if args.warm_from is not None else None
    if args.shuffle_source is not None:
        if source is None:
            parser.error("--shuffle-source: give the source to shuffle with --warm-from SPACE")
        source = shuffled(source, args.shuffle_source)
    if source is not None:
        try:
            spaces = other_recordings(source, spaces, str(args.warm_from))
        except UserError as exc:
            parser.error(str(exc))
        label += f" warm from {source.name}"
        if args.shuffle_source is not None:
            label += f" shuffled {args.shuffle_source}"
    spaces = sliced(spaces, [parse_fix(t) for t in args.fix])  # after the warm filter, as the bench's
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    with ProcessPoolExecutor(args.jobs, initializer=_apply, initargs=(settings,)) as pool:
        for space in spaces:
            warm = warm_start(source, space)
            run = partial(run_one, space, args.strategy, budget=args.budget, stop=args.stop, first=warm.first,
                          transfer=warm.transfer)
            runs = list(pool.map(run, seeds))
            _report(space, runs, label, seeds, args)
    return 0


def shuffled(source: RecordedSpace, seed: int) -> RecordedSpace:
    """``source`` with its recorded times permuted among its successful configurations (seeded; a
    failure stays where it was), under a device name that says so."""
    keys = [key for key, value in source.records.items() if isinstance(value, float)]
    times = [source.records[key] for key in keys]
    random.Random(seed).shuffle(times)
    records = {**source.records, **dict(zip(keys, times))}
    return dataclasses.replace(source, records=records, device=f"{source.device} (times shuffled, seed {seed})")


def _apply(settings: dict) -> None:
    for name, value in settings.items():
        setattr(AutoStrategy, name, value)


def _report(space, runs, label: str, seeds: range, args: argparse.Namespace) -> None:
    """One line per space (the medians at the checkpoints, the area, evaluations to 1%, ask p95), and
    its record in ``--json``."""
    _, optimum = space.optimum()
    matrix = anytime.curve_matrix([r.trace for r in runs], optimum, args.budget)
    checks = [c for c in CHECKS if c <= args.budget]
    medians = {c: float(statistics.median(matrix[:, c - 1])) for c in checks}
    area = anytime.area(anytime.median_curve([r.trace for r in runs], optimum, args.budget))
    asks = sorted(ms for r in runs for ms in r.ask_ms)
    to1 = [r.reached[0.01] for r in runs]
    median_to1 = statistics.median(n if n is not None else args.budget + 1 for n in to1)
    print(f"{space.name:32s} {label:40s} " + " ".join(f"@{c} {medians[c]:.3f}" for c in checks)
          + f" area {area:.3f} to1% {median_to1} ({sum(n is not None for n in to1)}/{len(to1)})"
          + f" ask p95 {asks[int(0.95 * (len(asks) - 1))]:.1f} ms", flush=True)
    if args.json is not None:
        record = {"space": space.name, "variant": label, "seeds": list(seeds), "budget": args.budget,
                  "warm_from": str(args.warm_from) if args.warm_from is not None else None,
                  "shuffle_source": args.shuffle_source,
                  "at": {c: matrix[:, c - 1].tolist() for c in checks}, "area": area,
                  "to_1pct": to1, "area_interval": anytime.area_interval([r.trace for r in runs], optimum,
                                                                         args.budget),
                  "ratios": matrix.round(4).tolist()}
        with args.json.open("a") as out:
            out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
