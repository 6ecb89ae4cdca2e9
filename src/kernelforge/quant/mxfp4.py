"""MXFP4: OCP microscaling FP4 weights (e2m1 values, one e8m0 scale per 32 elements), as GPT-OSS ships
its MoE experts.

The format (OCP Microscaling Formats (MX) v1.0; openai/gpt-oss ``gpt_oss/torch/weights.py`` at commit
1983a9d, ``FP4_VALUES`` and ``_get_mxfp4_tensor``; huggingface/transformers
``src/transformers/integrations/mxfp4.py`` ``convert_moe_packed_tensors``):

- A code is 4 bits, e2m1: sign (bit 3), a 2-bit exponent (bits 2-1, bias 1), a 1-bit mantissa (bit 0).
  Codes 0..7 are +0, 0.5, 1, 1.5, 2, 3, 4, 6 and codes 8..15 the same values negated (8 is -0).
- Every 32 consecutive elements along the reduction dimension (a *group*) share one scale byte ``s``,
  e8m0: the value of an element is ``e2m1(code) * 2**(s - 127)``. ``s = 255`` is NaN (OCP).
- Two codes per byte, the LOW nibble holding the even element: byte ``b`` at index ``j`` of a row
  holds elements ``2j`` (``b & 0xF``) and ``2j + 1`` (``b >> 4``).

The published checkpoint (openai/gpt-oss-120b, -20b, Hugging Face layout; transformers'
``Mxfp4GptOssExperts``) stores ``gate_up_proj_blocks [E, 2I, H/32, 16]`` uint8,
``gate_up_proj_scales [E, 2I, H/32]`` uint8, ``gate_up_proj_bias [E, 2I]`` bf16 and
``down_proj_blocks [E, H, I/32, 16]``, ``down_proj_scales [E, H, I/32]``, ``down_proj_bias [E, H]``.
Here a matrix ``[rows, cols]`` (``cols`` the reduction dimension) is stored as that layout with the
last two dimensions of the blocks flattened: codes ``[rows, cols/2]`` uint8 and scales
``[rows, cols/32]`` uint8, which is also vLLM's ``w13_weight``/``w13_weight_scale`` layout
(``vllm/model_executor/layers/quantization/mxfp4.py``, ``Mxfp4MoEMethod.create_weights``).

Quantisation (:func:`quantize`) follows the OCP rule by default: a group's shared exponent is
``floor(log2(amax)) - 2`` (2 is the largest exponent of e2m1), elements are divided by the power of
two and rounded to the nearest e2m1 value, ties to even, saturating at +-6. triton_kernels'
``downcast_to_mxfp_torch`` calls this ``DequantScaleRoundingMode.ROUND_DOWN``; its default,
``ROUND_UP`` (``2**ceil(log2(amax / 6))``, never clips), is :attr:`ScaleRounding.UP`
(triton-lang/triton ``python/triton_kernels/triton_kernels/numerics_details/mxfp.py``, commit 018a674).
"""

from __future__ import annotations

import math
from enum import Enum

import torch

from kernelforge.block import DEVICE_DRAW_MIN_ELEMENTS
from kernelforge.quant.base import SCALE, WeightFormat

#: Elements per scale group (along the reduction dimension).
GROUP = 32
#: The exponent bias of an e8m0 scale byte.
E8M0_BIAS = 127
#: The e8m0 byte that encodes NaN.
E8M0_NAN = 255
#: The values of the 16 e2m1 codes.
E2M1_VALUES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                  -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
#: The largest e2m1 magnitude, and the exponent of the largest power of two not above it.
E2M1_MAX = 6.0
E2M1_EMAX = 2
#: Root mean square of the e2m1 values over uniformly random codes: sqrt(68.5 / 8).
E2M1_RMS = math.sqrt(sum(v * v for v in E2M1_VALUES) / 16.0)
#: Storage per element: half a byte of code, and a 32nd of a scale byte.
CODE_BYTES_PER_ELEMENT = 0.5
SCALE_BYTES_PER_ELEMENT = 1.0 / GROUP
BYTES_PER_ELEMENT = CODE_BYTES_PER_ELEMENT + SCALE_BYTES_PER_ELEMENT

# Midpoints between neighbouring e2m1 magnitudes, and whether a tie there rounds up (to the even code).
_MIDPOINTS: tuple[tuple[float, bool], ...] = (
    (0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


class ScaleRounding(Enum):
    """How :func:`quantize` picks a group's shared exponent from its largest magnitude ``amax``."""

    #: OCP: ``floor(log2(amax)) - 2``; values above 6 * 2**e saturate to +-6.
    OCP = "ocp"
    #: triton_kernels' default: ``ceil(log2(amax / 6))`` (no element saturates).
    UP = "up"


def e2m1_table(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> torch.Tensor:
    """The 16 e2m1 values, indexed by code."""
    return torch.tensor(E2M1_VALUES, dtype=dtype, device=device)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """Codes ``[..., 2n]`` (uint8, 0..15) of packed bytes ``[..., n]``: low nibble first."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed codes must be uint8, not {packed.dtype}")
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """Bytes ``[..., n]`` of codes ``[..., 2n]`` (0..15): element 2j in the low nibble of byte j."""
    if codes.shape[-1] % 2:
        raise ValueError(f"an even number of codes is needed along the last dimension, not {codes.shape[-1]}")
    pairs = codes.to(torch.uint8).unflatten(-1, (-1, 2))
    return pairs[..., 0] | (pairs[..., 1] << 4)


def scale_values(scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``2**(s - 127)`` of e8m0 bytes ``s`` (NaN for 255), exactly (2**-127 is an fp32 subnormal)."""
    table = torch.tensor([math.ldexp(1.0, s - E8M0_BIAS) for s in range(256)], dtype=torch.float64)
    table[E8M0_NAN] = math.nan
    return table.to(dtype=dtype, device=scales.device)[scales.to(torch.int64)]


def dequantize(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values ``[..., K]`` of packed codes ``[..., K/2]`` and scales ``[..., K/32]`` (uint8).

    Exact: an e2m1 value times a power of two is a product of two ``dtype`` numbers that is itself
    representable, except that fp32 overflows to inf for values of 2**128 and above (scale bytes
    253 and 254 with large codes); ``dtype=torch.float64`` holds every MXFP4 value.
    """
    if scales.dtype != torch.uint8:
        raise TypeError(f"scales must be uint8 (e8m0), not {scales.dtype}")
    k = codes.shape[-1] * 2
    if scales.shape[-1] * GROUP != k or scales.shape[:-1] != codes.shape[:-1]:
        raise ValueError(f"codes {tuple(codes.shape)} and scales {tuple(scales.shape)} do not match: "
                         f"one scale per {GROUP} elements ({GROUP // 2} bytes) of the same rows")
    values = e2m1_table(dtype, codes.device)[unpack_codes(codes).to(torch.int64)]
    groups = values.unflatten(-1, (-1, GROUP)) * scale_values(scales, dtype).unsqueeze(-1)
    return groups.flatten(-2)


def _e2m1_codes(q: torch.Tensor) -> torch.Tensor:
    """Codes of ``q`` (fp32, already divided by the group's power of two): nearest e2m1, ties to
    the even code, magnitudes above 6 saturate; the sign bit follows the sign of ``q``."""
    a = q.abs()
    magnitude = torch.zeros(q.shape, dtype=torch.uint8, device=q.device)
    for midpoint, tie_up in _MIDPOINTS:
        magnitude += (a >= midpoint if tie_up else a > midpoint).to(torch.uint8)
    return magnitude | (torch.signbit(q).to(torch.uint8) << 3)


def quantize(w: torch.Tensor, rounding: ScaleRounding = ScaleRounding.OCP) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed codes ``[..., K/2]``, e8m0 scales ``[..., K/32]``) of ``w`` ``[..., K]`` (K a multiple of
    32), grouped along the last dimension.

    The shared exponent ``e`` of a group comes from its largest magnitude ``amax`` by ``rounding``
    (module docstring) and is clamped to the e8m0 range [-127, 127]; an all-zero group gets scale
    byte 0. Elements become ``round_e2m1(w / 2**e)``. A value already representable in MXFP4 with
    that group exponent comes back exactly. NaN or inf in ``w`` is an error.
    """
    if w.shape[-1] % GROUP:
        raise ValueError(f"the last dimension ({w.shape[-1]}) must be a multiple of {GROUP}")
    w32 = w.to(torch.float32)
    if not torch.isfinite(w32).all():
        raise ValueError("cannot quantise NaN or inf")
    groups = w32.unflatten(-1, (-1, GROUP))
    amax = groups.abs().amax(dim=-1)
    if rounding is ScaleRounding.OCP:
        _, exponent = torch.frexp(amax)  # amax = m * 2**exponent, m in [0.5, 1): floor(log2) = exponent - 1
        shared = exponent.to(torch.int32) - 1 - E2M1_EMAX
    else:
        # triton_kernels: amax / 6 in fp32, rounded up to a power of two on its bits.
        bits = (amax / E2M1_MAX).view(torch.int32)
        shared = (((bits + 0x007FFFFF) & 0x7F800000) >> 23) - E8M0_BIAS
    scales = torch.where(amax > 0, shared + E8M0_BIAS, torch.zeros_like(shared)).clamp(0, 254).to(torch.uint8)
    q = groups / scale_values(scales).unsqueeze(-1)
    return pack_codes(_e2m1_codes(q).flatten(-2)), scales


def _draw_generator(gen: torch.Generator, numel: int, device: torch.device) -> tuple[torch.Generator, torch.device]:
    # As kernelforge.block.random_tensor: large tensors bound for a GPU are drawn there.
    if device.type != "cpu" and numel >= DEVICE_DRAW_MIN_ELEMENTS:
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        device_gen = torch.Generator(device=device)
        device_gen.manual_seed(seed)
        return device_gen, device
    return gen, torch.device("cpu")


#: The spread of the scale exponents :meth:`Mxfp4Weights.draw` adds around the target: -1, 0 or +1.
#: The mean of 4**d over the three is 1.75, which the base exponent compensates.
_SPREAD = (-1, 0, 1)
_SPREAD_POWER = sum(4.0**d for d in _SPREAD) / len(_SPREAD)


class Mxfp4Weights(WeightFormat):
    """Packed e2m1 codes under the weight's name (``[..., rows, cols/2]`` uint8) and e8m0 scales
    under ``<name>_scale`` (``[..., rows, cols/32]`` uint8); ``cols`` must be a multiple of 32."""

    label = "mxfp4 (e2m1, e8m0 scale per 32)"

    def draw(self, lead, rows, cols, std, gen, device):
        """Codes uniformly random (both nibbles of every byte), and per group the scale exponent
        ``floor(L + u) + d`` with ``u`` uniform in [0, 1), ``d`` in {-1, 0, 1} and ``L`` the exponent
        at which e2m1 values of RMS :data:`E2M1_RMS` have RMS ``std`` (compensated for the spread):
        the values have about ``std`` RMS (within 12%), neighbouring groups have different scales,
        and scale bytes stay far from 0 and 255. Drawn directly, one matrix at a time; on a GPU large
        tensors are drawn there (as :func:`kernelforge.block.random_tensor`)."""
        if cols % GROUP:
            raise ValueError(f"MXFP4 needs a reduction dimension that is a multiple of {GROUP}, not {cols}")
        device = torch.device(device)
        level = math.log2(std / E2M1_RMS) - 0.5 * math.log2(_SPREAD_POWER)
        codes = torch.empty((*lead, rows, cols // 2), dtype=torch.uint8, device=device)
        scales = torch.empty((*lead, rows, cols // GROUP), dtype=torch.uint8, device=device)
        flat_codes, flat_scales = codes.view(-1, rows, cols // 2), scales.view(-1, rows, cols // GROUP)
        for i in range(flat_codes.shape[0]):
            draw_gen, on = _draw_generator(gen, rows * cols // 2, device)
            flat_codes[i].copy_(torch.randint(0, 256, (rows, cols // 2), generator=draw_gen, device=on,
                                              dtype=torch.uint8))
            shape = (rows, cols // GROUP)
            u = torch.rand(shape, generator=draw_gen, device=on)
            d = torch.randint(len(_SPREAD), shape, generator=draw_gen, device=on) + _SPREAD[0]
            exponent = torch.floor(level + u).to(torch.int64) + d
            flat_scales[i].copy_((exponent + E8M0_BIAS).clamp(1, 254).to(torch.uint8))
        return {"": codes, SCALE: scales}

    def dequantize(self, parts):
        return dequantize(parts[""], parts[SCALE])

    def nbytes(self, rows, cols):
        return BYTES_PER_ELEMENT * rows * cols


__all__ = [
    "BYTES_PER_ELEMENT", "CODE_BYTES_PER_ELEMENT", "E2M1_MAX", "E2M1_RMS", "E2M1_VALUES", "E8M0_BIAS",
    "E8M0_NAN", "GROUP", "Mxfp4Weights", "SCALE_BYTES_PER_ELEMENT", "ScaleRounding", "dequantize",
    "e2m1_table", "pack_codes", "quantize", "scale_values", "unpack_codes",
]
