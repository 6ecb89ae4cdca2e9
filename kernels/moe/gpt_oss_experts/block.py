"""GPT-OSS MoE routed experts: GEMM1 + bias, interleaved clamped SwiGLU, GEMM2 + bias, weighted combine.

The part of the GPT-OSS MoE block after routing (BLOCKS.md, "GPT-OSS MoE block"). Given tokens
that are already RMS-normalised, each token's top-k expert ids and routing weights::

    for each token t and slot k, with e = topk_ids[t, k]:
        h = W1[e] @ x[t] + b1[e]                    # W1 [E, 2I, H], b1 [E, 2I] -> h [2I]
        glu, lin = h[0::2], h[1::2]                 # interleaved, not halves
        glu = min(glu, 7); lin = clamp(lin, -7, 7)
        a = glu * sigmoid(1.702 * glu) * (lin + 1)  # [I]
        y = W2[e] @ a + b2[e]                       # W2 [E, H, I], b2 [E, H] -> y [H]
        out[t] += topk_weights[t, k] * y

The residual add of the model (``x + ...``), the RMSNorm before it and the router (linear + top-k +
softmax over the k) are outside this block: ``out`` is the routed-expert sum only.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from kernelforge.shipped import ShippedPath
from kernelforge.block import Block, Counts, Shape, generator, random_tensor
from kernelforge.profiles import PROMPT_TOKENS, VLLM_BATCH_SIZES
from kernelforge.routing import GroupRouting, balanced_routing

#: Routing patterns (the ``ROUTING`` shape dimension); see :func:`make_routing`.
ROUTINGS: tuple[str, ...] = ("uniform", "skewed", "one", "sparse")

#: SwiGLU constants of GPT-OSS.
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0

#: Standard deviation of the pre-activation h = W1 x + b1 for unit-normal x (``normal``
#: distribution): about 4, so |h| > 7 for about 8% of entries and the clamp is exercised; with the
#: ``large`` distribution (x scaled by 8) most entries clamp. W1 contributes 3.9, b1 1.0.
_W1_STD = 3.9
_B1_STD = 1.0
#: y = W2 a + b2 with a of RMS about 10: W2 entries 0.25/sqrt(I) give y of RMS about 2.5, and b2 of
#: RMS 1 is a visible part of it (a kernel that drops b2 is clearly wrong).
_W2_STD = 0.25
_B2_STD = 1.0

#: The token counts serving sees per MoE call: decode batches up to prefill chunks.
PRESET_TOKENS: tuple[int, ...] = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: Prompt lengths of the workload profiles (BLOCKS.md): a prefill runs the experts once over the
#: whole prompt (sets ``<model>-prefill``; the model-level projection reads them).
PREFILL_TOKENS: tuple[int, ...] = PROMPT_TOKENS
#: Real model presets: name -> (E, H, I, TOPK) (BLOCKS.md, model dimensions).
PRESETS: dict[str, tuple[int, int, int, int]] = {
    "gpt-oss-120b": (128, 2880, 2880, 4),
    "gpt-oss-20b": (32, 2880, 2880, 4),
}

#: Tensor-parallel degrees with a shape set each (``tp<N>-<model>``: I / N per rank).
TP_DEGREES: tuple[int, ...] = (2, 4, 8)
#: Expert-parallel degrees with a shape set each (``ep<N>-<model>``: E / N local experts, full I).
EP_DEGREES: tuple[int, ...] = (2, 4, 8)


def parallel_layouts(E: int, I: int, topk: int) -> dict[str, tuple[int, int]]:
    """The layouts of one rank generated from a model's dimensions: ``tp<N>`` and ``ep<N>`` ->
    the rank's (E, I). Tensor parallel: every expert's 1/N slice of I. Expert parallel: E / N whole
    experts (only where N divides E and the rank keeps at least TOPK experts)."""
    layouts = {f"tp{n}": (E, I // n) for n in TP_DEGREES if I % n == 0}
    layouts.update({f"ep{n}": (E // n, I) for n in EP_DEGREES if E % n == 0 and E // n >= topk})
    return layouts

#: Skewed routing: sampling without replacement with weights (rank + 1) ** -_SKEW_EXPONENT over a
#: random permutation of the experts, so a few (seed-dependent) experts get most tokens.
_SKEW_EXPONENT = 2.0


def _active_experts(E: int, topk: int) -> int:
    """How many experts the ``sparse`` routing may use: fewer than E, at least TOPK (+1 when
    possible so that tokens still differ), about half of them for large E."""
    return min(E - 1, max(topk + 1, E // 2))


def make_routing(T: int, E: int, topk: int, routing: str, gen: torch.Generator) -> torch.Tensor:
    """Top-k expert ids [T, topk] (int64, distinct within each row) for a routing pattern.

    - ``uniform``: balanced: every token picks topk distinct experts and every expert gets within
      one token-expert pair of the mean (:func:`kernelforge.routing.balanced_routing`), as a
      well-trained router approaches; independent random picks left loads 40-50% apart.
    - ``skewed``: synthetic, not from any measurement (no per-expert load figures of GPT-OSS in
      serving were found; :mod:`kernelforge.served_loads`): distinct experts sampled (without
      replacement) with Zipf weights (rank+1)^-2 over a random ranking of the experts: a few experts
      take most of the tokens.
    - ``one``: every token goes to the same topk experts, expert 0 and topk-1 others (random),
      in a random slot order per token: expert 0 gets every token.
    - ``sparse``: tokens pick uniformly among a random subset of ``_active_experts`` experts; the
      others get no tokens (requires E > topk).
    """
    if topk > E:
        raise ValueError(f"TOPK={topk} exceeds the number of experts E={E}")
    if routing == "uniform":
        return balanced_routing(T, GroupRouting(E, topk, 1, 1, 1.0), gen)
    if routing == "skewed":
        ranking = torch.randperm(E, generator=gen)
        logw = -_SKEW_EXPONENT * torch.log(torch.arange(E, dtype=torch.float32) + 1.0)
        # Gumbel top-k: sampling without replacement proportional to exp(logw).
        gumbel = -torch.log(-torch.log(torch.rand(T, E, generator=gen).clamp_min(1e-12)))
        ranks = (logw[None, :] + gumbel).topk(topk, dim=1).indices
        return ranking[ranks]
    if routing == "one":
        others = torch.randperm(E - 1, generator=gen)[: topk - 1] + 1
        chosen = torch.cat([torch.zeros(1, dtype=torch.int64), others])
        order = torch.rand(T, topk, generator=gen).argsort(dim=1)
        return chosen[order]
    if routing == "sparse":
        if E <= topk:
            raise ValueError(f"routing 'sparse' needs E > TOPK (E={E}, TOPK={topk})")
        active = torch.randperm(E, generator=gen)[: _active_experts(E, topk)]
        picks = torch.rand(T, active.numel(), generator=gen).topk(topk, dim=1).indices
        return active[picks]
    raise ValueError(f"unknown routing {routing!r}; choose from {', '.join(ROUTINGS)}")


def _expert_stack(
    gen: torch.Generator, E: int, dims: tuple[int, int], scale: float, dtype: torch.dtype,
    device: str | torch.device,
) -> torch.Tensor:
    """[E, *dims] unit-normal weights times ``scale``, drawn expert by expert (bounded host memory)."""
    out = torch.empty((E, *dims), dtype=dtype, device=device)
    for e in range(E):
        out[e].copy_(random_tensor(dims, gen, "normal", scale=scale, dtype=dtype, device=device))
    return out


def _shape(name: str, T: int, E: int, H: int, I: int, topk: int = 4, routing: str = "uniform") -> Shape:
    return Shape.of(name, T=T, E=E, TOPK=topk, H=H, I=I, ROUTING=routing)


class GptOssExperts(Block):
    """GPT-OSS routed experts (after routing, before the residual add). See the module docstring."""

    family = "moe"
    shipped = (
        ShippedPath(
            "*", "vLLM", "fused_moe Triton kernels with the tuned configuration per token count (E=128,N=2880 for "
            "GPT-OSS-120b) and the moe_align_block_size CUDA op",
            "vllm-project/vllm vllm/model_executor/layers/fused_moe/fused_moe.py and configs/ (commit fb73c46)",
            baseline_is_expert=False, baseline_is="vLLM's fused_moe design and tuned configurations, with tokens aligned "
            "by host-side torch ops where vLLM runs one device op (weaker at decode token counts)",
            library="vLLM fused_experts (Triton fused_moe + the _moe_C alignment op)", on_image=False,
            why_not="vLLM is not on the image and its compiled _C/_moe_C extensions are built for vLLM's own torch; "
                    "the library line timed instead is torch._grouped_mm (kernels/moe/gpt_oss_experts/library.py)"),
    )
    description = (
        "GPT-OSS routed experts after routing: GEMM1+bias, interleaved clamped SwiGLU (alpha 1.702, "
        "limit 7), GEMM2+bias, top-k weighted sum (the residual add is outside the block)"
    )

    # -- shapes ---------------------------------------------------------------------------------

    def shape_sets(self) -> Mapping[str, list[Shape]]:
        sets: dict[str, list[Shape]] = {
            # Tiny, each well under a second in the interpreter.
            "smoke": [
                _shape("smoke/T16-E8", T=16, E=8, H=128, I=128),
                _shape("smoke/T8-E4", T=8, E=4, H=64, I=128),
                _shape("smoke/T24-E8-skewed", T=24, E=8, H=128, I=64, routing="skewed"),
            ],
            # Held out: odd T (1, 7, 13, ragged 33), H and I not multiples of 32, skewed routing,
            # every token to one expert, empty experts. TOPK stays 4 (GPT-OSS's): a kernel may
            # specialise on it; the template itself also handles other values.
            "check": [
                _shape("check/T1", T=1, E=8, H=96, I=80),
                _shape("check/T7-skewed", T=7, E=8, H=80, I=96, routing="skewed"),
                _shape("check/T33-one", T=33, E=6, H=96, I=80, routing="one"),
                _shape("check/T33-sparse", T=33, E=8, H=80, I=96, routing="sparse"),
                _shape("check/T13-sparse", T=13, E=6, H=112, I=48, routing="sparse"),
            ],
        }
        for model, (E, H, I, topk) in PRESETS.items():
            sets[model] = [_shape(f"{model}/T{T}", T=T, E=E, H=H, I=I, topk=topk) for T in PRESET_TOKENS]
            sets[f"{model}-prefill"] = [_shape(f"{model}/T{T}", T=T, E=E, H=H, I=I, topk=topk) for T in PREFILL_TOKENS]
            # vLLM's tuner grid: the token counts of its fused_moe config files.
            sets[f"{model}-vllm"] = [_shape(f"{model}/T{T}", T=T, E=E, H=H, I=I, topk=topk) for T in VLLM_BATCH_SIZES]
            # One rank of a parallel layout (vLLM's config file E and N for it), at vLLM's token
            # grid: tensor parallel (I / TP) and expert parallel (E / EP local experts, full I;
            # each token the rank receives routed to TOPK of them).
            for layout, (rank_e, rank_i) in parallel_layouts(E, I, topk).items():
                sets[f"{layout}-{model}"] = [_shape(f"{layout}-{model}/T{T}", T=T, E=rank_e, H=H, I=rank_i, topk=topk)
                                             for T in VLLM_BATCH_SIZES]
        return sets

    def compile_shape(self) -> Shape:
        """Serving-aligned sizes (multiples of 64, TOPK 4) so AOT specialisation matches serving."""
        return _shape("compile/T64-E8", T=64, E=8, H=256, I=256)

    # -- data ------------------------------------------------------------------------------------

    def make_inputs(
        self,
        shape: Shape,
        dtype: torch.dtype,
        device: str | torch.device,
        seed: int,
        distribution: str = "normal",
    ) -> dict[str, Any]:
        """x [T, H] (dtype, the distribution applies here: the activations), topk_ids [T, TOPK]
        int32, topk_weights [T, TOPK] fp32 (softmax of unit-normal logits over the k), w1 [E, 2I, H],
        b1 [E, 2I], w2 [E, H, I], b2 [E, H] (dtype, unit normal scaled; see the module constants).

        Drawn where they are used: on a GPU, x and each expert's W1 and W2 come from a generator on
        ``device`` seeded from ``seed`` (:func:`kernelforge.block.random_tensor`), so the same seed
        gives the same inputs on that device. GPT-OSS-120b's experts are about 3.2 G values, which
        the CPU draws at over a second per expert (issue 11): a GPU run must not draw them there. On
        the CPU (the interpreter) all values come from the CPU generator. The routing (ids, weights)
        is always drawn on the CPU (T x E values at most) and moved."""
        T, E, topk, H, I = shape["T"], shape["E"], shape["TOPK"], shape["H"], shape["I"]
        gen = generator(seed, device)
        x = random_tensor((T, H), gen, distribution, dtype=dtype, device=device)
        ids = make_routing(T, E, topk, shape.get("ROUTING", "uniform"), gen)
        logits = torch.randn(T, topk, generator=gen, dtype=torch.float32)
        weights = torch.softmax(logits, dim=1)
        # Expert weights are drawn one expert at a time: the fp32 draw of all of W1 at E=128,
        # H=I=2880 would need 8.5 GB of (host or device) memory at once (one expert: 66 MB).
        w1 = _expert_stack(gen, E, (2 * I, H), _W1_STD / math.sqrt(H), dtype, device)
        b1 = random_tensor((E, 2 * I), gen, "normal", scale=_B1_STD, dtype=dtype, device=device)
        w2 = _expert_stack(gen, E, (H, I), _W2_STD / math.sqrt(I), dtype, device)
        b2 = random_tensor((E, H), gen, "normal", scale=_B2_STD, dtype=dtype, device=device)
        return {
            "x": x,
            "topk_ids": ids.to(torch.int32).to(device),
            "topk_weights": weights.to(device),
            "w1": w1,
            "b1": b1,
            "w2": w2,
            "b2": b2,
        }

    def make_output(self, shape: Shape, dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
        return torch.empty((shape["T"], shape["H"]), dtype=dtype, device=device)

    def expert_weights(self, inputs: Mapping[str, Any], e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """W1[e] [2I, H] and W2[e] [H, I] of expert ``e`` in fp32, exactly. A sibling block whose
        weights are stored in another format (moe/gpt_oss_experts_mxfp4) dequantises here."""
        return inputs["w1"][e].to(torch.float32), inputs["w2"][e].to(torch.float32)

    def reference(self, **inputs: Any) -> torch.Tensor:
        """The exact math in fp32, one expert at a time (only that expert's weights are converted,
        by :meth:`expert_weights`, so memory stays bounded at E=128, H=I=2880, T=4096); vectorised
        over its tokens."""
        x, ids, weights = inputs["x"], inputs["topk_ids"], inputs["topk_weights"]
        b1, b2 = inputs["b1"], inputs["b2"]
        T, H = x.shape
        out = torch.zeros((T, H), dtype=torch.float32, device=x.device)
        ids64 = ids.to(torch.int64)
        for e in torch.unique(ids64).tolist():
            tok, slot = torch.nonzero(ids64 == e, as_tuple=True)
            w1e, w2e = self.expert_weights(inputs, e)
            xe = x[tok].to(torch.float32)
            h = xe @ w1e.t() + b1[e].to(torch.float32)
            glu = h[:, 0::2].clamp(max=SWIGLU_LIMIT)
            lin = h[:, 1::2].clamp(min=-SWIGLU_LIMIT, max=SWIGLU_LIMIT)
            a = glu * torch.sigmoid(SWIGLU_ALPHA * glu) * (lin + 1.0)
            y = a @ w2e.t() + b2[e].to(torch.float32)
            out.index_add_(0, tok, y * weights[tok, slot].to(torch.float32)[:, None])
        return out

    # -- roofline ----------------------------------------------------------------------------------

    def expected_experts(self, shape: Shape) -> float:
        """Expected number of distinct experts one call touches (their weights are read once).

        uniform: E * (1 - (1 - TOPK/E)^T). one: TOPK. sparse: the same formula over the A active
        experts (tokens pick uniformly among them). skewed: sum_e 1 - (1 - q_e)^T with the
        per-token inclusion probabilities q_e of the generator, estimated from 4096 sampled tokens
        with a fixed seed (deterministic).
        """
        T, E, topk = shape["T"], shape["E"], shape["TOPK"]
        routing = shape.get("ROUTING", "uniform")
        if routing == "one":
            return float(topk)
        if routing in ("uniform", "sparse"):
            n = E if routing == "uniform" else _active_experts(E, topk)
            return n * (1.0 - (1.0 - topk / n) ** T)
        if routing == "skewed":
            ids = make_routing(4096, E, topk, "skewed", generator(0))
            q = torch.bincount(ids.flatten(), minlength=E).to(torch.float64) / 4096.0
            return float((1.0 - (1.0 - q) ** T).sum())
        raise ValueError(f"unknown routing {routing!r}; choose from {', '.join(ROUTINGS)}")

    def counts(self, shape: Shape, dtype: torch.dtype) -> Counts:
        """flops: 2*H*2I (GEMM1) + 2*I*H (GEMM2) per (token, slot); the elementwise work is
        negligible. bytes: W1, b1, W2, b2 of the expected touched experts (:meth:`expected_experts`),
        x read, out written, ids (int32) and weights (fp32) read. Intermediates are not counted
        (a fused kernel need not write them)."""
        T, topk, H, I = shape["T"], shape["TOPK"], shape["H"], shape["I"]
        elt = torch.empty((), dtype=dtype).element_size()
        flops = T * topk * (2.0 * H * 2 * I + 2.0 * I * H)
        per_expert = (2 * I * H + 2 * I + H * I + H) * elt
        nbytes = self.expected_experts(shape) * per_expert + 2.0 * T * H * elt + T * topk * (4 + 4)
        return Counts(flops=flops, bytes=nbytes)
