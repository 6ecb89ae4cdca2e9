"""FlexAttention and SDPA helpers of the attention library references with a sink
(``kernels/attention/*/library.py``, see :mod:`kernelforge.library`): what every such reference
does the same way, whatever its block's layout and mask.

A reference keeps its block's own parts (the mask, the key ranges, ``run``, ``run_flex`` and
``run_sdpa`` with the block's signature, its :data:`LABELS`-style table) and its module globals,
which is why these helpers hold no state and take those as arguments:

- ``BACKEND``: :meth:`kernelforge.search.library.LibraryReference.pinned_source` appends
  ``BACKEND = "..."`` to the reference's text, so only a global of that module can be pinned;
  :func:`choose_backend` is given it at each call.
- the compiled FlexAttention graph and ``COMPILE_BACKEND``: one cache per reference module
  (each block compiles its own function), read at each call so a test can switch the backend.

The sink (a per-head logit in the softmax denominator with no value) is exact in every backend:
FlexAttention returns the natural log-sum-exp ``L`` of each row's scores, and
``o_with_sink = o * Z / (Z + exp(S)) = o * sigmoid(L - S)``; SDPA sees the sink as a real column of
the softmax (a zero key and a zero value row, whose mask entry is the sink). Nothing here is copied
from FlashAttention, vLLM or PyTorch's examples.
"""

from __future__ import annotations

import inspect
from typing import Callable, Mapping, MutableMapping

import torch

#: FlexAttention's sparse tile (its default): block masks are given in tiles of this size.
FLEX_TILE = 128
#: torch.compile's backend for ``flex`` on a GPU (tests trace the same graph with "aot_eager").
DEFAULT_COMPILE_BACKEND = "inductor"
#: torch.compile recompiles per shape (static sizes give the fastest kernels); dynamo's default
#: limit of 8 would silently fall back to eager dense math after eight shapes.
RECOMPILE_LIMIT = 256
#: The label of the eager FlexAttention backend, the same in every reference.
FLEX_EAGER_LABEL = "FlexAttention (eager dense math, verification only)"


def flex_available() -> bool:
    """Whether this torch has FlexAttention."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def choose_backend(device: str | torch.device, pinned: str | None, labels: Mapping[str, str]) -> str:
    """The backend a reference uses on ``device``: ``pinned`` (its module's ``BACKEND``) when set,
    else ``flex`` on CUDA when FlexAttention exists, else ``sdpa``. A pinned name that is not in
    ``labels`` raises ValueError naming the choices."""
    if pinned is not None:
        if pinned not in labels:
            raise ValueError(f"unknown library backend {pinned!r}; choose from {', '.join(labels)}")
        return pinned
    if torch.device(device).type == "cuda" and flex_available():
        return "flex"
    return "sdpa"


def from_kv_blocks_options(seq_lengths: tuple[int, int]) -> dict[str, object]:
    """The optional keyword arguments of ``BlockMask.from_kv_blocks`` that this torch accepts: the
    (query, key) lengths of the mask and forward-only (no query-block index)."""
    from torch.nn.attention.flex_attention import BlockMask

    params = inspect.signature(BlockMask.from_kv_blocks).parameters
    extra: dict[str, object] = {}
    if "seq_lengths" in params:
        extra["seq_lengths"] = seq_lengths
    if "compute_q_blocks" in params:
        extra["compute_q_blocks"] = False  # forward only
    return extra


def flex_with_lse(q, k, v, mask, scale):
    """FlexAttention's output and natural log-sum-exp (whichever API this torch has); q, k, v are
    [B, H, S, D] with GQA in the kernel."""
    from torch.nn.attention import flex_attention as fa

    if hasattr(fa, "AuxRequest"):
        o, aux = fa.flex_attention(q, k, v, block_mask=mask, scale=scale, enable_gqa=True,
                                   return_aux=fa.AuxRequest(lse=True))
        return o, aux.lse
    return fa.flex_attention(q, k, v, block_mask=mask, scale=scale, enable_gqa=True, return_lse=True)


def flex_with_sink(q, k, v, sinks, mask, scale) -> torch.Tensor:
    """FlexAttention with the sink, in fp32 [B, H_Q, S_Q, D]: the output scaled by
    ``sigmoid(L - sink)`` per row. Called inside a reference's compiled function, so the factor
    fuses with the reference's store into its output."""
    o, lse = flex_with_lse(q, k, v, mask, scale)
    return o.float() * torch.sigmoid(lse - sinks.view(1, -1, 1)).unsqueeze(-1)


def compile_once(cache: MutableMapping[str, object], fn: Callable, backend: str) -> Callable:
    """``fn`` under torch.compile with ``backend``, compiled on the first call and kept in
    ``cache`` (the reference module's own) after that; one graph per shape (``dynamic=False``),
    with dynamo's recompile limit raised to :data:`RECOMPILE_LIMIT`."""
    if "flex" not in cache:
        import torch._dynamo.config as dynamo_config

        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(dynamo_config, name):
                setattr(dynamo_config, name, max(getattr(dynamo_config, name), RECOMPILE_LIMIT))
        cache["flex"] = torch.compile(fn, dynamic=False, backend=backend)
    return cache["flex"]  # type: ignore[return-value]


def with_sink_column(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values [B, S, H_KV, D] as [B, H_KV, S + 1, D] with one zero row appended: the
    sink's column for SDPA (its score comes from the mask, its value is zero)."""
    B, _, H_KV, D = k.shape
    zero = torch.zeros((B, H_KV, 1, D), dtype=k.dtype, device=k.device)
    return torch.cat([k.transpose(1, 2), zero], dim=2), torch.cat([v.transpose(1, 2), zero], dim=2)


__all__ = ["DEFAULT_COMPILE_BACKEND", "FLEX_EAGER_LABEL", "FLEX_TILE", "RECOMPILE_LIMIT", "choose_backend",
           "compile_once", "flex_available", "flex_with_lse", "flex_with_sink", "from_kv_blocks_options",
           "with_sink_column"]
