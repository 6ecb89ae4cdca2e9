"""The projection of the MLA models (DeepSeek-R1, Kimi K2.5): their sizes against the published
parameter counts, the memory check against a node of 8 GPUs, and worked TTFT/TBT examples."""

from __future__ import annotations

import pytest

from kernelforge.devices.hardware import Ceilings, ceilings_for
from kernelforge.report.projection import model as proj
from kernelforge.report.projection.mla import DECODE_BLOCK, FP8_BLOCK, MLA_MODELS
from kernelforge.report.projection.model import Measured

R1 = MLA_MODELS["deepseek-r1"]
KIMI = MLA_MODELS["kimi-k2.5"]
INTERACTIVE = proj.PROFILES["interactive"]
R1_MOE = "moe/deepseek_r1_experts"
ROUND = Ceilings("TEST", 1e12, 1e15)


def test_sizes_match_the_published_models():
    # DeepSeek-V3/R1: 671B parameters without the MTP module; Kimi K2: "1T total parameters".
    assert R1.parameters() == pytest.approx(671e9, rel=2e-3)
    assert KIMI.parameters() == pytest.approx(1.03e12, rel=2e-2)
    assert (R1.layers, R1.moe_layers, KIMI.moe_layers) == (61, 58, 60)
    # One MLA cache row: 512 latent + 64 rope values in bf16, on all 61 layers.
    assert R1.kv_bytes(1, 1) == 61 * 1152
    # FP8 weights with 128x128 fp32 block scales: about 673 GB; INT4 experts: about 594 GB.
    assert 665e9 < R1.weight_bytes() < 680e9 and 585e9 < KIMI.weight_bytes() < 600e9
    assert FP8_BLOCK == pytest.approx(1 + 4 / 16384)


# Long context at batch 64 on 8 x H200 (141 GB each, 1128 GB): the cache is
#   64 x 130000 x 61 x 1152 = 584,663,040,000 bytes; with R1's ~673 GB of weights it does not fit.
# Interactive at batch 8: 8 x 8800 x 61 x 1152 = 4,947,148,800 bytes: fits.
def test_memory_check_counts_the_node_of_eight_gpus():
    h200 = ceilings_for("NVIDIA H200")
    long_context = proj.PROFILES["long_context"]
    phase = proj.tbt(R1, long_context, 64, {}, [64], ceilings=h200)
    assert not phase.feasible and phase.fit.kv_bytes == pytest.approx(584_663_040_000)
    assert phase.fit.memory_bytes == pytest.approx(8 * 141e9) and "8 x H200" in phase.fit.message
    ok = proj.tbt(R1, INTERACTIVE, 8, {}, [8], ceilings=h200)
    assert ok.feasible and ok.fit.kv_bytes == pytest.approx(4_947_148_800)


def test_tbt_sums_mla_decode_on_every_layer_and_moe_on_the_moe_layers():
    measured = {(DECODE_BLOCK, "deepseek-r1/interactive/b8"): Measured(100e-6, 80e-6),
                (R1_MOE, "deepseek-r1/T8"): Measured(300e-6, 200e-6)}
    phase = proj.tbt(R1, INTERACTIVE, 8, measured, [1, 8, 64])
    attention, moe = phase.components
    assert attention.block == DECODE_BLOCK and attention.baseline_s == pytest.approx(61 * 100e-6)
    assert moe.block == R1_MOE and moe.winner_s == pytest.approx(58 * 200e-6)
    assert phase.speedup == pytest.approx((61 * 100 + 58 * 300) / (61 * 80 + 58 * 200))
    assert "8 GPUs" in moe.note and "not modelled" in moe.note


def test_ttft_estimates_the_mla_prefill_attention_no_block_measures():
    measured = {(R1_MOE, "deepseek-r1/T8000"): Measured(0.5, 0.4)}
    bare = proj.ttft(R1, INTERACTIVE, measured)
    assert [c.block for c in bare.components] == [R1_MOE] and bare.complete
    phase = proj.ttft(R1, INTERACTIVE, measured, ceilings=ROUND)
    attention, moe, dense = phase.components
    assert attention.estimate and dense.estimate and not moe.estimate
    # Causal attention over 8000 tokens, 128 heads, QK over 192 and PV over 128 dims, 61 layers:
    # 2 x 8000^2 / 2 x 128 x 320 x 61 = 1.599e17 FLOP at 1e15 FLOP/s (compute-bound).
    assert attention.baseline_s == pytest.approx(2 * 8000 ** 2 / 2 * 128 * 320 * 61 / 1e15)
    assert moe.baseline_s == pytest.approx(58 * 0.5)
    assert phase.baseline_s == pytest.approx(attention.baseline_s + 58 * 0.5 + dense.baseline_s)


def test_project_includes_the_mla_models():
    result = proj.project({}, {"deepseek-r1": [8], "kimi-k2.5": [8]}, profiles=["interactive"], batches=[8])
    models = {p.model for p in result.phases}
    assert {"deepseek-r1", "kimi-k2.5", "gpt-oss-120b"} <= models
    kimi = next(p for p in result.phases if p.model == "kimi-k2.5" and p.kind == "TBT")
    assert kimi.missing == [(DECODE_BLOCK, "kimi-k2.5/interactive/b8"), ("moe/kimi_k25_experts", "kimi-k2.5/T8")]
