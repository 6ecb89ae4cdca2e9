"""Compile targets: the GPUs a candidate can be compiled for without having one.

A :class:`Target` is Triton's ``GPUTarget`` (backend, architecture, warp size) plus the per-block
hard limits the compile step checks (shared memory, threads, Blackwell tensor memory). Targets are
named as users type them (``sm_90``, ``sm_90a``, ``gfx942``); :func:`parse_target` is the one
place a name becomes a target and :func:`default_target` the one place the default is chosen.
Nothing here imports triton at module level (see :mod:`kernelforge.compile.pool`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kernelforge.errors import UserError


@dataclass(frozen=True)
class Target:
    """A GPU to compile for: Triton's ``GPUTarget`` fields plus the per-block limits we check."""

    name: str
    backend: str  # "cuda" | "hip"
    arch: int | str  # compute capability (90) or gfx name ("gfx942")
    warp_size: int
    shared_limit: int  # bytes of shared memory (LDS) one block may use, opt-in maximum
    description: str = ""
    max_threads: int = 1024
    tmem_columns: int | None = None  # Blackwell tensor memory per SM, in columns
    # Per-architecture facts the LLM prompt gives (CUDA programming guide, compute capability
    # tables; None: not known here, never guessed). ``gpu`` names the product whose ceilings
    # (:func:`kernelforge.devices.hardware.ceilings_for`) describe this target when no GPU measures.
    gpu: str = ""
    sms: int | None = None
    shared_per_sm: int | None = None  # bytes
    fp32_flops: float | None = None  # CUDA-core (no tensor core) FP32 rate, datasheet
    fp8: bool = False  # tensor cores take fp8 (at twice the 16-bit rate)
    registers_per_sm: int | None = None  # 32-bit registers
    registers_per_thread: int | None = None

    @property
    def is_cuda(self) -> bool:
        return self.backend == "cuda"

    def gpu_target(self) -> Any:
        """Triton's ``GPUTarget`` for this target."""
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


#: NVIDIA's register file: 64K 32-bit registers per SM, at most 255 per thread.
_NVIDIA_REGISTERS = {"registers_per_sm": 65536, "registers_per_thread": 255}


def _cuda(cc: int, shared: int, description: str, **extra: Any) -> Target:
    return Target(f"sm_{cc}", "cuda", cc, 32, shared, description, **extra)


#: Known compile targets. Shared-memory limits are the per-block opt-in maxima of the CUDA
#: programming guide (compute capability table) and of the CDNA ISA guides (64 KiB LDS on
#: CDNA2/3, 160 KiB on CDNA4). Each was compiled offline with Triton 3.9 here.
TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        _cuda(80, 166912, "NVIDIA A100 (Ampere)", gpu="NVIDIA A100", sms=108, shared_per_sm=167936,
              fp32_flops=19.5e12, **_NVIDIA_REGISTERS),
        _cuda(86, 101376, "NVIDIA RTX 30xx / A10 / A40 (Ampere)"),
        _cuda(89, 101376, "NVIDIA L4 / L40 / RTX 40xx (Ada)"),
        _cuda(90, 232448, "NVIDIA H100 / H200 (Hopper, sm_90a)", gpu="NVIDIA H200", sms=132, shared_per_sm=233472,
              fp32_flops=67e12, fp8=True, **_NVIDIA_REGISTERS),
        _cuda(100, 232448, "NVIDIA B200 / GB200 (Blackwell, sm_100a)", tmem_columns=512, sms=148,
              shared_per_sm=233472, fp8=True, **_NVIDIA_REGISTERS),
        _cuda(120, 101376, "NVIDIA RTX 50xx / RTX PRO 6000 (Blackwell, sm_120a)"),
        Target("gfx90a", "hip", "gfx90a", 64, 65536, "AMD MI200 (CDNA2)"),
        Target("gfx942", "hip", "gfx942", 64, 65536, "AMD MI300X / MI325X (CDNA3)"),
        Target("gfx950", "hip", "gfx950", 64, 163840, "AMD MI350X / MI355X (CDNA4)"),
    )
}

#: Used when there is no local GPU: the H100/H200 is what the project's kernels are tuned for.
FALLBACK_TARGET = "sm_90"


def parse_target(name: str | Target) -> Target:
    """The :class:`Target` called ``name``: ``sm_90`` (also ``sm_90a``, ``sm90``), ``gfx942``, ...

    Raises UserError naming the known targets when ``name`` is not one of them.
    """
    if isinstance(name, Target):
        return name
    key = str(name).strip().lower()
    match = re.fullmatch(r"sm_?(\d+)a?", key)
    if match:
        key = f"sm_{int(match.group(1))}"
    else:
        key = key.split(":")[0]  # torch's gcnArchName carries feature flags: gfx942:sramecc+:xnack-
    if key not in TARGETS:
        raise UserError(
            f"unknown compile target {name!r}; known targets: {', '.join(TARGETS)} "
            "(sm_XY is an NVIDIA compute capability, gfxNNN an AMD GPU)"
        )
    return TARGETS[key]


def default_target() -> str:
    """The local GPU's target (``sm_XY`` from its compute capability, or its gfx name on ROCm)
    when torch sees a GPU, else ``sm_90``.

    A local GPU that is not in :data:`TARGETS` is still returned by name, so that compiling for it
    fails with a clear message instead of silently checking another GPU's limits.
    """
    try:
        import torch

        if torch.cuda.is_available():
            if getattr(torch.version, "hip", None):
                return str(torch.cuda.get_device_properties(0).gcnArchName).split(":")[0]
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}"
    except Exception:  # a broken driver install is the same as no GPU for choosing a target
        pass
    return FALLBACK_TARGET
