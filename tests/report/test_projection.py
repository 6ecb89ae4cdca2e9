"""The model-level projection's arithmetic, checked against a worked example computed by hand."""

from __future__ import annotations

import pytest

from kernelforge.report import projection as proj
from kernelforge.report.projection import Measured

MOE = proj.MOE_BLOCK
PRE = proj.PREFILL_BLOCK
DEC = proj.DECODE_BLOCK
PRESETS = [1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def test_layer_split_puts_window_layers_on_even_indices():
    # GPT-OSS: window on even layers, full on odd (0-based), so an odd count has one more window layer.
    assert proj.layer_split(36) == (18, 18)
    assert proj.layer_split(24) == (12, 12)
    assert proj.layer_split(5) == (2, 3)


def test_closest_token_count_and_prefill_calls():
    assert proj.closest_tokens(8000, PRESETS) == 4096
    assert proj.closest_tokens(3000, [2048, 4096]) == 2048  # 952 away against 1096
    assert proj.closest_tokens(3072, [2048, 4096]) == 4096  # a tie takes the larger
    assert proj.closest_tokens(8, PRESETS) == 8
    assert proj.closest_tokens(5, []) is None
    assert proj.moe_calls(8000, 4096) == 2
    assert proj.moe_calls(4096, 4096) == 1
    assert proj.moe_calls(128000, 4096) == 32
    assert proj.moe_calls(100, 4096) == 1


# The worked example, GPT-OSS-120b (36 layers: 18 full + 18 window), interactive profile (8000 in).
#
# Per-call figures (baseline -> winner):
#   prefill full      2.0 ms -> 1.5 ms     1.0 J -> 0.8 J
#   prefill window    0.4 ms -> 0.4 ms     0.2 J -> 0.2 J
#   MoE T4096         3.0 ms -> 2.5 ms     1.5 J -> 1.2 J   (closest preset to 8000; ceil(8000/4096) = 2 calls)
#   decode b8 full     40 us ->  30 us     (no energy)
#   decode b8 window    5 us ->   5 us
#   MoE T8            100 us ->  80 us
#
# TTFT by hand:
#   attention  baseline 18 x 2.0 + 18 x 0.4 = 36.0 + 7.2 = 43.2 ms; winner 18 x 1.5 + 7.2 = 34.2 ms
#   MoE        baseline 36 x 2 x 3.0 = 216.0 ms;                     winner 36 x 2 x 2.5 = 180.0 ms
#   total      baseline 259.2 ms; winner 214.2 ms; change -45.0 ms; speedup 259.2 / 214.2 = 1.2100840...
#   energy     baseline (18 x 1.0 + 18 x 0.2 + 72 x 1.5) J = 129.6 J -> 129.6 / 8000 = 0.0162 J/token
#              winner   (18 x 0.8 + 18 x 0.2 + 72 x 1.2) J = 104.4 J -> 104.4 / 8000 = 0.01305 J/token
# TBT at batch 8 by hand:
#   attention  baseline 18 x 40 + 18 x 5 = 810 us; winner 18 x 30 + 18 x 5 = 630 us
#   MoE        baseline 36 x 100 = 3600 us;        winner 36 x 80 = 2880 us
#   total      baseline 4410 us; winner 3510 us; change -900 us; speedup 4410 / 3510 = 1.2564102...
WORKED = {
    (PRE, "gpt-oss/interactive/full"): Measured(2.0e-3, 1.5e-3, 1.0, 0.8),
    (PRE, "gpt-oss/interactive/window"): Measured(0.4e-3, 0.4e-3, 0.2, 0.2),
    (MOE, "gpt-oss-120b/T4096"): Measured(3.0e-3, 2.5e-3, 1.5, 1.2),
    (DEC, "gpt-oss/interactive/b8/full"): Measured(40e-6, 30e-6),
    (DEC, "gpt-oss/interactive/b8/window128"): Measured(5e-6, 5e-6),
    (MOE, "gpt-oss-120b/T8"): Measured(100e-6, 80e-6),
}


def test_ttft_worked_example():
    phase = proj.ttft(proj.MODELS["gpt-oss-120b"], proj.PROFILES["interactive"], WORKED, PRESETS)
    attention, moe = phase.components
    assert attention.baseline_s == pytest.approx(43.2e-3) and attention.winner_s == pytest.approx(34.2e-3)
    assert moe.baseline_s == pytest.approx(216.0e-3) and moe.winner_s == pytest.approx(180.0e-3)
    assert moe.shapes == ((MOE, "gpt-oss-120b/T4096"),)
    assert "T4096" in moe.note and "2 call" in moe.note  # says which preset stood in, and how
    assert phase.complete
    assert phase.baseline_s == pytest.approx(259.2e-3)
    assert phase.winner_s == pytest.approx(214.2e-3)
    assert phase.change_s == pytest.approx(-45.0e-3)
    assert phase.speedup == pytest.approx(1.2100840336)
    assert phase.baseline_j_per_token == pytest.approx(0.0162)
    assert phase.winner_j_per_token == pytest.approx(0.01305)


def test_tbt_worked_example():
    phase = proj.tbt(proj.MODELS["gpt-oss-120b"], proj.PROFILES["interactive"], 8, WORKED, PRESETS)
    attention, moe = phase.components
    assert attention.baseline_s == pytest.approx(810e-6) and attention.winner_s == pytest.approx(630e-6)
    assert moe.baseline_s == pytest.approx(3600e-6) and moe.winner_s == pytest.approx(2880e-6)
    assert phase.baseline_s == pytest.approx(4410e-6)
    assert phase.winner_s == pytest.approx(3510e-6)
    assert phase.change_s == pytest.approx(-900e-6)
    assert phase.speedup == pytest.approx(1.2564102564)
    assert moe.note == ""  # T8 is stored: no stand-in
    # No energy was measured for the decode shapes: no joules per token, rather than a guess.
    assert phase.baseline_j_per_token is None and phase.winner_j_per_token is None


def test_missing_shapes_are_named_and_give_no_total():
    # GPT-OSS-20b (12 + 12 layers): its attention is the same shapes, its MoE preset is not stored.
    phase = proj.tbt(proj.MODELS["gpt-oss-20b"], proj.PROFILES["interactive"], 8, WORKED, PRESETS)
    attention, moe = phase.components
    assert attention.complete and attention.baseline_s == pytest.approx(12 * 40e-6 + 12 * 5e-6)
    assert not moe.complete and moe.missing == ((MOE, "gpt-oss-20b/T8"),)
    assert not phase.complete
    assert phase.baseline_s is None and phase.change_s is None and phase.speedup is None
    assert phase.missing == [(MOE, "gpt-oss-20b/T8")]


def test_project_covers_every_profile_and_lists_what_it_lacks():
    result = proj.project(WORKED, {"gpt-oss-120b": [8, 4096], "gpt-oss-20b": PRESETS})
    assert {p.profile for p in result.phases} == {"interactive", "rag", "coding", "long_context", "8k1k"}
    ttft_8k1k = next(p for p in result.phases if p.profile == "8k1k" and p.kind == "TTFT" and p.model == "gpt-oss-120b")
    assert (PRE, "gpt-oss/8k1k/full") in ttft_8k1k.missing and (PRE, "gpt-oss/8k1k/window") in ttft_8k1k.missing
    # The MoE part of 8k1k's TTFT is available: 8192 tokens as 2 calls of the stored T4096.
    moe = ttft_8k1k.components[1]
    assert moe.complete and moe.baseline_s == pytest.approx(36 * 2 * 3.0e-3)
    # rag prefill: 32000 tokens = ceil(32000 / 4096) = 8 calls per layer.
    rag = next(p for p in result.phases if p.profile == "rag" and p.kind == "TTFT" and p.model == "gpt-oss-120b")
    assert rag.components[1].baseline_s == pytest.approx(36 * 8 * 3.0e-3)
    # TBT at batch 32 with only T8 and T4096 stored: the closest stored preset (T8) stands in, and says so.
    b32 = next(p for p in result.phases if p.profile == "interactive" and p.batch == 32 and p.model == "gpt-oss-120b")
    assert b32.components[1].shapes == ((MOE, "gpt-oss-120b/T8"),) and "T8" in b32.components[1].note
