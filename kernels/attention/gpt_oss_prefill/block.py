"""GPT-OSS attention prefill: causal GQA attention with learned sinks, full or sliding window 128.

Math (docs BLOCKS.md, "GPT-OSS attention with sinks"): q-head h reads kv-head h // (H_Q // H_KV);
s_ij = scale * <q_i, k_j>; the query at absolute position i sees keys J(i) = {j <= i} on full
layers and {j <= i, i - j < W} on window layers (W = 128: the query itself and 127 earlier keys);
each head has a sink logit S_h in the units of s:

    o_i = sum_{j in J(i)} exp(s_ij) v_j / (exp(S_h) + sum_{j in J(i)} exp(s_ij))

Queries may start at an offset into an existing cache (chunked prefill): query row r sits at
absolute position ``offset + r`` with ``offset = S_KV - S_Q``, derived from the tensor shapes.

Candidate entry point: ``run(q, k, v, sinks, sm_scale, window, out)`` with q [B, S_Q, H_Q, D],
k and v [B, S_KV, H_KV, D], sinks [H_Q] fp32, ``window`` 0 (full causal) or W > 0, out
[B, S_Q, H_Q, D] in the dtype of q.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from kernelforge.shipped import ShippedPath
from kernelforge.block import Block, Counts, Shape, generator, random_tensor
from kernelforge.profiles import PROFILES as WORKLOADS

#: GPT-OSS-120b and -20b share these (BLOCKS.md, model dimensions).
GPT_OSS = dict(H_Q=64, H_KV=8, D=64)
GPT_OSS_WINDOW = 128

#: Prefill tokens of each workload profile (:mod:`kernelforge.profiles`).
PROFILES = {name: p.input_tokens for name, p in WORKLOADS.items()}


def allowed_pairs(s_q: int, s_kv: int, window: int) -> int:
    """Number of allowed (query, key) pairs of one sequence and one head, in closed form.

    Query r sits at position i = offset + r and sees min(i + 1, W) keys (i + 1 on full layers).
    With f(n) = sum_{i < n} min(i + 1, W), the count is f(offset + S_Q) - f(offset).
    """
    offset = s_kv - s_q

    def prefix(n: int) -> int:
        if window <= 0 or n <= window:
            return n * (n + 1) // 2
        return window * (window + 1) // 2 + (n - window) * window

    return prefix(offset + s_q) - prefix(offset)


def needed_keys(s_q: int, s_kv: int, window: int) -> int:
    """Keys of one sequence that some query can see (window layers with an offset skip a prefix)."""
    offset = s_kv - s_q
    if window <= 0:
        return s_kv
    return s_kv - max(0, offset - window + 1)


def reference_chunks(s_q: int, s_kv: int, window: int, budget: int):
    """Chunks ``(r0, r1, k0, k1)`` of query rows [r0, r1) and the keys [k0, k1) they can see,
    covering all rows in order, with ``(r1 - r0) * (k1 - k0) <= budget`` unless a chunk is a single
    row (one row always fits in practice: 128k keys x 64 heads x 4 B = 32 MiB)."""
    offset = s_kv - s_q
    r0 = 0
    while r0 < s_q:
        k0 = max(0, offset + r0 - window + 1) if window > 0 else 0
        # rows * (rows + c) <= budget, where rows + c = k1 - k0 is the number of keys seen.
        c = offset + r0 - k0
        rows = int((-c + math.sqrt(float(c) * c + 4.0 * budget)) / 2.0)
        while rows > 1 and rows * (rows + c) > budget:  # float rounding
            rows -= 1
        rows = max(1, min(rows, s_q - r0))
        yield r0, r0 + rows, k0, offset + r0 + rows
        r0 += rows


class GptOssPrefill(Block):
    """Causal GQA prefill attention with per-head sinks (GPT-OSS), full or sliding-window layers."""

    family = "attention"
    shipped = (
        ShippedPath(
            "*", "vLLM", "FlashAttention-3 with learned sinks (FlashAttentionBackend), on H100/H200", "vllm-project/vllm vllm/v1/attention/backends/flash_attn.py (commit 5704f34)",
            baseline_is_expert=False, baseline_is="a Triton FlashAttention-2-style kernel (vLLM's Triton attention design, "
            "its path where FA3 is not available)",
            library="FlashAttention-3 with sinks (vllm_flash_attn)", on_image=False,
            why_not="vLLM's FlashAttention-3 build (vllm_flash_attn) is a CUDA extension compiled against vLLM's own torch, not the image's torch 2.11, and no wheel of it fits the 64 MiB carry; the library line timed instead is FlexAttention (kernels/attention/<block>/library.py)"),
    )
    description = (
        "GPT-OSS prefill attention: causal GQA (64 q / 8 kv heads, D 64) with learned sinks, "
        "full or sliding window 128, queries at an offset into the cache (chunked prefill)"
    )
    dtypes = ("bfloat16", "float16")

    #: Elements of one fp32 score chunk in :meth:`reference` (2^25 = 128 MiB, exponentiated in
    #: place; the largest temporary). Tests lower it to exercise the chunking.
    reference_chunk_elements: int = 1 << 25

    # -- shapes -----------------------------------------------------------------------------------

    def shape_sets(self) -> Mapping[str, list[Shape]]:
        def attn(name: str, *, B: int, H_Q: int, H_KV: int, S_Q: int, S_KV: int, WINDOW: int, D: int = 64) -> Shape:
            return Shape.of(name, B=B, H_Q=H_Q, H_KV=H_KV, S_Q=S_Q, S_KV=S_KV, D=D, WINDOW=WINDOW)

        sets: dict[str, list[Shape]] = {
            # Tiny: each runs in the interpreter in a fraction of a second. The window is small so
            # that windowing (and skipped key tiles) happens at S = 128.
            "smoke": [
                attn("smoke/full", B=1, H_Q=4, H_KV=2, S_Q=128, S_KV=128, WINDOW=0),
                attn("smoke/window16", B=1, H_Q=4, H_KV=1, S_Q=128, S_KV=128, WINDOW=16),
                attn("smoke/offset_full", B=1, H_Q=4, H_KV=2, S_Q=64, S_KV=160, WINDOW=0),
                attn("smoke/offset_window32", B=1, H_Q=4, H_KV=1, S_Q=96, S_KV=200, WINDOW=32),
            ],
            # Held out: odd sizes, offsets, the real window 128, batch 2.
            "check": [
                attn("check/q1_full", B=2, H_Q=8, H_KV=2, S_Q=1, S_KV=300, WINDOW=0),
                attn("check/q7_window128", B=2, H_Q=8, H_KV=2, S_Q=7, S_KV=263, WINDOW=128),
                attn("check/q63_full", B=2, H_Q=4, H_KV=1, S_Q=63, S_KV=191, WINDOW=0),
                attn("check/q129_window128", B=2, H_Q=4, H_KV=2, S_Q=129, S_KV=257, WINDOW=128),
                attn("check/q129_full", B=2, H_Q=4, H_KV=1, S_Q=129, S_KV=129, WINDOW=0),
            ],
        }
        # One set per workload profile, both layer kinds; -120b and -20b share attention dims.
        for profile, tokens in PROFILES.items():
            sets[profile] = [
                attn(f"gpt-oss/{profile}/full", B=1, S_Q=tokens, S_KV=tokens, WINDOW=0, **GPT_OSS),
                attn(f"gpt-oss/{profile}/window", B=1, S_Q=tokens, S_KV=tokens, WINDOW=GPT_OSS_WINDOW, **GPT_OSS),
            ]
        # Chunked prefill: 8192 new tokens after 24000 cached ones.
        sets["chunked"] = [
            attn("gpt-oss/chunked/full", B=1, S_Q=8192, S_KV=32192, WINDOW=0, **GPT_OSS),
            attn("gpt-oss/chunked/window", B=1, S_Q=8192, S_KV=32192, WINDOW=GPT_OSS_WINDOW, **GPT_OSS),
        ]
        return sets

    def compile_shape(self) -> Shape:
        # Serving alignment: every size a multiple of 16, the real head counts and window.
        return Shape.of("gpt-oss/compile", B=1, S_Q=128, S_KV=128, WINDOW=GPT_OSS_WINDOW, **GPT_OSS)

    # -- data -------------------------------------------------------------------------------------

    def make_inputs(
        self,
        shape: Shape,
        dtype: torch.dtype,
        device: str | torch.device,
        seed: int,
        distribution: str = "normal",
    ) -> dict[str, Any]:
        B, H_Q, H_KV = shape["B"], shape["H_Q"], shape["H_KV"]
        S_Q, S_KV, D, window = shape["S_Q"], shape["S_KV"], shape["D"], shape["WINDOW"]
        if S_KV < S_Q:
            raise ValueError(f"shape {shape.name}: S_KV ({S_KV}) must be at least S_Q ({S_Q})")
        if H_Q % H_KV:
            raise ValueError(f"shape {shape.name}: H_Q ({H_Q}) must be a multiple of H_KV ({H_KV})")
        gen = generator(seed, device)
        sm_scale = D ** -0.5
        # Unit q and k make the scaled scores about N(0, 1): softmax over 16-128 keys is neither
        # uniform nor one-hot. "large" scales q and k by 8, so scores by 64.
        q = random_tensor((B, S_Q, H_Q, D), gen, distribution, dtype=dtype, device=device)
        k = random_tensor((B, S_KV, H_KV, D), gen, distribution, dtype=dtype, device=device)
        v = random_tensor((B, S_KV, H_KV, D), gen, distribution, dtype=dtype, device=device)
        # Sinks comparable with the scores (std 2x theirs): some heads' sinks take a visible share
        # of the probability mass even over 128 keys, so dropping or mis-scaling them shows.
        score_std = 64.0 if distribution == "large" else 1.0
        sinks = random_tensor((H_Q,), gen, "normal", scale=2.0 * score_std, dtype=torch.float32, device=device)
        return {"q": q, "k": k, "v": v, "sinks": sinks, "sm_scale": float(sm_scale), "window": int(window)}

    def make_output(self, shape: Shape, dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
        return torch.empty((shape["B"], shape["S_Q"], shape["H_Q"], shape["D"]), dtype=dtype, device=device)

    def reference(self, **inputs: Any) -> torch.Tensor:
        """Exact attention with sinks in fp32, chunked over query rows (and only over the keys a
        chunk can see) so that one score chunk holds at most :attr:`reference_chunk_elements`."""
        q, k, v, sinks = inputs["q"], inputs["k"], inputs["v"], inputs["sinks"]
        sm_scale, window = float(inputs["sm_scale"]), int(inputs["window"])
        B, S_Q, H_Q, D = q.shape
        S_KV, H_KV = k.shape[1], k.shape[2]
        G = H_Q // H_KV
        offset = S_KV - S_Q
        out = torch.empty((B, S_Q, H_Q, D), dtype=torch.float32, device=q.device)
        sink = sinks.to(torch.float32).reshape(H_KV, G, 1, 1)
        chunks = list(reference_chunks(S_Q, S_KV, window, max(1, self.reference_chunk_elements // H_Q)))
        first = chunks[0][2]  # keys before it are seen by no query
        for b in range(B):
            # fp32 copies of one sequence's keys and values (S_KV = 128k: 2 x 256 MiB), cast once
            # rather than per chunk; fp32 inputs are used as they are and never written.
            kf = k[b, first:].to(torch.float32)
            vf = v[b, first:].to(torch.float32)
            for r0, r1, k0, k1 in chunks:
                rows = r1 - r0
                qc = q[b, r0:r1].to(torch.float32).reshape(rows, H_KV, G, D).permute(1, 2, 0, 3)
                kc = kf[k0 - first:k1 - first].permute(1, 2, 0)  # [H_KV, D, n]
                vc = vf[k0 - first:k1 - first].permute(1, 0, 2)  # [H_KV, n, D]
                s = torch.matmul(qc, kc.unsqueeze(1)).mul_(sm_scale)  # [H_KV, G, rows, n]
                pos = torch.arange(offset + r0, offset + r1, device=q.device).unsqueeze(1)
                key = torch.arange(k0, k1, device=q.device).unsqueeze(0)
                allowed = key <= pos
                if window > 0:
                    allowed &= (pos - key) < window
                s.masked_fill_(~allowed, float("-inf"))
                m = torch.maximum(s.amax(dim=-1, keepdim=True), sink)  # finite: the sink
                s.sub_(m).exp_()
                denom = s.sum(dim=-1, keepdim=True) + torch.exp(sink - m)
                o = torch.matmul(s, vc.unsqueeze(1)) / denom  # [H_KV, G, rows, D]
                out[b, r0:r1] = o.permute(2, 0, 1, 3).reshape(rows, H_Q, D)
        return out

    def counts(self, shape: Shape, dtype: torch.dtype) -> Counts:
        """FLOPs: 2 D for q.k and 2 D for p.v per allowed pair and q head. Bytes: q and out once,
        k and v once for the keys some query can see, the fp32 sinks."""
        B, H_Q, H_KV, D = shape["B"], shape["H_Q"], shape["H_KV"], shape["D"]
        S_Q, S_KV, window = shape["S_Q"], shape["S_KV"], shape["WINDOW"]
        elt = torch.empty((), dtype=dtype).element_size()
        flops = 4.0 * D * H_Q * B * allowed_pairs(S_Q, S_KV, window)
        nbytes = elt * B * (2 * S_Q * H_Q * D + 2 * needed_keys(S_Q, S_KV, window) * H_KV * D) + 4 * H_Q
        return Counts(flops=float(flops), bytes=float(nbytes))
