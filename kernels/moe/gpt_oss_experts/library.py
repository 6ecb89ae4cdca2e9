"""Library reference of moe/gpt_oss_experts: the routed experts on torch's own grouped GEMM.

Trusted code written by us (not a candidate, not a template): kernelforge.search.library verifies
it against the block's fp32 reference like a candidate and, on a GPU, times it with the same device
timing, so a report shows "faster than the best library" beside "faster than the expert baseline".

Entry point ``run(x, topk_ids, topk_weights, w1, b1, w2, b2, out)``, exactly a candidate's (see
block.py).

What serving ships here is vLLM's ``fused_experts`` (its Triton fused_moe kernel with the tuned
file, after its CUDA ``moe_align_block_size``; ``kernelforge shipped``). Its Triton GEMMs are the
block's baseline; vLLM itself is not on the GPU image. The strongest MoE path the image's torch
has is ``torch._grouped_mm``: one grouped GEMM over every expert's rows (CUTLASS on sm_90, bf16 in,
fp32 accumulate), as torch's own MoE layers call it. Backends (:data:`LABELS`), chosen by
:func:`backend` unless :data:`BACKEND` pins one (the measuring code appends ``BACKEND = "..."``):

- ``grouped_mm``: the (token, slot) pairs sorted by expert, both GEMMs as one ``torch._grouped_mm``
  each over the expert stacks as stored (W [E, N, K] read transposed, no copy), bias, clamped
  SwiGLU and the weighted combine as torch ops in fp32. No host synchronisation (the expert
  offsets are counted on the device), so CUDA graphs can capture it. The default where torch has
  ``_grouped_mm``.
- ``loop``: one ``torch.mm`` pair per expert over its rows (E launches each): the fallback
  (:data:`FALLBACK`), and the CPU path of a torch without ``_grouped_mm``.

Both round each GEMM's output to the activation dtype, as a bf16 kernel writing its intermediate
does. Nothing here is copied from vLLM, torchtitan or PyTorch's tests.
"""

from __future__ import annotations

import torch

#: Pinned backend (None: :func:`backend` chooses).
BACKEND: str | None = None
#: What each backend is, as the report names it.
LABELS = {
    "grouped_mm": "torch._grouped_mm (one grouped GEMM per projection over expert-sorted rows; CUTLASS on sm_90)",
    "loop": "torch.mm per expert (two GEMMs per expert over its rows)",
}
#: The backend tried when the first choice fails on every shape.
FALLBACK = "loop"

#: GPT-OSS's clamped SwiGLU (block.py's constants: the reference's).
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0


def backend(device: str | torch.device) -> str:
    """The backend :func:`run` uses on ``device``: :data:`BACKEND` when pinned, else
    ``grouped_mm`` where this torch has it, else ``loop``."""
    if BACKEND is not None:
        if BACKEND not in LABELS:
            raise ValueError(f"unknown library backend {BACKEND!r}; choose from {', '.join(LABELS)}")
        return BACKEND
    return "grouped_mm" if hasattr(torch, "_grouped_mm") else "loop"


def implementation(device: str | torch.device) -> str:
    """The label of the backend :func:`run` uses on ``device``."""
    return LABELS[backend(device)]


def _swiglu(h: torch.Tensor) -> torch.Tensor:
    """Interleaved clamped SwiGLU of ``h`` [M, 2I] (fp32) -> [M, I] (fp32)."""
    glu = h[:, 0::2].clamp(max=SWIGLU_LIMIT)
    lin = h[:, 1::2].clamp(min=-SWIGLU_LIMIT, max=SWIGLU_LIMIT)
    return glu * torch.sigmoid(SWIGLU_ALPHA * glu) * (lin + 1.0)


def _sorted_pairs(topk_ids: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (token, slot) pairs in expert order: flat pair indices [T*K] (int64), their experts
    [T*K] (int64), and the running row count per expert [E] (int32: ``_grouped_mm``'s offsets),
    all made on the ids' device without a host synchronisation."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    order = torch.sort(flat, stable=True).indices
    counts = torch.zeros(experts, dtype=torch.int32, device=flat.device)
    counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    return order, flat[order], torch.cumsum(counts, dim=0, dtype=torch.int32)


def _grouped(x, topk_ids, topk_weights, w1, b1, w2, b2, out) -> None:
    T, topk = topk_ids.shape
    order, experts, offsets = _sorted_pairs(topk_ids, w1.shape[0])
    tokens = order // topk
    rows = x.index_select(0, tokens)  # [T*K, H] in expert order
    h = torch._grouped_mm(rows, w1.transpose(1, 2), offs=offsets)  # [T*K, 2I], the activation dtype
    a = _swiglu(h.float() + b1.index_select(0, experts).float()).to(x.dtype)
    y = torch._grouped_mm(a, w2.transpose(1, 2), offs=offsets)  # [T*K, H]
    scale = topk_weights.reshape(-1).index_select(0, order).float()[:, None]
    y = (y.float() + b2.index_select(0, experts).float()) * scale
    acc = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    acc.index_add_(0, tokens, y)
    out.copy_(acc)


def _loop(x, topk_ids, topk_weights, w1, b1, w2, b2, out) -> None:
    T, topk = topk_ids.shape
    flat = topk_ids.reshape(-1).to(torch.int64)
    acc = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    for e in torch.unique(flat).tolist():
        pairs = torch.nonzero(flat == e).flatten()
        tokens = pairs // topk
        h = torch.mm(x.index_select(0, tokens), w1[e].t())
        a = _swiglu(h.float() + b1[e].float()).to(x.dtype)
        y = torch.mm(a, w2[e].t()).float() + b2[e].float()
        acc.index_add_(0, tokens, y * topk_weights.reshape(-1)[pairs].float()[:, None])
    out.copy_(acc)


def run(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w1: torch.Tensor,
        b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor, out: torch.Tensor) -> None:
    (_grouped if backend(x.device) == "grouped_mm" else _loop)(x, topk_ids, topk_weights, w1, b1, w2, b2, out)
