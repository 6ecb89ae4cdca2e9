"""The report tests' stored databases (fixtures shared by the modules of this folder).

``toy``: a real tpe search on the toy block in the interpreter (compiled ahead of time for sm_90),
with a real LLM-origin candidate measured after it; ``h200``: GPT-OSS rows "measured on an H200"
written through Store (tests/fixtures/kf_synthetic_store.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import kf_synthetic_store as synthetic  # tests/fixtures (pytest pythonpath)
from kf_searches import searched
from kernelforge.block import DTYPES
from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.devices.registry import get_device
from kernelforge.execute.evaluate import evaluate
from kernelforge.job import load_job
from kernelforge.report.write import write_report
from kernelforge.result import StoredResult, env_key
from kernelforge.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "kernels"
KERNELS = ROOT / "kernels"

TOY_JOB = """
[job]
name = "toyreport"
device = "interpret"
target = "sm_90"
dtype = "float16"
tune = "all-shapes"
seed = 1
storage = "sqlite:///{db}"

[strategy]
name = "tpe"
evaluations = 4

[[blocks]]
id = "toy/axpy"
shapes = "check"
"""


def _add_llm_candidate(job, catalog, store, parent: str) -> Candidate:
    """An LLM-written rewrite of the toy kernel (operands swapped: same math), measured for real in
    the interpreter and stored with its origin and parent, as the LLM generator stores them."""
    template = catalog.baseline("toy/axpy")
    base = Candidate.from_template(template)
    source = base.source.replace("(alpha * x + y)", "(y + alpha * x)")
    assert source != base.source
    llm = Candidate("toy/axpy", "toy/axpy/llm_swap", base.params, source, origin="llm", parent=parent)
    store.add_candidate(llm, job.name)
    device = get_device("interpret")
    device.prepare()
    env = device.describe()
    block = catalog.block("toy/axpy")
    for ev in evaluate(block, source, block.shapes("check"), DTYPES[job.dtype], device):
        t = ev.timing
        store.add_result(StoredResult(
            candidate_id=llm.id, block="toy/axpy", shape=ev.shape.name, dtype=job.dtype, device=env["device_name"],
            env_key=env_key(env), status=ev.verification.status, rel_error=ev.verification.rel_error,
            median_s=t.median_s if t else None, p20_s=t.p20_s if t else None, p80_s=t.p80_s if t else None,
            samples=t.samples if t else None, timing_method=t.method if t else None, timing_label=t.label if t else None,
            joules=None, flops=ev.counts.flops, bytes=ev.counts.bytes, message=ev.verification.message, env=env,
            job=job.name, created=time.time()))
    return llm


@pytest.fixture
def toy(tmp_path_factory):
    """A real tpe search on the toy block (interpreter, compiled ahead of time for sm_90), one LLM
    candidate after it, and the report written from the database."""
    folder = tmp_path_factory.mktemp("toyreport")
    path = folder / "toyreport.toml"
    job, catalog, store = searched(path, TOY_JOB.format(db=folder / "toy.db"), FIXTURES, compile_enabled=True)
    baseline_id = Candidate.from_template(catalog.baseline("toy/axpy")).id
    llm = _add_llm_candidate(job, catalog, store, parent=baseline_id)
    report = write_report(job, catalog, store, folder / "report")
    return {"folder": folder / "report", "md": report.read_text(), "job": job, "catalog": catalog, "store": store,
            "data": json.loads((folder / "report" / "results.json").read_text()), "llm": llm,
            "baseline": baseline_id, "path": path}


@pytest.fixture(scope="module")
def h200(tmp_path_factory):
    folder = tmp_path_factory.mktemp("h200report")
    catalog = Catalog.discover(KERNELS)
    path, expected = synthetic.build(folder, catalog)
    job = load_job(path, catalog)
    store = Store(job.storage_url, create=False)
    report = write_report(job, catalog, store, folder / "report")
    return {"folder": folder / "report", "md": report.read_text(), "expected": expected, "catalog": catalog,
            "data": json.loads((folder / "report" / "results.json").read_text()), "store": store, "path": path,
            "root": folder}
