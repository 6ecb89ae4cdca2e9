"""Library reference of attention/gpt_oss_decode: the strongest attention the torch install offers.

Trusted code written by us (not a candidate, not a template): kernelforge.search.library verifies
it against the block's fp32 reference like a candidate and times it with the same device timing,
so a report can show "faster than the best library" beside "faster than the expert baseline".

Entry point ``run(q, k_cache, v_cache, lengths, sinks, sm_scale, window, out)``, exactly a
candidate's (see block.py).

Backends (:data:`LABELS`), chosen by :func:`backend` unless :data:`BACKEND` pins one (the measuring
code appends ``BACKEND = "..."`` to this source, so the stored source is exactly what ran):

- ``flex``: FlexAttention under ``torch.compile`` over the cache, one query row per sequence, GQA
  in the kernel (its decoding path), with a block-sparse mask built on the device from
  ``lengths`` at every call (no host synchronisation, so CUDA graphs can capture it): each
  sequence visits only the key tiles of its allowed range, and ``mask_mod`` trims the two end
  tiles. The default on a CUDA device.
- ``flex-eager``: the same call without compilation (dense math): CPU verification only.
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` with the q heads of each kv head
  as query rows, an explicit fp32 mask from ``lengths`` and the window, and the sink as an extra
  key column with a zero value row (the cache is copied once per call to append it: a fallback
  when FlexAttention is unavailable, not a fast path).

The sink is exact in every backend (how: :mod:`kernelforge.library_attention`, the helpers this
module shares with the prefill block's reference; what is here is this block's own: the key
ranges from ``lengths``, the mask built from them and the decode layouts). Nothing here is copied
from FlashAttention, vLLM or PyTorch's examples.
"""

from __future__ import annotations

import torch

from kernelforge.library_attention import (DEFAULT_COMPILE_BACKEND, FLEX_EAGER_LABEL, FLEX_TILE, choose_backend,
                                           compile_once, flex_with_sink, from_kv_blocks_options, with_sink_column)

#: Pinned backend (None: :func:`backend` chooses from the device).
BACKEND: str | None = None

#: What each backend is, as the report names it.
LABELS = {
    "flex": "FlexAttention (torch.compile decoding, block-sparse mask from lengths, sink via log-sum-exp)",
    "flex-eager": FLEX_EAGER_LABEL,
    "sdpa": "torch SDPA (explicit fp32 mask, sink as an extra key column with a zero value row; cache copied)",
}

#: FlexAttention's sparse tile.
TILE = FLEX_TILE

#: torch.compile's backend for ``flex`` (tests trace the same graph with "aot_eager" on a CPU).
COMPILE_BACKEND = DEFAULT_COMPILE_BACKEND

_COMPILED: dict[str, object] = {}


def backend(device: str | torch.device) -> str:
    """The backend :func:`run` uses on ``device``: :data:`BACKEND` when pinned, else ``flex`` on
    CUDA when FlexAttention exists, else ``sdpa``."""
    return choose_backend(device, BACKEND, LABELS)


def implementation(device: str | torch.device) -> str:
    """The label of the backend :func:`run` uses on ``device``."""
    return LABELS[backend(device)]


def key_range(lengths: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """First allowed key and one past the last, per sequence (int64 tensors on lengths' device)."""
    hi = lengths.to(torch.int64)
    lo = (hi - window).clamp(min=0) if window > 0 else torch.zeros_like(hi)
    return lo, hi


def block_mask(lengths: torch.Tensor, s_max: int, window: int):
    """The BlockMask of one call, from ``lengths`` with tensor arithmetic only: sequence b visits
    key tiles ``lo_b // TILE .. (hi_b - 1) // TILE``; ``mask_mod`` keeps keys in [lo_b, hi_b)."""
    from torch.nn.attention.flex_attention import BlockMask

    lo, hi = key_range(lengths, window)
    tiles = (s_max + TILE - 1) // TILE
    first, last = lo // TILE, (hi - 1) // TILE
    B = lengths.shape[0]
    count = (last - first + 1).to(torch.int32).view(B, 1, 1)
    idx = (first.view(B, 1) + torch.arange(tiles, device=lengths.device).view(1, tiles)).clamp(max=tiles - 1)
    idx = idx.to(torch.int32).view(B, 1, 1, tiles)

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx >= lo[b]) & (kv_idx < hi[b])

    return BlockMask.from_kv_blocks(count, idx, BLOCK_SIZE=TILE, mask_mod=mask_mod,
                                    **from_kv_blocks_options((1, s_max)))


def _flex_sink(q, k, v, sinks, mask, scale, out):
    # q [B, H_Q, 1, D], k and v [B, H_KV, S_MAX, D] views; out [B, H_Q, D]. Written here so the
    # compiled graph fuses the sink factor with the store.
    out.copy_(flex_with_sink(q, k, v, sinks, mask, scale).squeeze(2))


def _compiled():
    return compile_once(_COMPILED, _flex_sink, COMPILE_BACKEND)


def run_flex(q, k_cache, v_cache, lengths, sinks, sm_scale, window, out, *, compiled: bool = True):
    """The FlexAttention backend (``compiled=False``: eager, for CPU verification)."""
    mask = block_mask(lengths, k_cache.shape[1], int(window))
    fn = _compiled() if compiled else _flex_sink
    fn(q.unsqueeze(2), k_cache.transpose(1, 2), v_cache.transpose(1, 2), sinks, mask, float(sm_scale), out)


def run_sdpa(q, k_cache, v_cache, lengths, sinks, sm_scale, window, out):
    """The SDPA backend: the G q heads of each kv head are G query rows against that head's keys;
    one extra key column (zero key, zero value) whose fp32 mask entry is the sink."""
    import torch.nn.functional as F

    B, H_Q, D = q.shape
    S_MAX, H_KV = k_cache.shape[1], k_cache.shape[2]
    G = H_Q // H_KV
    kt, vt = with_sink_column(k_cache, v_cache)
    lo, hi = key_range(lengths, int(window))
    keys = torch.arange(S_MAX, device=q.device).view(1, S_MAX)
    bias = torch.zeros((B, S_MAX), dtype=torch.float32, device=q.device)
    bias.masked_fill_((keys < lo.view(B, 1)) | (keys >= hi.view(B, 1)), float("-inf"))
    mask = torch.cat([bias.view(B, 1, 1, S_MAX).expand(B, H_KV, G, S_MAX),
                      sinks.float().view(1, H_KV, G, 1).expand(B, -1, -1, 1)], dim=3)
    o = F.scaled_dot_product_attention(q.view(B, H_KV, G, D), kt, vt, attn_mask=mask, scale=float(sm_scale))
    out.copy_(o.reshape(B, H_Q, D))


def run(q, k_cache, v_cache, lengths, sinks, sm_scale, window, out):
    """GPT-OSS decode attention with sinks into ``out`` (the block's candidate signature)."""
    which = backend(q.device)
    if which == "sdpa":
        run_sdpa(q, k_cache, v_cache, lengths, sinks, sm_scale, window, out)
    else:
        run_flex(q, k_cache, v_cache, lengths, sinks, sm_scale, window, out, compiled=which == "flex")
