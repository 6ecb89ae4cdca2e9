"""Kimi K2.5 MoE experts: DeepSeek-V3's MoE structure with Kimi's constants and INT4 routed experts.

The computation is DeepSeek-R1's (``moe/deepseek_r1_experts``; its block class is loaded from that
file, a block folder being no Python package, and subclassed here): sigmoid routing in fp32 with
the correction bias for selection only, top-8, the unbiased scores normalised and scaled; SiLU-GLU
experts with gate and up as halves of W13 (rows 0..I-1 gate, I..2I-1 up), no bias, no clamp; one
shared expert added unscaled. Kimi's router has a single group (``n_group`` 1, ``topk_group`` 1),
so the group stage is a no-op.

Constants (the ``text_config`` of moonshotai/Kimi-K2.5 ``config.json``, model_type kimi_k2, the
text model of Kimi K2 / K2 Thinking; Hugging Face, checked against the public copies of that
config in the stored index): hidden_size 7168, moe_intermediate_size 2048, n_routed_experts 384,
num_experts_per_tok 8, n_group 1, topk_group 1, routed_scaling_factor 2.827, n_shared_experts 1
(intermediate 2048), scoring_func sigmoid, topk_method noaux_tc (``e_score_correction_bias``),
norm_topk_prob true, first_k_dense_replace 1, num_hidden_layers 61.

Weights as the checkpoint ships them (``quantization_config``: quant_method compressed-tensors,
format pack-quantized, weights num_bits 4, type int, symmetric, strategy group, group_size 32;
``ignore``: lm_head and the regexes for self_attn, shared_experts and the dense layer's
mlp.(gate|up|down)_proj): only the routed experts are INT4 (:class:`kernelforge.quant.int4.
Int4GroupWeights`: int32 words of 8 values, element j of a row in word j // 8 at bits 4 (j % 8),
stored as q + 8; value = q * bf16 scale of group j // 32); the shared expert stays bf16.
Activations stay bf16 (W4A16, as vLLM serves it; fp16 is also declared, as vLLM's W4A16 kernel
computes in the activations' dtype): the reference multiplies the exactly dequantised weights by the
activations in fp32 and rounds the intermediate to the activation dtype, as the kernel stores it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from kernelforge.shipped import ShippedPath
from kernelforge.quant.base import Bf16Weights, NativeActivations
from kernelforge.quant.int4 import Int4GroupWeights

_BASE = Path(__file__).parents[1] / "deepseek_r1_experts" / "block.py"
_SPEC = importlib.util.spec_from_file_location("kf_moe_kimi_k25_experts_base", _BASE)
_DEEPSEEK = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_DEEPSEEK)


#: What the baseline is, by token count: vLLM's own Triton W4A16 path sends T * 8 / 384 <= 6 (T <= 288)
#: to its moe_wna16 CUDA kernel (should_moe_wna16_use_cuda) and runs the Triton kernel the baseline
#: follows, at its configuration rule, above (tests/fixtures/vllm/int4_w4a16_triton_rule.toml).
_CUDA_TOKENS = 288
_BASELINE_IS = {
    (0, _CUDA_TOKENS): "a Triton W4A16 kernel in vLLM's fused_moe_kernel_gptq_awq design, at vLLM's Triton rule for a "
                       "GPU without its moe_wna16 CUDA kernel (at these counts vLLM's own Triton path runs that CUDA "
                       "kernel, not timed here)",
    (_CUDA_TOKENS + 1, 1 << 30): "vLLM's own Triton W4A16 path (fused_moe_kernel_gptq_awq's packing and dequantisation "
                                 "in the compute dtype, its default configuration rule), not the Marlin MoE it ships",
}
_MARLIN = dict(library="Marlin MoE (vLLM _moe_C)", on_image=False,
               why_not="vLLM's compiled _moe_C extension is built for vLLM's own torch and is not on the image")


def _shipped() -> tuple[ShippedPath, ...]:
    """Marlin MoE is what vLLM ships on Hopper; every real preset is the whole layer on one GPU, which
    nobody serves (``kimi-k2.5`` prefixes every preset family); the baseline's standing by token count."""
    served = tuple(ShippedPath(
        "*", "vLLM", "Marlin MoE (fused_marlin_moe) for compressed-tensors W4A16 on Hopper; vLLM's own Triton "
        "path hands T * 8 / 384 <= 6 to its moe_wna16 CUDA kernel",
        "vllm-project/vllm vllm/model_executor/layers/fused_moe/fused_marlin_moe.py (commit 129ab7c)",
        baseline_is_expert=False, baseline_is=what, tokens=tokens, **_MARLIN) for tokens, what in _BASELINE_IS.items())
    whole = tuple(ShippedPath(
        "kimi-k2.5", "nobody", "the whole layer on one GPU is not served (about 1 T parameters at 4 bits, far beyond "
        "one GPU's 80-141 GB); vLLM would run Marlin MoE", "moonshotai/Kimi-K2.5 config.json (the model's size)",
        baseline_is_expert=False, baseline_is=what, tokens=tokens, served=False, **_MARLIN)
        for tokens, what in _BASELINE_IS.items())
    return served + whole


class KimiK25Experts(_DEEPSEEK.GroupRoutedExperts):
    """Kimi K2.5's MoE experts (see the module docstring)."""

    shipped = _shipped()
    description = (
        "Kimi K2.5 MoE: sigmoid routing with correction bias, one group, top-8 x2.827; 384 INT4 "
        "(symmetric, bf16 scale per 32, compressed-tensors pack-quantized) SiLU-GLU experts + 1 bf16 "
        "shared expert, bf16 activations (W4A16)"
    )
    model = "kimi-k2.5"
    experts, topk, groups, topk_groups, scaling = 384, 8, 1, 1, 2.827
    hidden, intermediate, shared_intermediate = 7168, 2048, 2048
    routed_format = Int4GroupWeights()
    shared_format = Bf16Weights()
    activations = NativeActivations()
    #: bf16 as served; fp16 as vLLM's W4A16 Triton kernel also runs it (compute_type from the activations).
    dtypes = ("bfloat16", "float16")

    def small_shapes(self):
        """The smoke and check sets: 16 experts in one group, top-4; H and I multiples of the
        32-element quantisation group, some not of 64 or 128 (partial K and N tiles)."""
        s = self.shape
        small = dict(E=16, G=1, KG=1, TOPK=4)
        return {
            "smoke": [s("smoke/T16-E16", 16, H=128, I=64, IS=64, **small),
                      s("smoke/T8-E16-skewed", 8, H=64, I=96, IS=64, routing="skewed", **small)],
            "check": [s("check/T1", 1, H=128, I=64, IS=64, **small),
                      s("check/T7-one", 7, H=96, I=64, IS=96, routing="one", **small),
                      s("check/T33-sparse", 33, H=64, I=64, IS=64, routing="sparse", **small),
                      s("check/T13-partial", 13, H=160, I=96, IS=96, **small)],
        }

    def compile_shape(self):
        return self.shape("compile/T64-E16", 64, E=16, G=1, KG=1, TOPK=4, H=512, I=256, IS=256)
