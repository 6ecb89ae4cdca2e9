"""norm/fused_add_rmsnorm: the block's reference (against an independent fp64 formula), inputs,
shapes and counts, its baseline template in the interpreter at several points in bf16, fp16 and fp32
(both outputs: ``out`` and the in-place ``residual``), and the mutants the checks must catch.

The first block with two outputs, one of them in place (block contract v2): these tests call the
candidate directly, as the contract says (``run(**inputs, **outputs)``), so they do not depend on
the harness; test_conformance.py and test_mutants.py run it through :func:`verify`.
"""

from __future__ import annotations

import inspect
import math
import sys
from pathlib import Path

import pytest
import torch

from kernelforge.block import DISTRIBUTIONS, Tolerance
from kernelforge.devices import interpreter
from kernelforge.execute.judge.compare import within
from kernelforge.template import Template
from kernel_helpers import module_at

BLOCK_ID = "norm/fused_add_rmsnorm"
REPO = Path(__file__).resolve().parents[2]
MUTANTS = sorted((REPO / "tests" / "mutants" / BLOCK_ID).glob("*.py.j2"))
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
OUTPUTS = ("out", "residual")


@pytest.fixture(scope="module")
def block(catalog):
    return catalog.block(BLOCK_ID)


@pytest.fixture(scope="module")
def baseline(catalog):
    return catalog.baseline(BLOCK_ID)


def _small_shapes(block):
    return block.shapes("smoke") + block.shapes("check")


def _skip_without_bf16_fix(dtype):
    if dtype == torch.bfloat16 and interpreter.needs_bf16_fix() and not interpreter.is_patched():
        pytest.skip("this Triton's interpreter computes bf16 wrongly and kernelforge's fix is not applied")


def naive(x, residual, weight, eps):
    """Row by row: the add in the activation dtype (torch rounds it once), then fp64 statistics."""
    new_residual = x + residual
    out = torch.empty(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        r = new_residual[t].double()
        rms = math.sqrt(float((r * r).sum()) / r.numel() + eps)
        out[t] = r / rms * weight.double()
    return {"out": out, "residual": new_residual.double()}


def run_both(module, block, shape, dtype, distribution="normal", seed=0):
    """One direct call on fresh inputs with ``out`` poisoned: (results, fp32 reference, inputs
    before the call). ``results`` holds ``out`` and the final ``residual``."""
    inputs = block.make_inputs(shape, dtype, "cpu", seed=seed, distribution=distribution)
    before = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    ref = block.reference(**{**inputs, **{k: v.clone() for k, v in before.items()}})
    outputs = block.make_output(shape, dtype, "cpu")
    for tensor in outputs.values():
        tensor.fill_(float("nan"))
    module.run(**inputs, **outputs)
    return {"out": outputs["out"], "residual": inputs["residual"]}, ref, before


def _assert_correct(block, results, ref, before, dtype, where):
    for name in OUTPUTS:
        ok, why = within(results[name], ref[name], block.output_tolerance(name, dtype, "cpu"))
        assert ok, f"{where} {name}: {why}"
    # The in-place output is exactly x + residual rounded once (any correct kernel stores that).
    expected = (before["x"].float() + before["residual"].float()).to(dtype)
    assert torch.equal(results["residual"], expected), f"{where}: residual is not round(x + residual)"


# -- reference, inputs, shapes, counts --------------------------------------------------------------


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reference_matches_naive(block, dtype, distribution):
    for shape in _small_shapes(block):
        inputs = block.make_inputs(shape, dtype, "cpu", seed=3, distribution=distribution)
        ref = block.reference(**inputs)
        assert set(ref) == set(OUTPUTS)
        expected = naive(**inputs)
        for name in OUTPUTS:
            assert ref[name].dtype == torch.float32 and ref[name].shape == (shape["T"], shape["H"])
            diff = (ref[name].double() - expected[name]).norm() / expected[name].norm()
            assert diff < 1e-6, f"{shape.name} {name}: reference differs from the naive form by {diff:.3g}"


def test_reference_does_not_modify_inputs(block):
    inputs = block.make_inputs(block.shapes("check/T7-H7168")[0], torch.bfloat16, "cpu", seed=5)
    before = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    block.reference(**inputs)
    assert all(torch.equal(inputs[k], v) for k, v in before.items())


def test_reference_chunks_over_rows(block, monkeypatch):
    """Chunking the reference over rows (bounded memory at T=4096, H=7168) changes nothing."""
    inputs = block.make_inputs(block.shapes("check/T37-H2880")[0], torch.float16, "cpu", seed=2)
    whole = block.reference(**inputs)
    monkeypatch.setattr(sys.modules[type(block).__module__], "REFERENCE_CHUNK_ELEMENTS", 1)
    chunked = block.reference(**inputs)
    for name in OUTPUTS:
        assert torch.equal(chunked[name], whole[name])


def test_inputs_are_seeded_typed_and_have_quiet_and_zero_rows(block):
    shape = block.shapes("smoke/T5-H255")[0]
    a = block.make_inputs(shape, torch.float16, "cpu", 7)
    b = block.make_inputs(shape, torch.float16, "cpu", 7)
    c = block.make_inputs(shape, torch.float16, "cpu", 8)
    assert all(torch.equal(a[k], b[k]) for k in ("x", "residual", "weight"))
    assert not torch.equal(a["x"], c["x"]) and not torch.equal(a["residual"], c["residual"])
    assert {k: (tuple(v.shape), v.dtype) for k, v in a.items() if isinstance(v, torch.Tensor)} == {
        "x": ((5, 255), torch.float16), "residual": ((5, 255), torch.float16), "weight": ((255,), torch.float16)}
    assert a["eps"] == 1e-5 and block.make_inputs(block.shapes("smoke/T3-H200")[0], torch.float16, "cpu", 7)["eps"] == 1e-6
    r = a["x"].double() + a["residual"].double()
    mean_square = r.pow(2).mean(dim=1)
    assert mean_square[1] == pytest.approx(1e-5, rel=0.05), "row 1 is quiet: mean square about eps"
    assert (r[3] == 0).all(), "row 3 is a zero row (padding)"
    assert (mean_square[[0, 2, 4]] > 1.0).all(), "other rows are ordinary"
    weight = a["weight"].double()
    assert 0.3 < weight.std() < 0.7 and 0.8 < weight.mean() < 1.2
    outputs = block.make_output(shape, torch.bfloat16, "cpu")
    assert set(outputs) == {"out"} and outputs["out"].shape == (5, 255) and outputs["out"].dtype == torch.bfloat16


def test_eps_decides_quiet_and_zero_rows(block):
    """Without eps, the quiet row's output is sqrt(2) larger and the zero row is NaN."""
    inputs = block.make_inputs(block.shapes("smoke/T4-H256")[0], torch.float32, "cpu", 1)
    ref = block.reference(**inputs)["out"]
    no_eps = block.reference(**{**inputs, "eps": 0.0})["out"]
    assert (ref[3] == 0).all() and no_eps[3].isnan().all()
    assert (no_eps[1].norm() / ref[1].norm()).item() == pytest.approx(math.sqrt(2), rel=0.02)
    assert torch.allclose(no_eps[[0, 2]], ref[[0, 2]], rtol=1e-4)


def test_shapes_and_counts(block):
    sets = block.shape_sets()
    assert {"smoke", "check", "gpt-oss-120b", "deepseek-r1"} <= set(sets)
    for shape in sets["smoke"]:
        assert 1 <= shape["T"] <= 5 and 64 <= shape["H"] <= 256
    assert any(s["H"] % 2 for s in sets["smoke"]) and any(s["T"] == 1 for s in sets["smoke"])
    assert {s["H"] for s in sets["check"]} >= {2880, 7168} and {1, 37} <= {s["T"] for s in sets["check"]}
    for model, (H, eps) in {"gpt-oss-120b": (2880, 1e-5), "deepseek-r1": (7168, 1e-6)}.items():
        assert [(s["T"], s["H"], s["EPS"]) for s in sets[model]] == [(1, H, eps), (64, H, eps), (4096, H, eps)]
    assert block.compile_shape()["H"] % 16 == 0

    shape = block.shapes("gpt-oss-120b/prefill/T4096")[0]
    counts = block.counts(shape, torch.bfloat16)
    assert counts.flops == 4 * 4096 * 2880
    assert counts.bytes == (4 * 4096 * 2880 + 2880) * 2
    assert block.counts(shape, torch.float32).bytes == 2 * counts.bytes


def test_tolerances(block):
    assert block.output_tolerance("out", torch.bfloat16, "cpu") == block.tolerance(torch.bfloat16, "cpu")
    tight = block.output_tolerance("residual", torch.bfloat16, "cpu")
    assert tight == Tolerance(rel_norm=2 ** -7, atol=2 ** -7, rtol=2 ** -7)


# -- the baseline template in the interpreter -----------------------------------------------------


def test_discovered_with_its_contract(block, baseline):
    assert block.family == "norm" and type(block).__name__ == "FusedAddRmsNorm"
    assert tuple(block.inplace) == ("residual",)
    assert baseline.id == f"{BLOCK_ID}/fused_add_rmsnorm" and baseline.origin == "human"
    assert dict(baseline.baseline) == {"BLOCK_H": 4096, "num_warps": 8, "ROWS_PER_PROGRAM": 1}
    module = module_at(baseline)
    assert list(inspect.signature(module.run).parameters) == ["x", "residual", "weight", "eps", "out"]


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_baseline_on_smoke_and_check_shapes(block, baseline, dtype):
    _skip_without_bf16_fix(dtype)
    module = module_at(baseline)
    for index, shape in enumerate(_small_shapes(block)):
        distribution = DISTRIBUTIONS[index % len(DISTRIBUTIONS)]
        results, ref, before = run_both(module, block, shape, dtype, distribution, seed=index)
        _assert_correct(block, results, ref, before, dtype, f"{shape.name} {distribution}")


OTHER_POINTS = {
    # The chunked two-pass path on every check shape (2880 = 11 chunks of 256 + 64).
    "chunked-256": {"BLOCK_H": 256, "num_warps": 1, "ROWS_PER_PROGRAM": 1},
    # Several rows per program, T not a multiple of it (the last program is partly empty).
    "rows4": {"BLOCK_H": 1024, "num_warps": 4, "ROWS_PER_PROGRAM": 4},
    # The largest block: every row of every shape in one pass.
    "whole-8192": {"BLOCK_H": 8192, "num_warps": 16, "ROWS_PER_PROGRAM": 2},
}


@pytest.mark.interpreter
@pytest.mark.parametrize("point", list(OTHER_POINTS))
def test_other_points_fp16(block, baseline, point):
    module = module_at(baseline, OTHER_POINTS[point])
    for index, shape in enumerate(_small_shapes(block)):
        results, ref, before = run_both(module, block, shape, torch.float16, "outliers", seed=index)
        _assert_correct(block, results, ref, before, torch.float16, f"{shape.name} at {point}")


@pytest.mark.interpreter
def test_inputs_other_than_residual_are_untouched(block, baseline):
    module = module_at(baseline, OTHER_POINTS["chunked-256"])
    shape = block.shapes("check/T5-H4099")[0]
    inputs = block.make_inputs(shape, torch.bfloat16, "cpu", seed=4)
    before = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    module.run(**inputs, **block.make_output(shape, torch.bfloat16, "cpu"))
    assert torch.equal(inputs["x"], before["x"]) and torch.equal(inputs["weight"], before["weight"])
    assert not torch.equal(inputs["residual"], before["residual"])


# -- mutants: each deliberate bug must be caught -------------------------------------------------


def test_mutants_exist():
    names = {p.name[: -len(".py.j2")] for p in MUTANTS}
    assert {"residual_not_written", "eps_dropped", "variance_over_h_minus_1", "weight_not_applied",
            "first_chunk_only", "residual_is_x"} <= names


@pytest.mark.interpreter
# eps_dropped divides by zero on the zero rows (that is how it is caught).
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("path", MUTANTS, ids=lambda p: p.name[: -len(".py.j2")])
def test_mutant_is_caught(block, path):
    """In fp16 (the off-by-one variance, 1/(2H) relative, is below bf16's tolerance at every H >= 25,
    and below its rounding at real sizes: harmless there) some output of some small shape is wrong."""
    template = Template.from_file(path, BLOCK_ID)
    assert template.role == "variant"
    module = module_at(template)
    caught = []
    for index, shape in enumerate(_small_shapes(block)):
        results, ref, _ = run_both(module, block, shape, torch.float16, seed=index)
        for name in OUTPUTS:
            ok, why = within(results[name], ref[name], block.output_tolerance(name, torch.float16, "cpu"))
            if not ok:
                caught.append(f"{shape.name} {name}: {why}")
    assert caught, f"{path.name} passed every shape"
