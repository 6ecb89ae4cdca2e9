"""Model-level projection: what the measured per-call block times mean for time-to-first-token
(TTFT) and time-between-tokens (TBT) of a whole GPT-OSS model, per workload profile.

Pure arithmetic over plain numbers (no store, no torch), so the report can show its working and a
test can check it against a worked example by hand.

The model (BLOCKS.md, model dimensions and workload profiles):

- a layer runs one attention call and one MoE-experts call; GPT-OSS-120b has 36 layers, -20b 24;
  window-128 attention on even layers and full attention on odd ones (0-based), so with L layers
  ``ceil(L/2)`` are window layers and ``floor(L/2)`` full layers (18/18 and 12/12);
- TTFT (the blocks' part of it): the prefill attention of the profile's input tokens on every
  layer, plus the MoE experts over those tokens. MoE is measured at fixed token counts (presets
  T1..T4096), so the preset closest to the prefill token count is used and the prefill is counted as
  ``ceil(tokens / T)`` calls of that preset, the way a chunked prefill runs it; the report says so;
- TBT (the blocks' part of it): one decode step at batch B: decode attention over the profile's
  full context on every layer, plus the MoE experts at B tokens (one per sequence). The decode
  attention presets hold the longest cache of the profile (input + output tokens), so this is the
  slowest step of the profile;
- energy, where measured: joules per token = energy of the blocks' calls / tokens produced (the
  prefill's input tokens for TTFT, B tokens for one decode step).

Everything else in a layer (RMSNorm, router, QKV and output projections, RoPE, KV-cache writes,
communication) and outside the layers (embedding, LM head, sampling, scheduling) is not measured
and not included: the figures are the change in these blocks' contribution, not a full TTFT/TBT.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

PREFILL_BLOCK = "attention/gpt_oss_prefill"
DECODE_BLOCK = "attention/gpt_oss_decode"
MOE_BLOCK = "moe/gpt_oss_experts"

#: Not measured by any block: stated beside every projection.
NOT_MEASURED = ("RMSNorm", "router (linear + top-k + softmax)", "QKV and output projections", "RoPE",
                "KV-cache writes", "residual adds", "embedding and LM head", "sampling",
                "tensor-parallel communication")


@dataclass(frozen=True)
class Model:
    """A model the projection knows: its layer count and the MoE shape set with its dimensions."""

    name: str
    layers: int
    moe_set: str


@dataclass(frozen=True)
class Profile:
    """A workload profile: input (prefill) and output (decode) tokens. Its attention presets are
    named after it (``gpt-oss/<profile>/...``, see :func:`prefill_shapes` and :func:`decode_shapes`)."""

    name: str
    input_tokens: int
    output_tokens: int


MODELS: dict[str, Model] = {
    "gpt-oss-120b": Model("gpt-oss-120b", 36, "gpt-oss-120b"),
    "gpt-oss-20b": Model("gpt-oss-20b", 24, "gpt-oss-20b"),
}

PROFILES: dict[str, Profile] = {
    "interactive": Profile("interactive", 8000, 800),
    "rag": Profile("rag", 32000, 1200),
    "coding": Profile("coding", 64000, 4000),
    "long_context": Profile("long_context", 128000, 2000),
    "8k1k": Profile("8k1k", 8192, 1024),
}

#: Serving concurrency of the decode presets (attention/gpt_oss_decode BATCHES).
BATCHES: tuple[int, ...] = (1, 8, 32, 64)


# -- shape names (the blocks' preset naming) ----------------------------------------------------

def prefill_shapes(profile: str) -> dict[str, str]:
    """Layer kind -> prefill attention preset name of a profile."""
    return {"full": f"gpt-oss/{profile}/full", "window": f"gpt-oss/{profile}/window"}


def decode_shapes(profile: str, batch: int) -> dict[str, str]:
    """Layer kind -> decode attention preset name of a profile at a batch size."""
    return {"full": f"gpt-oss/{profile}/b{batch}/full", "window": f"gpt-oss/{profile}/b{batch}/window128"}


def moe_shape(model: Model, tokens: int) -> str:
    """MoE experts preset name of a model at a token count."""
    return f"{model.moe_set}/T{tokens}"


# -- the arithmetic -------------------------------------------------------------------------------

def layer_split(layers: int) -> tuple[int, int]:
    """(full layers, window layers): window attention on even layers, full on odd ones."""
    window = (layers + 1) // 2
    return layers - window, window


def closest_tokens(target: int, available: Iterable[int]) -> int | None:
    """The available token count closest to ``target`` (the larger one on a tie), or None."""
    options = sorted(set(available))
    if not options:
        return None
    return min(options, key=lambda t: (abs(t - target), -t))


def moe_calls(tokens: int, preset: int) -> int:
    """How many MoE calls of ``preset`` tokens process ``tokens`` tokens (a chunked prefill)."""
    return max(1, math.ceil(tokens / preset))


def attention_total(layers: int, full: float, window: float) -> float:
    """Attention over all layers: full-layer calls plus window-layer calls (seconds or joules)."""
    n_full, n_window = layer_split(layers)
    return n_full * full + n_window * window


def moe_total(layers: int, per_call: float, calls: int = 1) -> float:
    """MoE experts over all layers: ``calls`` calls per layer (seconds or joules)."""
    return layers * calls * per_call


@dataclass(frozen=True)
class Measured:
    """Per-call figures of one shape: baseline and winner time (s) and energy (J, when measured)."""

    baseline_s: float
    winner_s: float
    baseline_j: float | None = None
    winner_j: float | None = None


@dataclass(frozen=True)
class Component:
    """One block's contribution to a phase, summed over the model's layers.

    ``shapes`` are the shape names it needs (block, shape); ``missing`` those not measured.
    Times are None when anything is missing (no partial sums that look complete).
    """

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

    @property
    def complete(self) -> bool:
        return not self.missing and self.baseline_s is not None


@dataclass(frozen=True)
class Phase:
    """TTFT (prefill) or TBT (one decode step at a batch size) of one model and profile."""

    kind: str  # "TTFT" or "TBT"
    model: str
    profile: str
    batch: int | None
    tokens: int  # tokens this phase produces or consumes: prefill tokens, or the batch for TBT
    components: tuple[Component, ...]

    @property
    def complete(self) -> bool:
        return all(c.complete for c in self.components)

    def _sum(self, attr: str) -> float | None:
        values = [getattr(c, attr) for c in self.components]
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

    @property
    def baseline_j_per_token(self) -> float | None:
        j = self._sum("baseline_j")
        return None if j is None else j / self.tokens

    @property
    def winner_j_per_token(self) -> float | None:
        j = self._sum("winner_j")
        return None if j is None else j / self.tokens

    @property
    def missing(self) -> list[tuple[str, str]]:
        return [m for c in self.components for m in c.missing]


def _component(block: str, label: str, needed: list[tuple[str, str, float]], measured: Mapping[tuple[str, str], Measured],
               calls_per_layer: str, note: str = "") -> Component:
    """Sum ``weight x per-call figure`` over the needed (block, shape, weight) triples."""
    shapes = tuple((b, s) for b, s, _ in needed)
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


def ttft(model: Model, profile: Profile, measured: Mapping[tuple[str, str], Measured],
         moe_tokens: Iterable[int]) -> Phase:
    """The blocks' contribution to TTFT of ``model`` on ``profile``.

    ``measured`` maps (block, shape) to per-call figures; ``moe_tokens`` are the token counts of the
    model's MoE presets to choose from (the stored ones, else the block's presets, so that a missing
    shape can be named).
    """
    n_full, n_window = layer_split(model.layers)
    names = prefill_shapes(profile.name)
    attention = _component(
        PREFILL_BLOCK, "attention (prefill)",
        [(PREFILL_BLOCK, names["full"], n_full), (PREFILL_BLOCK, names["window"], n_window)], measured,
        f"{n_full} full-layer calls + {n_window} window-layer calls")
    preset = closest_tokens(profile.input_tokens, moe_tokens)
    if preset is None:
        moe = Component(MOE_BLOCK, "MoE experts", (), ((MOE_BLOCK, f"{model.moe_set}/T*"),), "-",
                        note="no MoE token-count preset of this model")
    else:
        calls = moe_calls(profile.input_tokens, preset)
        note = (f"closest stored MoE preset to {profile.input_tokens} prefill tokens: T{preset}; counted as "
                f"ceil({profile.input_tokens}/{preset}) = {calls} call(s) per layer (chunked prefill)")
        moe = _component(MOE_BLOCK, "MoE experts", [(MOE_BLOCK, moe_shape(model, preset), model.layers * calls)],
                         measured, f"{model.layers} layers x {calls} call(s) of T{preset}", note)
    return Phase("TTFT", model.name, profile.name, None, profile.input_tokens, (attention, moe))


def tbt(model: Model, profile: Profile, batch: int, measured: Mapping[tuple[str, str], Measured],
        moe_tokens: Iterable[int]) -> Phase:
    """The blocks' contribution to one decode step (TBT) at ``batch`` sequences."""
    n_full, n_window = layer_split(model.layers)
    names = decode_shapes(profile.name, batch)
    attention = _component(
        DECODE_BLOCK, "attention (decode)",
        [(DECODE_BLOCK, names["full"], n_full), (DECODE_BLOCK, names["window"], n_window)], measured,
        f"{n_full} full-layer calls + {n_window} window-layer calls")
    preset = closest_tokens(batch, moe_tokens)
    if preset is None:
        moe = Component(MOE_BLOCK, "MoE experts", (), ((MOE_BLOCK, f"{model.moe_set}/T{batch}"),), "-",
                        note="no MoE token-count preset of this model")
    else:
        note = "" if preset == batch else f"closest stored MoE preset to batch {batch}: T{preset}"
        moe = _component(MOE_BLOCK, "MoE experts", [(MOE_BLOCK, moe_shape(model, preset), model.layers)], measured,
                         f"{model.layers} calls of T{preset}", note)
    return Phase("TBT", model.name, profile.name, batch, batch, (attention, moe))


@dataclass
class Projection:
    """Every phase of every model and profile, with what was missing."""

    phases: list[Phase] = field(default_factory=list)

    def for_profile(self, profile: str) -> list[Phase]:
        return [p for p in self.phases if p.profile == profile]


def project(measured: Mapping[tuple[str, str], Measured], moe_tokens: Mapping[str, Iterable[int]],
            profiles: Iterable[str] = tuple(PROFILES), models: Iterable[str] = tuple(MODELS),
            batches: Iterable[int] = BATCHES) -> Projection:
    """TTFT and TBT phases for every (profile, model, batch). ``moe_tokens``: model name -> the
    token counts its MoE presets may be taken from."""
    out = Projection()
    for pname in profiles:
        profile = PROFILES[pname]
        for mname in models:
            model = MODELS[mname]
            tokens = list(moe_tokens.get(mname, ()))
            out.phases.append(ttft(model, profile, measured, tokens))
            for b in batches:
                out.phases.append(tbt(model, profile, b, measured, tokens))
    return out
