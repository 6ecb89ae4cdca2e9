"""``kernelforge export --format triton``: the dispatcher runs each tuned shape's own winner.

A real per-shape search of a cheap block in the interpreter (out = alpha * x + y over [T, C]
rows, written here beside toy/axpy's template), then two more candidates of its template whose
stored results make one the winner of T 2 and the other the winner of T 64. The export is
copied elsewhere, its dispatcher imported in a fresh module namespace and called with the block's
own inputs of each shape."""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from kernelforge.block import DTYPES
from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.cli.main import main
from kernelforge.execute.judge.contract import allocate
from kernelforge.report.collect import collect
from kernelforge.store.store import Store
from kf_searches import searched  # tests/fixtures (pytest pythonpath)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kernels"

BLOCK = '''
"""out = alpha * x + y over [T, C] rows (toy/axpy's computation, with a token dimension)."""
import importlib.util
from pathlib import Path

import torch

from kernelforge.block import Counts, Shape

_SPEC = importlib.util.spec_from_file_location("kf_test_rows_axpy", {axpy!r})
_AXPY = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_AXPY)


class Rows(_AXPY.Axpy):
    description = "out = alpha * x + y over [T, C]"
    dtypes = ("float16",)

    def shape_sets(self):
        return {{
            "smoke": [Shape.of("smoke/T4-C64", T=4, C=64), Shape.of("smoke/T8-C32", T=8, C=32)],
            "check": [Shape.of("check/T1-C7", T=1, C=7), Shape.of("check/T3-C33", T=3, C=33)],
            "tune": [Shape.of("tune/T2-C64", T=2, C=64), Shape.of("tune/T64-C64", T=64, C=64),
                     Shape.of("tune/T16-C32", T=16, C=32)],
        }}

    def make_inputs(self, shape, dtype, device, seed, distribution="normal"):
        flat = super().make_inputs(Shape.of(shape.name, N=shape["T"] * shape["C"]), dtype, device, seed, distribution)
        return {{**flat, "x": flat["x"].view(shape["T"], shape["C"]), "y": flat["y"].view(shape["T"], shape["C"])}}

    def make_output(self, shape, dtype, device):
        return torch.empty(shape["T"], shape["C"], dtype=dtype, device=device)

    def counts(self, shape, dtype):
        return super().counts(Shape.of(shape.name, N=shape["T"] * shape["C"]), dtype)
'''

JOB = """
[job]
name = "rowsexport"
device = "interpret"
dtype = "float16"
tune = "per-shape"
seed = 0
storage = "sqlite:///{db}"

[strategy]
name = "grid"
evaluations = 1

[[blocks]]
id = "toy/rows"
shapes = "tune"
"""


def _kernels(tmp_path: Path) -> Path:
    folder = tmp_path / "kernels" / "toy" / "rows"
    folder.mkdir(parents=True)
    (folder / "block.py").write_text(BLOCK.format(axpy=str(FIXTURES / "toy" / "axpy" / "block.py")))
    shutil.copy(FIXTURES / "toy" / "axpy" / "baseline.py.j2", folder / "baseline.py.j2")
    return tmp_path / "kernels"


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tritonexport")
    kernels = _kernels(tmp)
    path = tmp / "rows.toml"
    job, catalog, store = searched(path, JOB.format(db=tmp / "rows.db"), kernels)
    # Two more points of the template, timed as copies of the baseline's results: the first is the
    # fastest at T 2 and the slowest elsewhere, the second the fastest at T 64 (the stored timings
    # decide the winners; their sources are the template's own renderings, so they compute right).
    template = catalog.baseline("toy/rows")
    small, large = (Candidate.from_template(template, {"BLOCK": 64, "num_warps": 2}, origin="optuna"),
                    Candidate.from_template(template, {"BLOCK": 1024, "num_warps": 2}, origin="optuna"))
    results = store.results(block="toy/rows")
    baseline_id = next(r.candidate_id for r in results if store.candidate(r.candidate_id).origin == "baseline")
    for cand, fast_at in ((small, "tune/T2-C64"), (large, "tune/T64-C64")):
        store.add_candidate(cand, job.name)
        for like in (r for r in results if r.candidate_id == baseline_id and r.shape.startswith("tune/")):
            f = 0.25 if like.shape == fast_at else 4.0
            store.add_result(dataclasses.replace(like, candidate_id=cand.id, median_s=f * like.median_s,
                                                 p20_s=f * like.p20_s, p80_s=f * like.p80_s, created=time.time()))
    rows = {r.shape: r for r in collect(job, catalog, store).blocks[0].shapes}
    store.close()
    assert rows["tune/T2-C64"].winner == small.id and rows["tune/T64-C64"].winner == large.id
    result = CliRunner().invoke(main, ["--kernels", str(kernels), "export", str(path), "--format", "triton",
                                       "--out", str(tmp / "out")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    moved = tmp / "elsewhere"
    shutil.copytree(tmp / "out", moved)  # the files name no absolute path: the folder moves
    shutil.rmtree(tmp / "out")
    return {"folder": moved, "catalog": catalog, "rows": rows, "small": small.id, "large": large.id,
            "store": tmp / "rows.db"}


@pytest.mark.interpreter
def test_triton_export_writes_each_distinct_winner_and_a_dispatcher(exported):
    folder, rows = exported["folder"], exported["rows"]
    winners = {r.winner for r in rows.values()}
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["toy_rows.py", "kernelforge-export-triton.json", *[f"toy_rows__{cid}.py" for cid in winners]])
    store = Store(f"sqlite:///{exported['store']}", create=False)
    try:
        for cid in winners:  # each winner module is its stored source, as measured
            assert (folder / f"toy_rows__{cid}.py").read_text() == store.candidate(cid).source
    finally:
        store.close()


@pytest.mark.interpreter
def test_the_dispatcher_forwards_each_call_to_its_token_counts_winner(exported):
    folder, catalog, rows = exported["folder"], exported["catalog"], exported["rows"]
    block = catalog.block("toy/rows")
    disp = _import(folder / "toy_rows.py", "kf_test_dispatcher_rows")
    try:
        assert disp.TOKEN_DIM == "T" and disp.DIM_AXES == {"T": ("x", 0), "C": ("x", 1)}
        assert disp.LOADED == {}  # nothing imported before the first call
        # vLLM's rule among the C 64 shapes: nearest tuned T, ties (33: 31 from 2 and from 64) to the smaller.
        small, large = exported["small"], exported["large"]
        calls = ((1, small), (2, small), (5, small), (33, small), (34, large), (64, large), (10 ** 6, large))
        for tokens, want in calls:
            assert disp.winner_for(tokens, C=64) == want, tokens
        assert disp.winner_for(3, C=32) == rows["tune/T16-C32"].winner
        assert disp.config_for(64, C=64) is disp.CONFIGS[disp.SHAPE_CONFIGS["tune/T64-C64"]]
        assert disp.config_for(64, C=64).kwargs["BLOCK"] == rows["tune/T64-C64"].params["BLOCK"]
        loaded = []
        for name in ("tune/T2-C64", "tune/T64-C64", "tune/T16-C32"):
            shape = next(s for s in block.shapes("tune") if s.name == name)
            inputs = block.make_inputs(shape, DTYPES["float16"], "cpu", 3)
            outputs = allocate(block, shape, DTYPES["float16"], "cpu")
            disp.run(inputs["x"], inputs["y"], **{k: v for k, v in inputs.items() if k not in ("x", "y")}, **outputs)
            file = f"toy_rows__{rows[name].winner}.py"
            loaded.append(file)
            assert set(disp.LOADED) == set(loaded), name  # this call imported (or reused) its shape's winner
            torch.testing.assert_close(outputs["out"].float(), block.reference(**inputs), atol=2e-3, rtol=2e-3)
        assert disp.LOADED[f"toy_rows__{large}.py"] is not disp.LOADED[f"toy_rows__{small}.py"]
        # A call whose other dimensions match no tuned shape is refused, naming them.
        shape = next(s for s in block.shapes("check") if s.name == "check/T3-C33")
        inputs = block.make_inputs(shape, DTYPES["float16"], "cpu", 0)
        with pytest.raises(ValueError, match=r"no tuned shape has \{'C': 33\}"):
            disp.run(**inputs, **allocate(block, shape, DTYPES["float16"], "cpu"))
        with pytest.raises(ValueError, match=r"pass the dimensions \['C'\]"):
            disp.winner_for(8)  # C 64 and C 32 are both tuned
        with pytest.raises(ValueError, match="unknown dimension"):
            disp.winner_for(8, E=4)
        assert disp.SHAPES["tune/T64-C64"]["candidate"] == large  # readers' table
    finally:
        sys.modules.pop("kf_test_dispatcher_rows", None)


def test_the_dispatcher_refuses_bf16_in_the_interpreter_without_kernelforges_fix(exported, monkeypatch):
    # Issue 32: the exported folder ran bf16 silently wrong in Triton's CPU interpreter (it lacks the
    # interpreter's bf16 fix). On such a call it applies kernelforge's fix, or refuses with a clear error.
    import sys

    disp = _import(exported["folder"] / "toy_rows.py", "kf_test_dispatcher_bf16")
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setitem(sys.modules, "kernelforge.devices.interpreter", None)  # kernelforge not installed
    with pytest.raises(RuntimeError, match="bf16 in Triton's CPU interpreter"):
        disp.run(x=x, kf_shape="tune/T2-C64")
    monkeypatch.delitem(sys.modules, "kernelforge.devices.interpreter")
    disp._interpreter_bf16({"x": x})  # with kernelforge: the fix is applied, no error
    from kernelforge.devices.interpreter import is_patched, needs_bf16_fix

    assert is_patched() or not needs_bf16_fix()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setitem(sys.modules, "kernelforge.devices.interpreter", None)
    disp._interpreter_bf16({"x": x})  # on a GPU nothing is checked


@pytest.mark.interpreter
def test_the_exported_configs_feed_triton_autotune(exported):
    # Issue 32: the export's CONFIGS are the template's points (its names, its num_warps), which
    # @triton.autotune cannot take. AUTOTUNE_CONFIGS are each winner's launches read off its source,
    # under the kernel's own constexpr names: triton.autotune takes them as they are.
    import triton

    folder, rows = exported["folder"], exported["rows"]
    disp = _import(folder / "toy_rows.py", "kf_test_dispatcher_autotune")
    try:
        configs = disp.AUTOTUNE_CONFIGS["_axpy"]
        points = {(r.params["BLOCK"], r.params["num_warps"]) for r in rows.values()}
        assert {(c.kwargs["BLOCK"], c.num_warps) for c in configs} == points and len(configs) == len(points)
        assert all(set(c.kwargs) == {"BLOCK"} for c in configs) and disp.AUTOTUNE_HOST_BOUND == {}
        timed = []

        def wall_clock(call, quantiles):  # the interpreter has no GPU events: its wall time, labelled nowhere
            start = time.perf_counter()
            call()
            timed.append(time.perf_counter() - start)
            return [timed[-1]] * len(quantiles)

        tuned = triton.autotune(configs=configs, key=["n"], do_bench=wall_clock)(disp.jit_kernel("_axpy"))
        x, y = torch.randn(3, 100, dtype=torch.float16), torch.randn(3, 100, dtype=torch.float16)
        out = torch.empty_like(x)
        n = x.numel()
        tuned[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, 0.5, n)
        assert len(timed) == len(configs)  # every exported config was launched by the autotuner
        assert tuned.best_config in configs
        torch.testing.assert_close(out.float(), 0.5 * x.float() + y.float(), atol=2e-3, rtol=2e-3)
    finally:
        sys.modules.pop("kf_test_dispatcher_autotune", None)


def test_autotune_configs_are_read_off_the_launches_by_the_kernels_names():
    # The MoE template launches GEMM2 with its own parameters under the kernel's names
    # (BLOCK_SIZE_N=BLOCK_SIZE_N2); run-time values (TOPK=topk) and model constants (ALPHA) stay
    # with the caller; BLOCK_SIZE_M is also read by the host code (the padding to it): host-bound.
    from kernelforge.report.export.autotune import autotune_table

    real = Catalog.discover(Path(__file__).resolve().parents[3] / "kernels")
    template = real.baseline("moe/gpt_oss_experts")
    point = {**dict(template.baseline), "BLOCK_SIZE_N2": 32, "num_warps2": 8}
    source = Candidate.from_template(template, point).source
    table = autotune_table({"moe.py": (source, point)})
    (gemm2,) = table.configs["_gemm2_kernel"]
    assert dict(gemm2.kwargs) == {"BLOCK_SIZE_M": point["BLOCK_SIZE_M"], "BLOCK_SIZE_N": 32,
                                  "BLOCK_SIZE_K": point["BLOCK_SIZE_K2"], "GROUP_SIZE_M": point["GROUP_SIZE_M2"]}
    assert dict(gemm2.options) == {"num_warps": 8, "num_stages": point["num_stages2"]}
    (gemm1,) = table.configs["_gemm1_swiglu_kernel"]
    assert dict(gemm1.kwargs)["HALF_N"] == point["BLOCK_SIZE_N"] // 2
    assert not {"TOPK", "ALPHA", "LIMIT"} & set(dict(gemm1.kwargs))
    assert "BLOCK_SIZE_M" in table.host_bound["_gemm1_swiglu_kernel"]
    assert gemm2.expr().startswith("triton.Config({'BLOCK_SIZE_M': ")
