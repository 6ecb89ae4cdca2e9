"""Checks that need a CUDA GPU (skipped elsewhere; run by scripts/gpu_check.py).

They check the harness on real hardware: every baseline verifies on the GPU, the timer agrees with
wall time, and ahead-of-time compilation specialises exactly like the JIT (same registers).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from kernelforge.execute.judge.contract import allocate

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.devices.cuda import CudaDevice
from kernelforge.execute.runner import load_candidate
from kernelforge.result import Status
from kernelforge.execute.judge.verify import verify

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CATALOG = Catalog.discover(Path(__file__).resolve().parents[2] / "kernels")
BLOCK_IDS = sorted(CATALOG.blocks)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("block_id", BLOCK_IDS)
def test_baseline_verifies_on_gpu(block_id, dtype):
    block = CATALOG.block(block_id)
    template = CATALOG.baseline(block_id)
    module, failure = load_candidate(Candidate.from_template(template).source, block_id)
    assert failure is None
    results = verify(block, module.run, block.shapes("smoke") + block.shapes("check"), dtype, "cuda",
                     stop_at_first_failure=False)
    failed = [f"{s.name}: {v.message}" for s, v in results if v.status is not Status.OK]
    assert not failed, failed


def test_event_timing_is_consistent_with_wall_time():
    device = CudaDevice()
    device.prepare()
    src = torch.randn(64 * 2**20, device="cuda")  # 256 MiB: well past L2
    dst = torch.empty_like(src)
    timing = device.time([lambda: dst.copy_(src)], working_set_bytes=2 * src.numel() * 4)
    assert timing.method == "cuda-events"
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        dst.copy_(src)
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / 20
    assert 0 < timing.median_s <= wall * 1.5
    assert timing.wall_over_event is not None and timing.wall_over_event >= 1.0
    bandwidth = 2 * src.numel() * 4 / timing.median_s
    # A copy faster than the HBM (4.8 TB/s on H200) would mean the timer measures nothing.
    assert bandwidth < 6e12


@pytest.mark.parametrize("block_id", BLOCK_IDS)
def test_aot_registers_match_the_jit(block_id):
    """The AOT signature must specialise like the JIT: compile the same baseline both ways on the
    block's compile shape and compare registers per kernel."""
    from kernelforge.compile.pool import compile_candidate
    from kernelforge.compile.resources import jit_registers

    block = CATALOG.block(block_id)
    source = Candidate.from_template(CATALOG.baseline(block_id)).source
    report = compile_candidate(source, block_id, CATALOG.root, "bfloat16", None)
    assert report.status == "ok", report.message
    module, _ = load_candidate(source, block_id)
    shape = block.compile_shape()
    inputs = block.make_inputs(shape, torch.bfloat16, "cuda", seed=0)
    module.run(**inputs, **allocate(block, shape, torch.bfloat16, "cuda"))
    torch.cuda.synchronize()
    jit_regs = jit_registers(module)
    aot_regs = {k.name: k.registers for k in report.kernels}
    assert jit_regs, "no compiled kernels found in the module's JIT caches"
    for name, registers in jit_regs.items():
        assert aot_regs.get(name) == registers, (name, aot_regs, jit_regs)
