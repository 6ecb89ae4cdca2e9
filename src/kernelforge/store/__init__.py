"""The results database: the :class:`.store.Store` (candidates, compiles, results, confirmations),
its frozen records (:mod:`.records`), the job lock (:mod:`.lock`), the workers' ledger
(:mod:`.ledger`) and the LLM figures (:mod:`.llm_stats`). The schema and engine serve these."""

__all__ = ["store", "records", "lock", "ledger", "llm_stats"]
