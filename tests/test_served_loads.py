"""The ``measured`` routing (kernelforge.served_loads): GPU loads of the published layout match the
published DeepSeek-R1 statistic, made through the block's router inputs and grouped top-k; the
pattern is deterministic per seed, distinct per row and group-limited; models without published
loads have no such routing. The baseline template verifies on ``check/T24-measured`` in
tests/kernels/test_conformance.py (interpreter, with the other smoke and check shapes)."""

from __future__ import annotations

import pytest
import torch

from kernelforge.block import Shape, generator
from kernelforge.routing import GroupRouting, expert_loads, grouped_topk
from kernelforge.served_loads import DEEPSEEK_R1, PUBLISHED, expert_weights, rank_statistics, weighted_routing
from kernel_helpers import load_block_module

DEEPSEEK = load_block_module("moe/deepseek_r1_experts").GroupRoutedExperts("moe/deepseek_r1_experts")
R1 = GroupRouting(256, 8, 8, 4, 2.5)
#: Seeds averaged: the published figures are averages over layers and iterations, and one seed's
#: permutation of the weights over the GPUs moves a single draw's statistic by about 20%.
SEEDS = range(12)


def _published_layout_statistics(seed: int) -> tuple[float, float]:
    """(cv, imbalance) of the 32 GPUs' loads of one measured-routing draw at the published token
    count, selected by grouped top-k from the block's router inputs."""
    shape = DEEPSEEK.shape("t/T4096-measured", DEEPSEEK_R1.tokens, routing="measured")
    logits, bias = DEEPSEEK.router_inputs(shape, generator(seed))
    ids, _ = grouped_topk(logits, bias, DEEPSEEK.routing_of(shape))
    return rank_statistics(expert_loads(ids, shape["E"]), DEEPSEEK_R1.ranks)


def test_deepseek_measured_loads_match_the_published_coefficient_of_variation():
    stats = [_published_layout_statistics(s) for s in SEEDS]
    cv = sum(c for c, _ in stats) / len(stats)
    imbalance = sum(i for _, i in stats) / len(stats)
    # Fitted figure within 10%; the unfitted one within 25% (one spread cannot match both).
    assert abs(cv / DEEPSEEK_R1.cv - 1.0) < 0.10, cv
    assert abs(imbalance / DEEPSEEK_R1.imbalance - 1.0) < 0.25, imbalance
    # And far from balanced: uniform routing's GPU loads are equal to within a pair per expert.
    uniform = DEEPSEEK.shape("t/T4096", DEEPSEEK_R1.tokens)
    logits, bias = DEEPSEEK.router_inputs(uniform, generator(0))
    ids, _ = grouped_topk(logits, bias, DEEPSEEK.routing_of(uniform))
    assert rank_statistics(expert_loads(ids, 256), DEEPSEEK_R1.ranks)[0] < 0.01


def test_published_record_is_the_readme_figures():
    assert DEEPSEEK_R1.tokens * R1.topk == 1024 * DEEPSEEK_R1.ranks  # mean 1024 pairs per GPU at top-8
    assert DEEPSEEK_R1.cv == pytest.approx(0.4801, abs=1e-4)
    assert set(PUBLISHED) == {"deepseek-r1"}


def test_measured_routing_is_deterministic_per_seed_and_distinct_per_row():
    shape = DEEPSEEK.shape("t/T512-measured", 512, routing="measured")
    a = DEEPSEEK.router_inputs(shape, generator(3))
    b = DEEPSEEK.router_inputs(shape, generator(3))
    c = DEEPSEEK.router_inputs(shape, generator(4))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    ids, _ = grouped_topk(*a, DEEPSEEK.routing_of(shape))
    assert all(len(set(row)) == R1.topk for row in ids.tolist())
    groups = ids // (R1.experts // R1.groups)
    assert all(len(set(row)) <= R1.topk_groups for row in groups.tolist())


def test_weighted_routing_selects_what_the_logits_select():
    """The logits are built for the sampled ids: grouped top-k picks exactly them (as sets)."""
    shape = Shape.of("t", T=256, E=256, G=8, KG=4, TOPK=8, H=128, I=128, IS=128, ROUTING="measured")
    gen = generator(5)
    torch.randn(256, generator=gen)  # router_inputs draws the bias first
    expected = weighted_routing(256, R1, expert_weights(256, DEEPSEEK_R1.sigma, gen), gen)
    ids, _ = grouped_topk(*DEEPSEEK.router_inputs(shape, generator(5)), R1)
    assert torch.equal(ids.sort(dim=1).values, expected.sort(dim=1).values)


def test_expert_weights_are_a_lognormal_profile_in_a_seeded_order():
    w = expert_weights(256, 1.0, generator(0))
    assert w.mean().item() == pytest.approx(1.0)
    assert torch.equal(w, expert_weights(256, 1.0, generator(0)))
    assert torch.allclose(w.sort().values, expert_weights(256, 1.0, generator(1)).sort().values)
    assert torch.log(w).std().item() == pytest.approx(1.0, rel=0.05)


def test_models_without_published_loads_have_no_measured_routing():
    kimi = load_block_module("moe/kimi_k25_experts").KimiK25Experts("moe/kimi_k25_experts")
    with pytest.raises(ValueError, match="no published expert loads"):
        kimi.router_inputs(kimi.shape("t", 16, routing="measured"), generator(0))
    assert "kimi-k2.5-measured" not in kimi.shape_sets()
    sets = DEEPSEEK.shape_sets()
    assert all(s["ROUTING"] == "measured" for s in sets["deepseek-r1-measured"])


def test_counts_read_fewer_experts_under_measured_than_uniform_routing():
    """Hot experts take repeated picks, so a 64-token call touches fewer distinct experts (and
    reads fewer weight bytes) than a balanced one; computed from the pattern's own sample."""
    measured = DEEPSEEK.sample_expected_experts(DEEPSEEK.shape("t/T64-measured", 64, routing="measured"))
    uniform = DEEPSEEK.sample_expected_experts(DEEPSEEK.shape("t/T64", 64))
    assert measured < uniform - 10.0, (measured, uniform)
    assert measured > DEEPSEEK_R1.experts / 4  # still far from a few experts
