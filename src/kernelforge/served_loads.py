"""Expert loads fitted to published measurements of a model in serving (the ``measured`` routing).

One record per model whose per-expert (or per-GPU) load has been published with numbers that can be
read; a model without one has no ``measured`` routing (none is invented).

DeepSeek-R1 (:data:`DEEPSEEK_R1`): NVIDIA TensorRT-LLM, ``examples/wide_ep/ep_load_balancer/README.md``
(NVIDIA/TensorRT-LLM, commit 2a595f8157669fce7999f2098fbe32d8263981f0), "Offline EP Load Balancer",
step 1: deepseek-ai/DeepSeek-R1 served with 32-way expert parallelism (8 of the 256 routed experts
per GPU, in expert-id order, no load balancer), the routed token counts of iterations 100-200
recorded per layer and GPU. ``report_load_statistics.py`` prints, averaged over layers and
iterations: mean 1024.0 token-expert pairs per GPU, std 491.651199, imbalance ratio
(max - mean) / mean 1.564272 (layers 3-60; layer 3 alone: std 187.96, ratio 0.498; layer 58: std
570.88, ratio 2.461). 1024 pairs x 32 GPUs / top-8 is 4096 tokens per MoE call.

No per-expert load figures were found for Kimi K2 / K2.5 (the LMSYS K2 deployment post,
lm-sys/lm-sys.github.io ``blog/2025-07-17-k2-large-scale-ep.md``, only says EPLB with 96 redundant
experts balances it) or for GPT-OSS; the LMSYS DeepSeek post (``blog/2025-05-05-large-scale-ep.md``)
gives its "balancedness" (mean / max GPU load) only as a figure, without readable numbers.

The profile: expert ``e`` of a token is drawn with weight ``w_e``, the weights a log-normal profile
(``exp(sigma * z_i)`` at the E evenly spaced normal quantiles ``z_i``, so the shape is fixed and only
its order over the experts is random: one permutation from the shape's generator). A token draws its
TOPK_GROUPS groups without replacement by group weight, then TOPK / TOPK_GROUPS experts of each
without replacement by expert weight (one group: TOPK experts directly). ``sigma`` is fitted so that
the GPU loads of the published layout (E / ranks consecutive experts per GPU) at the published token
count have the published coefficient of variation (std / mean) averaged over seeds; the imbalance
ratio is then a check, not a fit (tests/test_served_loads.py computes both). The log-normal form
follows the observation in deepseek-ai/DeepEP pull request 393 (recorded DeepSeek-V3 per-GPU token
counts are fitted best by a log-normal); its parameters are not used (not readable there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelforge.routing import GroupRouting


@dataclass(frozen=True)
class PublishedLoad:
    """One published measurement of a model's routed load per GPU, and the profile fitted to it.

    ``tokens`` tokens per MoE call, ``ranks`` GPUs of ``experts // ranks`` consecutive experts each;
    ``cv`` (std / mean of the GPU loads) and ``imbalance`` ((max - mean) / mean) as published, both
    averaged over layers and iterations; ``sigma`` the log-normal spread fitted to ``cv``;
    ``source`` where the numbers are printed."""

    model: str
    experts: int
    ranks: int
    tokens: int
    cv: float
    imbalance: float
    sigma: float
    source: str

    def __post_init__(self) -> None:
        if self.experts % self.ranks:
            raise ValueError(f"{self.experts} experts do not split over {self.ranks} GPUs")


DEEPSEEK_R1 = PublishedLoad(
    model="deepseek-r1", experts=256, ranks=32, tokens=4096,
    cv=491.651199 / 1024.0, imbalance=1.564272, sigma=1.235,
    source="NVIDIA/TensorRT-LLM examples/wide_ep/ep_load_balancer/README.md (commit 2a595f8), "
           "DeepSeek-R1 at EP32 without a load balancer: std 491.65 of mean 1024 per GPU, imbalance ratio 1.564",
)

#: The published loads by model name (the blocks' ``model``); models without one are absent.
PUBLISHED: dict[str, PublishedLoad] = {DEEPSEEK_R1.model: DEEPSEEK_R1}


def expert_weights(experts: int, sigma: float, gen: torch.Generator) -> torch.Tensor:
    """Per-expert weights [E] (fp64, mean 1): ``exp(sigma * z_i)`` at the normal quantiles
    ``z_i = ndtri((i + 0.5) / E)``, normalised, in an order drawn from ``gen``."""
    q = (torch.arange(experts, dtype=torch.float64) + 0.5) / experts
    w = torch.exp(sigma * torch.special.ndtri(q))
    w = w / w.mean()
    return w[torch.randperm(experts, generator=gen)]


def weighted_routing(T: int, routing: GroupRouting, weights: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Expert ids [T, TOPK] (int64, distinct within each row, within TOPK_GROUPS groups): each token
    draws its groups without replacement by group weight (the sum of its experts'), then TOPK /
    TOPK_GROUPS experts of each without replacement by expert weight."""
    E, topk = routing.experts, routing.topk
    if routing.groups == 1 or topk <= routing.topk_groups:
        return torch.multinomial(weights.expand(T, E), topk, replacement=False, generator=gen)
    if topk % routing.topk_groups:
        raise ValueError(f"weighted routing needs TOPK ({topk}) divisible by TOPK_GROUPS ({routing.topk_groups})")
    per_group, each = E // routing.groups, topk // routing.topk_groups
    grouped = weights.view(routing.groups, per_group)
    groups = torch.multinomial(grouped.sum(dim=1).expand(T, routing.groups), routing.topk_groups,
                               replacement=False, generator=gen)  # [T, KG]
    within = torch.multinomial(grouped[groups.flatten()], each, replacement=False, generator=gen)  # [T*KG, each]
    return (groups.flatten()[:, None] * per_group + within).view(T, topk)


def rank_statistics(loads: torch.Tensor, ranks: int) -> tuple[float, float]:
    """(std / mean, (max - mean) / mean) of the loads of ``ranks`` GPUs holding consecutive experts,
    from per-expert loads [E] (std with Bessel's correction)."""
    per_rank = loads.to(torch.float64).view(ranks, -1).sum(dim=1)
    mean = per_rank.mean()
    return float(per_rank.std() / mean), float((per_rank.max() - mean) / mean)


__all__ = ["DEEPSEEK_R1", "PUBLISHED", "PublishedLoad", "expert_weights", "rank_statistics", "weighted_routing"]
