"""The LLM generator of two revisions on the same scripted answers and the same evaluation budget,
side by side in one run.

    python benchmarks/llm_generations.py [BASE_REV] [--evaluations 24] [--max-calls 12]

``BASE_REV`` (default: the last commit before the generator's second version) is checked out in a
temporary git worktree. Each revision runs the toy block's LLM job (``tests/fixtures/kernels``,
interpreter, compiled ahead of time for sm_90 unless ``--no-compile``) against its own loopback chat-completions server
(``tests/llm_server.py``) serving the same script, one reply per HTTP request: a faster whole
template, a diff edit of the parent, a kernel that does not compile, a wrong one, an answer with
no code, a diff that does not apply, another kernel that does not compile, a second diff edit,
another wrong kernel, then prose. For each revision it prints,
from the stored database: the LLM's requests, its templates verified correct, its templates that
failed and the evaluations spent on them (their own point and any point of them after), and the
evaluations in all. No repair turns (``repair_turns = 0``), so both revisions get the same answer to
the same request. Counts, not times: the figures
do not depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from llm_server import BROKEN, FAST, WRONG, Reply, ScriptedServer, fenced  # noqa: E402
from llm_toy import variant, write_llm_job  # noqa: E402

#: The generator's first version: the last commit before issue 15's work.
V1 = "1e3acfa"


def edit(search: str, replace: str, prose: str = "A smaller change to the parent:") -> str:
    """An answer with one search/replace block."""
    return f"{prose}\n\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


#: The script: every template the parent could be (the baseline or the fast one) has the lines
#: the diffs search for, so a diff applies whichever parent the generator chose.
SCRIPT = [
    Reply(fenced(FAST), label="fast"),
    Reply(edit("    mask = offs < n", "    mask = offs < n  # bounds of the last program"), label="diff"),
    Reply(fenced(BROKEN, "A fused variant."), label="broken"),
    Reply(fenced(WRONG, "A variant."), label="wrong"),
    Reply("I would try larger blocks; the baseline looks reasonable.", label="no_code"),
    Reply(edit("    mask = offs <= n - 1 + 0", "    mask = offs < n"), label="bad_diff"),
    Reply(fenced(variant(BROKEN, 2), "Another fused variant."), label="broken2"),
    Reply(edit("import triton.language as tl", "import triton.language as tl  # the axpy kernels"),
          label="diff2"),
    Reply(fenced(variant(WRONG, 2), "Another variant."), label="wrong2"),
]


@dataclass(frozen=True)
class Figures:
    requests: int
    verified: int
    failed_templates: int
    failed_evaluations: int
    evaluations: int
    outcomes: str


def _figures(db: Path) -> Figures:
    with sqlite3.connect(db) as conn:
        requests = conn.execute("select count(*) from kf_llm_calls where final").fetchone()[0]
        outcomes = conn.execute("select kind, count(*) from kf_llm_calls where final group by kind order by kind")
        outcome_text = ", ".join(f"{kind or 'none'} {n}" for kind, n in outcomes)
        verified = conn.execute(
            "select count(distinct c.template) from kf_candidates c join kf_results r on r.candidate_id = c.id "
            "where c.origin = 'llm' and r.status = 'ok'").fetchone()[0]
        failed_templates = conn.execute(
            "select count(distinct c.template) from kf_candidates c join kf_results r on r.candidate_id = c.id "
            "where c.origin = 'llm' and r.status != 'ok'").fetchone()[0]
        # Every evaluation of a template that failed (its own point and any point of it after).
        failed = conn.execute(
            "select count(distinct c.id) from kf_candidates c join kf_results r on r.candidate_id = c.id "
            "where c.template in (select c2.template from kf_candidates c2 join kf_results r2 "
            "on r2.candidate_id = c2.id where c2.origin = 'llm' and r2.status != 'ok')").fetchone()[0]
        evaluations = conn.execute("select count(distinct candidate_id) from kf_results").fetchone()[0]
    return Figures(requests, verified, failed_templates, failed, evaluations, outcome_text)


def _run(tree: Path, folder: Path, evaluations: int, max_calls: int, compile_ahead: bool) -> Figures:
    folder.mkdir(parents=True)
    db = folder / "search.db"
    with ScriptedServer(SCRIPT) as server:
        job = write_llm_job(folder, "llmbench", evaluations=evaluations, seed=3, base_url=server.base_url,
                            model="scripted", max_calls=max_calls, timeout_s=10.0, repair_turns=0,
                            tune_evaluations=3)
        env = {**os.environ, "PYTHONPATH": str(tree / "src"), "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "kernelforge", "--kernels", str(tree / "tests" / "fixtures" / "kernels"),
                   "search", str(job), "--storage", f"sqlite:///{db}", "--progress", "quiet", "--no-report",
                   *([] if compile_ahead else ["--no-compile"])]
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: search failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return _figures(db)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", nargs="?", default=V1, help=f"git revision of the first version (default {V1})")
    parser.add_argument("--evaluations", type=int, default=24, help="the block's evaluation budget")
    parser.add_argument("--max-calls", type=int, default=len(SCRIPT) + 3, help="[llm] max_calls")
    parser.add_argument("--no-compile", action="store_true", help="no ahead-of-time compile for the target "
                                                                  "(by default candidates compile for sm_90 while "
                                                                  "the one before is evaluated, as in a real search)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kf-llm-bench-") as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.base], cwd=REPO, check=True,
                       capture_output=True)
        try:
            rows = {"v1 " + args.base: _run(base_tree, Path(tmp) / "v1", args.evaluations, args.max_calls,
                                                  not args.no_compile),
                    "v2 working tree": _run(REPO, Path(tmp) / "v2", args.evaluations, args.max_calls,
                                              not args.no_compile)}
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=REPO, capture_output=True)
    print(f"same {len(SCRIPT)} scripted answers (then prose), {args.evaluations} evaluations, "
          f"max_calls {args.max_calls}, toy/axpy in the interpreter")
    print(f"{'revision':<18} {'requests':>8} {'verified':>8} {'failed':>6} {'their evals':>11} {'evaluations':>11}  "
          "outcomes")
    for name, f in rows.items():
        print(f"{name:<18} {f.requests:>8} {f.verified:>8} {f.failed_templates:>6} {f.failed_evaluations:>11} "
              f"{f.evaluations:>11}  {f.outcomes}")


if __name__ == "__main__":
    main()
