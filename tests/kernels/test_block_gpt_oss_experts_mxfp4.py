"""The moe/gpt_oss_experts_mxfp4 block: its reference against an fp64 dequantise-then-matmul, seeded
MXFP4 inputs that exercise the clamp, shapes and counts (scales included), its baseline template's
header and per-shape points (triton_kernels' Hopper defaults), the template verified in bf16 in the
interpreter, and its mutants."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from kernelforge.block import Shape
from kernelforge.execute.judge.verify import verify
from kernelforge.quant.mxfp4 import dequantize
from kernelforge.result import Status
from kernelforge.template import Template
from kernel_helpers import load_block_module, module_at

REPO = Path(__file__).resolve().parents[2]
BLOCK_ID = "moe/gpt_oss_experts_mxfp4"
BLOCK_DIR = REPO / "kernels" / BLOCK_ID
MUTANT_DIR = REPO / "tests" / "mutants" / BLOCK_ID




BLOCK = load_block_module(BLOCK_ID).GptOssExpertsMxfp4(BLOCK_ID)
SMOKE = BLOCK.shapes("smoke")
CHECK = BLOCK.shapes("check")
BASELINE = Template.from_file(BLOCK_DIR / "baseline.py.j2", BLOCK_ID)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _naive_fp64(x, topk_ids, topk_weights, w1, w1_scale, b1, w2, w2_scale, b2):
    """Token by token, slot by slot, in fp64, with the weights dequantised in fp64."""
    T, H = x.shape
    out = torch.zeros(T, H, dtype=torch.float64)
    for t in range(T):
        for k in range(topk_ids.shape[1]):
            e = int(topk_ids[t, k])
            h = dequantize(w1[e], w1_scale[e], torch.float64) @ x[t].double() + b1[e].double()
            glu, lin = h[0::2].clamp(max=7.0), h[1::2].clamp(min=-7.0, max=7.0)
            a = glu * torch.sigmoid(1.702 * glu) * (lin + 1.0)
            out[t] += float(topk_weights[t, k]) * (dequantize(w2[e], w2_scale[e], torch.float64) @ a + b2[e].double())
    return out


@pytest.mark.parametrize("shape, distribution",
                         [(SMOKE[1], "normal"), (CHECK[2], "large"), (CHECK[4], "outliers"), (CHECK[0], "normal")],
                         ids=lambda v: getattr(v, "name", v))
def test_reference_matches_naive_fp64(shape, distribution):
    inputs = BLOCK.make_inputs(shape, torch.bfloat16, "cpu", 3, distribution)
    ref = BLOCK.reference(**inputs)
    naive = _naive_fp64(**inputs)
    assert ref.dtype == torch.float32 and ref.shape == (shape["T"], shape["H"])
    assert ((ref.double() - naive).norm() / naive.norm()).item() < 1e-6


def test_inputs_are_seeded_mxfp4_and_exercise_the_clamp():
    shape = SMOKE[0]
    a, b = (BLOCK.make_inputs(shape, torch.bfloat16, "cpu", 7) for _ in range(2))
    c = BLOCK.make_inputs(shape, torch.bfloat16, "cpu", 8)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["w1"], c["w1"]) and not torch.equal(a["w2_scale"], c["w2_scale"])
    T, E, K, H, I = (shape[d] for d in ("T", "E", "TOPK", "H", "I"))
    expected = {"x": ((T, H), torch.bfloat16), "topk_ids": ((T, K), torch.int32),
                "topk_weights": ((T, K), torch.float32), "w1": ((E, 2 * I, H // 2), torch.uint8),
                "w1_scale": ((E, 2 * I, H // 32), torch.uint8), "b1": ((E, 2 * I), torch.bfloat16),
                "w2": ((E, H, I // 2), torch.uint8), "w2_scale": ((E, H, I // 32), torch.uint8),
                "b2": ((E, H), torch.bfloat16)}
    assert {k: (tuple(v.shape), v.dtype) for k, v in a.items()} == expected
    # Scales span several exponents around the bf16 block's weight std, far from 0 and 255.
    assert a["w1_scale"].unique().numel() >= 3 and 100 < int(a["w1_scale"].min()) and int(a["w1_scale"].max()) < 140
    w1 = torch.stack([BLOCK.expert_weights(a, e)[0] for e in range(E)])
    assert 3.9 / H**0.5 / 1.3 < w1.std().item() < 3.9 / H**0.5 * 1.3

    def clamped_fraction(distribution):
        inp = BLOCK.make_inputs(shape, torch.bfloat16, "cpu", 7, distribution)
        e = inp["topk_ids"][:, 0].long()
        w = torch.stack([BLOCK.expert_weights(inp, int(i))[0] for i in e])
        h = torch.einsum("th,tnh->tn", inp["x"].float(), w) + inp["b1"][e].float()
        return ((h[:, 0::2] > 7).float().mean() + (h[:, 1::2].abs() > 7).float().mean()).item() / 2

    normal, large = clamped_fraction("normal"), clamped_fraction("large")
    assert 0.01 < normal < 0.25 and large > 2 * normal


def test_reference_does_not_modify_inputs():
    inputs = BLOCK.make_inputs(CHECK[1], torch.bfloat16, "cpu", 5)
    before = {k: v.clone() for k, v in inputs.items()}
    BLOCK.reference(**inputs)
    assert all(torch.equal(v, before[k]) for k, v in inputs.items())


def test_shapes_and_counts_include_scales():
    sets = BLOCK.shape_sets()
    assert {"smoke", "check", "gpt-oss-120b", "gpt-oss-20b", "gpt-oss-120b-prefill"} <= set(sets)
    assert BLOCK.dtypes == ("bfloat16",)
    assert all(s["H"] % 32 == 0 and s["I"] % 32 == 0 for shapes in sets.values() for s in shapes)
    assert any(s["H"] % 64 or s["I"] % 64 for s in CHECK)  # 96, 160, 224: groups whole, tiles ragged
    assert {s["ROUTING"] for s in CHECK} >= {"skewed", "one", "sparse"} and 1 in {s["T"] for s in CHECK}
    assert any(s["T"] % 2 for s in CHECK)
    shape = BLOCK.shapes("gpt-oss-120b/T1")[0]
    c = BLOCK.counts(shape, torch.bfloat16)
    H = I = 2880
    assert c.flops == 4 * (2 * H * 2 * I + 2 * I * H)
    weights = 3 * H * I
    per_expert = weights / 2 + weights / 32 + (2 * I + H) * 2  # codes, scales, bf16 biases
    assert c.bytes == pytest.approx(4 * per_expert + 2 * H * 2 + 4 * 8)
    bf16 = super(type(BLOCK), BLOCK).counts(shape, torch.bfloat16)
    assert 3.5 < bf16.bytes / c.bytes < 4  # MXFP4 weights are 17/64 of bf16's


def test_baseline_header_and_hopper_points():
    assert BASELINE.role == "baseline" and BASELINE.origin == "human"
    assert "make_default_opt_flags_nvidia" in BASELINE.baseline_source
    common = {"BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 8, "num_warps": 8,
              "BLOCK_SIZE_N2": 256, "BLOCK_SIZE_K2": 128, "GROUP_SIZE_M2": 8, "num_warps2": 8}
    assert {k: BASELINE.baseline[k] for k in common} == common
    # triton_kernels' block_m from t = T * TOPK // E: 16 up to 8 tokens per expert, then 32, 64, 128.
    expected = {1: 16, 64: 16, 128: 16, 256: 16, 512: 32, 1024: 64, 2048: 64, 4096: 128}
    for T, block_m in expected.items():
        point = BASELINE.baseline_for(BLOCK.shapes(f"gpt-oss-120b/T{T}")[0]).point
        assert point["BLOCK_SIZE_M"] == block_m, T
        assert (point["num_stages"], point["num_stages2"]) == ((3, 3) if block_m == 128 else (4, 4))
    assert BASELINE.baseline_for(BLOCK.shapes("gpt-oss-20b/T1024")[0]).point["BLOCK_SIZE_M"] == 128
    assert not BASELINE.space.contains({**BASELINE.baseline, "num_stages": 4})  # 245760 B measured
    assert not BASELINE.space.contains({**BASELINE.baseline, "BLOCK_SIZE_K": 48})
    module = module_at(BASELINE)
    assert list(inspect.signature(module.run).parameters) == [
        "x", "topk_ids", "topk_weights", "w1", "w1_scale", "b1", "w2", "w2_scale", "b2", "out"]


OPT_FLAGS = tomllib.loads((Path(__file__).resolve().parents[1] / "fixtures" / "triton_kernels"
                           / "opt_flags_nvidia.toml").read_text())


def _pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def _triton_kernels_block_m(T: int, topk: int, experts: int) -> int:
    """make_default_opt_flags_nvidia's block_m for a ragged matmul, from the re-typed fixture."""
    rule = OPT_FLAGS["block_m"]
    t = max(1, T * topk // experts)
    if t <= rule["ragged_max"]:
        return max(rule["min_block"], min(_pow2(2 * t), rule["ragged_cap"]))
    return max(rule["min_block"], min(_pow2(t), rule["cap"]))


def test_block_m_reads_back_against_triton_kernels_source_at_every_preset():
    """Every real preset's BLOCK_SIZE_M (and GROUP_SIZE_M) is triton_kernels' default for that token
    count, evaluated from the fixture re-typed at the commit the template's rules name."""
    shapes = [s for name, ss in BLOCK.shape_sets().items() if name not in ("smoke", "check") for s in ss]
    assert shapes
    for shape in shapes:
        resolved = BASELINE.baseline_for(shape)
        assert resolved.point["BLOCK_SIZE_M"] == _triton_kernels_block_m(shape["T"], shape["TOPK"], shape["E"]), \
            shape.name
        assert resolved.point["GROUP_SIZE_M"] == resolved.point["GROUP_SIZE_M2"] == OPT_FLAGS["group_m"]
        assert resolved.point["BLOCK_SIZE_M"] == 128 or OPT_FLAGS["commit"][:7] in resolved.source


def _verify(template: Template, shapes: list[Shape], point: dict | None = None) -> list[str]:
    results = []
    for shape in shapes:
        chosen = dict(point) if point is not None else dict(template.baseline_for(shape).point)
        module = module_at(template, chosen)
        results += verify(BLOCK, module.run, [shape], torch.bfloat16, "cpu", stop_at_first_failure=False)
    return [f"{s.name}: {v.status.value} {v.message}" for s, v in results if v.status is not Status.OK]


@pytest.mark.interpreter
def test_baseline_verifies_in_bf16_on_smoke_and_check_at_each_shapes_point():
    assert not _verify(BASELINE, SMOKE + CHECK)


@pytest.mark.interpreter
def test_baseline_verifies_at_small_and_split_tiles():
    small = {**BASELINE.baseline, "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1,
             "BLOCK_SIZE_N2": 64, "BLOCK_SIZE_K2": 64, "GROUP_SIZE_M2": 16, "num_stages": 4, "num_stages2": 4}
    assert not _verify(BASELINE, [SMOKE[1], CHECK[4]], small)


@triton.jit
def _decode_probe(codes_ptr, scales_ptr, out_ptr, decode, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.arange(0, BN)[:, None]
    codes = tl.load(codes_ptr + rows * (BK // 2) + tl.arange(0, BK // 2)[None, :])
    scales = tl.load(scales_ptr + rows * (BK // 32) + tl.arange(0, BK // 32)[None, :])
    w = decode(codes, scales, BN, BK)  # [BK, BN]
    tl.store(out_ptr + tl.arange(0, BK)[:, None] * BN + tl.arange(0, BN)[None, :], w)


@pytest.mark.interpreter
def test_baseline_decode_is_exact_for_every_code_over_its_scale_range():
    """The template's in-kernel decode against the block's dequantisation, bit for bit in bf16: all
    256 code bytes (both nibbles, both signs, zero and the subnormal 0.5) at every scale byte of the
    documented exact range 3..252 (both ends included)."""
    scale_bytes = torch.arange(3, 253, dtype=torch.uint8)
    scale_bytes = torch.cat([scale_bytes, scale_bytes[:3], scale_bytes[-3:]])  # 256 rows (a power of 2)
    bn, bk = scale_bytes.numel(), 512  # a row: each byte value once, 16 groups with one scale
    codes = torch.arange(256, dtype=torch.uint8).repeat(bn, 1)
    scales = scale_bytes[:, None].repeat(1, bk // 32)
    out = torch.empty(bk, bn, dtype=torch.bfloat16)
    _decode_probe[(1,)](codes, scales, out, module_at(BASELINE)._decode_tile, BN=bn, BK=bk)
    expected = dequantize(codes, scales, torch.float64).to(torch.bfloat16).t()
    assert torch.equal(expected.double(), dequantize(codes, scales, torch.float64).t())  # exact in bf16
    assert torch.equal(out.view(torch.int16), expected.contiguous().view(torch.int16))


MUTANTS = sorted(MUTANT_DIR.glob("*.py.j2"))


def test_mutants_exist():
    names = {p.name.removesuffix(".py.j2") for p in MUTANTS}
    assert {"nibble_swapped", "scale_bias_off_by_one", "scale_row_shared", "halves", "sign_dropped"} <= names
