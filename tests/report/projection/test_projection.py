"""The model-level projection's arithmetic, checked against worked examples computed by hand:
MoE prefill in one pass (or the stated chunks), the dense parts as labelled roofline estimates,
the memory check, and a prefill preset for every profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelforge.catalog import Catalog
from kernelforge.devices.hardware import Ceilings, ceilings_for
from kernelforge.report.projection import model as proj
from kernelforge.report.projection.gpt_oss import layer_split
from kernelforge.report.projection.model import Measured

MOE = proj.MOE_BLOCK
PRE = proj.PREFILL_BLOCK
DEC = proj.DECODE_BLOCK
PRESETS = [1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096]
M120 = proj.MODELS["gpt-oss-120b"]
INTERACTIVE = proj.PROFILES["interactive"]
#: Round ceilings so the estimates can be worked out by hand: 1 TB/s, 1 PFLOP/s, memory unknown.
ROUND = Ceilings("TEST", 1e12, 1e15)


def test_layer_split_puts_window_layers_on_even_indices():
    # GPT-OSS: window on even layers, full on odd (0-based), so an odd count has one more window layer.
    assert layer_split(36) == (18, 18)
    assert layer_split(24) == (12, 12)
    assert layer_split(5) == (2, 3)


def test_closest_token_count_and_prefill_chunks():
    assert proj.closest_tokens(3000, [2048, 4096]) == 2048  # 952 away against 1096
    assert proj.closest_tokens(3072, [2048, 4096]) == 4096  # a tie takes the larger
    assert proj.closest_tokens(8, PRESETS) == 8
    assert proj.closest_tokens(5, []) is None
    # One pass over the prompt unless a chunk size is stated; then full chunks and the remainder.
    assert proj.prefill_chunks(8000) == [(8000, 1)]
    assert proj.prefill_chunks(8000, 4096) == [(4096, 1), (3904, 1)]  # 8000 = 4096 + 3904
    assert proj.prefill_chunks(8192, 4096) == [(4096, 2)]
    assert proj.prefill_chunks(100, 4096) == [(100, 1)]


# The worked example, GPT-OSS-120b (36 layers: 18 full + 18 window), interactive profile (8000 in).
#
# Per-call figures (baseline -> winner):
#   prefill full      2.0 ms -> 1.5 ms     1.0 J -> 0.8 J
#   prefill window    0.4 ms -> 0.4 ms     0.2 J -> 0.2 J
#   MoE T8000         5.0 ms -> 4.0 ms     2.5 J -> 2.0 J   (one pass over the 8000-token prompt)
#   MoE T4096, T3904  3.0 / 2.9 ms (baseline and winner alike; only for the chunked case)
#   decode b8 full     40 us ->  30 us     (no energy)
#   decode b8 window    5 us ->   5 us
#   MoE T8            100 us ->  80 us
#
# TTFT by hand (no ceilings: no estimates):
#   attention  baseline 18 x 2.0 + 18 x 0.4 = 36.0 + 7.2 = 43.2 ms; winner 18 x 1.5 + 7.2 = 34.2 ms
#   MoE        baseline 36 x 5.0 = 180.0 ms;                        winner 36 x 4.0 = 144.0 ms
#   total      baseline 223.2 ms; winner 178.2 ms; change -45.0 ms; speedup 223.2 / 178.2 = 1.25252...
#   energy     baseline (18 x 1.0 + 18 x 0.2 + 36 x 2.5) J = 111.6 J -> 111.6 / 8000 = 0.01395 J/token
#              winner   (18 x 0.8 + 18 x 0.2 + 36 x 2.0) J =  90.0 J ->  90.0 / 8000 = 0.01125 J/token
# (Counted the old way, ceil(8000/4096) = 2 calls of T4096, the MoE part would be 36 x 2 x 3.0 = 216 ms.)
# TBT at batch 8 by hand:
#   attention  baseline 18 x 40 + 18 x 5 = 810 us; winner 18 x 30 + 18 x 5 = 630 us
#   MoE        baseline 36 x 100 = 3600 us;        winner 36 x 80 = 2880 us
#   total      baseline 4410 us; winner 3510 us; change -900 us; speedup 4410 / 3510 = 1.2564102...
WORKED = {
    (PRE, "gpt-oss/interactive/full"): Measured(2.0e-3, 1.5e-3, 1.0, 0.8),
    (PRE, "gpt-oss/interactive/window"): Measured(0.4e-3, 0.4e-3, 0.2, 0.2),
    (MOE, "gpt-oss-120b/T8000"): Measured(5.0e-3, 4.0e-3, 2.5, 2.0),
    (MOE, "gpt-oss-120b/T4096"): Measured(3.0e-3, 3.0e-3),
    (DEC, "gpt-oss/interactive/b8/full"): Measured(40e-6, 30e-6),
    (DEC, "gpt-oss/interactive/b8/window128"): Measured(5e-6, 5e-6),
    (MOE, "gpt-oss-120b/T8"): Measured(100e-6, 80e-6),
}


def test_ttft_runs_the_moe_prefill_in_one_pass():
    phase = proj.ttft(M120, INTERACTIVE, WORKED)
    attention, moe = phase.components
    assert attention.baseline_s == pytest.approx(43.2e-3) and attention.winner_s == pytest.approx(34.2e-3)
    assert moe.shapes == ((MOE, "gpt-oss-120b/T8000"),) and "one pass" in moe.note
    assert moe.baseline_s == pytest.approx(180.0e-3) and moe.winner_s == pytest.approx(144.0e-3)
    assert phase.complete and phase.fit is None  # no ceilings: no memory check, no estimates
    assert phase.baseline_s == pytest.approx(223.2e-3) and phase.winner_s == pytest.approx(178.2e-3)
    assert phase.change_s == pytest.approx(-45.0e-3) and phase.speedup == pytest.approx(223.2 / 178.2)
    assert phase.baseline_j_per_token == pytest.approx(0.01395)
    assert phase.winner_j_per_token == pytest.approx(0.01125)


def test_a_stated_chunk_size_counts_full_chunks_and_the_remainder():
    # chunk 4096: per layer one T4096 call and one T3904 call; T3904 is not measured: named, no total.
    phase = proj.ttft(M120, INTERACTIVE, WORKED, chunk=4096)
    moe = phase.components[1]
    assert moe.missing == ((MOE, "gpt-oss-120b/T3904"),) and not phase.complete and phase.baseline_s is None
    # Measured: 36 x (3.0 + 2.9) ms = 212.4 ms (not 36 x 2 x 3.0 = 216 ms).
    measured = {**WORKED, (MOE, "gpt-oss-120b/T3904"): Measured(2.9e-3, 2.9e-3)}
    moe = proj.ttft(M120, INTERACTIVE, measured, chunk=4096).components[1]
    assert moe.baseline_s == pytest.approx(212.4e-3) and "chunks of 4096" in moe.note


def test_tbt_worked_example():
    phase = proj.tbt(M120, INTERACTIVE, 8, WORKED, PRESETS)
    attention, moe = phase.components
    assert attention.baseline_s == pytest.approx(810e-6) and attention.winner_s == pytest.approx(630e-6)
    assert moe.baseline_s == pytest.approx(3600e-6) and moe.winner_s == pytest.approx(2880e-6)
    assert phase.baseline_s == pytest.approx(4410e-6) and phase.winner_s == pytest.approx(3510e-6)
    assert phase.speedup == pytest.approx(4410 / 3510)
    assert phase.baseline_j_per_token is None  # the decode calls carry no energy


# The dense parts of one decode step at batch 1 of GPT-OSS-120b at ROUND (1e12 B/s, 1e15 FLOP/s);
# H = 2880, QKV width (64 + 2 x 8) x 64 = 5120, O input 64 x 64 = 4096, E = 128, vocab V = 201088,
# bf16 (2 bytes); each kernel takes max(flops / 1e15, bytes / 1e12), all memory-bound here:
#   QKV     bytes 2 x (2880 x 5120 + 5120 + 2880 + 5120)       = 29,517,440 -> 29.51744 us
#   O       bytes 2 x (4096 x 2880 + 2880 + 4096 + 2880)       = 23,612,672 -> 23.612672 us
#   router  bytes 2 x (2880 x 128 + 128 + 2880 + 128)          =    743,552 ->  0.743552 us
#   norms   bytes 2 norms x 4 tensors x 2880 x 2                =     46,080 ->  0.04608 us
#   per layer 53.919744 us; 36 layers 1941.110784 us
#   LM head bytes 2 x (2880 x 201088 + 2880 + 3 x 2880 + 201088) = 1,158,692,096 -> 1158.692096 us
#   total  3099.80288 us, the same for baseline and winner.
DENSE_B1_S = 3099.80288e-6


def test_dense_parts_are_labelled_roofline_estimates():
    measured = {**WORKED, (DEC, "gpt-oss/interactive/b1/full"): Measured(40e-6, 30e-6),
                (DEC, "gpt-oss/interactive/b1/window128"): Measured(5e-6, 5e-6),
                (MOE, "gpt-oss-120b/T1"): Measured(100e-6, 80e-6)}
    phase = proj.tbt(M120, INTERACTIVE, 1, measured, PRESETS, ceilings=ROUND)
    dense = phase.components[-1]
    assert dense.estimate and dense.block == proj.ESTIMATE and "estimate" in dense.label
    assert "roofline estimate, not measured" in dense.note and not dense.shapes
    assert dense.baseline_s == pytest.approx(DENSE_B1_S) and dense.winner_s == dense.baseline_s
    # Measured part as in the b8 example (same per-call figures): 4410 -> 3510 us, plus the estimate.
    assert phase.baseline_s == pytest.approx(4410e-6 + DENSE_B1_S)
    assert phase.speedup == pytest.approx((4410e-6 + DENSE_B1_S) / (3510e-6 + DENSE_B1_S))


def test_estimates_leave_the_measured_energy_alone():
    phase = proj.ttft(M120, INTERACTIVE, WORKED, ceilings=ROUND)
    assert phase.components[-1].estimate and phase.complete
    assert phase.baseline_j_per_token == pytest.approx(0.01395)  # the measured blocks' joules only
    assert phase.baseline_s > 223.2e-3  # the estimate is added to the time


# GPT-OSS-120b weights by hand (bytes): per layer
#   experts 128 x 3 x 2880 x 2880 x 4.25/8 (MXFP4) = 1,692,057,600; expert biases 128 x 8640 x 2 = 2,211,840
#   attention (2880 x 5120 + 5120 + 4096 x 2880 + 2880 + 64 sinks) x 2 = 53,100,288
#   router (2880 x 128 + 128) x 2 = 737,536; norms 2 x 2880 x 2 = 11,520      -> 1,748,118,784 per layer
#   x 36 = 62,932,276,224; embedding + LM head (2 x 201088 x 2880 + 2880) x 2 = 2,316,539,520
#   total 65,248,815,744 (about 65 GB: the published checkpoint's size).
# Long context, batch 64, decode at 128000 + 2000 = 130000 tokens; 2 x 8 x 64 x 2 = 2048 bytes per token per layer:
#   presets' layout (all 36 layers at 130000):      36 x 2048 x 130000 x 64 = 613,416,960,000 (613 GB)
#   smallest (18 full layers, 18 keeping 128 keys): 64 x 2048 x (18 x 130000 + 18 x 128) = 307,010,469,888
#   needed 65,248,815,744 + 307,010,469,888 = 372,259,285,632 > 141e9 (H200): infeasible.
# Interactive, batch 8 at 8800 tokens: 8 x 2048 x (18 x 8800 + 18 x 128) = 2,632,974,336 -> 67.9 GB: fits.
def test_presets_are_checked_against_device_memory():
    assert M120.weight_bytes() == pytest.approx(65_248_815_744)
    h200 = ceilings_for("NVIDIA H200")
    long_context = proj.PROFILES["long_context"]
    phase = proj.tbt(M120, long_context, 64, {}, PRESETS, ceilings=h200)
    fit = phase.fit
    assert not phase.feasible and not phase.components and not phase.complete and phase.baseline_s is None
    assert fit.kv_presets_bytes == pytest.approx(613_416_960_000)
    assert fit.kv_bytes == pytest.approx(307_010_469_888)
    assert fit.needed_bytes == pytest.approx(372_259_285_632) and fit.memory_bytes == 141e9
    assert "613 GB" in fit.message and "372 GB" in fit.message and "not projected" in fit.message
    ok = proj.tbt(M120, INTERACTIVE, 8, WORKED, PRESETS, ceilings=h200)
    assert ok.feasible and ok.fit.kv_bytes == pytest.approx(2_632_974_336) and ok.complete
    # An unknown memory is not a verdict: the phase is projected and not checked.
    assert proj.tbt(M120, long_context, 64, {}, PRESETS, ceilings=ROUND).fit is None


def test_missing_shapes_are_named_and_give_no_total():
    # GPT-OSS-20b (12 + 12 layers): its attention is the same shapes, its MoE preset is not stored.
    phase = proj.tbt(proj.MODELS["gpt-oss-20b"], INTERACTIVE, 8, WORKED, PRESETS)
    attention, moe = phase.components
    assert attention.complete and attention.baseline_s == pytest.approx(12 * 40e-6 + 12 * 5e-6)
    assert not moe.complete and moe.missing == ((MOE, "gpt-oss-20b/T8"),)
    assert not phase.complete and phase.baseline_s is None and phase.speedup is None
    assert phase.missing == [(MOE, "gpt-oss-20b/T8")]


def test_every_profile_has_the_presets_each_model_needs():
    catalog = Catalog.discover(Path(__file__).resolve().parents[3] / "kernels")

    def names(block):
        return {s.name for shapes in catalog.block(block).shape_sets().values() for s in shapes}

    for profile in proj.PROFILES.values():
        for model in proj.MODELS.values():
            # The MoE prefill runs once over the prompt: T<prompt tokens> is a preset of every model.
            assert proj.moe_shape(model, profile.input_tokens) in names(model.moe_block), (profile.name, model.name)
            for phase, batches in (("prefill", [None]), ("decode", proj.BATCHES)):
                for batch in batches:
                    calls = model.attention_calls(phase, profile.name, batch)
                    if calls is None:  # no block measures it: the model must estimate it instead
                        assert phase == "prefill" and model.attention_estimate(1000) is not None
                        continue
                    for block, shape, _ in calls.needed:
                        assert shape in names(block), (model.name, phase, batch, shape)


def test_project_covers_every_profile_and_lists_what_it_lacks():
    h200 = ceilings_for("NVIDIA H200")
    result = proj.project(WORKED, {"gpt-oss-120b": [8, 4096], "gpt-oss-20b": PRESETS},
                          prefill_ceilings=h200, decode_ceilings=h200)
    assert {p.profile for p in result.phases} == set(proj.PROFILES)
    ttft_8k1k = next(p for p in result.phases if p.profile == "8k1k" and p.kind == "TTFT" and p.model == "gpt-oss-120b")
    assert {(PRE, "gpt-oss/8k1k/full"), (PRE, "gpt-oss/8k1k/window"), (MOE, "gpt-oss-120b/T8192")} <= set(ttft_8k1k.missing)
    # TBT at batch 32 with only T8 and T4096 stored: the closest stored preset (T8) stands in, and says so.
    b32 = next(p for p in result.phases if p.profile == "interactive" and p.batch == 32 and p.model == "gpt-oss-120b")
    assert b32.components[1].shapes == ((MOE, "gpt-oss-120b/T8"),) and "T8" in b32.components[1].note
    # On an H200 the long-context batch-64 decode does not fit either model (20b: 218 GB): reported, not projected.
    infeasible = {(p.model, p.profile, p.batch) for p in result.phases if not p.feasible}
    assert {("gpt-oss-120b", "long_context", 64), ("gpt-oss-20b", "long_context", 64)} <= infeasible
    assert ("gpt-oss-120b", "interactive", 64) not in infeasible
