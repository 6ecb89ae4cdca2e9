"""FP8 e4m3 weights with 128x128 block scales, and activations quantised per token in groups of 128:
the format of the DeepSeek-V3/R1 checkpoints as DeepSeek, vLLM and SGLang serve them.

- Weights (``quantization_config`` of the DeepSeek-V3 ``config.json``: ``fmt`` e4m3,
  ``weight_block_size`` [128, 128]; deepseek-ai/DeepSeek-V3 ``inference/kernel.py``
  ``weight_dequant``): a matrix ``[rows, cols]`` is stored as ``torch.float8_e4m3fn`` values and an
  fp32 scale per 128 x 128 block, ``scale [ceil(rows/128), ceil(cols/128)]``; the value of element
  (r, c) is ``q[r, c] * scale[r // 128, c // 128]`` (in fp32: rounded once, as the kernels' fp32
  scaling rounds it). Blocks at the edges may be partial.
- Activations (``act_quant`` there; vLLM ``per_token_group_quant_fp8``): each token's features in
  groups of 128 share one fp32 scale ``max(amax, 1e-10) / 448`` and are stored as
  ``clamp(x / scale, -448, 448)`` in e4m3 (round to nearest even).
"""

from __future__ import annotations

import math

import torch

from kernelforge.block import random_tensor
from kernelforge.quant.base import SCALE, ActivationFormat, WeightFormat

#: Weight block and activation group size of the DeepSeek format.
BLOCK = 128
#: The largest finite e4m3 (``torch.finfo(torch.float8_e4m3fn).max``).
E4M3_MAX = 448.0
#: The floor of an activation group's amax (vLLM's ``eps``): an all-zero group gets a finite scale.
EPS = 1e-10
FP8 = torch.float8_e4m3fn
#: sqrt(E[4^u]) for u uniform in [-1, 1]: divides the block magnitudes 2^u to mean square 1.
_SPREAD_RMS = math.sqrt(3.75 / (2.0 * math.log(4.0)))


def block_scales(w: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """fp32 scales [ceil(rows/block), ceil(cols/block)] of ``w`` [rows, cols]: each block's
    amax / 448 (an all-zero block gets scale 1)."""
    rows, cols = w.shape
    pr, pc = -rows % block, -cols % block
    padded = torch.nn.functional.pad(w.abs().to(torch.float32), (0, pc, 0, pr))
    amax = padded.view(padded.shape[0] // block, block, padded.shape[1] // block, block).amax(dim=(1, 3))
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def expand_blocks(scale: torch.Tensor, rows: int, cols: int, block: int = BLOCK) -> torch.Tensor:
    """``scale`` [..., rb, cb] repeated to one value per element [..., rows, cols]."""
    full = scale.repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)
    return full[..., :rows, :cols]


def quantize_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values, fp32 block scales) of an fp32 matrix ``w`` [rows, cols]."""
    scale = block_scales(w)
    q = (w.to(torch.float32) / expand_blocks(scale, *w.shape)).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    return q, scale


class Fp8BlockWeights(WeightFormat):
    """e4m3 values under the weight's name, fp32 128x128 block scales under ``<name>_scale``."""

    label = "fp8 e4m3, 128x128 block scales"

    def draw(self, lead, rows, cols, std, gen, device):
        values = torch.empty((*lead, rows, cols), dtype=FP8, device=device)
        scales = torch.empty((*lead, math.ceil(rows / BLOCK), math.ceil(cols / BLOCK)), dtype=torch.float32,
                             device=device)
        flat_v, flat_s = values.view(-1, rows, cols), scales.view(-1, *scales.shape[-2:])
        rb, cb = scales.shape[-2:]
        for i in range(flat_v.shape[0]):  # one matrix at a time: bounded fp32 scratch
            w = random_tensor((rows, cols), gen, "normal", scale=std, dtype=torch.float32, device=device)
            # Each 128x128 block gets its own magnitude (spread 4x, mean square 1), as in real
            # checkpoints: a kernel that applies the scale of the wrong block is then visibly wrong.
            spread = torch.exp2(2.0 * torch.rand((rb, cb), generator=gen) - 1.0).to(device) / _SPREAD_RMS
            w *= expand_blocks(spread, rows, cols)
            q, s = quantize_blocks(w)
            flat_v[i].copy_(q)
            flat_s[i].copy_(s)
        return {"": values, SCALE: scales}

    def dequantize(self, parts):
        q, scale = parts[""], parts[SCALE]
        return q.to(torch.float32) * expand_blocks(scale, *q.shape[-2:])

    def nbytes(self, rows, cols):
        return rows * cols + 4.0 * math.ceil(rows / BLOCK) * math.ceil(cols / BLOCK)


def quantize_groups(x: torch.Tensor, group: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values [..., F], fp32 scales [..., ceil(F/group)]) of activations ``x`` [..., F]."""
    feats = x.shape[-1]
    pad = -feats % group
    xf = torch.nn.functional.pad(x.to(torch.float32), (0, pad))
    grouped = xf.view(*x.shape[:-1], -1, group)
    scale = grouped.abs().amax(dim=-1).clamp_min(EPS) / E4M3_MAX
    q = (grouped / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    return q.view(*x.shape[:-1], -1)[..., :feats], scale


def dequantize_groups(q: torch.Tensor, scale: torch.Tensor, group: int = BLOCK) -> torch.Tensor:
    """fp32 values of group-quantised activations."""
    return q.to(torch.float32) * scale.repeat_interleave(group, dim=-1)[..., : q.shape[-1]]


class Fp8GroupActivations(ActivationFormat):
    """Activations quantised to e4m3 per token in groups of 128 before every FP8 matmul."""

    label = "fp8 e4m3, per token in groups of 128"
    scale_bytes_per_element = 4.0 / BLOCK

    def round(self, x):
        return dequantize_groups(*quantize_groups(x))


__all__ = ["BLOCK", "E4M3_MAX", "EPS", "FP8", "Fp8BlockWeights", "Fp8GroupActivations", "block_scales",
           "dequantize_groups", "expand_blocks", "quantize_blocks", "quantize_groups"]
