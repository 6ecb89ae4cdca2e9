"""Model-level projection: what the measured per-call block times mean for time-to-first-token
(TTFT) and time-between-tokens (TBT) of a whole model, per workload profile: GPT-OSS-120b and -20b
(below), DeepSeek-R1 and Kimi K2.5 (:mod:`kernelforge.report.projection.mla`: MLA decode measured on
every layer, MLA prefill attention and the dense layers estimated, the MoE block on the MoE layers;
their weights need a node of 8 GPUs, and the figures are the full layer's block times on one GPU).

Pure arithmetic over plain numbers (no store, no torch), so the report can show its working and a
test can check it against a worked example by hand.

The GPT-OSS model (BLOCKS.md; dimensions from the public ``config.json`` of ``openai/gpt-oss-120b`` and
``openai/gpt-oss-20b``: hidden 2880, 64 query and 8 KV heads of 64, vocabulary 201088, sliding
window 128, 128 or 32 experts with top-4, 36 or 24 layers):

- a layer runs one attention call and one MoE-experts call (measured), and its dense parts: the
  QKV and output projections, the router, two fused add + RMSNorms (not measured: **roofline
  estimates** at the measured ceilings of the GPU, labelled ``estimate`` and the same for baseline
  and winner); the LM head (with the final norm) runs once per forward pass, on the rows that are
  sampled (the prompt's last token for TTFT, one row per sequence for TBT), also an estimate;
- window-128 attention on even layers and full attention on odd ones (0-based): ``ceil(L/2)``
  window layers and ``floor(L/2)`` full ones;
- TTFT: the prefill of the profile's prompt, attention on every layer plus the MoE experts **in one
  pass over the prompt** (preset ``T<prompt tokens>``), or, when the job states a prefill chunk
  size C, ``prompt // C`` calls of ``T<C>`` plus one call of the remainder;
- TBT: one decode step at batch B: decode attention over the profile's full context (the slowest
  step of the profile) plus the MoE experts at B tokens (the closest stored preset);
- **feasibility**: a phase is projected only if its sequences fit the GPU: the weights (MXFP4
  experts, bf16 rest) plus the KV cache, counted at its smallest (window layers keep 128 keys; the
  presets lay every layer out at the full context, which is reported beside it). A phase that
  does not fit is reported as infeasible with the numbers (:class:`Feasibility`), not projected;
- energy, where measured, of the measured blocks only (estimates have none): joules per token =
  energy / tokens of the phase (prompt tokens for TTFT, B for one decode step).

Not included at all: RoPE, KV-cache writes, embedding lookup, sampling, scheduling and
communication (:data:`NOT_MEASURED`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from kernelforge.devices.hardware import Ceilings
from kernelforge.profiles import BATCHES, PROFILES, Profile
from kernelforge.report.projection.mla import DECODE_BLOCK as MLA_DECODE_BLOCK
from kernelforge.report.projection.mla import MLA_MODELS
from kernelforge.report.projection.gpt_oss import (DECODE_BLOCK, PREFILL_BLOCK, AttentionCalls, Feasibility, Model,
                                            ProjectedModel, Work, feasibility, roofline_s)

MOE_BLOCK = "moe/gpt_oss_experts"
#: The ``block`` of the dense parts' components: roofline estimates, no block measured them.
ESTIMATE = "estimate"

#: Neither measured nor estimated: stated beside every projection.
NOT_MEASURED = ("RoPE", "KV-cache writes", "embedding lookup", "sampling", "scheduling",
                "tensor-parallel communication")
#: Estimated at the roofline, not measured (labelled as estimates in every phase).
ESTIMATED = ("QKV and output projections", "router", "RMSNorms with residual adds", "final norm and LM head")

MODELS: dict[str, ProjectedModel] = {
    "gpt-oss-120b": Model("gpt-oss-120b", 36, "gpt-oss-120b", experts=128),
    "gpt-oss-20b": Model("gpt-oss-20b", 24, "gpt-oss-20b", experts=32),
    **MLA_MODELS,
}
#: Every block the projection reads per-call times of.
PROJECTED_BLOCKS: tuple[str, ...] = tuple(dict.fromkeys(
    [PREFILL_BLOCK, DECODE_BLOCK, MLA_DECODE_BLOCK] + [m.moe_block for m in MODELS.values()]))

def moe_shape(model: ProjectedModel, tokens: int) -> str:
    """MoE experts preset name of a model at a token count."""
    return f"{model.moe_set}/T{tokens}"


def sharding_note(model: ProjectedModel) -> str:
    """What the figures of a model that needs several GPUs are (empty for one GPU)."""
    if model.gpus <= 1:
        return ""
    return (f"{model.name}'s weights need {model.gpus} GPUs: its figures sum the full layer's block times on one "
            f"GPU (the work of the layer); sharding it over the node and the communication are not modelled")


def closest_tokens(target: int, available: Iterable[int]) -> int | None:
    """The available token count closest to ``target`` (the larger one on a tie), or None."""
    options = sorted(set(available))
    if not options:
        return None
    return min(options, key=lambda t: (abs(t - target), -t))


def prefill_chunks(tokens: int, chunk: int | None = None) -> list[tuple[int, int]]:
    """(tokens per MoE call, calls) of a prefill of ``tokens``: one pass over the prompt, or with a
    stated ``chunk`` size, ``tokens // chunk`` calls of ``chunk`` and one of the remainder."""
    if not chunk or chunk >= tokens:
        return [(tokens, 1)]
    full, rest = divmod(tokens, chunk)
    return [(chunk, full)] + ([(rest, 1)] if rest else [])


# -- the dense parts: roofline estimates ---------------------------------------------------------

def dense_estimate(model: ProjectedModel, chunks: list[tuple[int, int]], head_rows: int,
                   ceilings: Ceilings) -> "Component":
    """The estimate component of a phase: every layer's dense kernels over each (rows, calls)
    chunk, plus the LM head over ``head_rows`` rows once."""
    kernels: dict[str, None] = {}
    seconds = roofline_s(model.head_work(head_rows), ceilings)
    for rows, calls in chunks:
        for name, work in model.dense_work(rows).items():
            kernels[name] = None
            seconds += calls * roofline_s(work, ceilings)
    note = (f"roofline estimate, not measured: {', '.join(kernels)} on {model.layers} layers, "
            f"LM head on {head_rows} row(s), at {ceilings.name} {ceilings.practical_bandwidth / 1e12:.2f} TB/s, "
            f"{ceilings.practical_flops / 1e12:.0f} TFLOP/s")
    return Component(ESTIMATE, "dense parts (estimate)", (), (), f"{model.layers} layers + LM head", seconds,
                     seconds, note=note, estimate=True)


def attention_estimate(model: ProjectedModel, work: Work, ceilings: Ceilings) -> "Component":
    """Attention that no block measures (MLA prefill), at the roofline: labelled an estimate."""
    seconds = roofline_s(work, ceilings)
    note = (f"roofline estimate, not measured: no block measures {model.name}'s prefill attention "
            f"({work.flops / 1e12:.1f} TFLOP over {model.layers} layers at {ceilings.name})")
    return Component(ESTIMATE, "attention (prefill, estimate)", (), (), f"{model.layers} layers", seconds, seconds,
                     note=note, estimate=True)


# -- phases --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Measured:
    """Per-call figures of one shape: baseline and winner time (s) and energy (J, when measured)."""

    baseline_s: float
    winner_s: float
    baseline_j: float | None = None
    winner_j: float | None = None


@dataclass(frozen=True)
class Component:
    """One part of a phase, summed over the model's layers: a measured block's (``shapes`` it
    needs as (block, shape), ``missing`` those not measured; times None when anything is missing)
    or, with ``estimate``, the dense parts' roofline estimate (no shapes, no energy)."""

    block: str
    label: str
    shapes: tuple[tuple[str, str], ...]
    missing: tuple[tuple[str, str], ...]
    calls_per_layer: str
    baseline_s: float | None = None
    winner_s: float | None = None
    baseline_j: float | None = None
    winner_j: float | None = None
    note: str = ""
    estimate: bool = False

    @property
    def complete(self) -> bool:
        return not self.missing and self.baseline_s is not None


@dataclass(frozen=True)
class Phase:
    """TTFT (prefill) or TBT (one decode step at a batch size) of one model and profile. An
    infeasible phase (``fit`` says why) has no components; ``fit`` None: memory not checked."""

    kind: str  # "TTFT" or "TBT"
    model: str
    profile: str
    batch: int | None
    tokens: int  # tokens this phase produces or consumes: prefill tokens, or the batch for TBT
    components: tuple[Component, ...]
    fit: Feasibility | None = None

    @property
    def feasible(self) -> bool:
        return self.fit is None or self.fit.feasible

    @property
    def complete(self) -> bool:
        return self.feasible and all(c.complete for c in self.components)

    def _sum(self, attr: str, measured_only: bool = False) -> float | None:
        values = [getattr(c, attr) for c in self.components if not (measured_only and c.estimate)]
        return sum(values) if self.complete and all(v is not None for v in values) else None

    @property
    def baseline_s(self) -> float | None:
        return self._sum("baseline_s")

    @property
    def winner_s(self) -> float | None:
        return self._sum("winner_s")

    @property
    def change_s(self) -> float | None:
        """Winner minus baseline (negative: the blocks save that much)."""
        b, w = self.baseline_s, self.winner_s
        return None if b is None or w is None else w - b

    @property
    def speedup(self) -> float | None:
        b, w = self.baseline_s, self.winner_s
        return None if not b or not w else b / w

    def _per_token(self, attr: str) -> float | None:
        j = self._sum(attr, measured_only=True)  # energy of the measured blocks: estimates have none
        return None if j is None else j / self.tokens

    @property
    def baseline_j_per_token(self) -> float | None:
        return self._per_token("baseline_j")

    @property
    def winner_j_per_token(self) -> float | None:
        return self._per_token("winner_j")

    @property
    def missing(self) -> list[tuple[str, str]]:
        return [m for c in self.components for m in c.missing]


def _component(block: str, label: str, needed: list[tuple[str, str, float]], measured: Mapping[tuple[str, str], Measured],
               calls_per_layer: str, note: str = "") -> Component:
    """Sum ``weight x per-call figure`` over the needed (block, shape, weight) triples."""
    shapes = tuple(dict.fromkeys((b, s) for b, s, _ in needed))
    missing = tuple(key for key in shapes if key not in measured)
    if missing:
        return Component(block, label, shapes, missing, calls_per_layer, note=note)
    rows = [(measured[(b, s)], w) for b, s, w in needed]
    base = sum(m.baseline_s * w for m, w in rows)
    win = sum(m.winner_s * w for m, w in rows)
    have_j = all(m.baseline_j is not None and m.winner_j is not None for m, _ in rows)
    base_j = sum(m.baseline_j * w for m, w in rows) if have_j else None  # type: ignore[operator]
    win_j = sum(m.winner_j * w for m, w in rows) if have_j else None  # type: ignore[operator]
    return Component(block, label, shapes, (), calls_per_layer, base, win, base_j, win_j, note)


def _attention(calls: AttentionCalls, measured: Mapping[tuple[str, str], Measured]) -> Component:
    return _component(calls.block, calls.label, list(calls.needed), measured, calls.calls)


def ttft(model: ProjectedModel, profile: Profile, measured: Mapping[tuple[str, str], Measured], *,
         chunk: int | None = None, ceilings: Ceilings | None = None) -> Phase:
    """TTFT of ``model`` on ``profile``: prefill attention, the MoE experts in one pass over the
    prompt (or in ``chunk``-token calls), and, with ``ceilings``, the dense parts' estimate and
    the memory check. ``measured`` maps (block, shape) to per-call figures."""
    tokens = profile.input_tokens
    fit = feasibility(model, "TTFT", 1, tokens, ceilings)
    if fit is not None and not fit.feasible:
        return Phase("TTFT", model.name, profile.name, None, tokens, (), fit)
    chunks = prefill_chunks(tokens, chunk)
    how = "one pass over the prompt" if len(chunks) == 1 and chunks[0][0] == tokens else f"chunks of {chunk} tokens"
    calls = " + ".join(f"{n} x T{t}" for t, n in chunks)
    block, layers = model.moe_block, model.moe_layers
    moe = _component(block, "MoE experts", [(block, moe_shape(model, t), layers * n) for t, n in chunks],
                     measured, f"{layers} layers x ({calls})",
                     "; ".join(filter(None, [f"MoE prefill of {tokens} tokens as {how}", sharding_note(model)])))
    attention = model.attention_calls("prefill", profile.name, None)
    parts = [] if attention is None else [_attention(attention, measured)]
    parts.append(moe)
    if ceilings is not None:
        unmeasured = model.attention_estimate(tokens)
        if attention is None and unmeasured is not None:
            parts.insert(0, attention_estimate(model, unmeasured, ceilings))
        parts.append(dense_estimate(model, chunks, 1, ceilings))
    return Phase("TTFT", model.name, profile.name, None, tokens, tuple(parts), fit)


def tbt(model: ProjectedModel, profile: Profile, batch: int, measured: Mapping[tuple[str, str], Measured],
        moe_tokens: Iterable[int], *, ceilings: Ceilings | None = None) -> Phase:
    """One decode step (TBT) at ``batch`` sequences; ``moe_tokens`` are the token counts of the
    model's MoE presets to choose from (the closest to the batch is used, and named)."""
    context = profile.input_tokens + profile.output_tokens
    fit = feasibility(model, "TBT", batch, context, ceilings)
    if fit is not None and not fit.feasible:
        return Phase("TBT", model.name, profile.name, batch, batch, (), fit)
    preset = closest_tokens(batch, moe_tokens)
    block, layers = model.moe_block, model.moe_layers
    if preset is None:
        moe = Component(block, "MoE experts", (), ((block, moe_shape(model, batch)),), "-",
                        note="no MoE token-count preset of this model")
    else:
        note = "; ".join(filter(None, ["" if preset == batch else f"closest stored MoE preset to batch {batch}: T{preset}",
                                       sharding_note(model)]))
        moe = _component(block, "MoE experts", [(block, moe_shape(model, preset), layers)], measured,
                         f"{layers} calls of T{preset}", note)
    attention = model.attention_calls("decode", profile.name, batch)
    parts = ([] if attention is None else [_attention(attention, measured)]) + [moe]
    if ceilings is not None:
        parts.append(dense_estimate(model, [(batch, 1)], batch, ceilings))
    return Phase("TBT", model.name, profile.name, batch, batch, tuple(parts), fit)


@dataclass
class Projection:
    """Every phase of every model and profile, with what was missing."""

    phases: list[Phase] = field(default_factory=list)

    def for_profile(self, profile: str) -> list[Phase]:
        return [p for p in self.phases if p.profile == profile]


def project(measured: Mapping[tuple[str, str], Measured], moe_tokens: Mapping[str, Iterable[int]],
            profiles: Iterable[str] = tuple(PROFILES), models: Iterable[str] = tuple(MODELS),
            batches: Iterable[int] = BATCHES, *, chunk: int | None = None,
            prefill_ceilings: Ceilings | None = None, decode_ceilings: Ceilings | None = None) -> Projection:
    """TTFT and TBT phases for every (profile, model, batch). ``moe_tokens``: model name -> the
    token counts its decode MoE presets may be taken from; ``chunk``: the job's prefill chunk size
    (None: one pass); the ceilings of the GPU the prefill and decode blocks were measured on
    (None: no estimates, no memory check)."""
    out = Projection()
    for pname in profiles:
        profile = PROFILES[pname]
        for mname in models:
            model = MODELS[mname]
            tokens = list(moe_tokens.get(mname, ()))
            out.phases.append(ttft(model, profile, measured, chunk=chunk, ceilings=prefill_ceilings))
            for b in batches:
                out.phases.append(tbt(model, profile, b, measured, tokens, ceilings=decode_ceilings))
    return out
