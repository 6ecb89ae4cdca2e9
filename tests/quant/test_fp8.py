"""kernelforge.quant.fp8: 128x128 block scales (partial edge blocks included), exact dequantisation,
per-token group quantisation of activations (an all-zero group, a partial last group), and the
interpreter's fp32 -> e4m3 cast agreeing with torch's (the baseline quantises in Triton)."""

from __future__ import annotations

import pytest
import torch

from kernelforge.quant.fp8 import (BLOCK, E4M3_MAX, EPS, FP8, Fp8BlockWeights, Fp8GroupActivations,
                                   block_scales, dequantize_groups, expand_blocks, quantize_blocks,
                                   quantize_groups)


def _by_hand(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q * scale[r // 128, c // 128], element by element (fp64)."""
    out = torch.empty(q.shape, dtype=torch.float64)
    qf = q.to(torch.float64)
    for r in range(q.shape[0]):
        for c in range(q.shape[1]):
            out[r, c] = qf[r, c] * float(scale[r // BLOCK, c // BLOCK])
    return out


def test_block_scales_are_block_amax_over_448_with_partial_blocks():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(200, 300, generator=gen)
    scale = block_scales(w)
    assert scale.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            block = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            assert scale[i, j] == block.abs().max() / E4M3_MAX
    assert torch.equal(block_scales(torch.zeros(130, 5)), torch.ones(2, 1))


def test_quantize_blocks_round_trip_is_within_half_an_e4m3_step():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(192, 320, generator=gen)
    q, scale = quantize_blocks(w)
    assert q.dtype == FP8 and scale.dtype == torch.float32
    assert q.to(torch.float32).abs().max() <= E4M3_MAX
    back = q.to(torch.float32) * expand_blocks(scale, 192, 320)
    # e4m3 has 3 mantissa bits: a relative step of at most 2^-3, so half a step 2^-4 (normals).
    full = expand_blocks(scale, 192, 320) * E4M3_MAX
    assert ((back - w).abs() <= w.abs() * 2.0 ** -4 + full * 2.0 ** -9).all()
    # The largest element of each block is exactly representable (it maps to 448).
    assert torch.equal(q.to(torch.float32).abs().amax(), torch.tensor(E4M3_MAX))


@pytest.mark.parametrize("rows, cols", [(256, 384), (200, 130)])
def test_format_draws_and_dequantises_exactly(rows, cols):
    fmt = Fp8BlockWeights()
    parts = fmt.draw((3,), rows, cols, cols ** -0.5, torch.Generator().manual_seed(2), "cpu")
    q, scale = parts[""], parts["_scale"]
    assert q.shape == (3, rows, cols) and q.dtype == FP8
    assert scale.shape == (3, -(-rows // 128), -(-cols // 128))
    deq = fmt.dequantize(parts)
    # q has 4 significant bits and the scale 24: the fp32 product is rounded once (half an ulp).
    torch.testing.assert_close(deq[1].double(), _by_hand(q[1], scale[1]), rtol=2.0 ** -24, atol=0.0)
    assert fmt.nbytes(rows, cols) == rows * cols + 4 * scale.shape[1] * scale.shape[2]
    # Blocks differ in magnitude (so a wrong block's scale shows), about std overall.
    assert scale.max() / scale.min() > 1.5
    assert 0.7 < deq.std().item() * cols ** 0.5 < 1.4


def test_activation_groups_with_a_zero_group_and_a_partial_last_group():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 300, generator=gen) * 3.0
    x[2, 128:256] = 0.0  # an all-zero group
    q, scale = quantize_groups(x)
    assert q.shape == (5, 300) and scale.shape == (5, 3)
    for t in range(5):
        for g in range(3):
            group = x[t, g * 128:(g + 1) * 128]
            assert scale[t, g] == max(group.abs().max().item(), EPS) / E4M3_MAX
    assert scale[2, 1] == torch.tensor(EPS, dtype=torch.float32) / E4M3_MAX
    back = dequantize_groups(q, scale)
    assert torch.equal(back[2, 128:256], torch.zeros(128))
    assert torch.equal(q[:, :128].to(torch.float32), (x[:, :128] / scale[:, :1]).clamp(-448, 448).to(FP8).float())
    full = scale.repeat_interleave(128, dim=1)[:, :300] * E4M3_MAX
    assert ((back - x).abs() <= x.abs() * 2.0 ** -4 + full * 2.0 ** -9).all()
    assert torch.equal(Fp8GroupActivations().round(x), back)


def test_interpreter_fp32_to_e4m3_cast_matches_torch():
    """The baseline quantises in Triton: kernelforge's patched interpreter must cast like the GPU
    (round to nearest even, saturate), i.e. like torch, on every value an activation group makes."""
    import triton
    import triton.language as tl

    from kernelforge.devices import interpreter

    interpreter.enable()

    @triton.jit
    def cast(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(y_ptr + offs, tl.clamp(x, -448.0, 448.0).to(y_ptr.dtype.element_ty), mask=offs < n)

    gen = torch.Generator().manual_seed(4)
    x = torch.cat([torch.randn(4000, generator=gen) * 100.0, torch.randn(4000, generator=gen) * 1e-2,
                   torch.tensor([447.9, 448.0, 460.0, -500.0, 0.0, -0.0, 2.0 ** -9, 3 * 2.0 ** -10])])
    y = torch.empty(x.shape, dtype=FP8)
    cast[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    assert torch.equal(y.view(torch.uint8), x.clamp(-448, 448).to(FP8).view(torch.uint8))
