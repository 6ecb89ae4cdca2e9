"""Progress of a search: a live terminal view, JSON lines for scripts, or quiet.

The search reports events (``start``, ``baseline``, ``measuring`` (a candidate whose measurement
starts now: ``candidate`` is its id, ``retimed`` true for the baseline timed again beside the
candidates), ``evaluated``, ``duplicate``, ``infeasible``
(a candidate the compile rejected for the target's resources: no evaluation), ``confirmed``,
``end``); a progress object turns them into output and never influences the search. A
``baseline`` event comes per distinct baseline candidate of a block, with the shapes it is the
baseline of and its ``source`` (a ``[[baselines]]`` rule's, or ``[template] baseline_source``).
Every mode prints an event only after the one redactor (:mod:`kernelforge.redact`) has masked
every secret in it: a message carrying the LLM key or a storage password is shown with ``***``.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter, defaultdict
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kernelforge.redact import redact, redact_data


class Progress:
    """Quiet: records nothing, prints nothing. Subclasses print."""

    def event(self, kind: str, **data: Any) -> None:
        """One thing that happened in the search."""

    def close(self) -> None:
        pass


class JsonLinesProgress(Progress):
    """One JSON object per event on a stream (stdout by default), for scripts."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout

    def event(self, kind: str, **data: Any) -> None:
        line = json.dumps({"event": kind, "time": round(time.time(), 3), **redact_data(data)}, default=str)
        self.stream.write(redact(line) + "\n")  # again: ``default=str`` may have shown an object's text
        self.stream.flush()


class LiveProgress(Progress):
    """A rich table, redrawn as events arrive: evaluations done of budget, best speedup so far,
    failures by kind and candidates per minute, per block; above it the elapsed time, an estimate
    of what is left (the evaluations left at this run's pace so far) and the candidate being measured."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(highlight=False)
        self.started = time.time()
        self.header = ""
        self.budget: dict[str, int] = {}
        self.done: Counter[str] = Counter()
        self.best: dict[str, float] = {}
        self.failures: dict[str, Counter[str]] = defaultdict(Counter)
        self.duplicates: Counter[str] = Counter()
        self.notes: list[str] = []
        self.current = ""  # the candidate being measured
        self.measured_since: float | None = None  # when this run's first measurement started
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def event(self, kind: str, **data: Any) -> None:
        data = redact_data(data)
        block = data.get("block", "")
        if kind == "start":
            self.header = f"job {data['job']} on {data['device']} ({data['dtype']}, strategy {data['strategy']})"
            self.budget.update(data.get("budgets", {}))
        elif kind == "measuring":
            self.measured_since = self.measured_since or time.time()
            params = " ".join(f"{k}={v}" for k, v in (data.get("params") or {}).items())
            retimed = " (baseline, re-timed)" if data.get("retimed") else ""
            self.current = f"measuring {block} {data.get('candidate', '')}{retimed} {params}".rstrip()
        elif kind == "evaluated":
            self.current = ""
            self.done[block] += 1
            if data["status"] != "ok":
                self.failures[block][data["status"]] += 1
            elif data.get("speedup") is not None:
                self.best[block] = max(self.best.get(block, 0.0), data["speedup"])
        elif kind == "duplicate":
            self.duplicates[block] += 1
        elif kind == "infeasible":  # rejected by the compile for the target's resources: no evaluation
            self.failures[block]["infeasible"] += 1
        elif kind == "baseline":
            self.best.setdefault(block, 1.0)
            if data.get("source"):
                shapes = ", ".join(data.get("shapes", ()))
                self.notes.append(f"{block} baseline{f' on {shapes}' if shapes else ''}: {data['source']}")
        elif kind == "confirmed":
            verdict = "winner" if data["winner"] else "within noise"
            self.notes.append(f"{block} {data['shape']}: {data['candidate']} x{data['median']:.3f} "
                              f"(p20-p80 {data['p20']:.3f}-{data['p80']:.3f}) {verdict}")
        elif kind in ("end", "stopped", "warning"):
            self.notes.append(data.get("message", kind))
        self.live.update(self._render())

    def _render(self) -> Group:
        minutes = max((time.time() - self.started) / 60.0, 1e-9)
        table = Table(title=self.header or "kernelforge search", title_justify="left")
        for column in ("block", "evaluations", "best speedup", "failures", "duplicates", "cand./min"):
            table.add_column(column)
        for block in self.budget:
            failures = ", ".join(f"{k} {v}" for k, v in sorted(self.failures[block].items())) or "-"
            best = self.best.get(block)
            table.add_row(block, f"{self.done[block]}/{self.budget[block]}", "-" if best is None else f"{best:.3f}x",
                          failures, str(self.duplicates[block]), f"{self.done[block] / minutes:.1f}")
        return Group(Text(self.clock()), table, *(Text(n) for n in self.notes[-8:]))

    def clock(self) -> str:
        """"elapsed 2m05s, about 3m10s left (6 evaluations); measuring BLOCK ID PARAMS": the estimate
        is the evaluations left of the budgets at the pace of this run's measured ones (none yet: unknown)."""
        now = time.time()
        done, left = sum(self.done.values()), sum(max(0, self.budget[b] - self.done[b]) for b in self.budget)
        text = f"elapsed {_duration(now - self.started)}"
        if left and done and self.measured_since is not None:
            text += f", about {_duration((now - self.measured_since) / done * left)} left ({left} evaluations)"
        elif left:
            text += f", {left} evaluations left"
        return text + (f"; {self.current}" if self.current else "")

    def close(self) -> None:
        self.live.update(self._render())
        self.live.stop()


def _duration(seconds: float) -> str:
    """``"2m05s"``, or ``"42s"`` under a minute."""
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def make_progress(mode: str) -> Progress:
    """``live`` (default), ``jsonl`` or ``quiet``."""
    if mode == "jsonl":
        return JsonLinesProgress()
    if mode == "quiet":
        return Progress()
    return LiveProgress()
