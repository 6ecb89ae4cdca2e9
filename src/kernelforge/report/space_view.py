"""The searched space of one block, from its stored candidates (:attr:`BlockReport.candidate_rows`):
how much each parameter explains of the measured speedups (importance) and a parallel-coordinates
chart of every measured candidate, drawn as inline SVG.

Importance is Optuna's, computed as optuna-dashboard computes it for the job's mirrored studies
(``kernelforge dashboard``), so the report and the dashboard show one method: PED-ANOVA
(:class:`optuna.importance.PedAnovaImportanceEvaluator`, its defaults) over the measured candidates,
each a trial whose value is log(geomean speedup), maximised. PED-ANOVA asks which parameter values
the best 10% of the trials concentrate on; with fewer than :data:`MIN_MEASURED` measured candidates
that best 10% is a single trial, and the report gives no scores and says so. Parameters are not
independent in a search (a sampler favours good regions), so the scores describe the stored
candidates, not a controlled experiment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Any, Sequence

from kernelforge.report.records import BlockReport, CandidateRow
from kernelforge.report.svg import fit
from kernelforge.space import is_number

#: Below this many measured candidates no importance is computed: PED-ANOVA's best 10% must hold
#: at least two trials.
MIN_MEASURED = 20
TOO_FEW = "too few measured candidates"
METHOD = "Optuna's PED-ANOVA (PedAnovaImportanceEvaluator, as optuna-dashboard computes it)"
FONT = "font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif"
CHAR_PX = 8.5  # a generous width of one character at 12px (capitals included), to keep labels inside


@dataclass(frozen=True)
class Importance:
    """One parameter's importance by Optuna's PED-ANOVA (``share``: normalised by Optuna to sum to 1
    over the block's parameters) and how many values it took among the measured candidates."""

    name: str
    share: float
    values: int


@dataclass(frozen=True)
class SpaceView:
    """What the report shows of a block's searched space: the measured candidates (params and
    geomean speedup), the parameters, the importance of each (empty with ``note`` when too few)."""

    block: str
    parameters: tuple[str, ...]
    measured: tuple[CandidateRow, ...]
    importance: tuple[Importance, ...]
    note: str
    winner: str | None  # id of the fastest measured candidate


def _sort_key(value: Any) -> tuple[int, float, str]:
    if not is_number(value):
        return (1, 0.0, str(value))
    return (0, float(value), "")


def _values(rows: Sequence[CandidateRow], name: str) -> list[Any]:
    """The distinct stored values of one parameter, in order (numbers by size, then the rest)."""
    seen: dict[str, Any] = {}
    for r in rows:
        v = r.params.get(name)
        seen.setdefault(repr(v), v)
    return sorted(seen.values(), key=_sort_key)


def optuna_importance(measured: Sequence[CandidateRow], names: Sequence[str]) -> dict[str, float]:
    """Optuna's PED-ANOVA importance of ``names`` over the ``measured`` candidates (value:
    log(geomean speedup), maximised), as optuna-dashboard calls it; parameters every candidate
    shares. An in-memory study: nothing is written to the job's database."""
    import warnings

    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

    choices = {n: tuple(dict((repr(c.params[n]), c.params[n]) for c in measured).values()) for n in names}
    distributions = {n: CategoricalDistribution(v) for n, v in choices.items()}
    study = optuna.create_study(direction="maximize", storage=optuna.storages.InMemoryStorage())
    for c in measured:
        study.add_trial(optuna.trial.create_trial(params={n: c.params[n] for n in names},
                                                  distributions=distributions, value=math.log(c.geomean_speedup)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna's notes on target direction and equal importances
        return dict(get_param_importances(study, target=lambda t: -t.value,
                                          evaluator=PedAnovaImportanceEvaluator()))


def space_view(block: BlockReport) -> SpaceView:
    """The space view of one block from its collected candidate rows."""
    measured = tuple(c for c in block.candidate_rows
                     if c.geomean_speedup is not None and c.geomean_speedup > 0 and c.status == "ok")
    names: list[str] = []
    for c in block.candidate_rows:
        names.extend(k for k in c.params if k not in names)
    winner = max(measured, key=lambda c: c.geomean_speedup).id if measured else None
    if len(measured) < MIN_MEASURED:
        return SpaceView(block=block.block, parameters=tuple(names), measured=measured, importance=(),
                         note=f"{TOO_FEW} ({len(measured)}; {METHOD} compares the best 10% with the rest and "
                              f"needs at least {MIN_MEASURED})", winner=winner)
    shared = [n for n in names if all(n in c.params for c in measured)]
    scores = optuna_importance(measured, shared)
    total = sum(scores.values())
    importance = tuple(sorted((Importance(name=n, share=scores.get(n, 0.0), values=len({repr(c.params[n]) for c in measured}))
                               for n in shared), key=lambda i: -i.share))
    note = "" if total > 0 else "the measured speedups do not vary with any parameter"
    skipped = [n for n in names if n not in shared]
    if skipped:
        note = "; ".join(filter(None, (note, "not scored (not in every measured candidate): " + ", ".join(skipped))))
    return SpaceView(block=block.block, parameters=tuple(names), measured=measured, importance=importance,
                     note=note, winner=winner)


def _colour(speedup: float, lo: float, hi: float) -> str:
    """Red (slowest) through grey to green (fastest), on log(speedup)."""
    t = 0.5 if hi <= lo else (math.log(speedup) - lo) / (hi - lo)
    r0, g0, b0 = (220, 38, 38) if t < 0.5 else (156, 163, 175)
    r1, g1, b1 = (156, 163, 175) if t < 0.5 else (22, 163, 74)
    u = t * 2 if t < 0.5 else (t - 0.5) * 2
    return "#%02x%02x%02x" % (round(r0 + (r1 - r0) * u), round(g0 + (g1 - g0) * u), round(b0 + (b1 - b0) * u))


def importance_svg(view: SpaceView, width: int = 520) -> str:
    """Horizontal bars of each parameter's normalised importance ("" without scores)."""
    if not view.importance:
        return ""
    label_w = min(220, 16 + CHAR_PX * max(len(i.name) for i in view.importance))
    bar_h, gap, top = 18, 6, 30
    height = top + len(view.importance) * (bar_h + gap) + 10
    plot_w = width - label_w - 60
    title = f"{view.block}: parameter importance"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'role="img" aria-label="{escape(title)}" style="{FONT};font-size:12px">', f"<title>{escape(title)}</title>",
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
           f'<text x="8" y="16" font-weight="600">{escape(fit(title, width - 20, CHAR_PX))}</text>']
    for k, imp in enumerate(view.importance):
        y = top + k * (bar_h + gap)
        out.append(f'<text x="{label_w - 8:.0f}" y="{y + 13}" text-anchor="end">{escape(fit(imp.name, label_w - 12, CHAR_PX))}</text>')
        out.append(f'<rect x="{label_w:.0f}" y="{y}" width="{max(0.5, plot_w * imp.share):.1f}" height="{bar_h}" '
                   f'fill="#2563eb" fill-opacity="0.75"><title>{escape(imp.name)}: {imp.share:.0%} '
                   f'(PED-ANOVA, {imp.values} values)</title></rect>')
        out.append(f'<text x="{label_w + plot_w * imp.share + 6:.1f}" y="{y + 13}">{imp.share:.0%}</text>')
    out.append("</svg>")
    return "\n".join(out)


def parallel_svg(view: SpaceView, width: int = 900, height: int = 320) -> str:
    """Parallel coordinates: one axis per parameter (its stored values, in order) and a last axis of
    geomean speedup; one polyline per measured candidate coloured by speedup, the winner in black."""
    if not view.measured or not view.parameters:
        return ""
    axes = [*view.parameters, "speedup"]
    left, right, top, bottom = 40, 56, 40, 34
    step = (width - left - right) / max(1, len(axes) - 1)
    plot_h = height - top - bottom
    values = {name: _values(view.measured, name) for name in view.parameters}
    logs = [math.log(c.geomean_speedup) for c in view.measured]
    lo, hi = min(logs), max(logs)
    span = (hi - lo) or 1.0

    def ax(i: int) -> float:
        return left + step * i

    def y_param(name: str, v: Any) -> float:
        vals = values[name]
        pos = next((i for i, w in enumerate(vals) if repr(w) == repr(v)), 0)
        return top + plot_h * (0.5 if len(vals) == 1 else 1 - pos / (len(vals) - 1))

    def y_speed(s: float) -> float:
        return top + plot_h * (0.5 if hi == lo else 1 - (math.log(s) - lo) / span)

    title = f"{view.block}: searched space, one line per measured candidate (colour: speedup; black: best)"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'role="img" aria-label="{escape(title)}" style="{FONT};font-size:12px">', f"<title>{escape(title)}</title>",
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
           f'<text x="8" y="16" font-weight="600">{escape(fit(title, width - 20, CHAR_PX))}</text>']
    ordered = sorted(view.measured, key=lambda c: c.id == view.winner)  # the winner drawn last, on top
    for c in ordered:
        pts = [(ax(i), y_param(n, c.params.get(n))) for i, n in enumerate(view.parameters)]
        pts.append((ax(len(axes) - 1), y_speed(c.geomean_speedup)))
        best = c.id == view.winner
        colour = "#111827" if best else _colour(c.geomean_speedup, lo, hi)
        d = "M" + "L".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        tip = f"{c.id}: {c.geomean_speedup:.3f}x " + " ".join(f"{k}={v}" for k, v in c.params.items())
        out.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="{3 if best else 1.5}" '
                   f'stroke-opacity="{1 if best else 0.7}"><title>{escape(tip)}</title></path>')
    label_px = step - 8 if len(axes) > 1 else width / 2
    for i, name in enumerate(axes):
        x = ax(i)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" stroke="#6b7280"/>')
        anchor = "start" if i == 0 else "end" if i == len(axes) - 1 else "middle"
        out.append(f'<text x="{x:.1f}" y="{height - 10}" text-anchor="{anchor}" fill="#374151">'
                   f'{escape(fit(name, label_px, CHAR_PX))}</text>')
        ticks = ([(y_speed(math.exp(v)), f"{math.exp(v):.3g}x") for v in {lo, hi}] if name == "speedup"
                 else [(y_param(name, v), str(v)) for v in values[name]])
        for y, text in ticks:
            tick_anchor = "end" if i == len(axes) - 1 else "start"
            dx = -4 if i == len(axes) - 1 else 4
            out.append(f'<text x="{x + dx:.1f}" y="{y - 3:.1f}" text-anchor="{tick_anchor}" font-size="10" '
                       f'fill="#374151">{escape(fit(text, min(label_px, 90), CHAR_PX))}</text>')
    out.append("</svg>")
    return "\n".join(out)
