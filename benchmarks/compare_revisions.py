"""Wall time of a search under two revisions of kernelforge, side by side in one run.

    python benchmarks/compare_revisions.py BASE_REV [--job search/demo.toml] [--rounds 1]

The base revision is checked out in a temporary git worktree; each round runs the job once with the
base and once with the working tree (alternating which goes first, so drift of a loaded machine
falls on both), each into a fresh database, and prints both wall times and their ratio. Used for
issue 10's acceptance: the trusted verdict and the sandbox must keep the demo within 1.3x.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(tree: Path, job: Path, db: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    command = [sys.executable, "-m", "kernelforge", "--kernels", str(tree / "kernels"), "search", str(job),
               "--storage", f"sqlite:///{db}", "--progress", "quiet", "--no-report"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{tree}: search failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="git revision to compare against (e.g. the commit before a change)")
    parser.add_argument("--job", default="search/demo.toml")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kf-bench-") as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.base], cwd=REPO, check=True,
                       capture_output=True)
        try:
            times: dict[str, list[float]] = {"base": [], "head": []}
            for round_ in range(args.rounds):
                order = [("base", base_tree), ("head", REPO)]
                for name, tree in order if round_ % 2 == 0 else reversed(order):
                    db = Path(tmp) / f"{name}-{round_}.db"
                    times[name].append(_run(tree, tree / args.job, db))
                    print(f"round {round_ + 1} {name}: {times[name][-1]:.1f} s", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=REPO, capture_output=True)
    base, head = sum(times["base"]), sum(times["head"])
    print(f"{args.job}: base {args.base} {base:.1f} s, working tree {head:.1f} s, ratio {head / base:.2f}x "
          f"(interpreter wall time on this machine, {args.rounds} round(s))")


if __name__ == "__main__":
    main()
