"""The toy block's LLM job that the LLM tests and benchmarks run against the loopback server
(``llm_server.py``): the job file written from keyword fields, a progress recorder, and an
in-process search of it with its LLM proposer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from kernelforge.catalog import Catalog
from kernelforge.job import load_job
from kernelforge.llm.advisor import advice_for
from kernelforge.llm.proposer import for_job
from kernelforge.search.search import Search
from kernelforge.store.store import Store
from kf_progress import Recorder
from toy_job import write_job

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kernels"
BLOCK = "toy/axpy"


#: The [llm] fields every toy job has unless a test says otherwise: one request at a time, no
#: retries, short timeouts, all of the block's evaluations kept for the LLM.
LLM_DEFAULTS: dict[str, Any] = {"concurrency": 1, "timeout_s": 5.0, "max_retries": 0, "repair_turns": 1,
                                "tune_share": 1.0}


def variant(template: str, n: int) -> str:
    """The same kernel with another comment in its module: another template, another candidate."""
    return template.replace("import triton\n", f"import triton  # variant {n}\n", 1)



def _toml(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def write_llm_job(folder: Path, name: str, *, evaluations: int, seed: int = 5, strategy: str = "tpe",
                  tables: str = "", **llm: Any) -> Path:
    """Write the toy LLM job ``name`` into ``folder``: ``llm`` are [llm] fields over
    :data:`LLM_DEFAULTS` (None leaves a field out), ``tables`` TOML appended after them
    (``[llm.extra_body]``, ``[[llm.models]]``...). Returns its path."""
    fields = {**LLM_DEFAULTS, **llm}
    lines = [f"{key} = {_toml(value)}" for key, value in fields.items() if value is not None]
    return write_job(folder, name, seed=seed, strategy=strategy, evaluations=evaluations, shapes="smoke",
                     tables="[llm]\n" + "\n".join(lines) + "\n" + tables)


def run_llm_search(path: Path, db: Path, **llm_changes: Any):
    """Run the job at ``path`` in-process (no compile) into the SQLite file ``db``, with ``llm_changes``
    replacing fields of its parsed [llm] spec. Returns (store, recorder, outcome)."""
    catalog = Catalog.discover(FIXTURES)
    job = load_job(path, catalog)
    if llm_changes:
        job = replace(job, llm=replace(job.llm, **llm_changes))
    store = Store(f"sqlite:///{db}")
    recorder = Recorder()
    outcome = Search(job, catalog, store, recorder, compile_enabled=False, in_process=True,
                     proposer=for_job(job, store, recorder), advisor=advice_for).run()
    return store, recorder, outcome
