"""kernelforge.routing.grouped_topk against a naive per-token fp64 loop written from DeepSeek-V3's
Gate (deepseek-ai/DeepSeek-V3 inference/model.py): sigmoid scores, bias for selection only, groups
scored by the sum of their 2 best biased scores, dropped groups masked with -inf, top-k, the unbiased
scores normalised and scaled. Also GroupRouting's validation."""

from __future__ import annotations

import math

import pytest
import torch

from kernelforge.routing import GroupRouting, grouped_topk


def _naive(logits: torch.Tensor, bias: torch.Tensor, r: GroupRouting, dropped_value: float = -math.inf):
    """(ids, weights) token by token in Python floats (fp64); ``dropped_value`` is what experts of
    dropped groups score (-inf officially; Hugging Face transformers used 0.0)."""
    ids, weights = [], []
    per = r.experts // r.groups
    for row in logits.tolist():
        scores = [1.0 / (1.0 + math.exp(-v)) for v in row]
        biased = [s + b for s, b in zip(scores, bias.tolist())]
        if r.groups > 1:
            group_score = [sum(sorted(biased[g * per:(g + 1) * per], reverse=True)[:2]) for g in range(r.groups)]
            kept = sorted(range(r.groups), key=lambda g: -group_score[g])[: r.topk_groups]
            biased = [v if e // per in kept else dropped_value for e, v in enumerate(biased)]
        chosen = sorted(range(r.experts), key=lambda e: -biased[e])[: r.topk]
        total = sum(scores[e] for e in chosen)
        ids.append(chosen)
        weights.append([scores[e] / total * r.scaling for e in chosen])
    return torch.tensor(ids), torch.tensor(weights, dtype=torch.float64)


ROUTINGS = {
    "deepseek-r1": GroupRouting(256, 8, 8, 4, 2.5),
    "small": GroupRouting(16, 4, 4, 2, 2.5),
    "one-group": GroupRouting(24, 4, 1, 1, 2.827),
}


@pytest.mark.parametrize("name", sorted(ROUTINGS))
@pytest.mark.parametrize("seed", [0, 1])
def test_grouped_topk_matches_the_naive_loop(name, seed):
    r = ROUTINGS[name]
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(9, r.experts, generator=gen)
    bias = torch.randn(r.experts, generator=gen) * 0.1
    ids, weights = grouped_topk(logits, bias, r)
    want_ids, want_weights = _naive(logits, bias, r)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids, want_ids)  # best first, the same order
    torch.testing.assert_close(weights.double(), want_weights, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(weights.sum(dim=1).double(), torch.full((9,), r.scaling, dtype=torch.float64))


def test_bias_chooses_but_does_not_weigh():
    r = GroupRouting(8, 2, 1, 1, 1.0)
    logits = torch.zeros(1, 8)
    bias = torch.tensor([0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.3, 0.0])
    ids, weights = grouped_topk(logits, bias, r)
    assert ids.tolist() == [[3, 6]]  # chosen by the bias
    torch.testing.assert_close(weights, torch.tensor([[0.5, 0.5]]))  # weighted by sigmoid(0) each


def test_groups_are_scored_by_the_sum_of_their_top_two():
    # Group 0 has the single best expert, group 1 the best pair: top-2 sums keep group 1.
    r = GroupRouting(8, 2, 2, 1, 1.0)
    logits = torch.full((1, 8), -4.0)
    logits[0, 0] = 4.0
    logits[0, 4] = logits[0, 5] = 2.5
    ids, _ = grouped_topk(logits, torch.zeros(8), r)
    assert sorted(ids[0].tolist()) == [4, 5]


def test_dropped_groups_are_masked_with_minus_inf_not_zero():
    """With negative biased scores in the kept groups, masking dropped groups with 0.0 (as Hugging
    Face transformers once did) selects experts of dropped groups; -inf never does."""
    r = GroupRouting(8, 3, 4, 2, 2.5)
    logits = torch.zeros(1, 8)  # scores 0.5; biased scores all < 0
    bias = torch.tensor([-0.6, -0.7, -0.8, -0.85, -0.9, -0.9, -0.9, -0.9])
    ids, _ = grouped_topk(logits, bias, r)
    minus_inf, _ = _naive(logits, bias, r)
    zero, _ = _naive(logits, bias, r, dropped_value=0.0)
    assert ids.tolist() == minus_inf.tolist() == [[0, 1, 2]]  # only the kept groups 0 and 1
    assert all(e // 2 >= 2 for e in zero[0].tolist())  # 0.0 beats every kept expert


def test_logits_of_the_wrong_width_are_refused():
    with pytest.raises(ValueError, match="experts"):
        grouped_topk(torch.zeros(2, 16), torch.zeros(16), ROUTINGS["deepseek-r1"])


@pytest.mark.parametrize("args, match", [
    ((10, 2, 4, 2, 1.0), "equal groups"),
    ((4, 1, 4, 2, 1.0), "at least 2 experts"),
    ((16, 2, 4, 0, 1.0), "topk_groups"),
    ((16, 2, 4, 5, 1.0), "topk_groups"),
    ((16, 9, 4, 2, 1.0), "cannot be chosen"),
])
def test_group_routing_validation(args, match):
    with pytest.raises(ValueError, match=match):
        GroupRouting(*args)


def test_one_group_is_plain_top_k():
    r = ROUTINGS["one-group"]
    gen = torch.Generator().manual_seed(5)
    logits, bias = torch.randn(4, 24, generator=gen), torch.randn(24, generator=gen) * 0.1
    ids, _ = grouped_topk(logits, bias, r)
    assert torch.equal(ids, (torch.sigmoid(logits) + bias).topk(4, dim=-1).indices)


def test_selection_margins_find_the_deciding_gap():
    from kernelforge.routing import selection_margins

    r = GroupRouting(8, 2, 2, 1, 1.0)  # 2 groups of 4, keep 1, top-2
    bias = torch.zeros(8)
    # Token 0: group 0 wins clearly; inside it the 2nd and 3rd biased scores tie exactly.
    # Token 1: both groups' top-2 sums tie exactly (the group choice is a coin toss).
    # Token 2: every gap is wide.
    logit = lambda p: math.log(p / (1 - p))  # noqa: E731 - the logit of a sigmoid score
    rows = [[0.9, 0.6, 0.6, 0.1, 0.2, 0.1, 0.1, 0.1],
            [0.9, 0.5, 0.1, 0.1, 0.9, 0.5, 0.1, 0.1],
            [0.95, 0.8, 0.3, 0.1, 0.2, 0.1, 0.05, 0.05]]
    logits = torch.tensor([[logit(p) for p in row] for row in rows])
    m = selection_margins(logits, bias, r)
    assert m[0] < 1e-6 and m[1] < 1e-6
    assert m[2] == pytest.approx(min((0.95 + 0.8) - (0.2 + 0.1), 0.8 - 0.3), abs=1e-5)
    # One group and top-k of all experts: nothing competes.
    assert torch.isinf(selection_margins(logits[:, :2], torch.zeros(2), GroupRouting(2, 2, 1, 1, 1.0))).all()


def test_block_inputs_keep_every_selection_away_from_a_tie():
    from kernel_helpers import load_block_module
    from kernelforge.routing import selection_margins

    module = load_block_module("moe/deepseek_r1_experts")
    block = module.GroupRoutedExperts("moe/deepseek_r1_experts")
    for shape in block.shapes("smoke") + block.shapes("check") + block.shapes("deepseek-r1/T4096"):
        logits, bias = block.router_inputs(shape, torch.Generator().manual_seed(5))
        assert selection_margins(logits, bias, block.routing_of(shape)).min() >= module.SELECTION_MARGIN, shape.name


# -- balanced ("uniform") routing (issue 31) -------------------------------------------------------

@pytest.mark.parametrize("T, routing", [(4096, GroupRouting(256, 8, 8, 4, 2.5)), (1000, GroupRouting(256, 8, 8, 4, 2.5)),
                                        (1, GroupRouting(256, 8, 8, 4, 2.5)), (64, GroupRouting(384, 8, 1, 1, 2.827)),
                                        (33, GroupRouting(8, 2, 4, 2, 2.5)), (100, GroupRouting(32, 1, 8, 4, 2.5)),
                                        (4096, GroupRouting(128, 4, 1, 1, 1.0))])
def test_balanced_routing_loads_every_expert_within_one_of_the_mean(T, routing):
    from kernelforge.routing import balanced_routing, expert_loads

    ids = balanced_routing(T, routing, torch.Generator().manual_seed(3))
    loads = expert_loads(ids, routing.experts).float()
    assert float((loads - T * routing.topk / routing.experts).abs().max()) <= 1.0
    per_group = routing.experts // routing.groups
    for row in ids.tolist():
        assert len(set(row)) == routing.topk  # distinct within a token
        assert len({e // per_group for e in row}) <= routing.topk_groups  # the group limit holds


def test_independent_random_picks_were_not_balanced():
    """What the balanced routing replaces: uniform random picks of DeepSeek's 256 experts at 4096
    tokens leave loads far from the mean (the issue measured 40%)."""
    from kernelforge.routing import expert_loads

    ids = torch.rand(4096, 256, generator=torch.Generator().manual_seed(0)).topk(8, dim=1).indices
    loads = expert_loads(ids, 256).float()
    assert float((loads - 128).abs().max()) > 20


@pytest.mark.parametrize("block_id, preset", [("moe/deepseek_r1_experts", "deepseek-r1-tp8/T1024"),
                                              ("moe/deepseek_r1_experts", "deepseek-r1-ep8/T256"),
                                              ("moe/kimi_k25_experts", "kimi-k2.5-tp8/T1024")])
def test_the_group_routed_blocks_uniform_inputs_are_balanced_and_need_the_bias(block_id, preset):
    """The blocks' ``uniform`` router inputs select a balanced set, and selecting on unbiased
    scores picks another set for most tokens (each token has a decoy only the bias rules out)."""
    from pathlib import Path

    from kernelforge.catalog import Catalog
    from kernelforge.routing import expert_loads

    block = Catalog.discover(Path(__file__).resolve().parents[1] / "kernels").block(block_id)
    shape = block.shapes(preset)[0]
    logits, bias = block.router_inputs(shape, torch.Generator().manual_seed(5))
    rule = block.routing_of(shape)
    ids, _ = grouped_topk(logits, bias, rule)
    loads = expert_loads(ids, rule.experts).float()
    assert float((loads - shape["T"] * rule.topk / rule.experts).abs().max()) <= 1.0
    unbiased, _ = grouped_topk(logits, torch.zeros_like(bias), rule)
    assert (ids.sort(1).values != unbiased.sort(1).values).any(1).float().mean() > 0.5
