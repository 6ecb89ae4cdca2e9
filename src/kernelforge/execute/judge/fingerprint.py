"""Byte-level views of tensors for the defenses: raw bytes, bitwise equality, and poison.

Everything here works on the raw bytes of a tensor flattened first, so it holds for every shape
and dtype: 0-d tensors, odd last dimensions of 2-byte dtypes, integer and bool tensors, transposed
views and views with a storage offset. Comparisons are exact byte for byte, never a digest: a
summed checksum of bytes collides (adding 1 to an fp16 value can keep its bytes' sum), and a
candidate that knew the digest could write results that match it.
"""

from __future__ import annotations

import math

import torch


def raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``tensor`` as a flat uint8 tensor (a copy only if it is not contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact equality of shape, dtype and bytes (NaN payloads included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(raw_bytes(a), raw_bytes(b))


def poison_value(dtype: torch.dtype) -> float | int | None:
    """What an unwritten output of ``dtype`` holds: NaN for floating point, the minimum of a
    signed integer type and the maximum of an unsigned one (values a real result rarely holds;
    integer outputs are compared exactly, so any leftover shows). None for bool (see
    :func:`poison`)."""
    if dtype.is_floating_point or dtype.is_complex:
        return math.nan
    if dtype == torch.bool:
        return None
    info = torch.iinfo(dtype)
    return info.min if info.min < 0 else info.max


def poison(tensor: torch.Tensor) -> None:
    """Fill ``tensor`` with :func:`poison_value` of its dtype. A bool tensor gets the byte 0xFF
    in every element, which is neither True (1) nor False (0) byte for byte: bool outputs are
    compared on their bytes, so an unwritten one never passes."""
    value = poison_value(tensor.dtype)
    if value is None:
        tensor.view(torch.uint8).fill_(0xFF)
    else:
        tensor.fill_(value)


def poisoned_count(tensor: torch.Tensor) -> torch.Tensor:
    """How many elements of ``tensor`` still hold :func:`poison` (an int64 scalar on its device,
    with no host synchronisation): NaN for floating point (a result never holds NaN: it fails
    verification), the integer sentinel, the byte 0xFF of a bool."""
    value = poison_value(tensor.dtype)
    if value is None:
        return (tensor.view(torch.uint8) == 0xFF).sum(dtype=torch.int64)
    if isinstance(value, float):
        # fp8 has no isnan on every device: widen it first (a small tensor, outside timing).
        return torch.isnan(tensor.float() if tensor.element_size() == 1 else tensor).sum(dtype=torch.int64)
    return (tensor == value).sum(dtype=torch.int64)


def synchronize(device: torch.device) -> None:
    """Wait for all work on ``device`` (every stream), where there is asynchronous work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def poison_free_memory(device: torch.device, sizes: list[int]) -> None:
    """Fill memory the allocator will hand out next with NaN bit patterns (0xFF bytes are NaN in
    fp16, bf16 and fp32), so a candidate's torch.empty sees NaN rather than a stale result.

    ``sizes`` are the byte sizes of the call's outputs. On a GPU, one large block of the caching
    allocator. On the CPU, glibc's malloc hands back the most recently freed chunk of a size class
    first, so freeing poisoned buffers of the sizes a candidate is likely to ask for (each output
    in its own dtype, in fp32 and in fp64: the sizes of the harness's own temporaries holding
    reference values) makes its next torch.empty of that size poisoned (measured: the freed chunk
    is reused for sizes of about 1 KB and up; the first 16 bytes hold malloc's free-list pointers).
    """
    if device.type == "cuda":
        junk = torch.empty(max(4 * sum(sizes), 1 << 20), dtype=torch.uint8, device=device)
        junk.fill_(0xFF)
        del junk
        return
    for size in sorted({s * k for s in sizes for k in (1, 2, 4)}):
        if size > 0:
            junk = torch.empty(size, dtype=torch.uint8, device=device)
            junk.fill_(0xFF)
            del junk
