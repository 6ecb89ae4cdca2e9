"""Reports read only the store: collection into frozen records (:mod:`.collect`, :mod:`.records`),
writing REPORT.md, results.json and index.html (:mod:`.write`), the Optuna mirror for
optuna-dashboard (:mod:`.dashboard`), and exports for vLLM, SGLang and Triton (:mod:`.export`).
The other modules serve these."""

__all__ = ["collect", "records", "write", "dashboard", "export"]
