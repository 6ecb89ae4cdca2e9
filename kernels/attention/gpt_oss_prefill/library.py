"""Library reference of attention/gpt_oss_prefill: the strongest attention the torch install offers.

Trusted code written by us (not a candidate, not a template): kernelforge.search.library verifies
it against the block's fp32 reference like a candidate and times it with the same device timing,
so a report can show "faster than the best library" beside "faster than the expert baseline".

Entry point ``run(q, k, v, sinks, sm_scale, window, out)``, exactly a candidate's (see block.py).

Backends (:data:`LABELS`), chosen by :func:`backend` unless :data:`BACKEND` pins one (the measuring
code appends ``BACKEND = "..."`` to this source, so the stored source is exactly what ran):

- ``flex``: FlexAttention (``torch.nn.attention.flex_attention``) under ``torch.compile``, with a
  block-sparse mask built in closed form from the causal band and the window (key tiles outside
  the band are skipped, interior tiles run without the mask), GQA in the kernel. The default on a
  CUDA device.
- ``flex-eager``: the same call without compilation (dense math): CPU verification of the sink
  and mask logic only, never timed.
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` with an explicit fp32 mask and
  the sink as one extra key column whose score is the sink and whose value row is zero (chunked
  over query rows to bound the mask). The fallback when FlexAttention is unavailable.

The sink is exact in every backend (how: :mod:`kernelforge.library_attention`, the helpers this
module shares with the decode block's reference; what is here is this block's own: the causal band
and window mask, its tiles and the prefill layouts). Nothing here is copied from FlashAttention,
vLLM or PyTorch's examples.
"""

from __future__ import annotations

import torch

from kernelforge.library_attention import (DEFAULT_COMPILE_BACKEND, FLEX_EAGER_LABEL, FLEX_TILE, choose_backend,
                                           compile_once, flex_with_sink, from_kv_blocks_options, with_sink_column)

#: Pinned backend (None: :func:`backend` chooses from the device).
BACKEND: str | None = None

#: What each backend is, as the report names it.
LABELS = {
    "flex": "FlexAttention (torch.compile, block-sparse causal/window mask, sink via log-sum-exp)",
    "flex-eager": FLEX_EAGER_LABEL,
    "sdpa": "torch SDPA (explicit fp32 mask, sink as an extra key column with a zero value row)",
}

#: FlexAttention's sparse tile: the block mask is given in tiles of this size.
TILE = FLEX_TILE

#: Elements of one fp32 mask chunk of the SDPA backend.
SDPA_MASK_ELEMENTS = 1 << 26

_MASKS: dict[tuple, object] = {}
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


def allowed(q_pos: torch.Tensor, kv_idx: torch.Tensor, window: int) -> torch.Tensor:
    """The block's mask: a query at absolute position ``q_pos`` sees keys ``kv_idx <= q_pos``,
    and on window layers only ``q_pos - kv_idx < window``."""
    ok = kv_idx <= q_pos
    if window > 0:
        ok = ok & (q_pos - kv_idx < window)
    return ok


def band_tiles(s_q: int, s_kv: int, window: int, tile: int = TILE) -> tuple[list[list[int]], list[list[int]]]:
    """Key tiles of each query tile: (partial, full). A full tile has every (row, key) pair of
    it allowed and inside the tensors, so the kernel skips the mask there; a partial tile has at
    least one allowed pair; tiles with none are left out."""
    offset = s_kv - s_q
    partial, full = [], []
    for m in range((s_q + tile - 1) // tile):
        r0, r1 = m * tile, min(s_q, (m + 1) * tile)  # rows [r0, r1)
        p_first, p_last = offset + r0, offset + r1 - 1
        lo = max(0, p_first - window + 1) if window > 0 else 0
        row_partial, row_full = [], []
        for n in range(lo // tile, p_last // tile + 1):
            k0, k1 = n * tile, min(s_kv, (n + 1) * tile)  # keys [k0, k1)
            inside = r1 - r0 == tile and k1 - k0 == tile
            all_ok = k1 - 1 <= p_first and (window <= 0 or p_last - k0 < window)
            (row_full if inside and all_ok else row_partial).append(n)
        partial.append(row_partial)
        full.append(row_full)
    return partial, full


def _indices(rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max((len(r) for r in rows), default=1))
    counts = torch.tensor([len(r) for r in rows], dtype=torch.int32).view(1, 1, -1)
    idx = torch.zeros((1, 1, len(rows), width), dtype=torch.int32)
    for m, r in enumerate(rows):
        idx[0, 0, m, :len(r)] = torch.tensor(r, dtype=torch.int32)
    return counts.to(device), idx.to(device)


def block_mask(s_q: int, s_kv: int, window: int, device: torch.device):
    """The FlexAttention BlockMask of one shape, built once per (shape, device) and cached: it
    depends on the sizes only, like the attention metadata a server builds once per batch and
    shares across layers."""
    key = (s_q, s_kv, window, str(device))
    if key not in _MASKS:
        from torch.nn.attention.flex_attention import BlockMask

        offset = s_kv - s_q

        def mask_mod(b, h, q_idx, kv_idx):
            return allowed(q_idx + offset, kv_idx, window)

        partial, full = band_tiles(s_q, s_kv, window)
        kv_num, kv_idx = _indices(partial, device)
        full_num, full_idx = _indices(full, device)
        _MASKS[key] = BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=TILE,
                                               mask_mod=mask_mod, **from_kv_blocks_options((s_q, s_kv)))
    return _MASKS[key]


def _flex_sink(q, k, v, sinks, mask, scale, out):
    # q, k, v [B, H, S, D] views; out [B, S_Q, H_Q, D]. Written into ``out`` here so the compiled
    # graph fuses the sink factor with the store (no extra pass over the output).
    out.copy_(flex_with_sink(q, k, v, sinks, mask, scale).transpose(1, 2))


def _compiled():
    return compile_once(_COMPILED, _flex_sink, COMPILE_BACKEND)


def run_flex(q, k, v, sinks, sm_scale, window, out, *, compiled: bool = True):
    """The FlexAttention backend (``compiled=False``: eager, for CPU verification)."""
    s_q, s_kv = q.shape[1], k.shape[1]
    mask = block_mask(s_q, s_kv, int(window), q.device)
    fn = _compiled() if compiled else _flex_sink
    fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), sinks, mask, float(sm_scale), out)


def run_sdpa(q, k, v, sinks, sm_scale, window, out):
    """The SDPA backend: one extra key column (zero key, zero value) whose fp32 mask entry is the
    sink, so the softmax denominator gains exp(sink) exactly; chunked over query rows."""
    import torch.nn.functional as F

    S_Q, H_Q, S_KV = q.shape[1], q.shape[2], k.shape[1]
    offset = S_KV - S_Q
    kt, vt = with_sink_column(k, v)
    qt = q.transpose(1, 2)
    rows = max(1, SDPA_MASK_ELEMENTS // (H_Q * (S_KV + 1)))
    keys = torch.arange(S_KV, device=q.device)
    for r0 in range(0, S_Q, rows):
        r1 = min(S_Q, r0 + rows)
        pos = torch.arange(offset + r0, offset + r1, device=q.device).unsqueeze(1)
        bias = torch.zeros((r1 - r0, S_KV), dtype=torch.float32, device=q.device)
        bias.masked_fill_(~allowed(pos, keys.unsqueeze(0), int(window)), float("-inf"))
        mask = torch.cat([bias.unsqueeze(0).expand(H_Q, -1, -1),
                          sinks.float().view(H_Q, 1, 1).expand(-1, r1 - r0, 1)], dim=2).unsqueeze(0)
        o = F.scaled_dot_product_attention(qt[:, :, r0:r1], kt, vt, attn_mask=mask, scale=float(sm_scale),
                                           enable_gqa=True)
        out[:, r0:r1].copy_(o.transpose(1, 2))


def run(q, k, v, sinks, sm_scale, window, out):
    """GPT-OSS prefill attention with sinks into ``out`` (the block's candidate signature)."""
    which = backend(q.device)
    if which == "sdpa":
        run_sdpa(q, k, v, sinks, sm_scale, window, out)
    else:
        run_flex(q, k, v, sinks, sm_scale, window, out, compiled=which == "flex")
