"""INT4 weights, symmetric, one bf16 scale per group of 32 along the reduction dimension, eight
values packed per int32 word: the ``pack-quantized`` format of compressed-tensors, in which the
Kimi K2 Thinking / K2.5 checkpoints ship their routed experts (``quantization_config``:
quant_method compressed-tensors, format pack-quantized, weights num_bits 4, type int, symmetric,
strategy group, group_size 32; the checkpoint stores ``weight_packed`` int32 [rows, cols / 8] and
``weight_scale`` bf16 [rows, cols / 32]).

The layout, as compressed-tensors writes and reads it (neuralmagic/compressed-tensors, now
vllm-project/compressed-tensors, ``src/compressed_tensors/compressors/quantized_compressors/
pack_quantized.py``, ``pack_to_int32`` / ``unpack_from_int32``, commit 179cba9)::

    nibble(q)   = q + 8                      # a signed value q in [-8, 7] is stored offset by 8,
                                             # as an unsigned nibble 0..15 (not two's complement)
    word[r, w]  = sum_{i<8} nibble(q[r, 8w + i]) << (4 i)    # element j of a row: word j // 8,
                                             # bits 4 (j % 8) .. 4 (j % 8) + 3 (lowest nibble first);
                                             # the sum wraps in int32, so a top nibble >= 8 makes
                                             # the word negative (the bits are what count)
    q[r, j]     = ((word[r, j // 8] >> 4 (j % 8)) & 0xF) - 8
    value[r, j] = q[r, j] * scale[r, j // 32]                # scale bf16; exact in fp32

Quantising (``calculate_qparams`` in ``src/compressed_tensors/quantization/utils/helpers.py``,
symmetric branch): a group's scale is ``amax / ((q_max - q_min) / 2) = amax / 7.5`` (an all-zero
group gets the scale dtype's eps), and ``q = clamp(round(w / scale), -8, 7)`` with round half to
even. We round the scale to bf16 first (the checkpoint's scale dtype) and quantise with that scale.

Our block inputs name the tensors ``<name>`` (the int32 words) and ``<name>_scale`` (bf16), with
any leading dimensions (a stack of experts). ``cols`` must be a multiple of 32: the format has no
partial groups.
"""

from __future__ import annotations

import torch

from kernelforge.block import random_tensor
from kernelforge.quant.base import SCALE, WeightFormat

#: Elements per scale (compressed-tensors ``group_size`` of the Kimi checkpoints).
GROUP = 32
#: 4-bit values per int32 word.
PER_WORD = 8
#: The offset of a stored nibble: nibble = q + 8.
OFFSET = 8
QMIN, QMAX = -8, 7
#: compressed-tensors' symmetric divisor: (q_max - q_min) / 2.
HALF_RANGE = (QMAX - QMIN) / 2.0
#: The scale of an all-zero group (compressed-tensors: the scale dtype's eps).
ZERO_SCALE = torch.finfo(torch.bfloat16).eps


def check_cols(cols: int) -> None:
    """Raise unless ``cols`` (the reduction dimension) is a whole number of groups of 32."""
    if cols % GROUP:
        raise ValueError(f"INT4 group-32 weights need a reduction dimension that is a multiple of {GROUP}; "
                         f"got {cols} (the format has no partial groups)")


def pack(q: torch.Tensor) -> torch.Tensor:
    """int32 words [..., cols / 8] of signed 4-bit values ``q`` [..., cols] (any integer dtype,
    values in [-8, 7]): element j in word j // 8 at bits 4 (j % 8), stored as q + 8."""
    if q.shape[-1] % PER_WORD:
        raise ValueError(f"cannot pack {q.shape[-1]} values into whole int32 words of {PER_WORD}")
    if q.numel() and q.device.type != "meta" and (int(q.min()) < QMIN or int(q.max()) > QMAX):
        raise ValueError(f"INT4 values must lie in [{QMIN}, {QMAX}]")
    nibbles = (q.to(torch.int64) + OFFSET).view(*q.shape[:-1], -1, PER_WORD)
    shifts = torch.arange(PER_WORD, device=q.device, dtype=torch.int64) * 4
    words = (nibbles << shifts).sum(dim=-1)  # 0 .. 2^32 - 1
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack(words: torch.Tensor) -> torch.Tensor:
    """The signed values (int8) [..., 8 * words] of packed ``words`` (int32): the inverse of :func:`pack`."""
    if words.dtype != torch.int32:
        raise ValueError(f"packed INT4 words must be int32, got {words.dtype}")
    shifts = torch.arange(PER_WORD, device=words.device, dtype=torch.int32) * 4
    nibbles = (words[..., None] >> shifts) & 0xF  # arithmetic shift; the mask keeps 4 bits
    return (nibbles - OFFSET).to(torch.int8).reshape(*words.shape[:-1], -1)


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values [..., cols] in [-8, 7], bf16 scales [..., cols / 32]) of ``w`` by the
    compressed-tensors symmetric rule (module docstring), with the scale rounded to bf16 first."""
    check_cols(w.shape[-1])
    grouped = w.to(torch.float32).view(*w.shape[:-1], -1, GROUP)
    scale = (grouped.abs().amax(dim=-1) / HALF_RANGE).to(torch.bfloat16)
    scale = torch.where(scale == 0, torch.full_like(scale, ZERO_SCALE), scale)
    q = torch.round(grouped / scale.to(torch.float32)[..., None]).clamp_(QMIN, QMAX)
    return q.to(torch.int8).view(w.shape), scale


def expand_groups(scale: torch.Tensor) -> torch.Tensor:
    """``scale`` [..., cols / 32] in fp32, one value per element [..., cols]."""
    return scale.to(torch.float32).repeat_interleave(GROUP, dim=-1)


class Int4GroupWeights(WeightFormat):
    """Packed int32 words under the weight's name, bf16 group-32 scales under ``<name>_scale``."""

    label = "int4 symmetric, bf16 scale per 32 (compressed-tensors pack-quantized)"

    def draw(self, lead, rows, cols, std, gen, device):
        """fp32 weights of ``std`` drawn one matrix at a time (on the device for large ones, as
        :func:`kernelforge.block.random_tensor` does), quantised and packed: bounded scratch."""
        check_cols(cols)
        words = torch.empty((*lead, rows, cols // PER_WORD), dtype=torch.int32, device=device)
        scales = torch.empty((*lead, rows, cols // GROUP), dtype=torch.bfloat16, device=device)
        flat_w, flat_s = words.view(-1, *words.shape[-2:]), scales.view(-1, *scales.shape[-2:])
        for i in range(flat_w.shape[0]):
            w = random_tensor((rows, cols), gen, "normal", scale=std, dtype=torch.float32, device=device)
            q, s = quantize(w)
            flat_w[i].copy_(pack(q))
            flat_s[i].copy_(s)
        return {"": words, SCALE: scales}

    def dequantize(self, parts):
        words, scale = parts[""], parts[SCALE]
        q = unpack(words)
        if scale.shape[-1] * GROUP != q.shape[-1]:
            raise ValueError(f"{q.shape[-1]} values need {q.shape[-1] // GROUP} scales per row, got {scale.shape[-1]}")
        return q.to(torch.float32) * expand_groups(scale)

    def nbytes(self, rows, cols):
        check_cols(cols)
        return rows * cols * 0.5 + 2.0 * rows * (cols // GROUP)


__all__ = ["GROUP", "HALF_RANGE", "Int4GroupWeights", "OFFSET", "PER_WORD", "QMAX", "QMIN", "check_cols",
           "expand_groups", "pack", "quantize", "unpack"]
