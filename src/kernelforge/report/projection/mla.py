"""The costs of the MLA models the projection knows: DeepSeek-R1 and Kimi K2.5 (the questions of
:class:`kernelforge.report.projection.gpt_oss.ProjectedModel`).

Dimensions from the public configs (deepseek-ai/DeepSeek-V3 ``inference/configs/config_671B.json``
and the DeepSeek-R1 ``config.json``; moonshotai/Kimi-K2.5 ``config.json``, its text model): hidden
7168, 61 layers of which the first 3 (DeepSeek) or 1 (Kimi) have a dense MLP (intermediate 18432)
and the others an MoE layer (256 or 384 routed experts of intermediate 2048, top-8, one shared
expert); MLA attention with 128 or 64 query heads, q_lora_rank 1536, kv_lora_rank 512, qk heads of
128 (no rope) + 64 (rope), value heads of 128; vocabularies 129280 and 163840.

Weights as served: DeepSeek-R1's checkpoint stores every linear layer in FP8 e4m3 with fp32 scales
per 128x128 block (embedding, LM head, norms and the router in bf16 or fp32); Kimi K2.5 stores its
routed experts in INT4 (groups of 32, bf16 scales) and the rest in bf16. The KV cache is MLA's
latent: 576 bf16 values per token per layer (1152 bytes).

Both need a node of 8 H200s for their weights. The projection sums the per-call times of the blocks
measured at the full layer's shapes on one GPU: the work of the whole layer. A serving node shards
that work over its GPUs (tensor/expert/data parallel) and adds communication; neither is modelled
(said beside every MLA model's figures).

Parts no block measures are roofline estimates: the MLA projections (q_a, q_b, kv_a, the kv_b
matrices W_UK/W_UV that decode absorbs and prefill expands, the output projection), the router, the
dense MLPs of the first layers, the norms, and in prefill the MLA attention itself (causal,
128 + 64 query/key and 128 value dimensions per head).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelforge.report.projection.gpt_oss import BF16, AttentionCalls, Work

#: Bytes per weight: FP8 with one fp32 scale per 128 x 128 block; INT4 with a bf16 scale per 32.
FP8_BLOCK = 1.0 + 4.0 / (128 * 128)
INT4_G32 = 0.5 + 2.0 / 32
#: MLA's cache per token per layer: the 512-value latent and the 64-value rope key, in bf16.
MLA_CACHE_VALUES = 512 + 64
DECODE_BLOCK = "attention/mla_decode"


@dataclass(frozen=True)
class MlaModel:
    """A DeepSeek-V3-architecture model (MLA attention, group-routed MoE with a shared expert)."""

    name: str
    moe_block: str
    q_heads: int
    experts: int
    dense_layers: int
    vocab: int
    expert_bytes: float  # per routed-expert weight
    linear_bytes: float  # per weight of every other linear layer (attention, shared expert, dense MLPs)
    layers: int = 61
    hidden: int = 7168
    moe_intermediate: int = 2048
    dense_intermediate: int = 18432
    q_lora: int = 1536
    kv_lora: int = 512
    qk_nope: int = 128
    qk_rope: int = 64
    v_head: int = 128
    gpus: int = 8

    @property
    def moe_set(self) -> str:
        return self.name

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    def summary(self) -> str:
        """The model in one line, for the report."""
        experts = "FP8 (128x128 block scales)" if self.expert_bytes == FP8_BLOCK else "INT4 (group 32)"
        return (f"{self.layers} layers (the first {self.dense_layers} dense), MLA attention with {self.q_heads} heads, "
                f"{self.experts} {experts} experts top-8 + 1 shared; its weights need {self.gpus} GPUs")

    # -- weights and cache -------------------------------------------------------------------------

    def attention_weights(self) -> dict[str, tuple[int, int]]:
        """(fan in, fan out) of one layer's MLA projections (the kv_b matrix holds W_UK and W_UV)."""
        h, heads = self.hidden, self.q_heads
        return {
            "q_a": (h, self.q_lora),
            "q_b": (self.q_lora, heads * (self.qk_nope + self.qk_rope)),
            "kv_a": (h, self.kv_lora + self.qk_rope),
            "kv_b": (self.kv_lora, heads * (self.qk_nope + self.v_head)),
            "o": (heads * self.v_head, h),
        }

    def weight_groups(self) -> dict[str, tuple[float, float]]:
        """The checkpoint's weights by kind: (parameters, bytes per parameter) over the model."""
        h, e = self.hidden, self.experts
        mlp = 3 * h * self.moe_intermediate
        attention = sum(i * o for i, o in self.attention_weights().values())
        norms = self.layers * (2 * h + self.q_lora + self.kv_lora) + h
        return {
            "routed experts": (self.moe_layers * e * mlp, self.expert_bytes),
            "shared experts": (self.moe_layers * mlp, self.linear_bytes),
            "dense MLPs": (self.dense_layers * 3 * h * self.dense_intermediate, self.linear_bytes),
            "attention": (self.layers * attention, self.linear_bytes),
            "routers": (self.moe_layers * (h * e + e), BF16),
            "norms": (norms, BF16),
            "embedding and LM head": (2 * self.vocab * h, BF16),
        }

    def parameters(self) -> float:
        return sum(n for n, _ in self.weight_groups().values())

    def weight_bytes(self) -> float:
        """Bytes of the served checkpoint: routed experts, shared experts, dense MLPs and attention
        in their formats; routers, norms, embedding and LM head in bf16."""
        return sum(n * b for n, b in self.weight_groups().values())

    def kv_bytes(self, sequences: int, tokens: int, window_layers_full: bool = False) -> float:
        """The latent cache of ``sequences`` x ``tokens`` on every layer (no window layers)."""
        del window_layers_full
        return sequences * tokens * self.layers * MLA_CACHE_VALUES * BF16

    # -- the projection's questions ----------------------------------------------------------------

    def attention_calls(self, phase: str, profile: str, batch: int | None) -> AttentionCalls | None:
        """Decode: the MLA decode block's preset ``<model>/<profile>/b<batch>`` on every layer.
        Prefill: no block measures MLA prefill (None: :meth:`attention_estimate`)."""
        if phase == "prefill":
            return None
        shape = f"{self.name}/{profile}/b{batch or 1}"
        return AttentionCalls(DECODE_BLOCK, "attention (MLA decode)", ((DECODE_BLOCK, shape, self.layers),),
                              f"{self.layers} layers")

    def attention_estimate(self, tokens: int) -> Work:
        """Causal MLA prefill attention over ``tokens`` on every layer: QK^T over 192 and PV over 128
        dimensions per head on half the (query, key) pairs; q, k, v read and o written in bf16."""
        heads, qk, v = self.q_heads, self.qk_nope + self.qk_rope, self.v_head
        flops = 2.0 * tokens * tokens / 2 * heads * (qk + v)
        nbytes = BF16 * tokens * heads * (2 * qk + 2 * v)
        return Work(self.layers * flops, self.layers * nbytes)

    def dense_work(self, rows: int) -> dict[str, Work]:
        """Every layer's unmeasured kernels over ``rows`` tokens, summed over the layers."""
        h, wb = self.hidden, self.linear_bytes
        out: dict[str, Work] = {}
        for name, (fan_in, fan_out) in self.attention_weights().items():
            out[f"MLA {name} projection"] = _linear(self.layers, rows, fan_in, fan_out, wb)
        out["router"] = _linear(self.moe_layers, rows, h, self.experts, BF16)
        # gate and up (h -> 2 x 18432) then down (18432 -> h), as one matmul of 3 h x 18432 weights
        out["dense MLP"] = _linear(self.dense_layers, rows, h, 3 * self.dense_intermediate, wb)
        out["2 RMSNorms + residual adds"] = Work(self.layers * 2 * 4 * rows * h, self.layers * 2 * 4 * rows * h * BF16)
        return out

    def head_work(self, rows: int) -> Work:
        """The final norm and the LM head (bf16) over ``rows`` sampled tokens."""
        h, v = self.hidden, self.vocab
        return Work(2 * rows * h * v + 4 * rows * h, BF16 * (h * v + h + 3 * rows * h + rows * v))


def _linear(layers: int, rows: int, fan_in: int, fan_out: int, weight_bytes: float) -> Work:
    """``layers`` matmuls of ``rows`` x ``fan_in`` activations by ``fan_in x fan_out`` weights: the
    weights read once per layer, the activations read and written in bf16."""
    weights = fan_in * fan_out
    return Work(layers * 2.0 * rows * weights,
                layers * (weights * weight_bytes + BF16 * rows * (fan_in + fan_out)))


MLA_MODELS: dict[str, MlaModel] = {
    "deepseek-r1": MlaModel("deepseek-r1", "moe/deepseek_r1_experts", q_heads=128, experts=256, dense_layers=3,
                            vocab=129280, expert_bytes=FP8_BLOCK, linear_bytes=FP8_BLOCK),
    "kimi-k2.5": MlaModel("kimi-k2.5", "moe/kimi_k25_experts", q_heads=64, experts=384, dense_layers=1,
                          vocab=163840, expert_bytes=INT4_G32, linear_bytes=BF16),
}

__all__ = ["DECODE_BLOCK", "FP8_BLOCK", "INT4_G32", "MLA_MODELS", "MlaModel"]
