"""Reports read only the store.

- :mod:`.collect` and :mod:`.records`: a job's results collected into frozen records.
- :mod:`.write`: REPORT.md, results.json and index.html (:mod:`.markdown`, :mod:`.html`,
  :mod:`.svg`, :mod:`.format`), and the compare page of two reports (:mod:`.compare`).
- :mod:`.projection`: what the measured block times mean for a model's TTFT and TBT.
- :mod:`.export`: exports for vLLM, SGLang and Triton, and the Optuna mirror for optuna-dashboard.

The other modules are sections of the report (LLM, Pareto front, searched space, MoE table,
library lines).
"""

__all__ = ["collect", "records", "write", "compare", "projection", "export"]
