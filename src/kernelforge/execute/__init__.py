"""Running candidates: the executor protocol (:mod:`.executor`: in-process, sandboxed worker,
replay), a candidate's evaluation over shapes (:mod:`.evaluate`), the timing round (:mod:`.timing`),
the static policy (:mod:`.policy`), the OS sandbox (:mod:`.sandbox`), the trusted runner of library
references (:mod:`.trusted_runner`), the outputs contract (:mod:`.contract`) and the timing
cross-check (:mod:`.crosscheck`). The other modules serve these."""

__all__ = ["executor", "evaluate", "timing", "policy", "sandbox", "trusted_runner", "contract", "crosscheck"]
