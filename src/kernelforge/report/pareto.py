"""The time-energy Pareto front of a block's candidates, from stored measurements only.

A point is on the front when no other point is at least as fast and at least as frugal and
strictly better in one of the two; points with the same time and energy are all on the front
(ties dominate nobody). A candidate without a measured energy (the interpreter, no NVML) has no
place on the front: it is left out and counted (``ParetoFront.unmeasured``)."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any, Mapping, Sequence

from markupsafe import Markup

from kernelforge.environment import Timings, timings_of
from kernelforge.objective import geomean
from kernelforge.result import StoredResult, format_seconds


@dataclass(frozen=True)
class ParetoPoint:
    """One candidate in the time-energy plane: seconds and joules per call (energy None: not measured)."""

    candidate: str
    time_s: float
    joules: float | None
    on_front: bool = False


@dataclass(frozen=True)
class ParetoFront:
    """The candidates of one shape group (``scope``: "all" or a shape name) placed in the
    time-energy plane, ``on_front`` marking the non-dominated ones; ``unmeasured`` counts the
    candidates left out because their energy was not measured; ``note`` says why a group has no
    front (energy not measurable on the device) or how many were left out."""

    scope: str
    points: tuple[ParetoPoint, ...]
    unmeasured: int = 0
    note: str = ""  # why there is no front (energy not measurable), or what was left out

    @property
    def front(self) -> tuple[ParetoPoint, ...]:
        """The non-dominated points, fastest first."""
        return tuple(sorted((p for p in self.points if p.on_front), key=lambda p: (p.time_s, p.joules)))

    def svg(self) -> Markup:
        """A small scatter of the points (seconds across, joules up), the front highlighted and
        joined; every label inside the viewBox. Empty without points."""
        return Markup(front_svg(self)) if self.points else Markup("")


def dominates(a: ParetoPoint, b: ParetoPoint) -> bool:
    """Whether ``a`` is at least as good as ``b`` in time and energy and strictly better in one."""
    if a.joules is None or b.joules is None:
        return False
    return a.time_s <= b.time_s and a.joules <= b.joules and (a.time_s < b.time_s or a.joules < b.joules)


def pareto_front(scope: str, measured: Sequence[tuple[str, float, float | None]]) -> ParetoFront:
    """The front of ``measured`` ((candidate, seconds, joules or None) per candidate)."""
    points = [ParetoPoint(c, t, j) for c, t, j in measured if j is not None]
    marked = tuple(ParetoPoint(p.candidate, p.time_s, p.joules, not any(dominates(q, p) for q in points))
                   for p in points)
    return ParetoFront(scope=scope, points=marked, unmeasured=sum(1 for _, _, j in measured if j is None))


def energy_note(env: Mapping[str, Any]) -> str | None:
    """Why a block's environment has no energy per call (None where NVML measured it)."""
    if env.get("energy") == "NVML energy counter":
        return None
    device = env.get("device_name") or env.get("device") or "this device"
    if timings_of(env) is Timings.INTERPRETER:
        why = "Triton interpreter"
    else:
        why = str(env.get("energy") or "no NVML")
    return f"energy was not measurable on {device} ({why}): no Pareto front"


def block_fronts(groups: Sequence[tuple[str, Sequence[str]]], table: Mapping[str, Mapping[str, StoredResult]],
                 env: Mapping[str, Any]) -> tuple[ParetoFront, ...]:
    """One front per shape group (``groups``: (scope, shape names), as the search grouped them)
    from the stored results of the block's environment (``table``: candidate -> shape -> result).
    A candidate counts where it verified and was timed on every shape of the group: its geometric
    means of seconds and of joules per call over those shapes (joules None where any is missing)."""
    unmeasurable = energy_note(env) if env else None
    fronts = []
    for scope, shapes in groups:
        measured = []
        for cid, rows in table.items():
            got = [rows.get(s) for s in shapes]
            if not shapes or not all(r is not None and r.ok and r.median_s for r in got):
                continue
            times = [r.median_s for r in got]  # type: ignore[union-attr]
            joules = [r.joules for r in got]  # type: ignore[union-attr]
            energy = geomean(joules) if all(j and j > 0 for j in joules) else None  # type: ignore[arg-type]
            measured.append((cid, geomean(times), energy))  # type: ignore[arg-type]
        front = pareto_front(scope, measured)
        if unmeasurable and not front.points:
            note = unmeasurable
        elif not front.points:
            note = "no candidate of this group has a measured energy per call: no Pareto front"
        elif front.unmeasured:
            note = f"{front.unmeasured} candidate(s) without a measured energy per call are left out"
        else:
            note = ""
        fronts.append(ParetoFront(front.scope, front.points, front.unmeasured, note))
    return tuple(fronts)


def front_markdown(fronts: Sequence[ParetoFront]) -> list[str]:
    """REPORT.md lines: each group's front as a table, or the note saying why there is none."""
    lines: list[str] = []
    for f in fronts:
        title = "Time and energy" + (f" ({f.scope})" if f.scope != "all" else "")
        lines.extend(["", f"{title}: " + (f.note or "the time-energy Pareto front (no candidate is both faster "
                                                    "and more frugal than one of these)."), ""])
        if f.front:
            lines.extend(["| candidate | time per call | energy per call |", "|---|---|---|"])
            lines.extend(f"| `{p.candidate}` | {format_seconds(p.time_s)} | {_joules(p.joules)} |" for p in f.front)
    return lines


def _joules(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g} J"


def front_svg(front: ParetoFront, width: int = 480, height: int = 300) -> str:
    """The scatter of :meth:`ParetoFront.svg` as SVG text (dominated points grey, the front orange)."""
    left, right, top, bottom = 90, 16, 14, 46
    xs = [p.time_s for p in front.points]
    ys = [p.joules for p in front.points if p.joules is not None]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    pad_x, pad_y = (x1 - x0) * 0.05 or x0 * 0.05 or 1e-9, (y1 - y0) * 0.05 or y0 * 0.05 or 1e-9
    x0, x1, y0, y1 = x0 - pad_x, x1 + pad_x, y0 - pad_y, y1 + pad_y

    def px(t: float) -> float:
        return left + (t - x0) / (x1 - x0) * (width - left - right)

    def py(j: float) -> float:
        return height - bottom - (j - y0) / (y1 - y0) * (height - top - bottom)

    out = [f'<svg class="pareto" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
           f'font-size="11" font-family="sans-serif" role="img" aria-label="time-energy Pareto front ({escape(front.scope)})">',
           f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" '
           'fill="none" stroke="#cbd5e1"/>']
    line = " ".join(f"{px(p.time_s):.1f},{py(p.joules):.1f}" for p in front.front if p.joules is not None)
    if len(front.front) > 1:
        out.append(f'<polyline points="{line}" fill="none" stroke="#ea580c" stroke-width="1.5"/>')
    for p in sorted(front.points, key=lambda p: p.on_front):  # the front drawn last, on top
        colour, radius = ("#ea580c", 5) if p.on_front else ("#94a3b8", 3.5)
        out.append(f'<circle class="{"front" if p.on_front else "dominated"}" data-candidate="{escape(p.candidate)}" '
                   f'cx="{px(p.time_s):.1f}" cy="{py(p.joules or 0.0):.1f}" r="{radius}" fill="{colour}">'
                   f'<title>{escape(p.candidate)}: {format_seconds(p.time_s)}, {_joules(p.joules)}'
                   f'{" (on the front)" if p.on_front else ""}</title></circle>')
    axis_y = height - bottom  # the labelled ticks sit at the extreme stored values
    tx0, tx1, ty0, ty1 = px(min(xs)), px(max(xs)), py(min(ys)), py(max(ys))
    out += [f'<path d="M{tx0:.1f},{axis_y} v4 M{tx1:.1f},{axis_y} v4 M{left},{ty0:.1f} h-4 M{left},{ty1:.1f} h-4" '
            'stroke="#64748b"/>',
            f'<text x="{tx0:.1f}" y="{axis_y + 16}" text-anchor="start">{format_seconds(min(xs))}</text>',
            f'<text x="{tx1:.1f}" y="{axis_y + 16}" text-anchor="end">{format_seconds(max(xs))}</text>',
            f'<text x="{(left + width - right) / 2:.0f}" y="{height - 8}" text-anchor="middle">time per call '
            '(geomean over shapes)</text>',
            f'<text x="{left - 6}" y="{ty0 + 4:.1f}" text-anchor="end">{_joules(min(ys))}</text>',
            f'<text x="{left - 6}" y="{ty1 + 4:.1f}" text-anchor="end">{_joules(max(ys))}</text>',
            f'<text x="{left - 6}" y="{(top + axis_y) / 2:.0f}" text-anchor="end">energy</text>',
            "</svg>"]
    # One time (or one energy): one label, not two on top of each other.
    same = ([f'>{format_seconds(max(xs))}</text>'] if min(xs) == max(xs) else []) + \
        ([f'>{_joules(max(ys))}</text>'] if min(ys) == max(ys) else [])
    for text in same:
        out.remove(next(line for line in reversed(out) if line.endswith(text)))
    return "\n".join(out)
