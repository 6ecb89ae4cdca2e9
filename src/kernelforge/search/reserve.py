"""The reserve: evaluations of each shape group kept for what a proposer proposes.

With ``[llm]``, ``tune_share`` of every group's evaluations is kept out of the human templates'
studies (see :func:`kernelforge.search.plan.llm_reserve`). A proposed template is paid from its
group's reserve in two steps: while unverified it holds one evaluation (its suggested point);
once that point is verified correct its study is granted up to ``tune_evaluations`` more, as far
as the pool then allows (a pool found empty: the template is simply not tuned further). A template
that fails costs its one evaluation and nothing more; an answer that is not evaluated at all
(no code, a policy rejection...) costs nothing. Each point a proposer suggests for a human template
is paid one evaluation. Whatever the proposer leaves unused goes back to the human templates once
it has stopped for good, so the job's whole budget is always spent.
"""

from __future__ import annotations

from kernelforge.search.progress import Progress
from kernelforge.search.study import Study

Group = tuple[str, str]  # (block id, scope)


class Reserve:
    """The reserve pools of every shape group, and the studies of proposed templates paid from them."""

    def __init__(self, tune_evaluations: int = 0):
        #: A verified proposed template's study is granted up to this many evaluations of tuning.
        self.tune_evaluations = tune_evaluations
        self._pools: dict[Group, int] = {}
        self._points_used: dict[Group, int] = {}
        self._studies: list[Study] = []

    def add_pool(self, block_id: str, scope: str, size: int) -> None:
        """The reserve of one shape group (0: nothing kept)."""
        self._pools[(block_id, scope)] = size

    def track(self, study: Study) -> None:
        """A study of a proposed template, paid from its group's pool."""
        self._studies.append(study)

    def studies_of(self, block_id: str) -> list[Study]:
        """The studies of proposed templates of ``block_id``, in the order they were made."""
        return [s for s in self._studies if s.block.id == block_id]

    def left(self, block_id: str, scope: str) -> int:
        """Evaluations left in a group's pool: open studies hold their budget (one evaluation
        while unverified, plus the tuning granted once verified), closed ones what they spent;
        points enqueued into human studies count one each."""
        committed = sum(s.budget if s.open else s.spent + s.in_flight
                        for s in self._studies if s.block.id == block_id and s.scope == scope)
        used = committed + self._points_used.get((block_id, scope), 0)
        return self._pools.get((block_id, scope), 0) - used

    def capacity(self, block_id: str) -> int:
        """How many more proposed templates of ``block_id`` could be verified now (each holds one
        evaluation until verified): the most any of its groups has left."""
        return max([self.left(b, scope) for b, scope in self._pools if b == block_id], default=0)

    def verification_budget(self, block_id: str, scope: str, verified: bool = False) -> int:
        """The budget of a new proposed template's study in a group: its one verification
        evaluation (0 when the pool is empty: no study). ``verified`` (a template of an earlier
        run whose point passed): its tuning too, as far as the pool allows."""
        wanted = 1 + self.tune_evaluations if verified else 1
        return min(wanted, self.left(block_id, scope))

    def grant_tuning(self, study: Study) -> int:
        """``study``'s suggested point was verified correct: raise its budget by up to
        ``tune_evaluations`` from its group's pool (what the pool has left; may be 0). Returns
        the evaluations granted."""
        granted = max(0, min(self.tune_evaluations, self.left(study.block.id, study.scope)))
        if granted:
            study.budget += granted
            study.exhausted = False
        return granted

    def pay_point(self, study: Study) -> None:
        """A proposed point enqueued into ``study``: one more evaluation for it, from the pool."""
        study.budget += 1
        study.exhausted = False
        if not study.proposed:  # a proposed template's study already counts against the pool
            key = (study.block.id, study.scope)
            self._points_used[key] = self._points_used.get(key, 0) + 1

    def give_back(self, studies: list[Study], progress: Progress) -> bool:
        """Hand what is left of each pool with no open proposed study to the group's human studies
        that are not exhausted (in turn). True when any study got more budget."""
        reopened = False
        for (block_id, scope), pool in list(self._pools.items()):
            if any(s.open for s in self._studies if s.block.id == block_id and s.scope == scope):
                continue
            left = self.left(block_id, scope)
            humans = [s for s in studies if not s.proposed and s.block.id == block_id and s.scope == scope
                      and not s.exhausted]
            if left <= 0 or not humans:
                continue
            self._pools[(block_id, scope)] = pool - left
            for i in range(left):
                humans[i % len(humans)].budget += 1
            reopened = True
            progress.event("llm_reserve", block=block_id, scope=scope, returned=left)
        return reopened
