"""moe/deepseek_r1_experts: the model's constants, the quantised reference against a straightforward
dequantise-then-matmul in fp64 token by token (issue 12's acceptance), the inputs, the counts, and
the baseline at every preset: vLLM's tuned H200 file at the tensor-parallel-8 presets (read back from
tests/fixtures/vllm/), its default FP8 block-quant configuration elsewhere (vLLM ships no tuned file
for E=256, N=2048 on Hopper)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from kernelforge.routing import grouped_topk
from kernelforge.template import Template
from kernel_helpers import load_block_module

REPO = Path(__file__).resolve().parents[2]
BLOCK_ID = "moe/deepseek_r1_experts"
BLOCK_DIR = REPO / "kernels" / BLOCK_ID




MODULE = load_block_module(BLOCK_ID)
BLOCK = MODULE.GroupRoutedExperts(BLOCK_ID)
BASELINE = Template.from_file(BLOCK_DIR / "baseline.py.j2", BLOCK_ID)
SMALL = BLOCK.shapes("smoke") + BLOCK.shapes("check")
#: vLLM get_default_config, dtype fp8_w8a8 with block_shape [128, 128], CUDA (fused_moe.py, commit 000d145).
VLLM_FP8_BLOCK_DEFAULT = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
                          "num_warps": 4, "num_stages": 3}
GEMM2 = {"BLOCK_SIZE_N": "BLOCK_SIZE_N2", "BLOCK_SIZE_K": "BLOCK_SIZE_K2", "GROUP_SIZE_M": "GROUP_SIZE_M2",
         "num_warps": "num_warps2", "num_stages": "num_stages2"}


def test_constants_are_deepseek_v3_config_671b():
    # deepseek-ai/DeepSeek-V3 inference/configs/config_671B.json (commit 9b4e978).
    b = BLOCK
    assert (b.hidden, b.intermediate, b.shared_intermediate) == (7168, 2048, 2048)
    assert (b.experts, b.topk, b.groups, b.topk_groups, b.scaling) == (256, 8, 8, 4, 2.5)
    shape = BLOCK.shapes("deepseek-r1/T64")[0]
    assert (shape["E"], shape["G"], shape["KG"], shape["TOPK"], shape["H"], shape["I"], shape["IS"]) == (
        256, 8, 4, 8, 7168, 2048, 2048)


# -- the reference against fp64 ------------------------------------------------------------------


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float64)


def _act_quant64(v: torch.Tensor) -> torch.Tensor:
    """Per group of 128: scale = max(amax, 1e-10) / 448 (fp32, as stored), q = e4m3(v / scale); fp64."""
    out = torch.empty_like(v)
    for g in range(0, v.numel(), 128):
        group = v[g:g + 128]
        scale = torch.tensor(max(group.abs().max().item(), 1e-10), dtype=torch.float32) / 448.0
        q = (group.to(torch.float32) / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        out[g:g + 128] = q.to(torch.float64) * scale.double()
    return out


def _dequant64(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q * scale[r // 128, c // 128] in fp64, by index."""
    r = torch.arange(q.shape[0])[:, None] // 128
    c = torch.arange(q.shape[1])[None, :] // 128
    return q.to(torch.float64) * scale.to(torch.float64)[r, c]


def _mlp64(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = _bf16(w13 @ x)
    half = w13.shape[0] // 2
    gate = _bf16(h[:half] / (1.0 + torch.exp(-h[:half])))
    return w2 @ _act_quant64(_bf16(gate * h[half:]))


def _naive64(inputs, shape) -> torch.Tensor:
    """The block's output token by token and slot by slot in fp64, each expert dequantised by
    index, with the served rounding points (bf16 h, silu, product; e4m3 activation groups)."""
    T = inputs["x"].shape[0]
    ids, weights = grouped_topk(inputs["router_logits"], inputs["correction_bias"], BLOCK.routing_of(shape))
    shared13 = _dequant64(inputs["shared_w13"], inputs["shared_w13_scale"])
    shared2 = _dequant64(inputs["shared_w2"], inputs["shared_w2_scale"])
    out = torch.zeros(inputs["x"].shape, dtype=torch.float64)
    for t in range(T):
        x = _act_quant64(inputs["x"][t].to(torch.float64))
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            w13 = _dequant64(inputs["w13"][e], inputs["w13_scale"][e])
            w2 = _dequant64(inputs["w2"][e], inputs["w2_scale"][e])
            out[t] += float(weights[t, k]) * _mlp64(x, w13, w2)
        out[t] += _mlp64(x, shared13, shared2)
    return out


@pytest.mark.parametrize("shape", SMALL, ids=lambda s: s.name)
def test_reference_matches_a_dequantise_then_matmul_loop_in_fp64(shape):
    inputs = BLOCK.make_inputs(shape, torch.bfloat16, "cpu", seed=7)
    ref = BLOCK.reference(**inputs).double()
    want = _naive64(inputs, shape)
    rel = ((ref - want).norm() / want.norm()).item()
    # Usually about 1e-7; a bf16 rounding point (h, the SiLU product) that lands within an fp32 ulp
    # of a tie rounds the other way in fp64 and costs one bf16 ulp there: 1.0e-5 on check/T1 at
    # seed 7 with the balanced routing's inputs, 9.8e-5 on check/T13-partial on a CPU whose matmul
    # accumulates in another order. A rounding point left out (h not rounded to bf16, or none at
    # all) reads 1.6e-2 on that shape: the bound sits ten times from each.
    assert rel < 1e-3, rel
    # The worst element: 2.2e-4 of the largest there with the tie flips, 1.1e-2 to 2.6e-2 with no
    # rounding point, on every small shape.
    assert (ref - want).abs().max() <= 2e-3 * want.abs().max()


# -- inputs and counts ---------------------------------------------------------------------------


def test_inputs_are_fp8_with_block_scales_and_spread_groups():
    shape = BLOCK.shapes("check/T13-partial")[0]
    inputs = BLOCK.make_inputs(shape, torch.bfloat16, "cpu", seed=0)
    E, H, I, IS = shape["E"], shape["H"], shape["I"], shape["IS"]
    assert inputs["w13"].dtype == torch.float8_e4m3fn and inputs["w13"].shape == (E, 2 * I, H)
    assert inputs["w13_scale"].shape == (E, math.ceil(2 * I / 128), math.ceil(H / 128))
    assert inputs["w2"].shape == (E, H, I) and inputs["w2_scale"].shape == (E, math.ceil(H / 128), math.ceil(I / 128))
    assert inputs["shared_w13"].shape == (2 * IS, H) and inputs["shared_w2_scale"].shape == (
        math.ceil(H / 128), math.ceil(IS / 128))
    assert inputs["router_logits"].dtype == torch.float32 and inputs["correction_bias"].shape == (E,)
    assert (inputs["topk"], inputs["num_groups"], inputs["topk_groups"], inputs["routed_scaling"]) == (
        shape["TOPK"], shape["G"], shape["KG"], 2.5)
    # Groups of 128 features of x differ in magnitude, so a wrong activation scale shows.
    amax = inputs["x"].float().abs()[:, :256].reshape(-1, 2, 128).amax(dim=(0, 2))
    assert max(amax) / min(amax) > 1.2 or inputs["x"].shape[1] < 256


def test_routing_patterns_route_as_named():
    one = BLOCK.shapes("check/T7-one")[0]
    inputs = BLOCK.make_inputs(one, torch.bfloat16, "cpu", seed=0)
    ids, _ = grouped_topk(inputs["router_logits"], inputs["correction_bias"], BLOCK.routing_of(one))
    assert (ids == 0).any(dim=1).all() and len(torch.unique(ids)) == one["TOPK"]
    sparse = BLOCK.shapes("check/T33-sparse")[0]
    inputs = BLOCK.make_inputs(sparse, torch.bfloat16, "cpu", seed=0)
    ids, _ = grouped_topk(inputs["router_logits"], inputs["correction_bias"], BLOCK.routing_of(sparse))
    assert len(torch.unique(ids)) <= sparse["E"] // 2  # half the experts receive no token


def test_counts_include_scales_and_the_shared_expert():
    shape = BLOCK.shapes("deepseek-r1/T4096")[0]
    counts = BLOCK.counts(shape, torch.bfloat16)
    H, I = 7168, 2048
    assert counts.flops == 4096 * 8 * 6.0 * H * I + 4096 * 6.0 * H * I
    per_expert = 3 * H * I + 4.0 * (32 * 56 + 56 * 16)  # fp8 values and fp32 128x128 block scales
    assert counts.bytes > 200 * per_expert  # every expert is touched at 4096 balanced tokens
    assert counts.bytes < 257 * per_expert + 4096 * H * 4 + 4 * 4096 * 257


# -- the baseline at every shape -----------------------------------------------------------------


def _both(config):
    point = dict(config)
    point.update({GEMM2[name]: config[name] for name in GEMM2})
    return point


TP8_FILE = REPO / "tests" / "fixtures" / "vllm" / "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
TP8_PUBLISHED = {int(k): v for k, v in json.loads(TP8_FILE.read_text()).items()}
TP8_SHAPES = BLOCK.shapes("deepseek-r1-tp8")


def test_tp8_presets_are_one_gpus_share_of_the_layer():
    assert [s["T"] for s in TP8_SHAPES] == list(MODULE.PRESET_TOKENS)
    assert all((s["E"], s["H"], s["I"], s["IS"], s["TOPK"]) == (256, 7168, 256, 256, 8) for s in TP8_SHAPES)
    assert TP8_PUBLISHED[1]["BLOCK_SIZE_M"] == 16 and TP8_PUBLISHED[4096]["GROUP_SIZE_M"] == 16
    assert "645d18f" in (TP8_FILE.parent / "README.md").read_text()


@pytest.mark.parametrize("tokens", sorted({*TP8_PUBLISHED, *(s["T"] for s in TP8_SHAPES), 3, 20, 700, 5000}))
def test_tp8_baseline_is_vllms_tuned_h200_config(tokens):
    """vLLM picks the entry whose key is nearest to the token count (the smaller key on a tie)."""
    shape = BLOCK.shape(f"deepseek-r1-tp8/T{tokens}", tokens, I=256, IS=256)
    resolved = BASELINE.baseline_for(shape)
    expected = TP8_PUBLISHED[min(sorted(TP8_PUBLISHED), key=lambda key: abs(key - tokens))]
    assert dict(resolved.point) == _both(expected)
    assert resolved.rule == 0 and "NVIDIA_H200,dtype=fp8_w8a8" in resolved.source and "645d18f" in resolved.source
    assert BASELINE.space.contains(resolved.point)


EP8_FILE = REPO / "tests" / "fixtures" / "vllm" / "E=32,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
EP8_PUBLISHED = {int(k): v for k, v in json.loads(EP8_FILE.read_text()).items()}
EP8_SHAPES = BLOCK.shapes("deepseek-r1-ep8")


def test_ep8_presets_are_one_gpus_experts_with_the_whole_intermediate_size():
    assert [s["T"] for s in EP8_SHAPES] == list(MODULE.PRESET_TOKENS)
    # 32 of 256 experts per GPU; each token's 8 picks spread over 8 GPUs: one pick here.
    assert all((s["E"], s["H"], s["I"], s["IS"], s["TOPK"]) == (32, 7168, 2048, 2048, 1) for s in EP8_SHAPES)
    assert "c6991a3" in (EP8_FILE.parent / "README.md").read_text()


@pytest.mark.parametrize("tokens", sorted({*EP8_PUBLISHED, *(s["T"] for s in EP8_SHAPES), 3, 20, 700, 5000}))
def test_ep8_baseline_is_vllms_tuned_h200_config_as_vllm_runs_it(tokens):
    """vLLM's nearest entry, with BLOCK_SIZE_K clamped to the 128-wide scale block as
    invoke_fused_moe_kernel runs it (the file's 256 at 2048 and 3072 tokens runs as 128)."""
    shape = BLOCK.shape(f"deepseek-r1-ep8/T{tokens}", tokens, E=32, TOPK=1, I=2048, IS=2048)
    resolved = BASELINE.baseline_for(shape)
    expected = dict(EP8_PUBLISHED[min(sorted(EP8_PUBLISHED), key=lambda key: abs(key - tokens))])
    expected["BLOCK_SIZE_K"] = min(expected["BLOCK_SIZE_K"], 128)
    assert dict(resolved.point) == _both(expected)
    assert resolved.rule == 1 and "E=32,N=2048,device_name=NVIDIA_H200" in resolved.source
    assert BASELINE.space.contains(resolved.point)


def test_shipped_paths_name_the_tuned_files_the_baseline_reads():
    """The block's shipped-path naming agrees with the baseline rules: the served layouts below
    128 tokens are the tuned files the rules cite (over experts), the whole layer is not served."""
    from kernelforge.shipped import baseline_claim, shipped_for

    tp8, ep8, whole = TP8_SHAPES[0], EP8_SHAPES[0], BLOCK.shapes("deepseek-r1")[0]
    assert "E=256,N=256" in shipped_for(BLOCK.shipped, tp8).path and baseline_claim(BLOCK.shipped, tp8) == "over experts"
    assert "E=32,N=2048" in shipped_for(BLOCK.shipped, ep8).path and baseline_claim(BLOCK.shipped, ep8) == "over experts"
    assert "645d18f" in shipped_for(BLOCK.shipped, tp8).source and "c6991a3" in shipped_for(BLOCK.shipped, ep8).source
    large = BLOCK.shapes("deepseek-r1-tp8/T4096")[0]
    assert "DeepGEMM" in shipped_for(BLOCK.shipped, large).path and baseline_claim(BLOCK.shipped, large) != "over experts"
    assert not shipped_for(BLOCK.shipped, whole).served and "nobody serves" in baseline_claim(BLOCK.shipped, whole)


@pytest.mark.parametrize("shape", [s for shapes in BLOCK.shape_sets().values() for s in shapes
                                   if s["I"] != 256 and s["E"] != 32], ids=lambda s: s.name)
def test_every_other_shape_gets_vllms_fp8_block_default(shape):
    resolved = BASELINE.baseline_for(shape)
    assert dict(resolved.point) == _both(VLLM_FP8_BLOCK_DEFAULT)
    assert resolved.rule is None
    assert "get_default_config" in resolved.source and "000d145" in resolved.source
    assert BASELINE.space.contains(resolved.point)


def test_space_is_vllms_tuner_space_with_the_block_quant_filter():
    space = dict(BASELINE.space.params)
    assert set(space["BLOCK_SIZE_K"]) == set(space["BLOCK_SIZE_K2"]) == {64, 128}  # {64, 128, 256} with 128 % BK == 0
    assert all(128 % k == 0 for k in space["BLOCK_SIZE_K"])
    assert set(space["BLOCK_SIZE_M"]) == {16, 32, 64, 128, 256}
    assert set(space["BLOCK_SIZE_N"]) == set(space["BLOCK_SIZE_N2"]) == {32, 64, 128, 256}
    assert set(space["GROUP_SIZE_M"]) >= {1, 16, 32, 64}
    assert set(space["num_warps"]) == {4, 8} and set(space["num_stages"]) == {2, 3, 4, 5}
    # sm_90's 232448 bytes per block: the largest fp8 tiles at 5 stages do not fit.
    big = {**_both(VLLM_FP8_BLOCK_DEFAULT), "BLOCK_SIZE_M": 256, "BLOCK_SIZE_N": 256, "num_stages": 5}
    assert not BASELINE.space.contains(big)
