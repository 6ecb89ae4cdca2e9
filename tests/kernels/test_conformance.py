"""One generic conformance test for every block and template found under kernels/.

Adding a block or a template adds its cases here with no registration: each block must honour the
Block contract, and each template must render, verify on the smoke and check shapes in every dtype
the block declares, and (see test_aot_conformance) compile for sm_90.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelforge.block import DISTRIBUTIONS, DTYPES, Shape
from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.execute.runner import load_candidate
from kernelforge.result import Status
from kernelforge.execute.judge.verify import verify
from kernel_helpers import check_dtype

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
CATALOG = Catalog.discover(KERNELS)
BLOCK_IDS = sorted(CATALOG.blocks)
TEMPLATE_IDS = [t.id for t in CATALOG.all_templates()]


def _tensors(inputs):
    return {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}


def _named(value):
    """Block contract v2: make_output and reference give a tensor (the one output ``out``) or a
    dict of named tensors."""
    return value if isinstance(value, dict) else {"out": value}


def test_there_are_blocks_and_each_has_one_baseline():
    assert {"attention/gpt_oss_prefill", "attention/gpt_oss_decode", "moe/gpt_oss_experts",
            "norm/fused_add_rmsnorm"} <= set(BLOCK_IDS)
    for block_id in BLOCK_IDS:
        assert CATALOG.baseline(block_id).origin == "human"


@pytest.mark.parametrize("block_id", BLOCK_IDS)
def test_block_contract(block_id):
    block = CATALOG.block(block_id)
    sets = block.shape_sets()
    assert {"smoke", "check"} <= set(sets), "every block needs smoke and check shape sets"
    presets = [name for name in sets if name not in ("smoke", "check")]
    assert presets, "every block needs real presets"
    # A name names one shape: a shape may sit in several sets (a model's set and a profile's), but
    # two different shapes never share a name.
    by_name: dict[str, Shape] = {}
    for shape in (s for shapes in sets.values() for s in shapes):
        assert by_name.setdefault(shape.name, shape) == shape, f"two different shapes are named {shape.name}"
    assert isinstance(block.compile_shape(), Shape)
    for dtype_name in block.dtypes:
        for shape in sets["smoke"]:
            _check_inputs_and_reference(block, shape, DTYPES[dtype_name])


def _check_inputs_and_reference(block, shape, dtype):
    """Seeded inputs in every distribution, and a finite fp32 reference that leaves them alone."""
    counts = block.counts(shape, dtype)
    assert counts.flops > 0 and counts.bytes > 0
    for distribution in DISTRIBUTIONS:
        a = block.make_inputs(shape, dtype, "cpu", seed=3, distribution=distribution)
        b = block.make_inputs(shape, dtype, "cpu", seed=3, distribution=distribution)
        c = block.make_inputs(shape, dtype, "cpu", seed=4, distribution=distribution)
        for name, tensor in _tensors(a).items():
            assert torch.equal(tensor, _tensors(b)[name]), f"{name}: same seed must give the same values"
        assert any(not torch.equal(t, _tensors(c)[n]) for n, t in _tensors(a).items()), "seed is ignored"
        before = {k: v.clone() for k, v in a.items() if isinstance(v, torch.Tensor)}
        scalars = {k: v for k, v in a.items() if not isinstance(v, torch.Tensor)}
        ref = _named(block.reference(**a))
        outputs = _named(block.make_output(shape, dtype, "cpu"))
        inplace = tuple(getattr(block, "inplace", ()))
        assert set(inplace) <= set(_tensors(a)), "in-place outputs must be tensor inputs"
        assert not set(inplace) & set(outputs), "an in-place output is an input, not a new output"
        # One reference entry per output and per in-place input, of its shape; fp32 when the output
        # is floating point (integer outputs, compared exactly, keep their dtype).
        expected = {**outputs, **{name: a[name] for name in inplace}}
        assert set(ref) == set(expected), f"reference gives {sorted(ref)}, outputs are {sorted(expected)}"
        for name, tensor in expected.items():
            if tensor.is_floating_point():
                assert ref[name].dtype == torch.float32, name
                assert torch.isfinite(ref[name]).all(), name
            else:
                assert ref[name].dtype == tensor.dtype, name
            assert tuple(ref[name].shape) == tuple(tensor.shape), name
        for name, tensor in _tensors(a).items():
            assert torch.equal(tensor, before[name]), f"{shape.name}: reference modified its input {name}"
        assert scalars == {k: v for k, v in a.items() if not isinstance(v, torch.Tensor)}


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
@pytest.mark.parametrize("template_id", TEMPLATE_IDS)
def test_template_verifies_at_its_baseline_point(template_id, dtype_name):
    template = CATALOG.template(template_id)
    block = CATALOG.block(template.block_id)
    if dtype_name not in block.dtypes:
        pytest.skip(f"{block.id} is not searched in {dtype_name}")
    candidate = Candidate.from_template(template)
    module, failure = load_candidate(candidate.source, template_id)
    assert failure is None, failure.message
    shapes = block.shapes("smoke") + block.shapes("check")
    results = verify(block, module.run, shapes, DTYPES[dtype_name], "cpu",
                     stop_at_first_failure=False)
    failed = [f"{s.name}: {v.status.value} {v.message}" for s, v in results if v.status is not Status.OK]
    assert not failed, failed


def _corner_points():
    """The first and last valid points of each template's space (smallest and largest tiles)."""
    for template in CATALOG.all_templates():
        # The last one is searched from the grid's end: a space can hold millions of points (MoE).
        space = template.space
        for label, point in (("first", next(space.points())), ("last", next(space.points(reverse=True)))):
            yield pytest.param(template.id, point, id=f"{template.id}-{label}")


@pytest.mark.interpreter
@pytest.mark.parametrize("template_id, point", list(_corner_points()))
def test_template_verifies_at_the_corners_of_its_space(template_id, point):
    template = CATALOG.template(template_id)
    block = CATALOG.block(template.block_id)
    module, failure = load_candidate(Candidate.from_template(template, point).source, template_id)
    assert failure is None, failure.message
    results = verify(block, module.run, block.shapes("smoke"), check_dtype(block), "cpu",
                     stop_at_first_failure=False)
    failed = [f"{s.name}: {v.status.value} {v.message}" for s, v in results if v.status is not Status.OK]
    assert not failed, (point, failed)


@pytest.mark.aot
@pytest.mark.parametrize("template_id", TEMPLATE_IDS)
def test_template_compiles_for_sm90_at_its_baseline_point(template_id):
    from kernelforge.compile.pool import compile_candidate

    template = CATALOG.template(template_id)
    report = compile_candidate(Candidate.from_template(template).source, template.block_id, KERNELS, "bfloat16", "sm_90")
    assert report.status == "ok", report.message
    assert report.kernels and all(k.registers and k.registers > 0 for k in report.kernels)
    assert all(k.shared_bytes <= 232448 for k in report.kernels)
