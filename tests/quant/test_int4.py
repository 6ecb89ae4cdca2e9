"""INT4 group-32 weights (compressed-tensors pack-quantized, Kimi K2.5's routed experts): the nibble
order and offset on hand-written words, exact dequantisation, the quantisation rule, round trips,
byte counts and the errors for shapes the format cannot hold."""

from __future__ import annotations

import pytest
import torch

from kernelforge.quant.base import SCALE
from kernelforge.quant.int4 import GROUP, Int4GroupWeights, pack, quantize, unpack

FORMAT = Int4GroupWeights()


def _row(values):
    """A [1, 32] int row: ``values`` then zeros."""
    return torch.tensor([list(values) + [0] * (GROUP - len(values))])


def test_element_j_is_nibble_j_mod_8_of_word_j_div_8_stored_plus_8():
    # Elements 0..7 = -8, -7, 0, 1, 2, 3, 4, 7 -> nibbles 0, 1, 8, 9, a, b, c, f, lowest first.
    words = pack(_row([-8, -7, 0, 1, 2, 3, 4, 7]))
    assert words.dtype == torch.int32 and words.shape == (1, 4)
    assert int(words[0, 0]) & 0xFFFFFFFF == 0xFCBA9810
    # A word of zeros is eight nibbles of 8; the top nibble >= 8 makes the int32 negative.
    assert int(words[0, 1]) == 0x88888888 - 2**32


def test_hand_written_words_unpack_in_order():
    words = torch.tensor([[0x76543210, 0x0123456F]], dtype=torch.int64)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    q = unpack(words)
    assert q.tolist() == [[-8, -7, -6, -5, -4, -3, -2, -1, 7, -2, -3, -4, -5, -6, -7, -8]]
    assert q.dtype == torch.int8


def test_element_at_word_boundary_and_high_nibble():
    q = torch.zeros(1, GROUP, dtype=torch.int8)
    q[0, 7], q[0, 8], q[0, 31] = 7, -8, -1  # last nibble of word 0, first of word 1, last of word 3
    words = pack(q)
    assert (int(words[0, 0]) & 0xFFFFFFFF) >> 28 == 7 + 8
    assert int(words[0, 1]) & 0xF == 0
    assert (int(words[0, 3]) & 0xFFFFFFFF) >> 28 == 7
    assert torch.equal(unpack(words), q)


def test_pack_unpack_round_trip_all_values():
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-8, 8, (5, 3, 96), generator=gen, dtype=torch.int8)
    assert torch.equal(unpack(pack(q)), q)


def test_dequantize_is_q_times_the_groups_bf16_scale_exactly():
    q = torch.randint(-8, 8, (2, 64), generator=torch.Generator().manual_seed(1), dtype=torch.int8)
    scale = torch.tensor([[0.5, 3.0], [1.0078125, 0.01]], dtype=torch.bfloat16)
    values = FORMAT.dequantize({"": pack(q), SCALE: scale})
    assert values.dtype == torch.float32
    for r in range(2):
        for j in range(64):
            assert float(values[r, j]) == int(q[r, j]) * float(scale[r, j // GROUP])


def test_quantize_is_the_compressed_tensors_symmetric_rule():
    w = torch.zeros(1, GROUP)
    w[0, :4] = torch.tensor([1.5, -1.5, 0.1, 0.7])
    q, scale = quantize(w)
    assert float(scale[0, 0]) == float(torch.tensor(1.5 / 7.5, dtype=torch.bfloat16))  # amax / 7.5, in bf16
    s = float(scale[0, 0])
    assert q[0, :4].tolist() == [min(round(1.5 / s), 7), max(round(-1.5 / s), -8), round(0.1 / s), round(0.7 / s)]
    assert q.dtype == torch.int8 and scale.dtype == torch.bfloat16
    # An all-zero group gets a finite positive scale and zero values.
    q0, s0 = quantize(torch.zeros(2, GROUP))
    assert (q0 == 0).all() and (s0 > 0).all()


def test_round_trip_error_is_within_half_a_step():
    w = torch.randn(8, 128, generator=torch.Generator().manual_seed(2))
    q, scale = quantize(w)
    back = FORMAT.dequantize({"": pack(q), SCALE: scale})
    step = scale.to(torch.float32).repeat_interleave(GROUP, dim=-1)
    # The clamp at +7 (amax maps to 7.5 steps) costs up to one step; everything else half a step.
    assert ((back - w).abs() <= step * 1.0001).all()
    assert ((back - w).abs() <= step * 0.5001).float().mean() > 0.9


def test_draw_shapes_dtypes_std_and_seed():
    parts = FORMAT.draw((3,), 64, 96, 0.05, torch.Generator().manual_seed(4), "cpu")
    assert parts[""].shape == (3, 64, 12) and parts[""].dtype == torch.int32
    assert parts[SCALE].shape == (3, 64, 3) and parts[SCALE].dtype == torch.bfloat16
    values = FORMAT.dequantize(parts)
    assert values.shape == (3, 64, 96)
    assert 0.04 < float(values.std()) < 0.06
    again = FORMAT.draw((3,), 64, 96, 0.05, torch.Generator().manual_seed(4), "cpu")
    assert torch.equal(again[""], parts[""]) and torch.equal(again[SCALE], parts[SCALE])
    # One expert's slice dequantises alike.
    assert torch.equal(FORMAT.dequantize({k: v[1] for k, v in parts.items()}), values[1])


def test_nbytes_counts_half_a_byte_per_value_and_the_scales():
    assert FORMAT.nbytes(4096, 7168) == 4096 * 7168 / 2 + 2 * 4096 * 7168 / 32


def test_columns_must_be_whole_groups():
    with pytest.raises(ValueError, match="multiple of 32"):
        FORMAT.draw((), 8, 48, 0.1, torch.Generator().manual_seed(0), "cpu")
    with pytest.raises(ValueError, match="multiple of 32"):
        FORMAT.nbytes(8, 100)
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize(torch.zeros(2, 40))


def test_bad_values_and_dtypes_are_refused():
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        pack(_row([8]))
    with pytest.raises(ValueError, match="int32"):
        unpack(torch.zeros(1, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="scales"):
        FORMAT.dequantize({"": torch.zeros(1, 8, dtype=torch.int32), SCALE: torch.ones(1, 1, dtype=torch.bfloat16)})
