"""DeepSeek-R1 MoE experts: group-limited sigmoid routing, FP8 block-scaled experts, one shared expert.

The MoE part of a DeepSeek-V3/R1 layer after the gate's linear (BLOCKS.md, "DeepSeek V3 / R1 and
Kimi K2.5 MoE"), as vLLM and SGLang serve the FP8 checkpoint::

    ids, w = grouped_topk(router_logits, correction_bias)      # kernelforge.routing (fp32)
    xq = fp8 quantise-dequantise of x per token in groups of 128
    for each token t and slot k, with e = ids[t, k]:
        h  = W13[e] @ xq[t]                   # W13 [E, 2I, H]: gate rows 0..I-1, up rows I..2I-1 (halves)
        a  = silu(h[:I]) * h[I:]              # SiLU-GLU, no bias, no clamp
        y  = W2[e] @ fp8q(bf16(a))            # W2 [E, H, I]
        out[t] += w[t, k] * y
    out += shared expert(x), the same MLP with its own W13 [2IS, H], W2 [H, IS], added unscaled

Constants (deepseek-ai/DeepSeek-V3 ``inference/configs/config_671B.json`` and the R1 ``config.json``):
hidden 7168, moe_intermediate_size 2048, n_routed_experts 256, num_experts_per_tok 8, n_group 8,
topk_group 4, routed_scaling_factor 2.5, n_shared_experts 1 (intermediate 2048), scoring sigmoid
with ``e_score_correction_bias``. Weights: FP8 e4m3 with one fp32 scale per 128x128 block
(``quantization_config``: fp8, ``weight_block_size`` [128, 128]); activations quantised per token
in groups of 128 (``act_quant`` in ``inference/kernel.py``; vLLM's ``per_token_group_quant_fp8``),
also before the second matmul, after the intermediate is rounded to bf16.

The reference multiplies exactly the values the served kernels multiply (dequantised weights,
quantise-dequantised activations) in fp32. ``out`` is the MoE output only: the residual add and
the RMSNorm before the block are outside it, and so is the gate's linear (its fp32 logits are an
input).

:class:`GroupRoutedExperts` is the block's class with every model constant and format as a class
attribute; ``kernels/moe/kimi_k25_experts`` subclasses it with Kimi's.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import torch

from kernelforge.shipped import ShippedPath
from kernelforge.block import Block, Counts, HarnessError, Shape, generator, random_tensor
from kernelforge.profiles import PROMPT_TOKENS, VLLM_BATCH_SIZES
from kernelforge.quant.base import ActivationFormat, WeightFormat, named_parts, parts_of
from kernelforge.quant.fp8 import Fp8BlockWeights, Fp8GroupActivations
from kernelforge.routing import GroupRouting, balanced_routing, grouped_topk, selection_margins
from kernelforge.served_loads import PUBLISHED, expert_weights, weighted_routing

#: Routing patterns (the ``ROUTING`` dimension), made through the router inputs (the block routes):
#: ``uniform``: balanced loads with a decoy per token that only the bias rules out
#: (:meth:`GroupRoutedExperts._chosen_router_inputs`); ``measured``: per-expert loads fitted to a published
#: measurement of the model in serving (:mod:`kernelforge.served_loads`; only models with one);
#: ``skewed``: synthetic, not from any measurement: a per-expert offset of -log(rank + 1) over a random
#: ranking, so a few experts get most tokens; ``one``: TOPK experts of one group (expert 0 among
#: them) get +20, so every token picks them; ``sparse``: half the groups (half the experts when there
#: is one group) get -20 and receive no token.
ROUTINGS: tuple[str, ...] = ("uniform", "measured", "skewed", "one", "sparse")
_BOOST = 20.0
#: Spread of the correction bias: comparable to the spread of sigmoid scores of unit-normal logits
#: (about 0.2), so it changes selections, and large enough that a kernel using it as a weight is wrong.
_BIAS_STD = 0.1
#: The smallest gap between a selected and an unselected (group or expert) score a token may have:
#: about 100 fp32 ulps at 1, far above any correct sigmoid's error, far below the scores' spread.
SELECTION_MARGIN = 1e-5
_MAX_REDRAWS = 64
#: Features per activation group whose magnitude :meth:`GroupRoutedExperts.make_inputs` varies
#: (the FP8 group size; harmless for other activation formats).
_GROUP = 128


def _rounded(t: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``t`` rounded to ``dtype`` (nearest even; bf16 unless the activations are fp16) and back to fp32."""
    return t.to(dtype).to(torch.float32)

#: Token counts serving sees per MoE call (decode batches to prefill chunks), and prompt lengths of
#: the workload profiles (one pass over the prompt).
PRESET_TOKENS: tuple[int, ...] = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096)
PREFILL_TOKENS: tuple[int, ...] = PROMPT_TOKENS
SKEWED_TOKENS: tuple[int, ...] = (64, 4096)


#: Why DeepSeek's library line (DeepGEMM) is not timed on the GPU image.
_DEEPGEMM_WHY = ("DeepGEMM JIT-compiles every GEMM shape with nvcc at first use (tens of seconds each) and its PyPI "
                 "release (1.0.0, 2025-02) predates the grouped API vLLM calls; not brought to the image")


def _served_layout(presets: str, tuned: str, commit: str) -> tuple[ShippedPath, ShippedPath]:
    """What vLLM runs on Hopper for one served layout of DeepSeek-R1's experts: its tuned fused_moe
    file below 128 tokens (the baseline reads it: over experts), DeepGEMM from 128 tokens."""
    library = dict(library="DeepGEMM grouped FP8 GEMM", on_image=False, why_not=_DEEPGEMM_WHY)
    return (
        ShippedPath(presets, "vLLM", f"fused_moe Triton fp8_w8a8, block [128, 128], tuned file {tuned},"
                    "device_name=NVIDIA_H200 (below 128 tokens)",
                    f"vllm-project/vllm vllm/model_executor/layers/fused_moe/configs/ (commit {commit})",
                    baseline_is_expert=True, tokens=(0, 127), **library),
        ShippedPath(presets, "vLLM", "DeepGEMM grouped FP8 GEMMs (vLLM's default on Hopper from 128 tokens)",
                    "vllm-project/vllm vllm/model_executor/layers/fused_moe/deep_gemm_moe.py (commit c45614b)",
                    baseline_is_expert=False, baseline_is="vLLM's fused_moe Triton path with its tuned file (what "
                    "vLLM runs with DeepGEMM off)", tokens=(128, 1 << 30), **library),
    )


class GroupRoutedExperts(Block):
    """DeepSeek-R1's MoE experts (see the module docstring); subclasses change the constants."""

    family = "moe"
    shipped = (
        *_served_layout("deepseek-r1-tp8/", "E=256,N=256", "645d18f"),
        *_served_layout("deepseek-r1-ep8/", "E=32,N=2048", "c6991a3"),
        ShippedPath(
            "deepseek-r1/", "nobody", "the whole layer on one GPU is not served (about 671 GB of FP8 weights against 80-141 GB "
            "per GPU); vLLM would take its default fused_moe configuration",
            "vllm-project/vllm vllm/model_executor/layers/fused_moe/fused_moe.py get_default_config (commit 000d145)",
            baseline_is_expert=False, baseline_is="vLLM's default fused_moe configuration",
            library="DeepGEMM grouped FP8 GEMM", on_image=False, why_not=_DEEPGEMM_WHY, served=False),
    )
    #: The expert parallelism of the ``<model>-ep<N>`` presets: one GPU of an 8-GPU node holding
    #: experts / N experts with the whole intermediate size.
    expert_parallel = 8
    description = (
        "DeepSeek-R1 MoE: sigmoid routing with correction bias, 8 groups keep 4, top-8 x2.5; "
        "256 FP8 (128x128 block-scaled) SiLU-GLU experts + 1 shared expert, activations FP8 per 128"
    )
    dtypes = ("bfloat16",)
    #: The model's name in preset names (``deepseek-r1/T64``) and its constants.
    model = "deepseek-r1"
    experts, topk, groups, topk_groups, scaling = 256, 8, 8, 4, 2.5
    hidden, intermediate, shared_intermediate = 7168, 2048, 2048
    #: The tensor parallelism of the ``<model>-tp<N>`` presets: one GPU of an 8-GPU node.
    tensor_parallel = 8
    routed_format: WeightFormat = Fp8BlockWeights()
    shared_format: WeightFormat = Fp8BlockWeights()
    activations: ActivationFormat = Fp8GroupActivations()

    # -- shapes ---------------------------------------------------------------------------------

    def shape(self, name: str, T: int, *, E: int | None = None, G: int | None = None, KG: int | None = None,
              TOPK: int | None = None, H: int | None = None, I: int | None = None, IS: int | None = None,
              routing: str = "uniform") -> Shape:
        """A shape of this block; omitted sizes are the model's."""
        return Shape.of(name, T=T, E=E or self.experts, G=G or self.groups, KG=KG or self.topk_groups,
                        TOPK=TOPK or self.topk, H=H or self.hidden, I=I or self.intermediate,
                        IS=IS or self.shared_intermediate, ROUTING=routing)

    def small_shapes(self) -> dict[str, list[Shape]]:
        """The smoke and check sets: 8 experts in 4 groups (of 2) keeping 2, top-2, H and I
        multiples of the 128-element quantisation blocks except where a check shape tests partial
        blocks. Few experts keep the interpreter affordable: a grouped GEMM runs one M-tile per
        non-empty expert."""
        s = self.shape
        small = dict(E=8, G=4, KG=2, TOPK=2)
        return {
            "smoke": [s("smoke/T16-E8", 16, H=256, I=128, IS=128, **small),
                      s("smoke/T8-E8-skewed", 8, H=128, I=256, IS=128, routing="skewed", **small)],
            "check": [s("check/T1", 1, H=256, I=128, IS=128, **small),
                      s("check/T7-one", 7, H=128, I=128, IS=256, routing="one", **small),
                      s("check/T33-sparse", 33, H=256, I=128, IS=128, routing="sparse", **small),
                      s("check/T13-partial", 13, H=320, I=192, IS=192, **small),
                      s("check/T24-measured", 24, H=128, I=128, IS=128, routing="measured", **small)],
        }

    def shape_sets(self) -> Mapping[str, list[Shape]]:
        sets = self.small_shapes()
        m = self.model
        sets[m] = [self.shape(f"{m}/T{t}", t) for t in PRESET_TOKENS]
        sets[f"{m}-prefill"] = [self.shape(f"{m}/T{t}", t) for t in PREFILL_TOKENS]
        sets[f"{m}-skewed"] = [self.shape(f"{m}/T{t}-skewed", t, routing="skewed") for t in SKEWED_TOKENS]
        if m in PUBLISHED:  # loads fitted to the model's published serving measurement
            sets[f"{m}-measured"] = [self.shape(f"{m}/T{t}-measured", t, routing="measured") for t in PRESET_TOKENS]
        # One GPU's share of the layer at tensor parallel TP (every expert, intermediate sizes / TP):
        # how a node serves the model, and the shape serving stacks tune their kernels for.
        tp = self.tensor_parallel
        sets[f"{m}-tp{tp}"] = [self.shape(f"{m}-tp{tp}/T{t}", t, I=self.intermediate // tp,
                                          IS=self.shared_intermediate // tp) for t in PRESET_TOKENS]
        # One GPU's share at expert parallel EP: experts / EP local experts with the whole intermediate
        # size. Each token's TOPK picks spread over the EP GPUs, so a GPU gets about T x TOPK / EP
        # token-expert pairs over its experts: modelled as top-(TOPK / EP) routing over the local
        # experts (the per-GPU GEMM work of a balanced dispatch, without the all-to-all).
        ep = self.expert_parallel
        local = dict(E=self.experts // ep, TOPK=max(1, self.topk // ep),
                     G=self.groups if (self.experts // ep) % self.groups == 0 and self.groups > 1 else 1)
        local["KG"] = min(self.topk_groups, local["G"])
        sets[f"{m}-ep{ep}"] = [self.shape(f"{m}-ep{ep}/T{t}", t, **local) for t in PRESET_TOKENS]
        # vLLM's tuner grid (the token counts of its fused_moe config files), whole layer and per GPU.
        sets[f"{m}-vllm"] = [self.shape(f"{m}/T{t}", t) for t in VLLM_BATCH_SIZES]
        sets[f"{m}-tp{tp}-vllm"] = [self.shape(f"{m}-tp{tp}/T{t}", t, I=self.intermediate // tp,
                                               IS=self.shared_intermediate // tp) for t in VLLM_BATCH_SIZES]
        return sets

    def compile_shape(self) -> Shape:
        return self.shape("compile/T64-E16", 64, E=16, G=4, KG=2, TOPK=4, H=512, I=256, IS=256)

    def routing_of(self, shape: Shape) -> GroupRouting:
        return GroupRouting(shape["E"], shape["TOPK"], shape["G"], shape["KG"], self.scaling)

    # -- data ------------------------------------------------------------------------------------

    def router_inputs(self, shape: Shape, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Router logits [T, E] and correction bias [E] (fp32, CPU) of the shape's routing pattern
        (:data:`ROUTINGS`): unit-normal logits plus a per-expert offset. Sigmoid scores saturate at
        1, so the patterns that must hold for every token (``one``, ``sparse``) also move the chosen
        (dropped) experts' bias by +1 (-1): no unboosted expert can then outscore them.

        Every token's selection is decided by at least :data:`SELECTION_MARGIN`
        (:func:`kernelforge.routing.selection_margins`): tokens closer to a tie are drawn again. A
        candidate computes the sigmoid itself (in Triton), and an ulp of difference at a near-tie
        would pick another expert and fail a correct kernel; with the margin only a wrong routing
        changes the selection."""
        T, E, G, topk = shape["T"], shape["E"], shape["G"], shape["TOPK"]
        bias = torch.randn(E, generator=gen, dtype=torch.float32) * _BIAS_STD
        # A trained correction bias balances the load: it cancels each expert's systematic score
        # offset where selections are made. So each expert's logits are offset by -bias / sigmoid'
        # at the selection threshold (the 1 - TOPK/E quantile of a unit normal): every expert is
        # about equally likely to be chosen, and only the biased scores choose them evenly.
        threshold = torch.sigmoid(torch.special.ndtri(torch.tensor(1.0 - topk / E)))
        offsets = -bias / float(threshold * (1.0 - threshold))
        routing = shape.get("ROUTING", "uniform")
        if routing == "skewed":
            ranking = torch.randperm(E, generator=gen)
            offsets[ranking] -= torch.log(torch.arange(E, dtype=torch.float32) + 1.0)
        elif routing == "one":
            per_group = E // G
            chosen = torch.cat([torch.zeros(1, dtype=torch.int64),  # expert 0 and others of group 0
                                torch.randperm(per_group - 1, generator=gen)[: topk - 1] + 1])
            offsets[chosen] += _BOOST
            bias[chosen] += 1.0
        elif routing == "sparse":
            unit = E // G if G > 1 else 1
            for u in torch.randperm(E // unit, generator=gen)[: (E // unit) // 2].tolist():
                offsets[u * unit:(u + 1) * unit] -= _BOOST
                bias[u * unit:(u + 1) * unit] -= 1.0
        elif routing == "uniform":
            return self._chosen_router_inputs(shape, balanced_routing(T, self.routing_of(shape), gen), bias, gen)
        elif routing == "measured":
            published = PUBLISHED.get(self.model)
            if published is None:
                raise ValueError(f"{self.model}: no published expert loads, so no 'measured' routing")
            rule = self.routing_of(shape)
            ids = weighted_routing(T, rule, expert_weights(E, published.sigma, gen), gen)
            return self._chosen_router_inputs(shape, ids, bias, gen)
        else:
            raise ValueError(f"unknown routing {routing!r}; choose from {', '.join(ROUTINGS)}")
        logits = torch.randn(T, E, generator=gen, dtype=torch.float32) + offsets
        rule = self.routing_of(shape)
        for _ in range(_MAX_REDRAWS):
            close = torch.nonzero(selection_margins(logits, bias, rule) < SELECTION_MARGIN).flatten()
            if close.numel() == 0:
                return logits, bias
            logits[close] = torch.randn(close.numel(), E, generator=gen, dtype=torch.float32) + offsets
        raise HarnessError(f"{shape.name}: router logits with a selection margin of {SELECTION_MARGIN} not found")

    def _chosen_router_inputs(self, shape: Shape, ids: torch.Tensor, bias: torch.Tensor,
                              gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Router logits that select the expert ids [T, TOPK] (distinct per row, within TOPK_GROUPS
        groups): the ``uniform`` routing's balanced ids (:func:`kernelforge.routing.balanced_routing`)
        or the ``measured`` routing's (:func:`kernelforge.served_loads.weighted_routing`). The chosen experts
        score 0.95-0.97 after the sigmoid and the others about 0.05, so the bias (std 0.1) never
        moves a selection by itself; but each token also gets a decoy: an unchosen expert of one
        of its kept groups, with a bias below every chosen one's, whose unbiased score beats the
        lowest chosen score. A kernel that selects on unbiased scores picks the decoy; only the
        biased scores choose the given ids."""
        T, E = shape["T"], shape["E"]
        rule = self.routing_of(shape)
        per_group = E // rule.groups

        def draw(rows: int) -> torch.Tensor:
            return torch.randn(rows, E, generator=gen, dtype=torch.float32) * 0.5 - 3.0

        scores = torch.sigmoid(draw(T))
        chosen_scores = 0.95 + 0.02 * torch.rand(T, rule.topk, generator=gen, dtype=torch.float32)
        scores.scatter_(1, ids, chosen_scores)
        chosen = torch.zeros(T, E, dtype=torch.bool).scatter_(1, ids, True)
        group_of = torch.arange(E) // per_group
        kept = torch.zeros(T, rule.groups, dtype=torch.bool).scatter_(1, group_of[ids], True)[:, group_of]
        low = bias[ids].min(dim=1).values
        candidate = kept & ~chosen & (bias[None, :] < low[:, None] - 0.01)
        decoy = torch.where(candidate, bias[None, :], torch.inf).argmin(dim=1)
        has = candidate.any(dim=1)
        rows = torch.nonzero(has).flatten()
        scores[rows, decoy[rows]] = (chosen_scores[rows].min(dim=1).values + 0.005).clamp(max=0.995)
        logits = torch.logit(scores.clamp(1e-6, 1 - 1e-6))
        for _ in range(_MAX_REDRAWS):
            close = torch.nonzero(selection_margins(logits, bias, rule) < SELECTION_MARGIN).flatten()
            if close.numel() == 0:
                return logits, bias
            high = logits[close] > -1.0  # chosen experts and decoys keep their logits
            logits[close] = torch.where(chosen[close] | high, logits[close], draw(close.numel()))
        raise HarnessError(f"{shape.name}: router logits for the chosen experts with a selection margin of {SELECTION_MARGIN} "
                           "not found")

    def make_inputs(self, shape: Shape, dtype: torch.dtype, device: str | torch.device, seed: int,
                    distribution: str = "normal") -> dict[str, Any]:
        """x [T, H] (dtype; the distribution applies to it), router_logits [T, E] and correction_bias
        [E] (fp32), the router's constants as Python numbers (topk, num_groups, topk_groups,
        routed_scaling, as vLLM's FusedMoE takes them), then each weight in its format: w13 [E, 2I, H], w2 [E, H, I], shared_w13
        [2IS, H], shared_w2 [H, IS] (and their ``_scale`` tensors where the format has scales).
        Weights have std 1/sqrt(fan-in), so every stage stays of order one."""
        T, E, H, I, IS = (shape[k] for k in ("T", "E", "H", "I", "IS"))
        gen = generator(seed, device)
        x = random_tensor((T, H), gen, distribution, dtype=dtype, device=device)
        # Each group of 128 features gets its own magnitude (spread 4x), like outlier channels:
        # a kernel that applies the scale of the wrong activation group is then visibly wrong.
        spread = torch.exp2(2.0 * torch.rand(-(-H // _GROUP), generator=gen) - 1.0)
        x = (x.to(torch.float32) * spread.repeat_interleave(_GROUP)[:H].to(device)).to(dtype)
        logits, bias = self.router_inputs(shape, gen)
        inputs: dict[str, Any] = {
            "x": x,
            "router_logits": logits.to(device),
            "correction_bias": bias.to(device),
            "topk": shape["TOPK"],
            "num_groups": shape["G"],
            "topk_groups": shape["KG"],
            "routed_scaling": self.scaling,
        }
        inputs.update(named_parts("w13", self.routed_format.draw((E,), 2 * I, H, H ** -0.5, gen, device)))
        inputs.update(named_parts("w2", self.routed_format.draw((E,), H, I, I ** -0.5, gen, device)))
        inputs.update(named_parts("shared_w13", self.shared_format.draw((), 2 * IS, H, H ** -0.5, gen, device)))
        inputs.update(named_parts("shared_w2", self.shared_format.draw((), H, IS, IS ** -0.5, gen, device)))
        return inputs

    def make_output(self, shape: Shape, dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
        return torch.empty((shape["T"], shape["H"]), dtype=dtype, device=device)

    # -- reference -------------------------------------------------------------------------------

    def mlp(self, xq: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
            dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """One expert's SiLU-GLU MLP in fp32 on already-rounded activations ``xq`` [N, H], rounded
        where the served kernels round, in the activation dtype ``dtype`` (bf16 as served; fp16 for a
        block that declares it): ``h = W13 xq`` is stored in it (vLLM's fused_moe writes GEMM1's
        output in the activation dtype; DeepSeek's ``Linear`` returns bf16), ``silu(gate)`` is
        rounded to it and so is its product with ``up`` (vLLM's ``silu_and_mul`` computes
        ``bf16(silu(x)) * y`` in bf16; DeepSeek's ``F.silu(w1(x)) * w3(x)`` on bf16 tensors), and
        the product is rounded as the activation format says before W2."""
        h = _rounded(xq @ w13.t(), dtype)
        half = w13.shape[0] // 2
        gate = _rounded(torch.nn.functional.silu(h[:, :half]), dtype)
        return self.activations.round(_rounded(gate * h[:, half:], dtype)) @ w2.t()

    def reference(self, **inputs: Any) -> torch.Tensor:
        """The exact math in fp32, one expert at a time (only its weights are dequantised)."""
        x = inputs["x"]
        routing = GroupRouting(inputs["router_logits"].shape[1], inputs["topk"], inputs["num_groups"],
                               inputs["topk_groups"], inputs["routed_scaling"])
        ids, weights = grouped_topk(inputs["router_logits"], inputs["correction_bias"], routing)
        xq = self.activations.round(x.to(torch.float32))
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        w13_parts, w2_parts = parts_of(inputs, "w13"), parts_of(inputs, "w2")
        for e in torch.unique(ids).tolist():
            tok, slot = torch.nonzero(ids == e, as_tuple=True)
            w13 = self.routed_format.dequantize({k: v[e] for k, v in w13_parts.items()})
            w2 = self.routed_format.dequantize({k: v[e] for k, v in w2_parts.items()})
            out.index_add_(0, tok, self.mlp(xq[tok], w13, w2, x.dtype) * weights[tok, slot][:, None])
        shared13 = self.shared_format.dequantize(parts_of(inputs, "shared_w13"))
        shared2 = self.shared_format.dequantize(parts_of(inputs, "shared_w2"))
        return out + self.mlp(xq, shared13, shared2, x.dtype)

    # -- roofline ----------------------------------------------------------------------------------

    def expected_experts(self, shape: Shape) -> float:
        """Expected distinct routed experts one call touches (their weights are read once):
        sum_e 1 - (1 - q_e)^T, with each expert's per-token inclusion probability q_e estimated
        from 4096 tokens of the shape's routing pattern with a fixed seed (deterministic). Computed
        once per block class and shape: :meth:`counts` runs on every evaluation and timing round."""
        return _expected_experts(type(self), shape)

    def sample_expected_experts(self, shape: Shape) -> float:
        """:meth:`expected_experts` without the cache."""
        sample = Shape.of("sample", **{**shape.as_dict(), "T": 4096})
        logits, bias = self.router_inputs(sample, generator(0))
        ids, _ = grouped_topk(logits, bias, self.routing_of(shape))
        q = torch.bincount(ids.flatten(), minlength=shape["E"]).to(torch.float64) / 4096.0
        return float((1.0 - (1.0 - q) ** shape["T"]).sum())

    def counts(self, shape: Shape, dtype: torch.dtype) -> Counts:
        """flops: 2*H*2I + 2*I*H per (token, slot) and 2*H*2IS + 2*IS*H per token (the shared
        expert); elementwise work and quantisation are negligible. bytes: the expected touched
        experts' and the shared expert's weights in their format (scales included), x read, out
        written, the logits and bias read. Intermediates are not counted."""
        T, E, topk, H, I, IS = (shape[k] for k in ("T", "E", "TOPK", "H", "I", "IS"))
        elt = torch.empty((), dtype=dtype).element_size()
        flops = T * topk * 6.0 * H * I + T * 6.0 * H * IS
        routed = self.routed_format.nbytes(2 * I, H) + self.routed_format.nbytes(H, I)
        shared = self.shared_format.nbytes(2 * IS, H) + self.shared_format.nbytes(H, IS)
        nbytes = self.expected_experts(shape) * routed + shared + 2.0 * T * H * elt + 4.0 * (T * E + E)
        return Counts(flops=flops, bytes=nbytes)


@functools.lru_cache(maxsize=1024)
def _expected_experts(block_type: type, shape: Shape) -> float:
    return block_type("cache").sample_expected_experts(shape)
