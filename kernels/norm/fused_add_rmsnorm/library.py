"""Library reference of norm/fused_add_rmsnorm: residual add + RMSNorm as torch runs it.

Trusted code written by us (not a candidate, not a template): kernelforge.search.library verifies
it against the block's fp32 reference like a candidate and, on a GPU, times it with the same device
timing, so a report shows "faster than the library" beside "faster than the baseline".

Entry point ``run(x, residual, weight, eps, out)``, exactly a candidate's (see block.py): the
rounded sum is written back into ``residual``, the normalised row into ``out``.

What serving ships here is vLLM's CUDA ``fused_add_rms_norm`` (``kernelforge shipped``), which is
not on the GPU image. The strongest path the image has is Inductor: ``torch.compile`` of the eager
add + RMSNorm fuses it into one generated Triton kernel, which is also what vLLM's own compilation
produces where it does not call its CUDA kernel. Backends (:data:`LABELS`), chosen by
:func:`backend` unless :data:`BACKEND` pins one (the measuring code appends ``BACKEND = "..."``):

- ``inductor``: the eager function under ``torch.compile`` (one compile per shape and dtype). The
  default on a CUDA device.
- ``eager``: the same torch ops, uncompiled: CPU verification, and the fallback (:data:`FALLBACK`).
"""

from __future__ import annotations

import torch

#: Pinned backend (None: :func:`backend` chooses from the device).
BACKEND: str | None = None
#: What each backend is, as the report names it.
LABELS = {
    "inductor": "torch.compile (Inductor's fused Triton kernel) of add + RMSNorm",
    "eager": "torch eager add + RMSNorm (five kernels)",
}
#: The backend tried when the device's first choice fails on every shape.
FALLBACK = "eager"

_COMPILED: dict[str, object] = {}


def backend(device: str | torch.device) -> str:
    """The backend :func:`run` uses on ``device``: :data:`BACKEND` when pinned, else ``inductor``
    on CUDA and ``eager`` elsewhere."""
    if BACKEND is not None:
        if BACKEND not in LABELS:
            raise ValueError(f"unknown library backend {BACKEND!r}; choose from {', '.join(LABELS)}")
        return BACKEND
    return "inductor" if torch.device(device).type == "cuda" else "eager"


def implementation(device: str | torch.device) -> str:
    """The label of the backend :func:`run` uses on ``device``."""
    return LABELS[backend(device)]


def _add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 out: torch.Tensor) -> None:
    r = (x.to(torch.float32) + residual.to(torch.float32)).to(x.dtype)
    residual.copy_(r)
    rf = r.to(torch.float32)
    normed = rf * torch.rsqrt(rf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.to(torch.float32)
    out.copy_(normed.to(out.dtype))


def run(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    if backend(x.device) == "inductor":
        compiled = _COMPILED.setdefault("inductor", torch.compile(_add_rmsnorm, dynamic=False))
        compiled(x, residual, weight, eps, out)
    else:
        _add_rmsnorm(x, residual, weight, eps, out)
