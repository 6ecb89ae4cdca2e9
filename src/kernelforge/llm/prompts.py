"""The prompts: Jinja2 templates shipped in ``kernelforge/prompts/`` filled with what the model
needs to write a better kernel.

What the model is given (``new.j2``): the block's math (the reference's source and docstring), its
inputs, the shapes verified and timed with their dimensions, the production shapes the kernel is
for and the target GPU's ceilings and resources (:mod:`kernelforge.llm.target`: even when the
search verifies smoke shapes in the interpreter, the kernel is written for the target), the
verification tolerances and held-out shapes, the baseline template, the interface and header
format a candidate must keep, the parent it should improve on, the best candidates so far with
their timings per shape and speedups, compile resources (registers, spills, shared memory) of the
best ones, the failures of earlier attempts with their messages and failing shapes, and the rules
(``system.j2``). A repair turn (``repair.j2``) adds the error of its answer, the failing shape's
dimensions and the diff of the failed template against its parent; the failed answer itself is
resent cut to :data:`MAX_ANSWER` characters (:func:`capped_answer`), never the whole conversation
(:func:`first_turn`). Everything is read from the store, so a prompt never contains more than the
search knows.
"""

from __future__ import annotations

import functools
import inspect
import textwrap
from typing import Any, Iterable

import jinja2

from kernelforge.objective import by_candidate, rank, speedup
from kernelforge.block import Block, Shape
from kernelforge.environment import Timings, timings_of
from kernelforge.llm.target import TargetGPU
from kernelforge.result import format_seconds
from kernelforge.space import toml_value

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
#: Production shapes a prompt names at most (the others are counted).
MAX_PRODUCTION = 12
#: A failed answer resent in a repair turn keeps at most this many characters (the rest is cut
#: with a note saying so), and the diff of a failed template against its parent as many.
MAX_ANSWER = 8000
MAX_DIFF = 4000
#: Shape sets that are not production shapes: the interpreter's tiny ones and the held-out sizes.
NOT_PRODUCTION = ("smoke", "check")
#: Characters per token of the budget's estimate of a prompt (a common average for English and code).
CHARS_PER_TOKEN = 4


def render(name: str, **context: Any) -> str:
    """Render prompt template ``name`` (e.g. ``"new.j2"``)."""
    return _ENV.get_template(name).render(**context)


def system_prompt() -> str:
    return render("system.j2")


@functools.lru_cache(maxsize=32)
def _facts(block_type: type, block_id: str, dtype_name: str) -> dict[str, Any]:
    from kernelforge.block import DTYPES
    from kernelforge.execute.judge.contract import allocate

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

    interpreter = timings_of(env) is Timings.INTERPRETER
    timing = env.get("timing") or ("interpreter wall time" if interpreter else "GPU time")
    if interpreter:
        return {"timing": timing, "roofline": [], "description": (
            "This search verifies and times in Triton's interpreter on a CPU (no GPU here). Correctness is "
            "real; the times are interpreter wall time, not GPU speed: they grow with programs x loop "
            "iterations x operations per program, so they favour few, large programs, which on a GPU would "
            "leave most SMs idle. Do not design for them: write the kernel for the target GPU and the "
            "production shapes described above.")}
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


def dims(shape: Shape) -> str:
    """A shape with its dimensions, e.g. ``n7 (N=7)``; a long run of equal lengths is written
    ``(8800,)*64``."""
    parts = []
    for key, value in shape.as_dict().items():
        if isinstance(value, (tuple, list)) and len(value) > 4 and len(set(value)) == 1:
            text = f"({value[0]},)*{len(value)}"
        elif isinstance(value, (tuple, list)) and len(value) > 8:
            text = f"({', '.join(map(str, value[:6]))}, ... {len(value)} values)"
        else:
            text = str(tuple(value)) if isinstance(value, list) else str(value)
        parts.append(f"{key}={text}")
    return f"{shape.name} ({', '.join(parts)})"


def production_shapes(block: Block, job_shapes: str) -> tuple[list[Shape], int]:
    """The shapes the kernel is for, at most :data:`MAX_PRODUCTION` of them, and how many there
    are: the job's own when it names a production set or shape, else those of every set of the
    block but :data:`NOT_PRODUCTION` (as many from each set, spread over it: small and large)."""
    sets = block.shape_sets()
    if job_shapes not in NOT_PRODUCTION and not any(s.name == job_shapes for n in NOT_PRODUCTION
                                                    for s in sets.get(n, ())):
        found = block.shapes(job_shapes)
        return found[:MAX_PRODUCTION], len(found)
    groups = [list(shapes) for name, shapes in sets.items() if name not in NOT_PRODUCTION]
    chosen: dict[str, Shape] = {}
    per_set = max(1, MAX_PRODUCTION // max(len(groups), 1))
    for group in groups:
        k = min(per_set, len(group))
        for i in sorted({round(j * (len(group) - 1) / max(k - 1, 1)) for j in range(k)}):
            if len(chosen) < MAX_PRODUCTION:
                chosen.setdefault(group[i].name, group[i])
    return list(chosen.values()), len({s.name for g in groups for s in g})


def production_facts(block: Block, job_shapes: str, dtype, gpu: TargetGPU) -> dict[str, Any]:
    """The production shapes with their work and roofline time on the target GPU."""
    shapes, total = production_shapes(block, job_shapes)
    ceilings = gpu.ceilings
    lines = []
    for shape in shapes:
        line = dims(shape)
        try:
            counts = block.counts(shape, dtype)
        except Exception:  # a block whose counts cannot be computed for a shape: the shape still says
            lines.append(line)
            continue
        line += f": {counts.flops:.3g} FLOP, {counts.bytes:.3g} B"
        if ceilings is not None:
            line += (f", {ceilings.bound(counts.flops, counts.bytes)}-bound, at best "
                     f"{format_seconds(ceilings.roofline_seconds(counts.flops, counts.bytes))} on the {gpu.gpu}")
        lines.append(line)
    timed = job_shapes not in NOT_PRODUCTION and bool(shapes)
    return {"lines": lines, "more": total - len(shapes), "timed": timed}


@functools.lru_cache(maxsize=32)
def _tolerances(block_type: type, block_id: str, dtype_name: str, device_type: str) -> tuple[str, ...]:
    import torch

    from kernelforge.block import DTYPES
    from kernelforge.execute.judge.contract import allocate

    block = block_type(block_id)
    dtype = DTYPES[dtype_name]
    try:
        outs = allocate(block, block.shape_sets()["smoke"][0], dtype, "cpu")
    except Exception:  # outputs that cannot be made on a CPU: say the block's tolerance for the dtype
        outs = {}
    lines = []
    # An input updated in place is checked like an output (its tolerance is the block's for it).
    outs.update({name: torch.empty(0, dtype=dtype) for name in block.inplace if name not in outs})
    for name, tensor in outs.items():
        if not (tensor.dtype.is_floating_point or tensor.dtype.is_complex):
            lines.append(f"{name} ({str(tensor.dtype).replace('torch.', '')}): must match the reference exactly")
            continue
        tol = block.output_tolerance(name, dtype, device_type)
        lines.append(f"{name}: relative error of the whole tensor ||out - ref|| / ||ref|| <= {tol.rel_norm:g}, and "
                     f"every element |out - ref| <= {tol.atol:g} * rms(ref) + {tol.rtol:g} * |ref|")
    if not lines:
        tol = block.tolerance(dtype, device_type)
        lines.append(f"outputs: ||out - ref|| / ||ref|| <= {tol.rel_norm:g}, every element within "
                     f"{tol.atol:g} * rms(ref) + {tol.rtol:g} * |ref|")
    return tuple(lines)


def verification_facts(block: Block, dtype_name: str, env: dict[str, Any], timed: list[Shape]) -> dict[str, Any]:
    """How a candidate is verified: the tolerances per output (for this run's device) and the
    held-out shapes with their dimensions."""
    device = str(env.get("device", ""))
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    names = {s.name for s in timed}
    held = []
    for set_name in ("check", "smoke"):
        try:
            held = [dims(s) for s in block.shapes(set_name) if s.name not in names]
        except Exception:  # a block without that set
            held = []
        if held:
            break
    return {"tolerances": list(_tolerances(type(block), block.id, dtype_name, device_type)),
            "held_out": held[:MAX_PRODUCTION], "interpreter": timings_of(env) is Timings.INTERPRETER}


def new_prompt(*, block: Block, dtype_name: str, shapes: list[Shape], baseline: Any, baseline_point: dict,
               parent: dict[str, Any] | None, standings_rows: list[dict[str, Any]], resource_lines: list[str],
               failures: list[dict[str, str]], device: dict[str, Any], target: str | None,
               template_ids: list[str], gpu: TargetGPU | None = None, production: dict[str, Any] | None = None,
               verification: dict[str, Any] | None = None) -> str:
    """The user message asking for a new template (see the module docstring)."""
    return render(
        "new.j2",
        block=block_facts(block, dtype_name), dtype=dtype_name,
        shapes=[dims(s) for s in shapes], shape_names=[s.name for s in shapes],
        baseline={"id": baseline.id, "text": baseline.text.rstrip(), "point": _point(baseline_point),
                  "point_toml": ", ".join(f"{k} = {toml_value(v)}" for k, v in baseline_point.items())},
        parent=parent, standings=standings_rows, resources=resource_lines[:12],
        failures=[{**f, "message": _short(f["message"]) + (f" (failing shape {f['shape']})" if f.get("shape") else "")}
                  for f in failures[-MAX_FAILURES:]],
        device=device, target=target or "-", template_ids=template_ids,
        gpu=gpu.lines(dtype_name) if gpu is not None else [],
        production=production or {"lines": [], "more": 0, "timed": False},
        verification=verification or {"tolerances": [], "held_out": [], "interpreter": False},
    )


def repair_prompt(*, kind: str, status: str, message: str, template_id: str = "", point: str = "",
                  shape: str = "", diff: str = "", parent: str = "") -> str:
    """The user message of a repair turn: what went wrong with the previous answer; ``shape`` the
    failing shape with its dimensions (:func:`dims`), ``diff`` the failed template against its
    parent ``parent`` (cut to :data:`MAX_DIFF` characters)."""
    return render("repair.j2", kind=kind, status=status, message=_short(message, 1500), template_id=template_id,
                  point=point, shape=shape, diff=_cut(diff, MAX_DIFF, "diff") if diff else "", parent=parent)


def capped_answer(text: str, limit: int = MAX_ANSWER) -> str:
    """A failed answer as a repair turn resends it: whole when at most ``limit`` characters, else
    its head and tail with a note saying it was cut and how long it was."""
    return _cut(text, limit, "answer")


def first_turn(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The messages of a conversation up to its first user prompt (the system prompt and the
    request): what a repair turn resends of it, once."""
    for i, message in enumerate(messages):
        if message.get("role") == "user":
            return list(messages[: i + 1])
    return list(messages)


def estimate_tokens(messages: list[dict[str, str]], response_tokens: int | None = None) -> int:
    """The tokens a request is budgeted at before it is sent: :data:`CHARS_PER_TOKEN` characters
    a token of every message, plus ``response_tokens`` (the answer's cap) when set."""
    chars = sum(len(str(m.get("content", ""))) for m in messages)
    return -(-chars // CHARS_PER_TOKEN) + (response_tokens or 0)


def _cut(text: str, limit: int, what: str) -> str:
    if len(text) <= limit:
        return text
    head, tail = (3 * limit) // 4, limit // 4
    return (f"{text[:head]}\n\n[... cut: the {what} was {len(text)} characters; only its first {head} and last "
            f"{tail} are shown ...]\n\n{text[-tail:]}")


def _point(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _short(text: str, limit: int = MAX_MESSAGE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = ["block_facts", "capped_answer", "device_facts", "dims", "estimate_tokens", "first_turn", "new_prompt",
           "production_facts", "production_shapes", "repair_prompt", "resources", "standings", "system_prompt",
           "verification_facts"]
