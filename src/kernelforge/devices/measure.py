"""Measured ceilings: what a kernel can really reach on this GPU, measured in the run that uses them.

Datasheet ceilings are upper bounds nobody reaches; percent of roofline is fairer against what the
device does on this host today (hardware.py). :func:`measure_ceilings` times two things with CUDA
events, each after a warm-up and as the median of several calls:

- **copy bandwidth**: a device-to-device copy of a 1 GiB buffer (read + write: 2 GiB of traffic
  per call), far beyond L2;
- **bf16 matmul rate**: an 8192^3 bf16 ``torch.matmul`` on random data (random data draws more
  power than zeros, and so clocks lower: the honest figure).

The result (:class:`MeasuredCeilings`) is written as JSON (``kernelforge ceilings --json FILE``)
and read back through ``KERNELFORGE_CEILINGS`` by :func:`kernelforge.devices.hardware.ceilings_for`,
so every roofline of a report made from that run's databases uses the run's own figures. On the
interpreter nothing is measured: its times are no hardware's.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from kernelforge.errors import UserError

COPY_BYTES = 2**30
MATMUL_N = 8192


@dataclass(frozen=True)
class MeasuredCeilings:
    """One device's measured ceilings: ``bandwidth`` in bytes/s, ``flops`` in FLOP/s (dense
    bf16), the device name torch reports, and how they were measured."""

    device_name: str
    bandwidth: float
    flops: float
    method: str

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> "MeasuredCeilings":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls(str(data["device_name"]), float(data["bandwidth"]), float(data["flops"]), str(data["method"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{path}: not a measured-ceilings file written by `kernelforge ceilings --json` "
                            f"({exc}); measure again or unset KERNELFORGE_CEILINGS") from None


def _median_event_seconds(fn, calls: int = 10, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def measure_ceilings(index: int = 0) -> MeasuredCeilings:
    """Measure copy bandwidth and the bf16 matmul rate of CUDA device ``index`` (see the module
    docstring). A UserError without a GPU."""
    if not torch.cuda.is_available():
        raise UserError("measuring ceilings needs a CUDA GPU; the interpreter's times are no hardware's")
    device = f"cuda:{index}"
    torch.cuda.set_device(index)
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_s = _median_event_seconds(lambda: dst.copy_(src))
    del src, dst
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(MATMUL_N, MATMUL_N, device=device, dtype=torch.bfloat16, generator=generator)
    b = torch.randn(MATMUL_N, MATMUL_N, device=device, dtype=torch.bfloat16, generator=generator)
    matmul_s = _median_event_seconds(lambda: torch.matmul(a, b))
    return MeasuredCeilings(
        device_name=torch.cuda.get_device_name(index), bandwidth=2 * COPY_BYTES / copy_s,
        flops=2 * MATMUL_N**3 / matmul_s,
        method=f"median of 10 event-timed calls: device-to-device copy of {COPY_BYTES >> 20} MiB "
               f"(read + write), bf16 matmul {MATMUL_N}^3 on random data; torch {torch.__version__}")
