"""GPT-OSS MoE routed experts with the checkpoint's MXFP4 expert weights (bf16 activations).

The math is moe/gpt_oss_experts's (GEMM1 + bias, interleaved clamped SwiGLU with alpha 1.702 and
limit 7, GEMM2 + bias, top-k weighted sum; the residual add and the router are outside the block);
only the storage of W1 and W2 differs: MXFP4 as the published openai/gpt-oss-120b and -20b
checkpoints ship the experts (e2m1 codes, one e8m0 scale per 32 elements along the reduction
dimension, the low nibble of a byte holding the even element; :mod:`kernelforge.quant.mxfp4`,
which cites openai/gpt-oss ``gpt_oss/torch/weights.py``).

Inputs, in the checkpoint's layout with each row's blocks flattened (``gate_up_proj_blocks
[E, 2I, H/32, 16]`` -> ``w1 [E, 2I, H/2]``; vLLM's ``w13_weight``/``w13_weight_scale`` layout,
``vllm/model_executor/layers/quantization/mxfp4.py``)::

    x            [T, H]        bf16   (activations, already RMS-normalised)
    topk_ids     [T, TOPK]     int32
    topk_weights [T, TOPK]     fp32
    w1           [E, 2I, H/2]  uint8  packed e2m1 codes of W1 (gate_up_proj; rows interleaved glu/lin)
    w1_scale     [E, 2I, H/32] uint8  e8m0 scales of W1
    b1           [E, 2I]       bf16
    w2           [E, H, I/2]   uint8  packed e2m1 codes of W2 (down_proj)
    w2_scale     [E, H, I/32]  uint8  e8m0 scales of W2
    b2           [E, H]        bf16

H and I must be multiples of 32 (the scale groups); GPT-OSS's 2880 is 90 groups. The reference
dequantises one expert at a time exactly (fp32 holds every value the drawn scales give) and runs
the bf16 block's fp32 math on it (:meth:`GptOssExperts.reference`, through ``expert_weights``).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any, Mapping

import torch

from kernelforge.shipped import ShippedPath
from kernelforge.block import Counts, Shape, generator, random_tensor
from kernelforge.quant.base import parts_of
from kernelforge.quant.mxfp4 import BYTES_PER_ELEMENT, GROUP, Mxfp4Weights

# A block folder is no package: the bf16 block's class is loaded from its file.
_BASE = Path(__file__).parents[1] / "gpt_oss_experts" / "block.py"
_SPEC = importlib.util.spec_from_file_location("kf_moe_gpt_oss_experts_base", _BASE)
_BF16 = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_BF16)

#: The one weight format of this block.
MXFP4 = Mxfp4Weights()


def _shape(name: str, T: int, E: int, H: int, I: int, routing: str = "uniform") -> Shape:
    return Shape.of(name, T=T, E=E, TOPK=4, H=H, I=I, ROUTING=routing)


class GptOssExpertsMxfp4(_BF16.GptOssExperts):
    """GPT-OSS routed experts with MXFP4 W1/W2 (see the module docstring)."""

    shipped = (
        ShippedPath(
            "*", "vLLM", "OpenAI triton_kernels matmul_ogs with MXFP4 weights (Hopper: weights upcast in the kernel)",
            "vllm-project/vllm vllm/model_executor/layers/fused_moe/gpt_oss_triton_kernels_moe.py (commit 9b243f9)",
            baseline_is_expert=False, baseline_is="a re-implementation of triton_kernels' Hopper design in the fused_moe "
            "form with its default tiles (at sm_90 it spills at block_m 32 in the K loop and at block_m 128 in the "
            "epilogue, which triton_kernels subtiles; docs/blocks.md)",
            library="triton_kernels matmul_ogs", on_image=False,
            why_not="OpenAI's triton_kernels ships only inside Triton's source tree (python/triton_kernels, matched to "
                    "each Triton release); the PyPI package of that name is another project; not brought to the image"),
    )
    description = (
        "GPT-OSS routed experts with the checkpoint's MXFP4 weights (e2m1 codes, e8m0 scale per 32, "
        "dequantised in the kernel), bf16 activations and biases: GEMM1+bias, interleaved clamped "
        "SwiGLU, GEMM2+bias, top-k weighted sum"
    )
    dtypes = ("bfloat16",)
    #: The routed experts' weight format (read by the fused_moe config export).
    routed_format = MXFP4

    def shape_sets(self) -> Mapping[str, list[Shape]]:
        """The bf16 block's sets (its smoke shapes and the model presets already have H and I in
        multiples of 32), with held-out check shapes whose H and I are multiples of 32 but not of
        64 or 128 (96, 160, 224) or a single group (32): odd T, skewed, one-expert and sparse routing."""
        # Not the bf16 block's tensor-parallel sets: I / TP is no multiple of 32 at TP 4 and 8
        # (vLLM pads the MXFP4 weights there, which this block does not model).
        sets = {name: shapes for name, shapes in super().shape_sets().items() if not name.startswith("tp")}
        sets["check"] = [
            _shape("check/T1", T=1, E=8, H=96, I=160),
            _shape("check/T7-skewed", T=7, E=8, H=160, I=96, routing="skewed"),
            _shape("check/T33-one", T=33, E=6, H=96, I=160, routing="one"),
            _shape("check/T33-sparse", T=33, E=8, H=160, I=96, routing="sparse"),
            _shape("check/T13-sparse", T=13, E=6, H=224, I=32, routing="sparse"),
        ]
        for shapes in sets.values():
            for shape in shapes:
                if shape["H"] % GROUP or shape["I"] % GROUP:
                    raise ValueError(f"{shape.name}: H and I must be multiples of {GROUP} for MXFP4")
        return sets

    def make_inputs(
        self,
        shape: Shape,
        dtype: torch.dtype,
        device: str | torch.device,
        seed: int,
        distribution: str = "normal",
    ) -> dict[str, Any]:
        """x, biases and routing as the bf16 block draws them (x in ``dtype``, the distribution
        applying to it; biases in ``dtype``); W1 and W2 drawn directly as MXFP4 codes and scales
        (:meth:`kernelforge.quant.mxfp4.Mxfp4Weights.draw`) whose values have the bf16 block's
        weight standard deviations (3.9/sqrt(H) and 0.25/sqrt(I)), one expert at a time and on the
        GPU when the inputs are for one (cheap even for gpt-oss-120b)."""
        T, E, topk, H, I = shape["T"], shape["E"], shape["TOPK"], shape["H"], shape["I"]
        gen = generator(seed, device)
        x = random_tensor((T, H), gen, distribution, dtype=dtype, device=device)
        ids = _BF16.make_routing(T, E, topk, shape.get("ROUTING", "uniform"), gen)
        weights = torch.softmax(torch.randn(T, topk, generator=gen, dtype=torch.float32), dim=1)
        w1 = MXFP4.draw((E,), 2 * I, H, _BF16._W1_STD / math.sqrt(H), gen, device)
        b1 = random_tensor((E, 2 * I), gen, "normal", scale=_BF16._B1_STD, dtype=dtype, device=device)
        w2 = MXFP4.draw((E,), H, I, _BF16._W2_STD / math.sqrt(I), gen, device)
        b2 = random_tensor((E, H), gen, "normal", scale=_BF16._B2_STD, dtype=dtype, device=device)
        return {
            "x": x,
            "topk_ids": ids.to(torch.int32).to(device),
            "topk_weights": weights.to(device),
            "w1": w1[""],
            "w1_scale": w1["_scale"],
            "b1": b1,
            "w2": w2[""],
            "w2_scale": w2["_scale"],
            "b2": b2,
        }

    def expert_weights(self, inputs: Mapping[str, Any], e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert ``e``'s W1 [2I, H] and W2 [H, I], dequantised exactly to fp32."""
        w1 = MXFP4.dequantize({k: v[e] for k, v in parts_of(inputs, "w1").items()})
        w2 = MXFP4.dequantize({k: v[e] for k, v in parts_of(inputs, "w2").items()})
        return w1, w2

    def counts(self, shape: Shape, dtype: torch.dtype) -> Counts:
        """flops as the bf16 block (dequantisation is not counted: a few integer ops per weight).
        bytes: per touched expert (:meth:`expected_experts`) the codes (half a byte per weight) and
        scales (one byte per 32 weights) of W1 and W2 plus the bf16 biases; x read and out written
        in ``dtype``; ids (int32) and weights (fp32)."""
        T, topk, H, I = shape["T"], shape["TOPK"], shape["H"], shape["I"]
        elt = torch.empty((), dtype=dtype).element_size()
        flops = T * topk * (2.0 * H * 2 * I + 2.0 * I * H)
        per_expert = MXFP4.nbytes(2 * I, H) + MXFP4.nbytes(H, I) + (2 * I + H) * 2
        nbytes = self.expected_experts(shape) * per_expert + 2.0 * T * H * elt + T * topk * (4 + 4)
        return Counts(flops=flops, bytes=nbytes)


__all__ = ["BYTES_PER_ELEMENT", "GptOssExpertsMxfp4", "MXFP4"]
