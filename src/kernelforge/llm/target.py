"""The GPU a kernel is written for, as the prompt describes it: its ceilings and its resources.

The search may verify on another device (Triton's interpreter on a CPU, with smoke shapes): the
prompt still describes the job's target, the GPU the kernel will run on. That is the measuring GPU
when the run has one (``env``: a CUDA device, or the recorded one of a replay), else the GPU of
the job's compile ``target`` (``sm_90`` is an H100/H200, described by the H200's figures).

Figures come from the two tables of GPU facts and nowhere else: per product, the ceilings of
:mod:`kernelforge.devices.hardware` (datasheet, dense, no sparsity; measured where known); per
architecture, the compile targets of :mod:`kernelforge.targets` (limits and per-SM
resources). This module holds no figure of its own. Where a figure is not known it is left out,
never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelforge.targets import FALLBACK_TARGET, Target, parse_target
from kernelforge.devices.hardware import Ceilings, ceilings_for, timed_device_name
from kernelforge.errors import UserError


@dataclass(frozen=True)
class TargetGPU:
    """The target GPU's ceilings and resources (see the module docstring). ``source`` says where
    the GPU came from (the measuring device, or the compile target)."""

    target: Target
    gpu: str
    source: str
    ceilings: Ceilings | None
    sms: int | None
    shared_per_sm: int | None
    fp32_flops: float | None
    fp8: bool

    def lines(self, dtype_name: str) -> list[str]:
        """The facts, one line each, for the prompt."""
        t = self.target
        out = [f"{self.gpu}, compile target {t.name} ({t.description}): {self.source}" if self.gpu
               else f"compile target {t.name} ({t.description}): {self.source}"]
        c = self.ceilings
        if c is not None:
            out.append(f"HBM bandwidth {c.bandwidth / 1e12:.2f} TB/s"
                       + (f" (measured copy: {c.measured_bandwidth / 1e12:.2f} TB/s)" if c.measured_bandwidth else "")
                       + (f", HBM capacity {c.memory_bytes / 1e9:.0f} GB" if c.memory_bytes else ""))
            rates = [f"fp16/bf16 tensor cores {c.flops / 1e12:.0f} TFLOP/s"]
            if self.fp8:
                rates.append(f"fp8 {2 * c.flops / 1e12:.0f}")
            rates.append(f"tf32 {c.flops / 2e12:.0f}")
            if self.fp32_flops:
                rates.append(f"fp32 without tensor cores {self.fp32_flops / 1e12:.1f}")
            out.append("Peak dense compute: " + ", ".join(rates) + f" TFLOP/s (this job's dtype: {dtype_name}); "
                       f"ridge point {c.flops / c.bandwidth:.0f} FLOP/byte at 16-bit")
        else:
            out.append("Peak bandwidth and FLOP/s: not known for this GPU")
        resources = [f"shared memory {t.shared_limit // 1024} KiB per block (opt-in maximum)"]
        if self.shared_per_sm:
            resources.append(f"{self.shared_per_sm // 1024} KiB per SM")
        if t.registers_per_sm:
            resources.append(f"registers {t.registers_per_sm // 1024}K 32-bit per SM, at most "
                             f"{t.registers_per_thread} per thread")
        resources.append(f"at most {t.max_threads} threads per block, warp size {t.warp_size}")
        if self.sms:
            resources.append(f"{self.sms} SMs (a grid of fewer programs than SMs leaves the GPU partly idle)")
        if t.tmem_columns:
            resources.append(f"tensor memory {t.tmem_columns} columns per SM")
        out.append("Resources: " + "; ".join(resources))
        return out


def target_gpu(env: dict, target: str | None) -> TargetGPU:
    """The GPU the prompt writes for (see the module docstring). ``target``: the run's compile
    target (None: the fallback, ``sm_90``); an unknown target name falls back to it too."""
    try:
        target_info = parse_target(target or FALLBACK_TARGET)
    except UserError:  # a local GPU kernelforge has no limits for: describe the fallback's
        target_info = parse_target(FALLBACK_TARGET)
    t = target_info
    measured = timed_device_name(env)
    ceilings = ceilings_for(measured) if measured else None
    if ceilings is not None:
        return TargetGPU(t, str(measured), "the GPU this search measures on", ceilings, t.sms, t.shared_per_sm,
                         t.fp32_flops, t.fp8)
    return TargetGPU(t, t.gpu, f"the job's target, described by the {t.gpu}'s figures" if t.gpu else "the job's target",
                     ceilings_for(t.gpu) if t.gpu else None, t.sms, t.shared_per_sm, t.fp32_flops, t.fp8)


__all__ = ["TargetGPU", "target_gpu"]
