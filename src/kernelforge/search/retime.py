"""The baseline re-timed through the search, beside the candidates: before the device evaluates a
candidate, each shape whose baseline was timed ``every`` or more evaluations ago has its
baseline verified and timed again, and the timing is stored
(:class:`~kernelforge.baseline_timing.BaselineTiming`). A candidate's result is then compared
with the baseline as timed most recently before it (:mod:`kernelforge.baseline_timing`), so drift
of the machine between the first baseline timing and a candidate cannot rank the candidate.

How often, by executor kind (:data:`BASELINE_EVERY`), unless the job says (``[strategy]
baseline_every``): beside every candidate on a GPU, where a timing costs little next to the
compile; every fourth one in the interpreter, whose timings only exercise the mechanism. The
first candidate a run evaluates on a shape always has the baseline timed beside it: the baseline's
first timing was taken before the search started (or by an earlier run, resumed).
"""

from __future__ import annotations

import time

from kernelforge.baseline_timing import BaselineTiming
from kernelforge.block import Block, Shape
from kernelforge.execute.timing.rounds import TimingPlan
from kernelforge.search.context import RunContext
from kernelforge.textsafe import DETAIL, cut

#: Re-time a shape's baseline before every Nth evaluation on it, by executor kind.
BASELINE_EVERY = {"cuda": 1, "interpret": 4}


class BaselineRetimer:
    """Decides when a shape's baseline is timed again and does it (one per run)."""

    def __init__(self, run: RunContext):
        self.run = run
        kind = run.executor.kind
        self.every = run.job.strategy.baseline_every or BASELINE_EVERY.get(kind, BASELINE_EVERY["cuda"])
        #: (block id, shape name) -> evaluations on the shape since its baseline was last timed (by this run)
        self._since: dict[tuple[str, str], int] = {}

    def before(self, block: Block, shapes: list[Shape], plan: TimingPlan | None) -> bool:
        """Before a candidate is evaluated on ``shapes``: re-time the baselines that are due (True
        when some were)."""
        run = self.run
        if not run.executor.runs_code:
            return False  # a replay: the recording is all there is
        baselines = run.baselines[block.id]
        due: dict[str, list[Shape]] = {}
        for shape in shapes:
            key = (block.id, shape.name)
            if self._since.setdefault(key, self.every) >= self.every:  # the first candidate: due
                due.setdefault(baselines[shape.name].id, []).append(shape)
        for group in due.values():
            self._retime(block, group, plan)
        for shape in shapes:  # the candidate about to be evaluated
            self._since[(block.id, shape.name)] += 1
        return bool(due)

    def _retime(self, block: Block, group: list[Shape], plan: TimingPlan | None) -> None:
        run = self.run
        candidate = run.baselines[block.id][group[0].name]
        run.progress.event("measuring", block=block.id, candidate=candidate.id, params=candidate.point, retimed=True)
        evaluations = run.executor.evaluate(block, candidate.source, group, run.dtype, plan=plan)
        for ev in evaluations:
            self._since[(block.id, ev.shape.name)] = 0
            t = ev.timing
            if not ev.verification.ok or t is None or not t.median_s:
                run.progress.event("warning", message=(
                    f"the baseline of {block.id} on {ev.shape.name} failed when re-timed "
                    f"({ev.verification.status.value}: {cut(ev.verification.message, DETAIL)}); candidates there are "
                    "compared with its earlier timing"))
                continue
            timing = BaselineTiming(job=run.job.name, block=block.id, shape=ev.shape.name, dtype=run.dtype_name,
                                    env_key=run.env_key, baseline_id=candidate.id, median_s=t.median_s,
                                    p20_s=t.p20_s, p80_s=t.p80_s, timing_method=t.method, created=time.time())
            run.store.add_baseline_timing(timing)
            run.progress.event("baseline-retimed", block=block.id, shape=ev.shape.name, candidate=candidate.id,
                               median_s=t.median_s)
