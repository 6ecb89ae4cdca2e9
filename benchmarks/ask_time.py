"""How long a strategy's ask takes at 50, 200 and 400 told trials with the job's storage, and how
long a search's device still waits on it once asks are issued ahead (issue 14, item 6).

    python benchmarks/ask_time.py [--quick] [--strategies tpe,auto,nsga2] [--space PATH]
                                  [--device-ms 20] [--seeds 1] [--storage URL] [--budget-s 70]

Default: tpe and auto (when this checkout has it), checkpoints 50,200,400, at most ``--budget-s``
seconds per run (two runs per strategy and seed): at most about 5 minutes. ``--quick``: checkpoints
25 and 50, at most 40 s per run.

For each strategy, on a recorded space (a Kernel Tuner cache: its recorded configurations are the
points that exist; each told value is the recorded time, a recorded failure is told as failed):

1. direct: ask and tell in a loop, as the search did before asks were issued ahead; the time of
   each ask and tell is recorded. Shown per checkpoint N: median and 95th percentile over the
   asks N-W+1..N (made with N-W..N-1 trials told; W = ``--window``).
2. ahead: the same through :class:`~kernelforge.strategies.ahead.AskAhead`, sleeping
   ``--device-ms`` between ask and tell (a stand-in for the device measuring the point). Shown:
   how long the caller waited in ask(), and in tell() (a tell waits for an ask still running
   ahead); their sum is what the device idles per evaluation in a serial search loop.

``--history H`` tells each strategy H recorded configurations first, drawn at random (seeded) from
the feasible set with their recorded outcomes, as a resumed search tells its stored history (not
asks, not evaluations); the checkpoints count them, so ``--history 380 --checkpoints 400`` times
the 20 asks made with 380 to 399 trials told, in seconds rather than the many minutes that 400
asks of ``auto`` take on a loaded host. The history is a random sample, not the strategy's own
choices: what costs time at 400 told (the fit over the told points, the pool) depends on how many
are told more than on which.

The storage is the job's: a fresh SQLite file per run (``--storage`` for another URL, e.g. a
PostgreSQL server; each run gets its own study name), opened like a search opens it (heartbeats
on). Strategies that keep no study (``auto``, ``random``) ignore it. Every time printed is the
strategy's CPU work on this host (wall clock), not a GPU time; the host's load average is printed
with them, since a loaded host makes asks several times slower.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from kernelforge.strategies.ahead import AskAhead  # noqa: E402
from kernelforge.strategies.base import Strategy  # noqa: E402
from kernelforge.strategies.names import STRATEGY_NAMES, make_strategy, strategy_available  # noqa: E402
from kernelforge.strategies.bench.recorded import RecordedSpace, load_kernel_tuner_cache  # noqa: E402

#: The clock asks and tells are timed with: wall clock (``--clock wall``, the default) or this
#: process's CPU time (``--clock cpu``: the work itself, whatever else loads the host; in the
#: 'ahead' run it also counts the ask running ahead in its thread while the caller sleeps).
CLOCK = [time.perf_counter]
DEFAULT_SPACE = REPO.parent / "shared" / "data" / "tuning-spaces" / "gemm_RTX_Titan.json.gz"


@dataclass(frozen=True)
class Window:
    """Median, 95th percentile and slowest (ms) of one kind of call over one checkpoint's window."""

    median_ms: float
    p95_ms: float
    max_ms: float = 0.0

    def __str__(self) -> str:
        return f"{self.median_ms:8.1f} {self.p95_ms:8.1f}"


def window(seconds: list[float]) -> Window:
    ms = sorted(1000 * s for s in seconds)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return Window(statistics.median(ms), p95, ms[-1])


@dataclass
class Calls:
    """The time of every ask and tell of one run (seconds, in call order)."""

    asks: list[float]
    tells: list[float]
    free: list[int]  # the strategy's free tells after each tell (direct runs only)
    why: str = ""  # why it stopped before the last checkpoint

    def at(self, n: int, width: int) -> tuple[Window, Window, Window, str] | None:
        """Ask, tell and ask+tell over the calls n-width+1..n, and the free proposals per ask over
        them (None: the run stopped before n)."""
        if len(self.asks) < n:
            return None
        lo = max(0, n - width)
        asks, tells = self.asks[lo:n], self.tells[lo:n]
        free = f"{(self.free[n - 1] - (self.free[lo - 1] if lo else 0)) / (n - lo):6.1f}" if self.free else "     -"
        return window(asks), window(tells), window([a + t for a, t in zip(asks, tells)]), free


def drive(strategy: Strategy, recorded: RecordedSpace, trials: int, device_s: float, budget_s: float,
          history: int = 0, seed: int = 0) -> Calls:
    """Tell ``history`` random recorded configurations (seeded by ``seed``), then ask and tell up to
    ``trials`` points, sleeping ``device_s`` between each ask and its tell, for at most
    ``budget_s`` seconds."""
    if history:
        keys = random.Random(seed).sample(sorted(recorded.records, key=repr), history)
        for key in keys:
            point = dict(zip(recorded.space.names, key))
            strategy.tell(point, recorded.lookup(point))
    calls = Calls([], [], [])
    end = time.perf_counter() + budget_s
    for _ in range(trials):
        if time.perf_counter() > end:
            calls.why = f"time budget of {budget_s:g} s spent"
            break
        start = CLOCK[0]()
        point = strategy.ask()
        asked = CLOCK[0]()
        if point is None:
            calls.why = "nothing left to ask"
            break
        calls.asks.append(asked - start)
        if device_s:
            time.sleep(device_s)
        start = CLOCK[0]()
        strategy.tell(point, recorded.lookup(point))
        calls.tells.append(CLOCK[0]() - start)
        if not isinstance(strategy, AskAhead):  # reading it through AskAhead would wait for the ask ahead
            calls.free.append(strategy.free_tells)
    return calls


def build(name: str, recorded: RecordedSpace, seed: int, storage: str) -> Strategy:
    return make_strategy(name, recorded.space, seed=seed, storage=storage,
                         study_name=f"ask-time-{name}-{seed}-{uuid.uuid4().hex[:8]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--space", type=Path, default=DEFAULT_SPACE, help="a Kernel Tuner cache file")
    parser.add_argument("--strategies", default="tpe,auto", help="comma-separated strategy names (e.g. tpe,auto,nsga2,gp)")
    parser.add_argument("--checkpoints", default="50,200,400", help="told-trial counts to report at")
    parser.add_argument("--window", type=int, default=20, help="asks per checkpoint's statistics")
    parser.add_argument("--device-ms", type=float, default=20.0, help="simulated device time per evaluation (ahead run)")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--storage", default="", help="storage URL (default: a fresh SQLite file per run)")
    parser.add_argument("--budget-s", type=float, default=70.0,
                        help="seconds each run may take (a loaded host makes asks slow; later checkpoints are then missing)")
    parser.add_argument("--history", type=int, default=0,
                        help="random recorded configurations told as history first (counted in the checkpoints)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time asks by wall clock or by this process's CPU time (load-independent)")
    parser.add_argument("--quick", action="store_true", help="checkpoints 25,50, window 5, 40 s per run")
    args = parser.parse_args(argv)
    if args.quick:
        args.checkpoints, args.window, args.budget_s = "25,50", 5, min(args.budget_s, 40.0)
    checkpoints = sorted({int(c) for c in args.checkpoints.split(",")})
    names = [n.strip() for n in args.strategies.split(",") if n.strip()]
    unknown = [n for n in names if n not in STRATEGY_NAMES]
    names = [n for n in names if n in STRATEGY_NAMES and strategy_available(n)]
    recorded = load_kernel_tuner_cache(args.space)
    if any(c - args.history < args.window for c in checkpoints):
        parser.error("every checkpoint must be at least --history plus --window")
    trials = checkpoints[-1] - args.history
    CLOCK[0] = time.process_time if args.clock == "cpu" else time.perf_counter

    print("ASK TIME OF THE STRATEGIES: CPU (wall-clock) time of the strategy's own work on this host,")
    print("NOT GPU times. The device is simulated by a sleep in the 'ahead' run.")
    print(f"space {recorded.name} ({recorded.device}): {recorded.space.valid_count()[0]} feasible points; "
          f"storage {args.storage or 'a fresh SQLite file per run'}; {args.seeds} seed(s); window {args.window} asks; "
          f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start"
          + f"; clock: {'CPU time of this process' if args.clock == 'cpu' else 'wall clock'}"
          + (f"; {args.history} random recorded configurations told as history first" if args.history else ""))
    if unknown:
        print(f"skipped (not a strategy name here): {', '.join(unknown)}")
    print()
    print(f"{'strategy':<10} {'run':<7} {'told':>5}  {'ask med':>8} {'ask p95':>8}  {'tell med':>8} {'tell p95':>8}"
          f"  {'idle med':>8} {'idle p95':>8}  {'free/ask':>8}  {'ask max':>8}")
    print("(ms over the window of asks ending at 'told'; idle = ask + tell: what the device waits per evaluation "
          "in a serial loop;\n free/ask: proposals the strategy settled itself (duplicates, infeasible) per ask)")
    with tempfile.TemporaryDirectory(prefix="ask-time-") as folder:
        for name in names:
            for seed in range(args.seeds):
                runs = {}
                for run in ("direct", "ahead"):
                    storage = args.storage or f"sqlite:///{Path(folder) / f'{name}-{seed}-{run}.db'}"
                    strategy = build(name, recorded, seed, storage)
                    if run == "ahead":
                        strategy = AskAhead(strategy)
                    runs[run] = drive(strategy, recorded, trials, args.device_ms / 1000 if run == "ahead" else 0.0,
                                      args.budget_s, args.history, seed)
                    if isinstance(strategy, AskAhead):
                        strategy.close()
                for n in checkpoints:
                    for run, calls in runs.items():
                        stats = calls.at(n - args.history, args.window)
                        label = f"{name}" + (f"#{seed}" if args.seeds > 1 else "")
                        if stats is None:
                            print(f"{label:<10} {run:<7} {n:>5}  (stopped after {len(calls.asks)} asks: {calls.why})")
                            continue
                        ask, tell, idle, free = stats
                        print(f"{label:<10} {run:<7} {n:>5}  {ask}  {tell}  {idle}  {free:>8}  {ask.max_ms:8.1f}")
                print(flush=True)
    print(f"host load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
