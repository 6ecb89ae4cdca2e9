"""Byte-level helpers and exact comparison work for every shape and dtype (v1's fingerprint
crashed on bf16/fp16 outputs with an odd last dimension: "must be divisible by 4 to view Byte as
Int"; v2's summed-bytes digest missed a change to a transposed fp16 tensor whose bytes kept their
sum, so the defenses compare bytes exactly and keep no digest)."""

from __future__ import annotations

import math

import pytest
import torch

from kernelforge.block import TOLERANCES, HarnessError
from kernelforge.execute.judge.compare import check, check_reference_spread, compare_exact
from kernelforge.execute.judge.fingerprint import bits_equal, poison, poison_value, raw_bytes

_DRAW = torch.Generator().manual_seed(0)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_DRAW)


CASES = {
    "bf16 2x5": _randn(2, 5).to(torch.bfloat16),
    "fp16 2x3": _randn(2, 3).to(torch.float16),
    "fp16 odd bytes": _randn(7).to(torch.float16),
    "fp32 0-d": torch.tensor(1.5),
    "bf16 0-d": torch.tensor(1.5, dtype=torch.bfloat16),
    "bf16 offset view": _randn(11).to(torch.bfloat16)[1:9].view(2, 4),
    "fp16 transposed": _randn(3, 5).to(torch.float16).t(),
    "int32": torch.arange(6, dtype=torch.int32).view(2, 3),
    "int64": torch.arange(5, dtype=torch.int64),
    "int8 odd": torch.arange(7, dtype=torch.int8),
    "uint8": torch.arange(3, dtype=torch.uint8),
    "bool": torch.tensor([True, False, True]),
    "empty": torch.empty(0, 4, dtype=torch.bfloat16),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fingerprint_and_bit_equality_work_for_every_shape_and_dtype(name):
    tensor = CASES[name]
    assert raw_bytes(tensor).numel() == tensor.numel() * tensor.element_size()
    assert bits_equal(tensor, tensor.clone())
    if tensor.numel():
        changed = tensor.clone()
        first = (0,) * changed.dim()
        changed[first] = ~changed[first] if tensor.dtype == torch.bool else changed[first] + 1
        assert not bits_equal(tensor, changed)


def test_a_change_that_keeps_the_bytes_sum_is_still_seen():
    """The change v2's summed digest missed: 1.0 -> 2.0 in fp16 is 0x3C00 -> 0x4000, bytes
    (0x00, 0x3C) -> (0x00, 0x40); with a second value moved down by the same 4 the byte sum holds."""
    before = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float16).view(3, 1).t()
    after = before.clone()
    after[0, 0], after[0, 1] = 2.0, 1.0
    assert raw_bytes(before).sum() == raw_bytes(after).sum()
    assert not bits_equal(before, after)


def test_bit_equality_tells_nan_payloads_and_dtypes_apart():
    a = torch.full((3,), math.nan)
    assert bits_equal(a, a.clone()) and not torch.equal(a, a.clone())
    assert not bits_equal(a, a.to(torch.float16))
    assert not bits_equal(torch.zeros(2, 3), torch.zeros(3, 2))


def test_poison_is_nan_or_a_sentinel_no_result_holds():
    assert math.isnan(poison_value(torch.bfloat16))
    assert poison_value(torch.int32) == torch.iinfo(torch.int32).min
    assert poison_value(torch.uint8) == 255
    flags = torch.empty(4, dtype=torch.bool)
    poison(flags)
    assert set(flags.view(torch.uint8).tolist()) == {0xFF}
    # A bool output left poisoned never passes, though its elements read as True.
    assert compare_exact(flags, torch.ones(4, dtype=torch.bool))[2]
    ints = torch.empty(3, dtype=torch.int64)
    poison(ints)
    assert (ints == torch.iinfo(torch.int64).min).all()


def test_integer_outputs_are_compared_exactly():
    ref = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    assert check(ref.clone(), ref, TOLERANCES[torch.float16]) == (0.0, 0.0, "")
    off = ref.clone()
    off[1, 0] += 1
    rel, excess, problem = check(off, ref, TOLERANCES[torch.bfloat16])
    assert math.isinf(rel) and math.isinf(excess)
    assert problem == "1 of 4 elements differ (first at index (1, 0): 1 instead of 0)"


def test_the_spread_check_is_for_floating_point_references_only():
    check_reference_spread(torch.zeros(8, dtype=torch.int32), "toy")  # a constant count is fine
    with pytest.raises(HarnessError, match="nearly constant"):
        check_reference_spread(torch.ones(8), "toy")
