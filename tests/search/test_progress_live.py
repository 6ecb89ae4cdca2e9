"""Issue 32: the live view says how long the search has run, about how long is left, and which
candidate is being measured (kernelforge.search.progress.LiveProgress.clock)."""

from __future__ import annotations

import io

from rich.console import Console

from kernelforge.search import progress as progress_module
from kernelforge.search.progress import LiveProgress


def test_the_live_view_shows_elapsed_estimate_and_the_current_candidate(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(progress_module.time, "time", lambda: now[0])
    view = LiveProgress(Console(file=io.StringIO(), width=200))
    try:
        view.event("start", job="j", device="cpu", dtype="bf16", strategy="auto", budgets={"toy/axpy": 4})
        assert view.clock() == "elapsed 0s, 4 evaluations left"
        now[0] += 10.0
        view.event("measuring", block="toy/axpy", candidate="c1", params={"BLOCK": 64})
        assert view.clock().endswith("; measuring toy/axpy c1 BLOCK=64")
        now[0] += 30.0
        view.event("evaluated", block="toy/axpy", candidate="c1", status="ok", speedup=1.2)
        # One evaluation in 30 s of measuring, three left: about 90 s.
        assert view.clock() == "elapsed 40s, about 1m30s left (3 evaluations)"
    finally:
        view.close()
