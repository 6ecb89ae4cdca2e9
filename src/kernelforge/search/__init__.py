"""The search: the plan of a job (:mod:`.plan`), the search itself (:mod:`.search`, :class:`.search.Search`) and
its evaluation loop, the run context every stage shares (:mod:`.context`), the seams through which
proposers and advisers take part without the search importing them (:mod:`.proposer`), the policy
gate (:mod:`.gate`), warm starts (:mod:`.warm`) and progress output (:mod:`.progress`). The wiring of
a run is above it, in :mod:`kernelforge.start`."""

__all__ = ["search", "context", "plan", "proposer", "gate", "progress", "warm", "evaluation_loop"]
