"""moe/kimi_k25_experts: Kimi K2.5's constants and formats, its presets, the quantised reference
against a straightforward fp64 dequantise-then-matmul (issue 12's acceptance), byte counts with the
INT4 scales, the baseline's per-shape points (vLLM's W4A16 Triton defaults) and the baseline verifying
at its decode point in the interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from kernelforge.candidate import Candidate
from kernelforge.execute.runner import load_candidate
from kernelforge.execute.judge.verify import verify
from kernelforge.quant import base as quant_base, int4
from kernelforge.quant.base import Bf16Weights, NativeActivations
from kernelforge.quant.int4 import Int4GroupWeights
from kernelforge.result import Status
from kernelforge.routing import GroupRouting, grouped_topk
from kernelforge.shipped import baseline_claim, shipped_for
from kernelforge.template import Template
from kernel_helpers import load_block_module

REPO = Path(__file__).resolve().parents[2]
BLOCK_ID = "moe/kimi_k25_experts"
BLOCK_DIR = REPO / "kernels" / BLOCK_ID




BLOCK = load_block_module(BLOCK_ID).KimiK25Experts(BLOCK_ID)
BASELINE = Template.from_file(BLOCK_DIR / "baseline.py.j2", BLOCK_ID)


def test_kimi_constants_and_formats():
    b = BLOCK
    assert (b.experts, b.topk, b.groups, b.topk_groups, b.scaling) == (384, 8, 1, 1, 2.827)
    assert (b.hidden, b.intermediate, b.shared_intermediate) == (7168, 2048, 2048)
    assert isinstance(b.routed_format, Int4GroupWeights)
    assert isinstance(b.shared_format, Bf16Weights) and isinstance(b.activations, NativeActivations)
    assert b.routing_of(b.shapes("kimi-k2.5")[0]) == GroupRouting(384, 8, 1, 1, 2.827)
    assert b.dtypes == ("bfloat16", "float16")


def test_presets_are_kimi_sized_and_small_sets_have_one_group():
    sets = BLOCK.shape_sets()
    assert {"kimi-k2.5", "kimi-k2.5-prefill", "kimi-k2.5-skewed"} <= set(sets)
    for name in ("kimi-k2.5", "kimi-k2.5-prefill", "kimi-k2.5-skewed"):
        for s in sets[name]:
            assert (s["E"], s["G"], s["KG"], s["TOPK"], s["H"], s["I"], s["IS"]) == (384, 1, 1, 8, 7168, 2048, 2048)
    assert [s["T"] for s in sets["kimi-k2.5"]][:2] == [1, 8]
    assert all(s["ROUTING"] == "skewed" for s in sets["kimi-k2.5-skewed"])
    small = sets["smoke"] + sets["check"]
    assert all(s["G"] == 1 and s["KG"] == 1 and s["H"] % 32 == 0 and s["I"] % 32 == 0 for s in small)
    assert any(s["T"] % 2 for s in small)  # odd token counts
    assert any(s["H"] % 64 or s["I"] % 64 for s in small)  # partial tiles
    assert {"one", "sparse", "skewed"} <= {s["ROUTING"] for s in small}


def _hand_dequant(words: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp64 weights from packed words by hand: element j is nibble j % 8 of word j // 8, minus 8,
    times the scale of group j // 32."""
    rows, cols = words.shape[0], words.shape[1] * 8
    out = torch.empty(rows, cols, dtype=torch.float64)
    for r in range(rows):
        row_words = [int(w) & 0xFFFFFFFF for w in words[r].tolist()]
        row_scale = scale[r].to(torch.float64).tolist()
        for j in range(cols):
            q = ((row_words[j // 8] >> (4 * (j % 8))) & 0xF) - 8
            out[r, j] = q * row_scale[j // 32]
    return out


def test_reference_agrees_with_fp64_dequantise_then_matmul():
    """Issue 12's acceptance: the block's reference (fp32, exact dequantisation) against a token-by-token
    fp64 loop that unpacks the words by hand; intermediates are rounded to bf16 where the served kernels
    store them, in both."""
    shape = BLOCK.shape("t/T5", 5, E=8, G=1, KG=1, TOPK=3, H=64, I=32, IS=32)
    inputs = BLOCK.make_inputs(shape, torch.bfloat16, "cpu", 11)
    ref = BLOCK.reference(**inputs)

    scores = torch.sigmoid(inputs["router_logits"].to(torch.float64))
    ids = (scores + inputs["correction_bias"].to(torch.float64)).topk(3, dim=-1).indices
    fp32_ids, _ = grouped_topk(inputs["router_logits"], inputs["correction_bias"], BLOCK.routing_of(shape))
    assert torch.equal(ids, fp32_ids)  # the same selection in fp64 as in fp32
    w13 = [_hand_dequant(inputs["w13"][e], inputs["w13_scale"][e]) for e in range(8)]
    w2 = [_hand_dequant(inputs["w2"][e], inputs["w2_scale"][e]) for e in range(8)]
    sw13, sw2 = inputs["shared_w13"].to(torch.float64), inputs["shared_w2"].to(torch.float64)

    def bf16(v):
        return v.to(torch.bfloat16).to(torch.float64)

    def mlp(x, a, b):  # rounded where vLLM's kernels store: h, silu(gate), the product
        h = bf16(a @ x)
        return b @ bf16(bf16(torch.nn.functional.silu(h[:32])) * h[32:])

    x = inputs["x"].to(torch.float64)
    expected = torch.zeros(5, 64, dtype=torch.float64)
    for t in range(5):
        picked = scores[t, ids[t]]
        weights = picked / picked.sum() * 2.827
        for k in range(3):
            expected[t] += weights[k] * mlp(x[t], w13[int(ids[t, k])], w2[int(ids[t, k])])
        expected[t] += mlp(x[t], sw13, sw2)
    err = (ref.to(torch.float64) - expected).norm() / expected.norm()
    assert err < 1e-3, err


def test_counts_include_the_int4_scales():
    shape = BLOCK.shapes("kimi-k2.5")[-1]  # T 4096
    counts = BLOCK.counts(shape, torch.bfloat16)
    per_expert = (4096 * 7168 + 7168 * 2048) * (0.5 + 2.0 / 32)
    shared = (4096 * 7168 + 7168 * 2048) * 2.0
    weights = counts.bytes - 2.0 * 4096 * 7168 * 2 - 4.0 * (4096 * 384 + 384)
    assert weights == pytest.approx(BLOCK.expected_experts(shape) * per_expert + shared)
    assert 8 < BLOCK.expected_experts(shape) <= 384
    assert counts.flops == 4096 * 8 * 6.0 * 7168 * 2048 + 4096 * 6.0 * 7168 * 2048


def test_expert_weights_are_drawn_on_the_device_one_matrix_at_a_time(monkeypatch):
    """The full preset's INT4 experts: every fp32 draw is one matrix, asked for on the target device
    (the meta device stands in for a GPU: nothing is allocated)."""
    asked = []

    def spy(shape, gen, distribution, *, scale=1.0, dtype, device):
        asked.append((tuple(shape), torch.device(device).type))
        return torch.empty(shape, dtype=dtype, device=device)

    monkeypatch.setattr(int4, "random_tensor", spy)
    monkeypatch.setattr(quant_base, "random_tensor", spy)  # the bf16 shared expert
    inputs = BLOCK.make_inputs(BLOCK.shapes("kimi-k2.5")[0], torch.bfloat16, "meta", 0)
    assert {device for _, device in asked} == {"meta"}
    # 384 routed W13 and W2 (and the shared expert's, of the same sizes: intermediate 2048).
    assert asked.count(((4096, 7168), "meta")) == 385 and asked.count(((7168, 2048), "meta")) == 385
    assert inputs["w13"].shape == (384, 4096, 7168 // 8) and inputs["w13"].dtype == torch.int32
    assert inputs["w13_scale"].shape == (384, 4096, 7168 // 32) and inputs["w13_scale"].dtype == torch.bfloat16
    assert inputs["w2"].shape == (384, 7168, 2048 // 8) and inputs["shared_w13"].dtype == torch.bfloat16


# -- the baseline ------------------------------------------------------------------------------------------

#: vLLM's configuration rule for its Triton W4A16 path, re-typed as numbers (tests/fixtures/vllm/README.md).
RULE = tomllib.loads((REPO / "tests" / "fixtures" / "vllm" / "int4_w4a16_triton_rule.toml").read_text())


def _launch(rows: int, top_k: int) -> dict[str, int]:
    """get_moe_wna16_block_config's Triton branch for one launch of ``rows`` rows and ``top_k``."""
    kind = "single" if rows * top_k // top_k == 1 else "other"
    return RULE["wna16_block_config"][kind]


def _vllm_point(T: int, topk: int = 8) -> dict[str, int]:
    """The point vLLM's Triton W4A16 path takes at T tokens, read from the fixture: get_default_config's
    BLOCK_SIZE_M and GROUP_SIZE_M, GEMM1's block config (T rows, the model's top_k), GEMM2's (T * top_k
    rows, top_k 1), Triton's launch defaults for the warps and stages neither sets."""
    rule = RULE["default_config"]
    bm = next((m for bound, m in rule["block_size_m_bounds"] if T <= bound), rule["block_size_m_above"])
    gemm1, gemm2 = _launch(T, topk), _launch(T * topk, 1)
    warps, stages = RULE["triton_defaults"]["num_warps"], RULE["triton_defaults"]["num_stages"]
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": gemm1["BLOCK_SIZE_N"], "BLOCK_SIZE_K": gemm1["BLOCK_SIZE_K"],
            "GROUP_SIZE_M": rule["group_size_m"], "num_warps": warps, "num_stages": stages,
            "BLOCK_SIZE_N2": gemm2["BLOCK_SIZE_N"], "BLOCK_SIZE_K2": gemm2["BLOCK_SIZE_K"],
            "GROUP_SIZE_M2": rule["group_size_m"], "num_warps2": warps, "num_stages2": stages}


def _vllm_uses_cuda(T: int, experts: int = 384, topk: int = 8, group: int = 32) -> bool:
    """should_moe_wna16_use_cuda on a CUDA GPU for INT4, read from the fixture."""
    cuda = RULE["moe_wna16_cuda"]
    return cuda["bits"] == 4 and group in cuda["group_sizes"] and T * topk / experts <= cuda["max_tokens_per_expert"]


@pytest.mark.parametrize("shape", [s for name, shapes in BLOCK.shape_sets().items() if name.startswith("kimi")
                                   for s in shapes], ids=lambda s: s.name)
def test_preset_baseline_is_vllms_w4a16_triton_default(shape):
    resolved = BASELINE.baseline_for(shape)
    assert dict(resolved.point) == _vllm_point(shape["T"])
    assert BASELINE.space.contains(resolved.point)
    assert "int4_w4a16" in resolved.source and RULE["commit"][:7] in resolved.source


def test_shipped_claim_splits_where_vllms_triton_path_takes_its_cuda_kernel():
    """vLLM's own Triton path runs the moe_wna16 CUDA kernel up to T * 8 / 384 <= 6 (T <= 288) and the
    Triton kernel this baseline follows above; neither is what vLLM ships on Hopper (Marlin MoE), so
    no claim is "over experts", and each names what the baseline is at its token counts."""
    assert _vllm_uses_cuda(288) and not _vllm_uses_cuda(289)
    for T in (1, 288, 289, 4096):
        for name in (f"smoke/T{T}", f"kimi-k2.5/T{T}", f"kimi-k2.5-prefill/T{T}"):
            entry = shipped_for(BLOCK.shipped, BLOCK.shape(name, T))
            assert entry is not None and not entry.baseline_is_expert and "Marlin" in entry.path
            assert ("moe_wna16 CUDA" in entry.baseline_is) == _vllm_uses_cuda(T), (name, entry.baseline_is)
            assert ("vLLM's own Triton W4A16 path" in entry.baseline_is) == (not _vllm_uses_cuda(T))
            assert entry.served == name.startswith("smoke"), name  # every Kimi preset is the whole layer on one GPU
            assert "over experts" not in baseline_claim(BLOCK.shipped, BLOCK.shape(name, T))


@pytest.mark.parametrize("T", [1, 2, 20, 21, 40, 41, 288, 289, 100_000])
def test_baseline_rules_at_their_edges(T):
    shape = BLOCK.shape(f"t/T{T}", T)
    assert dict(BASELINE.baseline_for(shape).point) == _vllm_point(T)


@pytest.mark.interpreter
def test_baseline_verifies_at_its_decode_point():
    """The T == 1 rule's point (GEMM1 16/32/64, GEMM2 16/64/32), another than the conformance test's
    [baseline], on the smoke shapes in bf16."""
    point = dict(BASELINE.baseline_for(BLOCK.shape("t/T1", 1)).point)
    module, failure = load_candidate(Candidate.from_template(BASELINE, point).source, "kimi_decode_point")
    assert failure is None, failure.message
    results = verify(BLOCK, module.run, BLOCK.shapes("smoke"), torch.bfloat16, "cpu", stop_at_first_failure=False)
    assert [v.status for _, v in results] == [Status.OK] * len(results), [v.message for _, v in results]


def test_baseline_refuses_more_than_one_group():
    module, failure = load_candidate(Candidate.from_template(BASELINE).source, "kimi_groups")
    assert failure is None
    shape = BLOCK.shape("t/T2-G2", 2, E=16, G=2, KG=1, TOPK=2, H=64, I=32, IS=32)
    inputs = BLOCK.make_inputs(shape, torch.bfloat16, "cpu", 0)
    with pytest.raises(ValueError, match="one group"):
        module.run(**inputs, out=BLOCK.make_output(shape, torch.bfloat16, "cpu"))
