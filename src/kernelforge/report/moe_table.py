"""The MoE report's default-versus-tuned table per token count, as vLLM's config pull requests show
it (kernel time per batch size with the default config and with the tuned file, and the speedup).

Built at render time from a block's :class:`~kernelforge.report.records.ShapeRow` rows (stored
measurements only). "Default" is the shape's stored baseline: the block's shipped default at that
shape's baseline point. vLLM's own fallback (``get_default_config`` in
``vllm/model_executor/layers/fused_moe/fused_moe.py``, used when no config file exists) is not
measured by kernelforge and is not shown.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelforge.report.format import fmt_speedup, fmt_time, measured_text, params_text
from kernelforge.report.records import BlockReport, ShapeRow

#: The dimensions that, besides the token count T, name one fused_moe config file's shapes.
FAMILY_DIMS = ("E", "I", "H", "TOPK", "ROUTING")


@dataclass(frozen=True)
class TokenRow:
    """One token count: the stored default (baseline) and tuned (winner) times and points, and
    the speedup, all from the shape row's one measurement (``measured_by``)."""

    tokens: int
    shape: str
    default_s: float | None
    tuned_s: float | None
    speedup: float | None
    speedup_p20: float | None
    speedup_p80: float | None
    confirmed: bool
    tuned_is_default: bool
    tuned_params: dict
    default_params: dict
    measured_by: str = "search"  # the row's times and speedup: "N pairs" (the confirmation) or "search"


@dataclass(frozen=True)
class MoeTable:
    """The token-count rows of one shape family (same E, I, H, TOPK, routing), by token count."""

    family: str
    rows: tuple[TokenRow, ...]


def _token_row(r: ShapeRow) -> TokenRow:
    return TokenRow(tokens=int(r.dims["T"]), shape=r.shape, default_s=r.baseline_s, tuned_s=r.best_s,
                    speedup=r.speedup, speedup_p20=r.speedup_p20, speedup_p80=r.speedup_p80, confirmed=r.confirmed,
                    tuned_is_default=r.winner_is_baseline, tuned_params=dict(r.params),
                    default_params=dict(r.baseline_params), measured_by=measured_text(r))


def moe_tables(block: BlockReport) -> tuple[MoeTable, ...]:
    """One table per shape family of an MoE block (shapes with T, E and I); empty for other blocks."""
    families: dict[str, list[TokenRow]] = {}
    for r in block.shapes:
        if not r.is_moe:
            continue
        family = ", ".join(f"{k}={r.dims[k]}" for k in FAMILY_DIMS if k in r.dims)
        families.setdefault(family, []).append(_token_row(r))
    return tuple(MoeTable(family, tuple(sorted(rows, key=lambda t: t.tokens))) for family, rows in families.items())


def moe_markdown(block: BlockReport) -> list[str]:
    """REPORT.md lines of the default-versus-tuned tables (none for a non-MoE block)."""
    lines: list[str] = []
    for table in moe_tables(block):
        lines.extend(["", f"Default versus tuned per token count ({table.family}); default = the shape's stored "
                          "baseline (vLLM's get_default_config is not measured here):", "",
                      "| tokens | default | tuned | speedup (p20-p80) | measured by | confirmed | tuned config |",
                      "|---|---|---|---|---|---|---|"])
        for t in table.rows:
            spread = f" ({t.speedup_p20:.3f}-{t.speedup_p80:.3f})" if t.speedup_p20 is not None else ""
            config = "default kept" if t.tuned_is_default else params_text(t.tuned_params)
            lines.append(f"| {t.tokens} | {fmt_time(t.default_s)} | {fmt_time(t.tuned_s)} | {fmt_speedup(t.speedup)}"
                         f"{spread} | {t.measured_by} | {'yes' if t.confirmed else 'no'} | {config} |")
    return lines
