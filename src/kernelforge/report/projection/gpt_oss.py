"""The costs of a GPT-OSS model that the projection (:mod:`kernelforge.report.projection.model`) needs
beyond the measured blocks: its dimensions (the public ``config.json`` of ``openai/gpt-oss-120b``
and ``openai/gpt-oss-20b``), the bytes of its weights and KV cache, the FLOPs and bytes of its
dense kernels (for roofline estimates), which attention presets a phase needs, and whether a phase
fits a GPU's memory. The MLA models (DeepSeek-R1, Kimi K2.5) are in
:mod:`kernelforge.report.projection.mla`; both kinds answer the same questions (:class:`Model`'s methods).

Pure arithmetic over plain numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kernelforge.devices.hardware import Ceilings

BF16 = 2
#: MXFP4: 4-bit values plus one 8-bit scale per 32 (the experts of the GPT-OSS checkpoints).
MXFP4 = 4.25 / 8


@dataclass(frozen=True)
class AttentionCalls:
    """The attention calls of one phase over all layers: (block, shape, calls) triples and the calls
    in words (``18 full-layer calls + 18 window-layer calls``)."""

    block: str
    label: str
    needed: tuple[tuple[str, str, float], ...]
    calls: str


class ProjectedModel(Protocol):
    """What the projection asks of a model (GPT-OSS: :class:`Model`; DeepSeek-R1 and Kimi K2.5:
    :class:`kernelforge.report.projection.mla.MlaModel`)."""

    name: str
    layers: int
    moe_set: str
    moe_block: str
    gpus: int

    @property
    def moe_layers(self) -> int: ...

    def summary(self) -> str: ...

    def weight_bytes(self) -> float: ...

    def kv_bytes(self, sequences: int, tokens: int, window_layers_full: bool = False) -> float: ...

    def attention_calls(self, phase: str, profile: str, batch: int | None) -> "AttentionCalls | None": ...

    def attention_estimate(self, tokens: int) -> "Work | None": ...

    def dense_work(self, rows: int) -> "dict[str, Work]": ...

    def head_work(self, rows: int) -> "Work": ...


@dataclass(frozen=True)
class Model:
    """A GPT-OSS model the projection knows (its ``config.json`` figures) and its MoE shape set.

    What the projection asks of every model (:class:`ProjectedModel`):
    ``name``, ``layers``, ``moe_block`` and ``moe_set`` (its MoE presets are ``<moe_set>/T<tokens>``),
    ``moe_layers``, ``gpus`` (the GPUs its weights need: the memory check is against all of them),
    :meth:`weight_bytes`, :meth:`kv_bytes`, :meth:`attention_calls` (None: no block measures that
    attention; :meth:`attention_estimate` gives its roofline work), :meth:`dense_work` and
    :meth:`head_work`.
    """

    name: str
    layers: int
    moe_set: str
    experts: int
    moe_block: str = "moe/gpt_oss_experts"
    gpus: int = 1
    hidden: int = 2880
    intermediate: int = 2880
    q_heads: int = 64
    kv_heads: int = 8
    head_dim: int = 64
    vocab: int = 201088
    window: int = 128
    topk: int = 4

    def weight_bytes(self) -> float:
        """Bytes of the checkpoint's weights: MXFP4 expert matrices, bf16 biases and the rest
        (attention, sinks, router, norms, untied embedding and LM head)."""
        h, i, e, qd, kvd = self.hidden, self.intermediate, self.experts, self.q_heads * self.head_dim, \
            self.kv_heads * self.head_dim
        experts = e * 3 * h * i * MXFP4 + e * (2 * i + h) * BF16
        attention = (h * (qd + 2 * kvd) + (qd + 2 * kvd) + qd * h + h + self.q_heads) * BF16
        router, norms = (h * e + e) * BF16, 2 * h * BF16
        return self.layers * (experts + attention + router + norms) + (2 * self.vocab * h + h) * BF16

    def kv_bytes(self, sequences: int, tokens: int, window_layers_full: bool = False) -> float:
        """KV cache (bf16) of ``sequences`` sequences of ``tokens`` tokens: every full layer holds
        all tokens, every window layer ``min(tokens, window)`` (or all, ``window_layers_full``)."""
        n_full, n_window = layer_split(self.layers)
        per_token_layer = 2 * self.kv_heads * self.head_dim * BF16
        kept = tokens if window_layers_full else min(tokens, self.window)
        return sequences * per_token_layer * (n_full * tokens + n_window * kept)

    @property
    def moe_layers(self) -> int:
        return self.layers

    def summary(self) -> str:
        """The model in one line, for the report."""
        return (f"{self.layers} layers, GQA {self.q_heads}/{self.kv_heads} with sinks (window-128 attention on "
                f"half the layers, full on the others), {self.experts} MXFP4 experts, top-{self.topk}")

    def attention_calls(self, phase: str, profile: str, batch: int | None) -> AttentionCalls:
        """The GPT-OSS attention presets of a phase (``prefill`` or ``decode``): a full-layer and a
        window-layer shape, each called on its half of the layers."""
        n_full, n_window = layer_split(self.layers)
        if phase == "prefill":
            block, label, names = PREFILL_BLOCK, "attention (prefill)", prefill_shapes(profile)
        else:
            block, label, names = DECODE_BLOCK, "attention (decode)", decode_shapes(profile, batch or 1)
        return AttentionCalls(block, label, ((block, names["full"], n_full), (block, names["window"], n_window)),
                              f"{n_full} full-layer calls + {n_window} window-layer calls")

    def attention_estimate(self, tokens: int) -> "Work | None":
        """GPT-OSS's attention is always a measured block: no estimate."""
        del tokens
        return None

    def dense_work(self, rows: int) -> dict[str, Work]:
        """The dense kernels of every layer over ``rows`` tokens, summed over the layers."""
        return {k: Work(w.flops * self.layers, w.bytes * self.layers) for k, w in layer_dense_work(self, rows).items()}

    def head_work(self, rows: int) -> "Work":
        return head_work(self, rows)


PREFILL_BLOCK = "attention/gpt_oss_prefill"
DECODE_BLOCK = "attention/gpt_oss_decode"


def prefill_shapes(profile: str) -> dict[str, str]:
    """Layer kind -> GPT-OSS prefill attention preset name of a profile."""
    return {"full": f"gpt-oss/{profile}/full", "window": f"gpt-oss/{profile}/window"}


def decode_shapes(profile: str, batch: int) -> dict[str, str]:
    """Layer kind -> GPT-OSS decode attention preset name of a profile at a batch size."""
    return {"full": f"gpt-oss/{profile}/b{batch}/full", "window": f"gpt-oss/{profile}/b{batch}/window128"}


def layer_split(layers: int) -> tuple[int, int]:
    """(full layers, window layers): window attention on even layers, full on odd ones."""
    window = (layers + 1) // 2
    return layers - window, window


@dataclass(frozen=True)
class Work:
    """FLOPs and bytes of one kernel of the dense parts."""

    flops: float
    bytes: float


def layer_dense_work(model: Model, rows: int) -> dict[str, Work]:
    """The dense kernels of one layer over ``rows`` tokens (bf16 weights and activations)."""
    h, e = model.hidden, model.experts
    qkv, qd = (model.q_heads + 2 * model.kv_heads) * model.head_dim, model.q_heads * model.head_dim
    return {
        "QKV projection": Work(2 * rows * h * qkv, BF16 * (h * qkv + qkv + rows * h + rows * qkv)),
        "output projection": Work(2 * rows * qd * h, BF16 * (qd * h + h + rows * qd + rows * h)),
        "router": Work(2 * rows * h * e, BF16 * (h * e + e + rows * h + rows * e)),
        # Two fused add + RMSNorms: each reads x and the residual and writes both.
        "2 RMSNorms + residual adds": Work(2 * 4 * rows * h, 2 * 4 * rows * h * BF16),
    }


def head_work(model: Model, rows: int) -> Work:
    """The final norm and the LM head over the ``rows`` sampled tokens."""
    h, v = model.hidden, model.vocab
    return Work(2 * rows * h * v + 4 * rows * h, BF16 * (h * v + h + 3 * rows * h + rows * v))


def roofline_s(work: Work, ceilings: Ceilings) -> float:
    """The time of ``work`` at the GPU's practical (measured where known) ceilings."""
    return ceilings.practical_seconds(work.flops, work.bytes)


@dataclass(frozen=True)
class Feasibility:
    """Whether a phase's sequences fit the GPU: ``needed_bytes`` (weights + ``kv_bytes``, the
    smallest KV cache: window layers keep ``window`` keys) against ``memory_bytes``;
    ``kv_presets_bytes`` is the cache as the presets lay it out (every layer at the full context).
    Activations and the allocator's overhead are not counted: a phase that fails this check cannot
    run at all. ``message`` says it with the numbers (made by :func:`feasibility`)."""

    model: str
    kind: str
    batch: int
    tokens: int
    weight_bytes: float
    kv_bytes: float
    kv_presets_bytes: float
    needed_bytes: float
    memory_bytes: float
    device: str
    feasible: bool
    message: str


def feasibility(model: ProjectedModel, kind: str, batch: int, tokens: int,
                ceilings: Ceilings | None) -> Feasibility | None:
    """The memory check of a phase against all the GPUs the model needs (``model.gpus``), or None
    when the GPU's memory is not known."""
    if ceilings is None or not ceilings.memory_bytes:
        return None
    weights, kv = model.weight_bytes(), model.kv_bytes(batch, tokens)
    presets = model.kv_bytes(batch, tokens, window_layers_full=True)
    needed, memory, gb = weights + kv, ceilings.memory_bytes * model.gpus, 1e9
    of = f"{memory / gb:.0f} GB of {ceilings.name}" if model.gpus == 1 else \
        f"{memory / gb:.0f} GB of {model.gpus} x {ceilings.name}"
    verdict = "fits" if needed <= memory else "does not fit: not projected"
    message = (f"{model.name} {kind} at batch {batch} x {tokens} tokens needs at least {needed / gb:.0f} GB "
               f"(weights {weights / gb:.1f} GB + KV cache {kv / gb:.1f} GB; {presets / gb:.0f} GB with every layer "
               f"at the full context, as the presets lay it out) of the {of}: {verdict}")
    return Feasibility(model.name, kind, batch, tokens, weights, kv, presets, needed, memory, ceilings.name,
                       needed <= memory, message)
