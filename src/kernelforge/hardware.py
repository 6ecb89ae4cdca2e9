"""Hardware ceilings for roofline figures (BLOCKS.md): peak dense bf16/fp16 FLOP rate and HBM
bandwidth, datasheet and measured, per GPU model. A time is compared with the roofline time
``max(flops / peak_flops, bytes / bandwidth)``; a result below that time is physically impossible
and marks a broken measurement or a cheating candidate."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ceilings:
    name: str
    bandwidth: float  # bytes/s, datasheet
    flops: float  # dense bf16 FLOP/s, datasheet
    measured_bandwidth: float | None = None
    measured_flops: float | None = None

    def roofline_seconds(self, flops: float, nbytes: float) -> float:
        return max(flops / self.flops, nbytes / self.bandwidth)

    def bound(self, flops: float, nbytes: float) -> str:
        """Which ceiling limits a call of this arithmetic intensity: "compute" or "memory"."""
        return "compute" if flops / self.flops >= nbytes / self.bandwidth else "memory"


# Measured figures from BLOCKS.md (copy bandwidth; bf16 matmul on random data).
KNOWN: tuple[Ceilings, ...] = (
    Ceilings("H200", 4.8e12, 989e12, measured_bandwidth=4.3e12, measured_flops=790e12),
    Ceilings("H100", 3.35e12, 989e12),
)


def ceilings_for(device_name: str) -> Ceilings | None:
    """Ceilings of a device by its reported name (e.g. "NVIDIA H200"), or None when unknown."""
    upper = device_name.upper()
    for ceilings in KNOWN:
        if ceilings.name in upper:
            return ceilings
    return None
