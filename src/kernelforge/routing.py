"""Group-limited sigmoid routing of DeepSeek-V3/R1 and Kimi K2/K2.5 MoE layers, in fp32.

The math, as the official DeepSeek-V3 inference code computes it (deepseek-ai/DeepSeek-V3,
``inference/model.py``, class ``Gate``, score_func "sigmoid"; the constants from
``inference/configs/config_671B.json`` and the models' Hugging Face ``config.json``)::

    s  = sigmoid(logits)                       # [T, E], fp32
    b  = s + correction_bias                   # [E]: used to choose experts, never as a weight
    # E experts in G groups of E/G: a group scores the sum of its 2 best biased scores;
    # the best K_G groups stay, every expert of the others is masked with -inf
    ids = topk(b masked, TOPK)                 # [T, TOPK]
    w   = s[ids] / sum(s[ids]) * scaling       # unbiased scores, normalised, times the factor

DeepSeek R1: E 256, 8 groups (of 32), K_G 4, TOPK 8, scaling 2.5. Kimi K2.5: E 384, 1 group
(a no-op), TOPK 8, scaling 2.827. Dropped groups are masked with -inf as in the official code
(Hugging Face transformers used 0.0, which selects differently when biased scores are negative).

This one function is the routing of every group-routed block's reference; candidates compute it
themselves (a template may not import kernelforge).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GroupRouting:
    """The router constants of one model: ``experts`` in ``groups`` equal groups, ``topk_groups``
    groups kept, ``topk`` experts chosen, weights scaled by ``scaling``."""

    experts: int
    topk: int
    groups: int
    topk_groups: int
    scaling: float

    def __post_init__(self) -> None:
        if self.experts % self.groups:
            raise ValueError(f"{self.experts} experts do not split into {self.groups} equal groups")
        per_group = self.experts // self.groups
        if self.groups > 1 and per_group < 2:
            raise ValueError("a group scores its 2 best experts: groups need at least 2 experts")
        if not 1 <= self.topk_groups <= self.groups:
            raise ValueError(f"topk_groups {self.topk_groups} must be within 1..{self.groups}")
        if self.topk > self.topk_groups * per_group:
            raise ValueError(f"top-{self.topk} cannot be chosen from {self.topk_groups} groups of {per_group}")


def _limit_groups(biased: torch.Tensor, routing: GroupRouting) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The group stage: every expert of a dropped group masked with -inf in the biased scores
    [T, E], and the group scores [T, G] (the sum of each group's 2 best; None with one group)."""
    if routing.groups == 1:
        return biased, None
    T, E = biased.shape
    grouped = biased.view(T, routing.groups, E // routing.groups)
    group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    keep = group_scores.topk(routing.topk_groups, dim=-1).indices
    dropped = torch.ones(T, routing.groups, dtype=torch.bool, device=biased.device)
    dropped.scatter_(1, keep, False)
    return grouped.masked_fill(dropped[:, :, None], float("-inf")).view(T, E), group_scores


def grouped_topk(logits: torch.Tensor, correction_bias: torch.Tensor,
                 routing: GroupRouting) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [T, TOPK] int64, weights [T, TOPK] fp32) for router ``logits`` [T, E] and the
    per-expert ``correction_bias`` [E] (both taken in fp32). Ids are ordered by biased score,
    best first."""
    T, E = logits.shape
    if E != routing.experts:
        raise ValueError(f"logits have {E} experts, the routing {routing.experts}")
    scores = torch.sigmoid(logits.to(torch.float32))
    biased, _ = _limit_groups(scores + correction_bias.to(torch.float32)[None, :], routing)
    ids = biased.topk(routing.topk, dim=-1).indices
    weights = scores.gather(1, ids)
    weights = weights / weights.sum(dim=-1, keepdim=True) * routing.scaling
    return ids, weights


def selection_margins(logits: torch.Tensor, correction_bias: torch.Tensor, routing: GroupRouting) -> torch.Tensor:
    """The smallest gap [T] (fp32) that decides each token's selection: between the last kept and
    the first dropped group's score, and between the TOPK-th and the next biased score among the
    kept groups (inf where nothing competes). A kernel whose sigmoid differs from torch's by an ulp
    or two picks the same experts wherever this gap is larger than that."""
    T = logits.shape[0]
    biased = torch.sigmoid(logits.to(torch.float32)) + correction_bias.to(torch.float32)[None, :]
    biased, group_scores = _limit_groups(biased, routing)
    margin = torch.full((T,), float("inf"), dtype=torch.float32, device=logits.device)
    if group_scores is not None and routing.topk_groups < routing.groups:
        ranked = group_scores.sort(dim=-1, descending=True).values
        margin = ranked[:, routing.topk_groups - 1] - ranked[:, routing.topk_groups]
    candidates = int(torch.isfinite(biased[0]).sum()) if T else 0
    if routing.topk < candidates:
        top = biased.topk(routing.topk + 1, dim=-1).values
        margin = torch.minimum(margin, top[:, routing.topk - 1] - top[:, routing.topk])
    return margin


def _balanced_rows(T: int, width: int, items: int, gen: torch.Generator) -> torch.Tensor:
    """[T, width] indices into ``items``, distinct within each row, each item used within one time
    of every other: rows are cut from a stream of random permutations, and at each permutation
    boundary the next permutation is reordered (stably) so that a row never repeats an item."""
    need = T * width
    stream: list[int] = []
    while len(stream) < need:
        perm = torch.randperm(items, generator=gen).tolist()
        open_row = stream[len(stream) - len(stream) % width:] if len(stream) % width else []
        if open_row:
            taken = set(open_row)
            perm = [i for i in perm if i not in taken] + [i for i in perm if i in taken]
        stream.extend(perm)
    return torch.tensor(stream[:need], dtype=torch.int64).view(T, width)


def balanced_routing(T: int, routing: GroupRouting, gen: torch.Generator) -> torch.Tensor:
    """Expert ids [T, TOPK] (int64, distinct within each row) that load every expert within one
    token-expert pair of every other where the group limit allows: each token takes TOPK_GROUPS
    groups from a balanced stream of groups and TOPK / TOPK_GROUPS experts of each from a balanced
    stream per group (what a trained router with a well-fitted correction bias approaches, and the
    "uniform" routing a fair benchmark needs: independent random picks leave some experts 40-50%
    above the mean and others empty). One group, or a TOPK not divisible by TOPK_GROUPS: experts
    from one balanced stream over all of them."""
    E, topk = routing.experts, routing.topk
    if routing.groups == 1 or topk <= routing.topk_groups:  # a row then spans at most TOPK_GROUPS groups
        return _balanced_rows(T, topk, E, gen)
    if topk % routing.topk_groups:
        raise ValueError(f"balanced routing needs TOPK ({topk}) divisible by TOPK_GROUPS ({routing.topk_groups})")
    per_group, each = E // routing.groups, topk // routing.topk_groups
    groups = _balanced_rows(T, routing.topk_groups, routing.groups, gen)  # [T, KG]
    streams = {g: iter(_balanced_rows(-(-T * routing.topk_groups // routing.groups) + 1, each, per_group, gen).tolist())
               for g in range(routing.groups)}
    rows = [[g * per_group + e for g in row for e in next(streams[g])] for row in groups.tolist()]
    return torch.tensor(rows, dtype=torch.int64).view(T, topk)


def expert_loads(ids: torch.Tensor, experts: int) -> torch.Tensor:
    """Token-expert pairs per expert [E] (int64) of expert ids [T, TOPK]."""
    return torch.bincount(ids.reshape(-1), minlength=experts)


__all__ = ["GroupRouting", "balanced_routing", "expert_loads", "grouped_topk", "selection_margins"]
