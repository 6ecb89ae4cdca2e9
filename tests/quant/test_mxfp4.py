"""kernelforge.quant.mxfp4: the e2m1 table, nibble order, exact dequantisation, the OCP quantiser, the
byte counts, and the acceptance test of issue 12: the MXFP4 block's reference agrees with a plain
dequantise-then-matmul in fp64 whose nibbles are unpacked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from kernelforge.quant import mxfp4
from kernelforge.quant.mxfp4 import GROUP, Mxfp4Weights, ScaleRounding, dequantize, pack_codes, quantize, unpack_codes
from kernel_helpers import load_block_module


def test_e2m1_table_is_sign_exponent_mantissa():
    """Each code's value from its bits: sign 3, exponent 2-1 (bias 1, 0 subnormal), mantissa 0."""
    for code in range(16):
        sign = -1.0 if code & 8 else 1.0
        e, m = (code >> 1) & 3, code & 1
        magnitude = m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2)
        assert mxfp4.E2M1_VALUES[code] == sign * magnitude
        assert math.copysign(1.0, mxfp4.E2M1_VALUES[code]) == sign  # code 8 is -0
    assert mxfp4.E2M1_VALUES[:8] == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def test_nibble_order_with_hand_written_bytes():
    # 0x21: low nibble 1 (0.5) is element 0, high nibble 2 (1.0) element 1; 0xF7: 6.0 then -6.0;
    # 0x80: +0 then -0; 0x3C: -2.0 then 1.5.
    packed = torch.tensor([[0x21, 0xF7, 0x80, 0x3C] + [0] * 12], dtype=torch.uint8)
    assert unpack_codes(packed)[0, :8].tolist() == [1, 2, 7, 15, 0, 8, 12, 3]
    assert torch.equal(pack_codes(unpack_codes(packed)), packed)
    values = dequantize(packed, torch.tensor([[127]], dtype=torch.uint8))
    assert values[0, :8].tolist() == [0.5, 1.0, 6.0, -6.0, 0.0, -0.0, -2.0, 1.5]
    assert math.copysign(1.0, values[0, 5].item()) == -1.0
    assert torch.equal(values[0, 8:], torch.zeros(24))


@pytest.mark.parametrize("scale", [1, 100, 120, 127, 128, 140, 200, 252])
def test_dequantize_is_exact_on_every_code(scale):
    """Every code pair in a byte (all 256 bytes = 16 groups of 32 elements) at one scale: exactly
    e2m1 * 2^(s - 127), in fp32 and fp64."""
    packed = torch.arange(256, dtype=torch.uint8).reshape(1, 256)
    scales = torch.full((1, 16), scale, dtype=torch.uint8)
    expected = [math.ldexp(mxfp4.E2M1_VALUES[c], scale - 127) for b in range(256) for c in (b & 15, b >> 4)]
    for dtype in (torch.float32, torch.float64):
        got = dequantize(packed, scales, dtype)
        assert got.dtype == dtype and got[0].tolist() == expected


def test_each_group_uses_its_own_scale_and_255_is_nan():
    packed = torch.full((2, 32), 0x22, dtype=torch.uint8)  # every element 1.0
    scales = torch.tensor([[127, 130], [0, 255]], dtype=torch.uint8)
    got = dequantize(packed, scales)
    assert (got[0, :32] == 1.0).all() and (got[0, 32:] == 8.0).all()
    assert (got[1, :32] == 2.0**-127).all() and got[1, 32:].isnan().all()  # 2^-127: an fp32 subnormal
    with pytest.raises(ValueError, match="do not match"):
        dequantize(packed, scales[:, :1])
    with pytest.raises(TypeError):
        dequantize(packed, scales.to(torch.int32))


def test_round_trip_of_representable_values():
    """Values with one group exponent come back exactly (both scale rules), and so do their codes
    when the group's largest magnitude is 4 or 6 (the OCP exponent is then the group's own)."""
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (6, 64), generator=gen, dtype=torch.uint8)
    codes[:, 0] = 7  # 6.0: the largest magnitude in the first group
    codes[:, 32] = 14  # -4.0 in the second
    packed = pack_codes(codes)
    scales = torch.randint(100, 150, (6, 2), generator=gen, dtype=torch.uint8)
    w = dequantize(packed, scales)
    for rounding in ScaleRounding:
        c, s = quantize(w, rounding)
        assert torch.equal(dequantize(c, s), w), rounding
    c, s = quantize(w)
    assert torch.equal(c, packed) and torch.equal(s, scales)


def test_quantize_uses_the_ocp_exponent_and_rounds_to_nearest_even():
    # amax 5.0 -> floor(log2 5) - 2 = 0: scale byte 127; elements round to the nearest e2m1 value,
    # ties to the even code (0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 2.5 -> 2.0, 5.0 -> 4.0),
    # 5.1 -> 6.0, and the sign is kept.
    row = [5.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, -5.1, 0.3, -0.74] + [0.0] * 22
    c, s = quantize(torch.tensor([row]))
    assert s.tolist() == [[127]]
    got = dequantize(c, s)[0, :10].tolist()
    assert got == [4.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, -6.0, 0.5, -0.5]
    # OCP saturates: amax 7.9 gives exponent 0 and 7.9 -> 6; triton_kernels' UP rule gives 2^1 (7.9/6 > 1).
    big = torch.tensor([[7.9] + [1.0] * 31])
    assert quantize(big)[1].item() == 127 and dequantize(*quantize(big))[0, 0].item() == 6.0
    assert quantize(big, ScaleRounding.UP)[1].item() == 128
    assert quantize(torch.zeros(1, 32))[1].item() == 0
    with pytest.raises(ValueError):
        quantize(torch.zeros(1, 48))
    with pytest.raises(ValueError):
        quantize(torch.tensor([[math.nan] * 32]))


def test_quantisation_error_is_half_a_gap_or_saturation():
    """Within +-6 units of the group's power of two the error is at most half the widest e2m1 gap
    (4 -> 6: one unit); beyond it (OCP's exponent leaves amax in [4, 8) units) values saturate to +-6."""
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    c, s = quantize(w)
    unit = mxfp4.scale_values(s).unsqueeze(-1)
    got, w = dequantize(c, s).unflatten(-1, (-1, GROUP)), w.unflatten(-1, (-1, GROUP))
    inside = w.abs() <= 6 * unit
    assert ((got - w).abs() <= unit)[inside].all()
    assert (got == torch.sign(w) * 6 * unit)[~inside].all() and (~inside).any()


def test_byte_counts_and_drawn_weights():
    assert mxfp4.BYTES_PER_ELEMENT == 0.5 + 1 / 32
    fmt = Mxfp4Weights()
    assert fmt.nbytes(5760, 2880) == 5760 * 2880 / 2 + 5760 * 2880 / 32
    gen = torch.Generator().manual_seed(3)
    parts = fmt.draw((4,), 96, 160, 0.05, gen, "cpu")
    assert parts[""].shape == (4, 96, 80) and parts["_scale"].shape == (4, 96, 5)
    assert parts[""].dtype == parts["_scale"].dtype == torch.uint8
    w = fmt.dequantize(parts)
    assert 0.05 / 1.3 < w.std().item() < 0.05 * 1.3
    assert len(parts["_scale"].unique()) >= 3  # neighbouring groups differ
    again = fmt.draw((4,), 96, 160, 0.05, torch.Generator().manual_seed(3), "cpu")
    assert all(torch.equal(parts[k], again[k]) for k in parts)
    with pytest.raises(ValueError):
        fmt.draw((1,), 8, 48, 0.1, gen, "cpu")


# -- acceptance: the quantised reference against a straightforward fp64 dequantise-then-matmul -------


def _load_block():
    return load_block_module("moe/gpt_oss_experts_mxfp4").GptOssExpertsMxfp4("moe/gpt_oss_experts_mxfp4")


def _by_hand(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp64 [rows, 2 * bytes]: every byte's nibbles unpacked with Python ints, low nibble first."""
    rows, nbytes = codes.shape
    out = torch.empty(rows, 2 * nbytes, dtype=torch.float64)
    for r in range(rows):
        for j, byte in enumerate(codes[r].tolist()):
            for half, nibble in enumerate((byte & 0xF, byte >> 4)):
                k = 2 * j + half
                out[r, k] = math.ldexp(mxfp4.E2M1_VALUES[nibble], int(scales[r, k // 32]) - 127)
    return out


def test_reference_agrees_with_fp64_dequantise_then_matmul():
    block = _load_block()
    shape = next(s for s in block.shapes("check") if s.name == "check/T7-skewed")
    inputs = block.make_inputs(shape, torch.bfloat16, "cpu", seed=5)
    ref = block.reference(**inputs)
    x, ids, tw = inputs["x"].double(), inputs["topk_ids"], inputs["topk_weights"].double()
    T, H = x.shape
    naive = torch.zeros(T, H, dtype=torch.float64)
    for e in sorted(set(ids.flatten().tolist())):
        w1 = _by_hand(inputs["w1"][e], inputs["w1_scale"][e])
        w2 = _by_hand(inputs["w2"][e], inputs["w2_scale"][e])
        for t in range(T):
            for k in range(ids.shape[1]):
                if int(ids[t, k]) != e:
                    continue
                h = w1 @ x[t] + inputs["b1"][e].double()
                glu, lin = h[0::2].clamp(max=7.0), h[1::2].clamp(-7.0, 7.0)
                a = glu * torch.sigmoid(1.702 * glu) * (lin + 1.0)
                naive[t] += tw[t, k] * (w2 @ a + inputs["b2"][e].double())
    assert ((ref.double() - naive).norm() / naive.norm()).item() < 1e-6
    assert torch.allclose(ref.double(), naive, rtol=1e-5, atol=1e-5 * naive.abs().max().item())
