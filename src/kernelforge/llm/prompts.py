"""The prompts: Jinja2 templates shipped in ``kernelforge/prompts/`` filled with what the model
needs to write a better kernel.

What the model is given (``new.j2``): the block's math (the reference's source and docstring), its
inputs, the shapes, the baseline template, the interface and header format a candidate must keep,
the parent it should improve on, the best candidates so far with their timings per shape and
speedups, compile resources (registers, spills, shared memory) of the best ones, the failures of
earlier attempts with their messages, the device's ceilings and where the baseline sits against
them, and the rules (``system.j2``). A repair turn (``repair.j2``) adds the error of its answer.
Everything is read from the store, so a prompt never contains more than the search knows.
"""

from __future__ import annotations

import functools
import inspect
import textwrap
from typing import Any, Iterable

import jinja2

from kernelforge.objective import by_candidate, rank, speedup
from kernelforge.block import Block, Shape
from kernelforge.result import format_seconds

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("kernelforge.llm", "templates"),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)

#: Bounds that keep a prompt a few thousand tokens whatever the history.
MAX_STANDINGS = 5
MAX_FAILURES = 6
MAX_MESSAGE = 600


def render(name: str, **context: Any) -> str:
    """Render prompt template ``name`` (e.g. ``"new.j2"``)."""
    return _ENV.get_template(name).render(**context)


def system_prompt() -> str:
    return render("system.j2")


@functools.lru_cache(maxsize=32)
def _facts(block_type: type, block_id: str, dtype_name: str) -> dict[str, Any]:
    from kernelforge.block import DTYPES
    from kernelforge.execute.contract import allocate

    module = inspect.getmodule(block_type)
    docs = [d for d in (module.__doc__ if module else None, block_type.__doc__) if d]
    block = block_type(block_id)
    shape = block.shape_sets()["smoke"][0]
    inputs, output, output_names = [], "?", ["out"]
    try:
        made = block.make_inputs(shape, DTYPES[dtype_name], "cpu", 0)
        for name, value in made.items():
            if hasattr(value, "shape") and hasattr(value, "dtype"):
                inputs.append(f"{name}: tensor {tuple(value.shape)} {str(value.dtype).replace('torch.', '')}")
            else:
                inputs.append(f"{name}: {type(value).__name__} = {value!r}")
        outs = allocate(block, shape, DTYPES[dtype_name], "cpu")
        output = ", ".join(f"`{name}` (tensor {tuple(v.shape)} {str(v.dtype).replace('torch.', '')})"
                           for name, v in outs.items())
        output_names = list(outs)
    except Exception as exc:  # a block whose inputs cannot be made on a CPU: the source still says
        inputs.append(f"(could not be shown: {type(exc).__name__})")
    return {
        "docstring": "\n\n".join(inspect.cleandoc(d) for d in docs),
        "reference": textwrap.dedent(inspect.getsource(block_type.reference)).rstrip(),
        "make_inputs": textwrap.dedent(inspect.getsource(block_type.make_inputs)).rstrip(),
        "inputs": inputs,
        "output": output,
        "output_names": output_names,
        "inplace": list(block.inplace),
        "example_shape": f"{shape.name} {shape.as_dict()}",
    }


def block_facts(block: Block, dtype_name: str) -> dict[str, Any]:
    """The block's identity, math and interface, for the prompt."""
    return {"id": block.id, "description": block.description, **_facts(type(block), block.id, dtype_name)}


def standings(store, block_id: str, shapes: list[str], dtype: str, env_key: str, baseline_id: str,
              limit: int = MAX_STANDINGS) -> list[dict[str, Any]]:
    """The best verified candidates of a block (the baseline among them), with per-shape times and
    speedups over the baseline, best first."""
    table = by_candidate(r for r in store.results(block=block_id, dtype=dtype) if r.env_key == env_key)
    base = table.get(baseline_id, {})
    ranked = rank(table, baseline_id, shapes)
    chosen = ranked[:limit]
    if baseline_id not in [cid for cid, _ in chosen] and any(cid == baseline_id for cid, _ in ranked):
        chosen.append((baseline_id, 1.0))
    rows = []
    for cid, geo in chosen:
        candidate = store.candidate(cid)
        if candidate is None:
            continue
        cells = []
        for shape in shapes:
            row = table[cid].get(shape)
            s = speedup(base.get(shape), row)
            cells.append(f"{format_seconds(row.median_s)} (x{s:.2f})" if row and row.median_s and s else "-")
        rows.append({"id": cid, "template": candidate.template, "origin": candidate.origin,
                     "point": _point(candidate.params), "cells": cells, "geomean": f"x{geo:.3f}",
                     "speedup": geo})
    return rows


def resources(store, candidate_ids: Iterable[str], target: str | None, dtype: str) -> list[str]:
    """Compile resources of the given candidates on ``target``, one line per kernel."""
    if not target:
        return []
    lines = []
    for cid in candidate_ids:
        row = store.compile(cid, target, dtype)
        if row is None:
            continue
        for k in row.kernels:
            spills = "-" if k.get("spill_stores") is None else f"{k['spill_stores']}/{k['spill_loads']} B"
            lines.append(f"{cid} {k.get('name')}: registers {k.get('registers', '-')}, spill stores/loads {spills}, "
                         f"shared memory {k.get('shared_bytes', '-')} B, warps {k.get('num_warps')}, "
                         f"stages {k.get('num_stages')}")
        if row.status != "ok":
            lines.append(f"{cid}: {row.status}: {_short(row.message)}")
    return lines


def device_facts(env: dict[str, Any], block: Block, shapes: list[Shape], dtype, baseline_times: dict[str, float]
                 ) -> dict[str, Any]:
    """What the model should know about the device: its ceilings and the baseline's place under them."""
    from kernelforge.devices.hardware import ceilings_for

    device = env.get("device", "")
    timing = env.get("timing") or ("interpreter wall time" if device == "interpret" else "GPU time")
    if device == "interpret":
        return {"timing": timing, "roofline": [], "description": (
            "Triton's interpreter on a CPU (no GPU here). Correctness is real; times are interpreter wall "
            "time, roughly programs x loop iterations x operations per program, so fewer, larger programs "
            "are faster. They say nothing about GPU speed; the kernel must still be a good GPU kernel.")}
    # The device that measured: a replay's environment names the recorded one.
    name = env.get("recorded_device") or env.get("device_name", "")
    ceilings = ceilings_for(str(name or ""))
    if ceilings is None:
        return {"timing": timing, "roofline": [], "description": f"{name}: ceilings unknown."}
    lines = []
    for shape in shapes:
        counts = block.counts(shape, dtype)
        roof = ceilings.roofline_seconds(counts.flops, counts.bytes)
        base = baseline_times.get(shape.name)
        if base:
            lines.append(f"{shape.name}: baseline {format_seconds(base)}, roofline {format_seconds(roof)} "
                         f"({ceilings.bound(counts.flops, counts.bytes)}-bound, {counts.flops:.3g} FLOP, "
                         f"{counts.bytes:.3g} B): the baseline reaches {100 * roof / base:.0f}% of the roofline")
    return {"timing": timing, "roofline": lines, "description": (
        f"{name}: HBM {ceilings.bandwidth / 1e12:.2f} TB/s, dense 16-bit {ceilings.flops / 1e12:.0f} TFLOP/s "
        "(datasheet).")}


def new_prompt(*, block: Block, dtype_name: str, shapes: list[Shape], baseline: Any, baseline_point: dict,
               parent: dict[str, Any] | None, standings_rows: list[dict[str, Any]], resource_lines: list[str],
               failures: list[dict[str, str]], device: dict[str, Any], target: str | None,
               template_ids: list[str]) -> str:
    """The user message asking for a new template (see the module docstring)."""
    return render(
        "new.j2",
        block=block_facts(block, dtype_name), dtype=dtype_name,
        shapes=[f"{s.name} {s.as_dict()}" for s in shapes], shape_names=[s.name for s in shapes],
        baseline={"id": baseline.id, "text": baseline.text.rstrip(), "point": _point(baseline_point),
                  "point_toml": ", ".join(f"{k} = {_toml(v)}" for k, v in baseline_point.items())},
        parent=parent, standings=standings_rows, resources=resource_lines[:12],
        failures=[{**f, "message": _short(f["message"])} for f in failures[-MAX_FAILURES:]],
        device=device, target=target or "-", template_ids=template_ids,
    )


def repair_prompt(*, kind: str, status: str, message: str, template_id: str = "", point: str = "") -> str:
    """The user message of a repair turn: what went wrong with the previous answer."""
    return render("repair.j2", kind=kind, status=status, message=_short(message, 1500), template_id=template_id,
                  point=point)


def _point(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def _short(text: str, limit: int = MAX_MESSAGE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = ["block_facts", "device_facts", "new_prompt", "repair_prompt", "resources", "standings", "system_prompt"]
