"""Fused residual add + RMSNorm: the norm before attention and before the MLP/MoE of every layer.

Math, exactly as vLLM's ``fused_add_rms_norm(input, residual, weight, epsilon)`` (its CUDA kernel
``fused_add_rms_norm_kernel`` and the Triton RMSNorm kernels of vLLM and Liger-Kernel compute the
same), per token row t of T, over the H hidden features::

    r_t   = round_dtype(x_t + residual_t)          # the new residual stream, in the activation dtype
    v_t   = mean_j(float32(r_t[j])^2)              # fp32, from the *rounded* r_t
    out_t = float32(r_t) / sqrt(v_t + eps) * weight

``residual`` is updated in place to r_t (the next layer's residual input) and ``out`` is a new tensor
(vLLM writes it over ``input``; here the input x must stay unchanged). Block contract v2: two outputs,
one of them in place (``inplace = ("residual",)``).

Inputs (keyword arguments of a candidate's ``run(x, residual, weight, eps, out)``)::

    x         [T, H]   dtype   the sublayer's output (attention or MLP), the distribution applies here
    residual  [T, H]   dtype   the residual stream (twice the scale of x); updated in place
    weight    [H]      dtype   the norm's learned scale (bf16 in serving checkpoints)
    eps       python float     1e-5 GPT-OSS, 1e-6 DeepSeek V3/R1 (from the shape's EPS)

Outputs: ``out`` [T, H] in dtype, and ``residual`` (in place).

Model configs (public ``config.json`` of each checkpoint on the Hugging Face hub):

- openai/gpt-oss-120b and -20b: ``hidden_size`` 2880, ``rms_norm_eps`` 1e-05.
- deepseek-ai/DeepSeek-V3 and DeepSeek-R1 (``DeepseekV3ForCausalLM``): ``hidden_size`` 7168,
  ``rms_norm_eps`` 1e-06.
- moonshotai/Kimi-K2-Instruct (``model_type`` kimi_k2): ``hidden_size`` 7168, ``rms_norm_eps`` 1e-06;
  copies of the Kimi K2.5 ``text_config`` read 1e-05 (not verified against the hub): EPS is a shape
  dimension, so a Kimi preset only has to state its own.

Every row's statistics are independent, so a correct kernel is one pass over memory (two in a
chunked form that re-reads its own row). Inputs make three kinds of rows (see :data:`QUIET_ROW`):
ordinary rows, *quiet* rows whose mean square is about ``eps`` (a kernel that drops eps, or adds it
after the square root, is visibly wrong only there: eps is 1e-5 of an ordinary row's mean square),
and all-zero rows (padding tokens: 0 / sqrt(0 + eps) = 0, and NaN without eps).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from kernelforge.block import Block, Counts, Shape, Tolerance, generator, random_tensor

#: Hidden size and rms_norm_eps of each model family (see the module docstring for the sources).
MODELS: dict[str, tuple[int, float]] = {
    "gpt-oss-120b": (2880, 1e-5),
    "deepseek-r1": (7168, 1e-6),
}

#: Token counts of the presets: decode steps (batch 1 and 64) and a prefill chunk.
DECODE_TOKENS: tuple[int, ...] = (1, 64)
PREFILL_TOKENS: tuple[int, ...] = (4096,)

#: The residual stream is larger than one sublayer's output: it sums all earlier layers.
RESIDUAL_SCALE = 2.0
#: weight = 1 + WEIGHT_STD * N(0, 1): trained norm scales spread around 1; a kernel that skips the
#: weight is then off by about 45% (relative norm), far outside every tolerance.
WEIGHT_STD = 0.5

#: Rows ``t`` with ``t % ROW_CYCLE == QUIET_ROW`` are scaled so that the mean square of x + residual
#: is ``eps`` (then eps halves 1/sqrt(.) and dropping it is a 41% error); rows with
#: ``t % ROW_CYCLE == ZERO_ROW`` are all zero. T = 1 (a single decode token) has only an ordinary row.
ROW_CYCLE = 4
QUIET_ROW = 1
ZERO_ROW = 3

#: Bound on the fp32 elements of one row chunk in :meth:`FusedAddRmsNorm.reference` (64 MiB).
REFERENCE_CHUNK_ELEMENTS = 1 << 24


def _shape(name: str, T: int, H: int, eps: float) -> Shape:
    return Shape.of(name, T=T, H=H, EPS=eps)


class FusedAddRmsNorm(Block):
    """residual <- x + residual; out <- RMSNorm(residual) * weight. See the module docstring."""

    family = "norm"
    description = (
        "Fused residual add + RMSNorm (vLLM fused_add_rms_norm): residual <- x + residual in the "
        "activation dtype (in place), out <- residual / sqrt(mean(residual^2) + eps) * weight, "
        "variance in fp32"
    )
    #: ``residual`` is an input that the candidate overwrites with x + residual (block contract v2).
    inplace = ("residual",)

    # -- shapes ---------------------------------------------------------------------------------

    def shape_sets(self) -> Mapping[str, list[Shape]]:
        sets: dict[str, list[Shape]] = {
            # Tiny, for the interpreter: a single decode token, an odd H, a power of two, and rows of
            # every kind (T >= 2 has a quiet row, T >= 4 a zero row). Both model epsilons.
            "smoke": [
                _shape("smoke/T1-H64", T=1, H=64, eps=1e-5),
                _shape("smoke/T3-H200", T=3, H=200, eps=1e-6),
                _shape("smoke/T4-H256", T=4, H=256, eps=1e-5),
                _shape("smoke/T5-H255", T=5, H=255, eps=1e-5),
            ],
            # Held out: the real hidden sizes at odd token counts, and an odd H just past a power of
            # two (a chunked kernel's last chunk has 3 elements; a whole-row one pads 4099 to 8192).
            "check": [
                _shape("check/T37-H2880", T=37, H=2880, eps=1e-5),
                _shape("check/T1-H2880", T=1, H=2880, eps=1e-5),
                _shape("check/T7-H7168", T=7, H=7168, eps=1e-6),
                _shape("check/T5-H4099", T=5, H=4099, eps=1e-6),
            ],
        }
        for model, (H, eps) in MODELS.items():
            sets[model] = [_shape(f"{model}/decode/T{T}", T=T, H=H, eps=eps) for T in DECODE_TOKENS] + [
                _shape(f"{model}/prefill/T{T}", T=T, H=H, eps=eps) for T in PREFILL_TOKENS
            ]
        return sets

    def compile_shape(self) -> Shape:
        """GPT-OSS's hidden size at a decode batch: H = 2880 is a multiple of 16 like every serving
        hidden size, so the AOT specialisation matches serving (smoke sizes are deliberately odd)."""
        return _shape("compile/T64-H2880", T=64, H=2880, eps=1e-5)

    # -- data ------------------------------------------------------------------------------------

    def make_inputs(
        self,
        shape: Shape,
        dtype: torch.dtype,
        device: str | torch.device,
        seed: int,
        distribution: str = "normal",
    ) -> dict[str, Any]:
        """x and residual drawn from ``distribution`` (residual scaled by :data:`RESIDUAL_SCALE`),
        quiet and zero rows as in :data:`QUIET_ROW`; weight = 1 + 0.5 N(0, 1); eps from the shape."""
        T, H, eps = shape["T"], shape["H"], float(shape["EPS"])
        gen = generator(seed, device)
        # Drawn in fp32 on the CPU, so the quiet rows can be scaled before rounding to dtype; the
        # largest preset is 4096 x 7168 (117 MB per tensor in fp32).
        x = random_tensor((T, H), gen, distribution, dtype=torch.float32, device="cpu")
        residual = random_tensor((T, H), gen, distribution, scale=RESIDUAL_SCALE, dtype=torch.float32, device="cpu")
        weight = 1.0 + random_tensor((H,), gen, "normal", scale=WEIGHT_STD, dtype=torch.float32, device="cpu")
        rows = torch.arange(T)
        quiet = rows[rows % ROW_CYCLE == QUIET_ROW]
        if quiet.numel():
            mean_square = (x[quiet] + residual[quiet]).pow(2).mean(dim=1, keepdim=True)
            factor = torch.sqrt(eps / mean_square)
            x[quiet] *= factor
            residual[quiet] *= factor
        zero = rows[rows % ROW_CYCLE == ZERO_ROW]
        x[zero] = 0.0
        residual[zero] = 0.0
        return {
            "x": x.to(device=device, dtype=dtype),
            "residual": residual.to(device=device, dtype=dtype),
            "weight": weight.to(device=device, dtype=dtype),
            "eps": eps,
        }

    def make_output(self, shape: Shape, dtype: torch.dtype, device: str | torch.device) -> dict[str, torch.Tensor]:
        """The one new output, ``out`` [T, H]; ``residual`` is the other output, written in place."""
        return {"out": torch.empty((shape["T"], shape["H"]), dtype=dtype, device=device)}

    def reference(
        self, *, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> dict[str, torch.Tensor]:
        """fp32 ``out`` and the expected final ``residual``, chunked over rows (bounded memory).

        The new residual is rounded to the activation dtype *before* its variance is taken, as a
        kernel that stores it and normalises the stored value must (and as vLLM does).
        """
        T, _ = x.shape
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        new_residual = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        w = weight.to(torch.float32)
        step = max(1, REFERENCE_CHUNK_ELEMENTS // max(x.shape[1], 1))
        for t0 in range(0, T, step):
            sl = slice(t0, min(T, t0 + step))
            r = (x[sl].to(torch.float32) + residual[sl].to(torch.float32)).to(x.dtype).to(torch.float32)
            variance = r.pow(2).mean(dim=1, keepdim=True)
            out[sl] = r * torch.rsqrt(variance + eps) * w
            new_residual[sl] = r
        return {"out": out, "residual": new_residual}

    def output_tolerance(self, name: str, dtype: torch.dtype, device_type: str) -> Tolerance:
        """``out`` as every floating-point output of ``dtype``; ``residual`` within one rounding:
        x + residual rounded once to ``dtype`` is exact up to half an ulp, whatever the kernel."""
        if name == "residual":
            ulp = torch.finfo(dtype).eps
            return Tolerance(rel_norm=ulp, atol=ulp, rtol=ulp)
        return self.tolerance(dtype, device_type)

    # -- roofline ----------------------------------------------------------------------------------

    def counts(self, shape: Shape, dtype: torch.dtype) -> Counts:
        """flops: per element an add, a square-accumulate (2), a multiply by 1/rms and one by the
        weight: 4*T*H (plus T square roots, negligible). bytes: x and residual read, residual and out
        written (T*H each), weight read once (H); every row's second look at its residual in a
        chunked kernel hits cache and is not counted."""
        T, H = shape["T"], shape["H"]
        elem = torch.empty((), dtype=dtype).element_size()
        return Counts(flops=4.0 * T * H, bytes=float((4 * T * H + H) * elem))


__all__ = ["FusedAddRmsNorm", "MODELS"]
