"""GPT-OSS decode attention: one new query per sequence against a ragged KV cache, with learned sinks.

Math (BLOCKS.md, "GPT-OSS attention with sinks"): q-head h reads kv-head h // (H_Q / H_KV). The
query of sequence b sits at position i = length_b - 1, and its own key/value are already in the cache
there. Allowed keys: J = {0..i} on full layers (window 0), {i - W + 1..i} on window layers (W = 128
in GPT-OSS). With s_j = scale * <q, k_j> and the sink logit S_h of the head:

    o = sum_{j in J} exp(s_j) v_j / (exp(S_h) + sum_{j in J} exp(s_j))

Inputs (keyword arguments of a candidate's ``run``):

    q        [B, H_Q, D]            dtype
    k_cache  [B, S_MAX, H_KV, D]    dtype
    v_cache  [B, S_MAX, H_KV, D]    dtype
    lengths  [B]                    int32, 1 <= length <= S_MAX
    sinks    [H_Q]                  float32
    sm_scale python float           D ** -0.5 (0.125 for GPT-OSS)
    window   python int             0 = full attention, W > 0 = the last W keys

Every cache row a correct kernel must not read (positions >= length, and on window layers the
positions before the window) holds junk: large, finite keys and values, so a kernel that reads past
the end or outside the window gives a clearly wrong result rather than a subtly wrong one.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from kernelforge.shipped import ShippedPath
from kernelforge.block import Block, Counts, Shape, generator, random_tensor
from kernelforge.profiles import BATCHES
from kernelforge.profiles import PROFILES as WORKLOADS

#: GPT-OSS-120b and -20b share attention dims (BLOCKS.md): 64 q heads, 8 kv heads, head dim 64.
GPT_OSS = dict(H_Q=64, H_KV=8, D=64)

#: Context length at the end of decode (input + output tokens) of each workload profile
#: (:mod:`kernelforge.profiles`): the decode step with the longest cache, i.e. the slowest one.
PROFILES: dict[str, int] = {name: p.context for name, p in WORKLOADS.items()}

#: GPT-OSS layer kinds: odd layers full attention, even layers a sliding window of 128 keys.
LAYER_KINDS = {"full": 0, "window128": 128}

#: Junk written into cache rows outside the allowed keys. A key of all 16s scores
#: scale * 16 * sum(q), about N(0, 16^2) for unit-normal q (next to N(0, 1) for real keys), so it
#: dominates the softmax for a large share of heads; its value of 1024 then swamps the output.
JUNK_KEY = 16.0
JUNK_VALUE = 1024.0

#: Bound on the fp32 elements of one gathered K (or V) chunk in :meth:`reference` (512 MiB).
_REF_CHUNK_ELEMS = 1 << 27


def allowed_range(length: int, window: int) -> tuple[int, int]:
    """First allowed key and one past the last for a query at position ``length - 1``."""
    lo = max(0, length - window) if window > 0 else 0
    return lo, length


class GptOssDecodeAttention(Block):
    family = "attention"
    shipped = (
        ShippedPath(
            "*", "vLLM", "FlashAttention-3 with learned sinks over the paged KV cache (FlashAttentionBackend), on "
            "H100/H200", "vllm-project/vllm vllm/v1/attention/backends/flash_attn.py (commit 5704f34)",
            baseline_is_expert=False, baseline_is="a Triton flash-decoding kernel with FlashAttention-2's split heuristic",
            library="FlashAttention-3 with sinks (vllm_flash_attn)", on_image=False,
            why_not="vLLM's FlashAttention-3 build (vllm_flash_attn) is a CUDA extension compiled against vLLM's own torch, not the image's torch 2.11, and no wheel of it fits the 64 MiB carry; the library line timed instead is FlexAttention (kernels/attention/<block>/library.py)"),
    )
    description = (
        "GPT-OSS decode attention: one query per sequence against a ragged KV cache, GQA 64/8, "
        "head dim 64, learned sinks, full or 128-key sliding window"
    )
    output_name = "out"

    # -- shapes ---------------------------------------------------------------------------------

    def shape_sets(self) -> Mapping[str, list[Shape]]:
        sets: dict[str, list[Shape]] = {
            # Tiny, for the interpreter. GQA groups of 8 like GPT-OSS; the last sequence of each batch
            # is shorter than S_MAX so a read one past its end stays inside the allocation.
            "smoke": [
                Shape.of("smoke/full", B=2, H_Q=16, H_KV=2, D=64, S_MAX=128, LENGTHS=(128, 77), WINDOW=0),
                Shape.of("smoke/window32", B=2, H_Q=8, H_KV=1, D=64, S_MAX=128, LENGTHS=(100, 20), WINDOW=32),
            ],
            # Held out: odd lengths (a single key, shorter than the window, just past it) in one batch.
            "check": [
                Shape.of("check/ragged/full", B=5, H_Q=8, H_KV=1, D=64, S_MAX=203,
                         LENGTHS=(1, 7, 63, 129, 200), WINDOW=0),
                Shape.of("check/ragged/window128", B=5, H_Q=8, H_KV=1, D=64, S_MAX=203,
                         LENGTHS=(200, 129, 1, 63, 7), WINDOW=128),
            ],
        }
        # Real presets: every sequence at the profile's full context (input + output), the last and
        # slowest decode step of the profile; real batches are ragged, which only makes them shorter.
        for profile, length in PROFILES.items():
            sets[profile] = [
                Shape.of(f"gpt-oss/{profile}/b{b}/{kind}", B=b, **GPT_OSS, S_MAX=length,
                         LENGTHS=(length,) * b, WINDOW=window)
                for b in BATCHES
                for kind, window in LAYER_KINDS.items()
            ]
        return sets

    def compile_shape(self) -> Shape:
        """GPT-OSS heads and a 16-aligned cache, like serving (smoke shapes have fewer heads)."""
        return Shape.of("compile/gpt-oss", B=4, **GPT_OSS, S_MAX=256, LENGTHS=(256, 200, 129, 1), WINDOW=128)

    # -- data ------------------------------------------------------------------------------------

    def make_inputs(
        self,
        shape: Shape,
        dtype: torch.dtype,
        device: str | torch.device,
        seed: int,
        distribution: str = "normal",
    ) -> dict[str, Any]:
        b, h_q, h_kv, d, s_max = (shape[k] for k in ("B", "H_Q", "H_KV", "D", "S_MAX"))
        lengths, window = tuple(shape["LENGTHS"]), int(shape["WINDOW"])
        if len(lengths) != b or not all(1 <= n <= s_max for n in lengths):
            raise ValueError(f"shape {shape.name}: LENGTHS must be {b} ints in [1, {s_max}], got {lengths}")
        if h_q % h_kv:
            raise ValueError(f"shape {shape.name}: H_Q={h_q} is not a multiple of H_KV={h_kv}")
        gen = generator(seed, device)
        q = random_tensor((b, h_q, d), gen, distribution, dtype=dtype, device=device)
        sinks = random_tensor((h_q,), gen, distribution, dtype=torch.float32, device=device)
        k_cache = torch.full((b, s_max, h_kv, d), JUNK_KEY, dtype=dtype, device=device)
        v_cache = torch.full((b, s_max, h_kv, d), JUNK_VALUE, dtype=dtype, device=device)
        # Only the allowed rows are drawn, one sequence at a time: host memory stays bounded by one
        # sequence (long_context b64 is 17 GB of cache in bf16), and window presets draw 128 rows.
        for i, n in enumerate(lengths):
            lo, hi = allowed_range(n, window)
            k_cache[i, lo:hi] = random_tensor((hi - lo, h_kv, d), gen, distribution, dtype=dtype, device=device)
            v_cache[i, lo:hi] = random_tensor((hi - lo, h_kv, d), gen, distribution, dtype=dtype, device=device)
        return {
            "q": q,
            "k_cache": k_cache,
            "v_cache": v_cache,
            "lengths": torch.tensor(lengths, dtype=torch.int32, device=device),
            "sinks": sinks,
            "sm_scale": float(d) ** -0.5,
            "window": window,
        }

    def make_output(self, shape: Shape, dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
        return torch.empty((shape["B"], shape["H_Q"], shape["D"]), dtype=dtype, device=device)

    def reference(
        self,
        *,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        lengths: torch.Tensor,
        sinks: torch.Tensor,
        sm_scale: float,
        window: int,
    ) -> torch.Tensor:
        """fp32, padded and masked per chunk of sequences; only the allowed key rows are gathered."""
        b, h_q, d = q.shape
        h_kv = k_cache.shape[2]
        group = h_q // h_kv
        device = q.device
        lens = lengths.to(device=device, dtype=torch.int64)
        lo = (lens - window).clamp(min=0) if window > 0 else torch.zeros_like(lens)
        spans = (lens - lo).tolist()
        sink = sinks.to(device=device, dtype=torch.float32).view(1, h_kv, group, 1)
        out = torch.empty((b, h_q, d), dtype=torch.float32, device=device)
        start = 0
        while start < b:
            # Grow the chunk while its padded K gather stays under the element budget.
            stop, span = start + 1, spans[start]
            while stop < b and (stop + 1 - start) * max(span, spans[stop]) * h_kv * d <= _REF_CHUNK_ELEMS:
                span = max(span, spans[stop])
                stop += 1
            sl = slice(start, stop)
            pos = lo[sl, None] + torch.arange(span, device=device)              # [c, span]
            valid = pos < lens[sl, None]
            pos = pos.clamp(max=k_cache.shape[1] - 1)
            rows = torch.arange(start, stop, device=device)[:, None]
            k = k_cache[rows, pos].float()                                      # [c, span, h_kv, d]
            v = v_cache[rows, pos].float()
            qc = q[sl].float().view(stop - start, h_kv, group, d)
            s = torch.einsum("bhgd,bshd->bhgs", qc, k) * sm_scale
            s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
            m = torch.maximum(s.amax(dim=-1, keepdim=True), sink)                # the sink is a logit too
            p = torch.exp(s - m)
            denom = p.sum(dim=-1, keepdim=True) + torch.exp(sink - m)
            o = torch.einsum("bhgs,bshd->bhgd", p, v) / denom
            out[sl] = o.reshape(stop - start, h_q, d)
            start = stop
        return out

    def counts(self, shape: Shape, dtype: torch.dtype) -> Counts:
        """QK^T and PV: 2 FLOPs per multiply-add, each over D, per allowed key and q head. Bytes: the
        allowed K and V rows (each read once per kv head, shared by its q-head group), q and out."""
        h_q, h_kv, d, window = shape["H_Q"], shape["H_KV"], shape["D"], shape["WINDOW"]
        keys = sum(hi - lo for lo, hi in (allowed_range(n, window) for n in shape["LENGTHS"]))
        elem = torch.empty((), dtype=dtype).element_size()
        flops = 4.0 * d * h_q * keys
        kv_bytes = keys * h_kv * d * 2 * elem
        q_out_bytes = 2 * shape["B"] * h_q * d * elem
        return Counts(flops=flops, bytes=float(kv_bytes + q_out_bytes))
