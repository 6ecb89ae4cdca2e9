"""Adversarial checks that need a CUDA GPU (skipped elsewhere; run by scripts/gpu_check.py):
work on a side stream the timing events do not see, timings faster than the hardware allows, a
CUDA error poisoning the worker's context, and the defenses not over-rejecting the real
baselines on the GPU. The same logic is exercised on the CPU with a simulated GPU timing in
tests/execute/test_adversarial.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelforge.block import Block, Counts, Shape, generator, random_tensor
from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.devices.cuda import CudaDevice
from kernelforge.execute.evaluate import ROOFLINE_FLAG
from kernelforge.execute.inprocess import InProcessExecutor
from kernelforge.policy.checker import check_source
from kernelforge.result import Status
from kernelforge.execute.worker.executor import WorkerExecutor

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

REPO = Path(__file__).resolve().parents[2]
CATALOG = Catalog.discover(REPO / "kernels")


class BigAxpy(Block):
    """out = alpha * x + y on 2**24 elements (long enough for side-stream work to show)."""

    family = "test"
    description = "axpy, large"
    dtypes = ("float16",)
    claimed: Counts | None = None

    def shape_sets(self):
        return {"smoke": [Shape.of("n16m", N=1 << 24)], "check": [Shape.of("n1000", N=1000)]}

    def make_inputs(self, shape, dtype, device, seed, distribution="normal"):
        gen = generator(seed)
        n = shape["N"]
        return {"x": random_tensor((n,), gen, distribution, dtype=dtype, device=device),
                "y": random_tensor((n,), gen, distribution, dtype=dtype, device=device), "alpha": 1.5}

    def make_output(self, shape, dtype, device):
        return torch.empty(shape["N"], dtype=dtype, device=device)

    def reference(self, x, y, alpha):
        return alpha * x.float() + y.float()

    def counts(self, shape, dtype):
        if self.claimed is not None:
            return self.claimed
        return Counts(flops=2.0 * shape["N"], bytes=6.0 * shape["N"])


KERNEL = """
import torch
import triton
import triton.language as tl


@triton.jit
def _axpy(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (alpha * x + y).to(out_ptr.dtype.element_ty), mask=mask)
"""

HONEST = KERNEL + """

def run(x, y, alpha, out):
    n = x.numel()
    _axpy[(triton.cdiv(n, 1024),)](x, y, out, alpha, n, BLOCK=1024)
"""

#: The work goes to a side stream: events recorded on the main stream around the call see none of
#: it (EVALUATION.md #13). The policy refuses torch.cuda; with the policy off, the run-time checks
#: must catch it.
SIDE_STREAM = KERNEL + """

_SIDE = []


def run(x, y, alpha, out):
    if not _SIDE:
        _SIDE.append(torch.cuda.Stream())
    side = _SIDE[0]
    side.wait_stream(torch.cuda.current_stream())
    n = x.numel()
    with torch.cuda.stream(side):
        for _ in range(8):
            _axpy[(triton.cdiv(n, 1024),)](x, y, out, alpha, n, BLOCK=1024)
"""

#: An unmasked load far outside the allocation: an illegal memory access poisons the context.
ILLEGAL_ADDRESS = HONEST.replace("x = tl.load(x_ptr + offs, mask=mask)", "x = tl.load(x_ptr + offs + (1 << 40))")


def test_the_policy_refuses_side_streams():
    assert not check_source(SIDE_STREAM).ok and "torch.cuda" in check_source(SIDE_STREAM).message()


def test_side_stream_work_is_caught_by_the_timer_cross_check():
    device = CudaDevice()
    device.prepare()
    src = torch.randn(1 << 28, device="cuda")  # 1 GiB: about 0.5 ms to copy
    dst = torch.empty_like(src)
    small_src = torch.randn(1 << 24, device="cuda")  # 64 MiB on the timed stream: about 30 us, so
    small_dst = torch.empty_like(small_src)  # the events path is taken, not CUDA graphs
    side = torch.cuda.Stream()

    def hidden():
        small_dst.copy_(small_src)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            dst.copy_(src)

    timing = device.time([hidden], working_set_bytes=2 * src.numel() * 4)
    assert timing.method == "cuda-events" and timing.extra["event_wall_mismatch"], timing.extra
    honest = device.time([lambda: dst.copy_(src)], working_set_bytes=2 * src.numel() * 4)
    assert not honest.extra["event_wall_mismatch"], honest.extra


def test_a_side_stream_candidate_is_rejected_with_the_policy_off():
    device = CudaDevice()
    device.prepare()
    block = BigAxpy("test/big_axpy")
    [ev] = InProcessExecutor(device, policy=False).evaluate(block, SIDE_STREAM, block.shapes("smoke"), torch.float16)
    assert ev.status is Status.REJECTED, ev.verification.message
    message = ev.verification.message
    assert "deferred" in message or "[event-wall-mismatch]" in message


def test_faster_than_the_roofline_is_flagged_on_a_real_gpu():
    device = CudaDevice()
    device.prepare()
    if device.ceilings() is None:
        pytest.skip(f"no ceilings known for {torch.cuda.get_device_name()}")
    block = BigAxpy("test/big_axpy")
    block.claimed = Counts(flops=1e18, bytes=1e18)  # a block whose counts no kernel could meet
    [ev] = InProcessExecutor(device).evaluate(block, HONEST, block.shapes("smoke"), torch.float16)
    assert ev.status is Status.OK and ev.verification.message.startswith(ROOFLINE_FLAG), ev.verification.message
    block.claimed = None
    [plain] = InProcessExecutor(device).evaluate(block, HONEST, block.shapes("smoke"), torch.float16)
    assert plain.status is Status.OK and not plain.verification.message


def test_a_cuda_error_retires_the_worker_and_the_next_candidate_runs():
    big = BigAxpy("test/big_axpy")
    with WorkerExecutor(CudaDevice(), held_out=False) as executor:
        info = executor.probe()
        assert info["rlimit_as"] == -1  # RLIM_INFINITY: no address-space limit under CUDA
        bad = executor.evaluate(big, ILLEGAL_ADDRESS, big.shapes("check"), torch.float16)
        assert bad[0].status is Status.RUNTIME_ERROR, bad[0].verification.message
        starts = executor.starts
        [ok] = executor.evaluate(big, HONEST, big.shapes("check"), torch.float16)
        assert ok.status is Status.OK, ok.verification.message
        assert executor.starts == starts + 1


@pytest.fixture(scope="module")
def gpu_worker():
    with WorkerExecutor(CudaDevice()) as executor:
        yield executor


@pytest.mark.parametrize("block_id", sorted(CATALOG.blocks))
def test_baselines_pass_every_defense_in_the_worker(gpu_worker, block_id):
    """No over-rejection on real hardware: the human baselines pass the host-compute guard, the
    held-out shapes, the post-timing re-check and the side-stream cross-check in the worker."""
    block = CATALOG.block(block_id)
    source = Candidate.from_template(CATALOG.baseline(block_id)).source
    results = gpu_worker.evaluate(block, source, block.shapes("smoke"), torch.bfloat16)
    failed = [f"{r.shape.name}: {r.status.value} {r.verification.message}" for r in results
              if r.status is not Status.OK]
    assert not failed, failed
    assert all(r.timing is not None and not r.timing.extra.get("event_wall_mismatch") for r in results)
