"""Hardware ceilings for roofline figures (BLOCKS.md): peak dense bf16/fp16 FLOP rate and HBM
bandwidth, datasheet and measured, per GPU model. A time is compared with the roofline time
``max(flops / peak_flops, bytes / bandwidth)``; a result below that time is physically impossible
and marks a broken measurement or a cheating candidate.

Two roofline times are used, for two different questions:

- *percent of roofline* (how close to the limit) is against the **measured** ceilings where they are
  known (copy bandwidth, matmul rate on random data: what a kernel can really reach), else the
  datasheet ones;
- *suspect* (faster than physically possible) is against the **datasheet** ceilings, the hard
  upper bound: beating a measured ceiling is unusual, beating the datasheet is impossible.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Ceilings:
    """Peak rates of one GPU model. ``name`` is matched against the device name torch reports."""

    name: str
    bandwidth: float  # bytes/s, datasheet
    flops: float  # dense bf16 FLOP/s, datasheet
    measured_bandwidth: float | None = None
    measured_flops: float | None = None
    source: str = "datasheet"
    #: HBM capacity in bytes (datasheet), for the projection's memory check; None: unknown.
    memory_bytes: float | None = None

    def roofline_seconds(self, flops: float, nbytes: float) -> float:
        """The datasheet roofline time: no correct kernel can be faster."""
        return max(flops / self.flops, nbytes / self.bandwidth)

    def bound(self, flops: float, nbytes: float, practical: bool = False) -> str:
        """Which ceiling limits a call of this arithmetic intensity: "compute" or "memory" (against
        the datasheet ceilings, or the practical ones with ``practical``)."""
        peak, bw = (self.practical_flops, self.practical_bandwidth) if practical else (self.flops, self.bandwidth)
        return "compute" if flops / peak >= nbytes / bw else "memory"

    @property
    def practical_bandwidth(self) -> float:
        """Measured bandwidth where known, else the datasheet figure."""
        return self.measured_bandwidth or self.bandwidth

    @property
    def practical_flops(self) -> float:
        """Measured FLOP rate where known, else the datasheet figure."""
        return self.measured_flops or self.flops

    @property
    def measured(self) -> bool:
        """True when both practical ceilings are measured figures rather than datasheet ones."""
        return self.measured_bandwidth is not None and self.measured_flops is not None

    def practical_seconds(self, flops: float, nbytes: float) -> float:
        """The roofline time against the practical (measured where known) ceilings."""
        return max(flops / self.practical_flops, nbytes / self.practical_bandwidth)

    def ridge(self, practical: bool = True) -> float:
        """Arithmetic intensity (FLOP/byte) where the compute and memory ceilings meet."""
        if practical:
            return self.practical_flops / self.practical_bandwidth
        return self.flops / self.bandwidth


# Longer (more specific) names first: "H100 PCIe" must not be taken for an H100 SXM. Memory is the
# NVIDIA datasheet HBM capacity (H200: 141 GB). H200 and H100 SXM figures are BLOCKS.md's (H200 measured: copy bandwidth 4.3 TB/s, bf16 matmul on random data
# 790 TFLOP/s); the others are NVIDIA datasheet figures for dense bf16 without sparsity.
KNOWN: tuple[Ceilings, ...] = (
    Ceilings("H200", 4.8e12, 989e12, measured_bandwidth=4.3e12, measured_flops=790e12,
             source="datasheet; measured copy bandwidth and bf16 matmul rate (BLOCKS.md)", memory_bytes=141e9),
    Ceilings("H100 PCIE", 2.0e12, 756e12, memory_bytes=80e9),
    Ceilings("H100 NVL", 3.9e12, 835e12, memory_bytes=94e9),
    Ceilings("H100", 3.35e12, 989e12, measured_bandwidth=3.0e12, measured_flops=798e12,
             source="datasheet (SXM); measured copy bandwidth and bf16 matmul rate on a lent H100 80GB",
             memory_bytes=80e9),
    Ceilings("A100-SXM4-40GB", 1.555e12, 312e12, memory_bytes=40e9),
    Ceilings("A100", 2.039e12, 312e12, source="datasheet (80 GB SXM)", memory_bytes=80e9),
)


#: A measured-ceilings file (``kernelforge ceilings --json FILE``, :mod:`kernelforge.devices.measure`):
#: when set, its figures replace the table's measured ones for the device it names.
CEILINGS_ENV = "KERNELFORGE_CEILINGS"


def ceilings_for(device_name: str) -> Ceilings | None:
    """Ceilings of a device by its reported name (e.g. "NVIDIA H200"), or None when unknown. With
    ``$KERNELFORGE_CEILINGS`` naming a measured-ceilings file of this device, its measured copy
    bandwidth and matmul rate are the practical ceilings (the datasheet stays the hard bound)."""
    upper = device_name.upper()
    known = next((ceilings for ceilings in KNOWN if ceilings.name in upper), None)
    path = os.environ.get(CEILINGS_ENV)
    if not path:
        return known
    from kernelforge.devices.measure import MeasuredCeilings

    measured = MeasuredCeilings.read(Path(path))
    if measured.device_name.upper() != upper:
        return known
    base = known or Ceilings(device_name, measured.bandwidth, measured.flops, source="unknown datasheet")
    return replace(base, measured_bandwidth=measured.bandwidth, measured_flops=measured.flops,
                   source=f"{base.source.split(';')[0]}; measured in this run ({Path(path).name}): {measured.method}")


def gpu_slug(device_name: str) -> str:
    """A short lower-case name for folders and labels: the first known model in the name
    (``NVIDIA H100 80GB HBM3`` -> ``h100``, ``NVIDIA H200`` -> ``h200``), else the name itself
    with every run of other characters as one ``-``."""
    known = next((ceilings.name for ceilings in KNOWN if ceilings.name in device_name.upper()), None)
    if known:
        return re.sub(r"[^a-z0-9]+", "-", known.lower()).strip("-")
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower().replace("nvidia", "")).strip("-") or "gpu"


def timed_device_name(env: dict) -> str | None:
    """The GPU whose speed a stored env's timings measure: the device itself for ``cuda``, the
    recorded GPU for ``replay``, and None for the interpreter (its timings measure no GPU)."""
    device = env.get("device")
    if device == "replay":
        return env.get("recorded_device")
    if device == "cuda" or str(device or "").startswith("cuda"):
        return env.get("device_name")
    return None


@dataclass(frozen=True)
class RooflinePoint:
    """Where one timed call sits against a device's ceilings.

    ``achieved_flops`` and ``achieved_bandwidth`` are the stored FLOP and byte counts over the
    measured time; ``percent`` is roofline time / measured time x 100 against the practical
    ceilings (100 = at the limit); ``suspect`` is True when the time is below the datasheet
    roofline time (faster than physically possible). Without ceilings (the interpreter, an unknown
    GPU) only the achieved rates and the intensity are set.
    """

    intensity: float | None
    achieved_flops: float | None
    achieved_bandwidth: float | None
    roofline_s: float | None = None
    percent: float | None = None
    bound: str | None = None
    suspect: bool = False
    above_measured: bool = False


def assess(flops: float | None, nbytes: float | None, seconds: float | None,
           ceilings: Ceilings | None) -> RooflinePoint:
    """Place one timed call on the roofline (see :class:`RooflinePoint`)."""
    intensity = flops / nbytes if flops is not None and nbytes else None
    if not seconds or seconds <= 0 or not math.isfinite(seconds):
        return RooflinePoint(intensity, None, None)
    achieved_flops = flops / seconds if flops is not None else None
    achieved_bw = nbytes / seconds if nbytes is not None else None
    if ceilings is None or flops is None or nbytes is None:
        return RooflinePoint(intensity, achieved_flops, achieved_bw)
    practical = ceilings.practical_seconds(flops, nbytes)
    hard = ceilings.roofline_seconds(flops, nbytes)
    return RooflinePoint(
        intensity, achieved_flops, achieved_bw, roofline_s=practical, percent=100.0 * practical / seconds,
        # The bound of the ceilings the percent is taken against, so the two always agree.
        bound=ceilings.bound(flops, nbytes, practical=True), suspect=seconds < hard,
        above_measured=seconds < practical,
    )
