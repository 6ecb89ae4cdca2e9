"""``kernelforge export JOB --format triton``: per block, a package-free folder of files that runs
each tuned shape's own winner.

- ``<block>__<candidate>.py``: the stored rendered source of every DISTINCT winner of the block
  (the baseline where nothing beat it), as the search measured it; each defines the block's
  ``run(...)`` (docs/block-contract.md).
- ``<block>.py``: the dispatcher. It records every tuned shape (its token count, its other
  dimensions, its winner module and its winning point), and its ``run(*args, **kwargs)`` reads the
  call's token count (and the other dimensions it can read) off the argument tensors, picks the
  winner by vLLM's rule (the tuned token count nearest the call's, ties to the smaller, among the
  shapes whose other dimensions match the call) and forwards to that module's ``run``. The winner
  modules are imported lazily, by path relative to the dispatcher, so the folder can be copied
  anywhere. ``winner_for(tokens, **dims)`` names the candidate, ``config_for`` gives its point
  as a ``triton.Config`` under the template's names (``CONFIGS`` / ``SHAPE_CONFIGS``, for readers).
  ``AUTOTUNE_CONFIGS`` are what ``@triton.autotune`` takes: per ``@triton.jit`` kernel of the
  winners, each distinct launch's meta-parameters under the kernel's own names, read off the
  sources (:mod:`kernelforge.report.export.autotune`); ``jit_kernel(name)`` gives the kernel to
  wrap, and ``AUTOTUNE_HOST_BOUND`` names the meta-parameters its host code also reads.

Which argument holds a dimension (``DIM_AXES``: dim -> (argument name, axis)) is found by building
the block's own inputs (``make_inputs``) for its ``smoke`` and ``check`` shapes on the CPU: the
first argument axis whose size equals the dimension in every one of them. A block with no token
dimension (none of :data:`TOKEN_DIMS` in its shapes) is dispatched by exact shape name only
(``run(..., kf_shape=NAME)``).
"""

from __future__ import annotations

import textwrap
from typing import Any

import torch

from kernelforge.block import DTYPES, Block
from kernelforge.catalog import Catalog
from kernelforge.errors import UserError
from kernelforge.execute.judge.contract import allocate
from kernelforge.report.export.autotune import AutotuneTable, autotune_table
from kernelforge.report.export.entry import ExportEntry, provenance, slug, winner_files
from kernelforge.report.records import Report, ShapeRow
from kernelforge.store.store import Store

#: The names a block's token dimension goes by, in the order they are looked for: MoE blocks' T
#: (or tokens / M), attention decode's batch B (one token per sequence).
TOKEN_DIMS = ("T", "tokens", "TOKENS", "num_tokens", "M", "B")


def config_expr(params: dict[str, Any], module: str = "triton") -> str:
    """``triton.Config({...}, num_warps=..., num_stages=...)`` source text of a point."""
    kwargs = {k: v for k, v in params.items() if k not in ("num_warps", "num_stages")}
    extra = "".join(f", {k}={params[k]!r}" for k in ("num_warps", "num_stages") if k in params)
    return f"{module}.Config({kwargs!r}{extra})"


def token_dim(rows: list[ShapeRow]) -> str | None:
    """The first of :data:`TOKEN_DIMS` that every shape has as an int, else None."""
    for name in TOKEN_DIMS:
        if rows and all(isinstance((r.dims or {}).get(name), int) for r in rows):
            return name
    return None


def argument_layout(block: Block, dtype: str) -> tuple[tuple[str, ...], dict[str, tuple[str, int | None]]]:
    """The keyword names of the block's ``run`` (inputs, then outputs) and, per int dimension, the
    first (argument, axis) whose size equals it in the inputs of every smoke and check shape (built on
    the CPU),
    else the first int argument equal to it (axis None: an attention window)."""
    sets = block.shape_sets()
    shapes = [*sets.get("smoke", []), *sets.get("check", [])]  # small, and odd sizes tell dimensions apart
    torch_dtype = DTYPES.get(dtype, torch.float32)
    names: tuple[str, ...] = ()
    found: dict[str, list[tuple[str, int | None]]] | None = None
    for shape in shapes:
        args = {**block.make_inputs(shape, torch_dtype, "cpu", 0), **allocate(block, shape, torch_dtype, "cpu")}
        names = names or tuple(args)
        here = {d: [*[(n, a) for n, t in args.items() if isinstance(t, torch.Tensor)
                      for a, size in enumerate(t.shape) if size == v],
                    *[(n, None) for n, t in args.items() if type(t) is int and t == v]]
                for d, v in shape.as_dict().items() if type(v) is int}
        found = here if found is None else {d: [p for p in found[d] if p in here.get(d, [])] for d in found}
    return names, {d: spots[0] for d, spots in (found or {}).items() if spots}


_DISPATCHER = '''

_HERE = _Path(__file__).resolve().parent
LOADED = {}  # the winner modules imported so far: file name -> module


def _module(file):
    """The winner module ``file`` (beside this one), imported once."""
    if file not in LOADED:
        name = "kf_export_" + file[:-3]
        spec = _ilu.spec_from_file_location(name, _HERE / file)
        module = _ilu.module_from_spec(spec)
        _sys.modules[name] = module  # triton.jit resolves a kernel's globals through its module
        spec.loader.exec_module(module)
        LOADED[file] = module
    return LOADED[file]


def shape_for(tokens, **dims):
    """The tuned shape that serves a call of ``tokens`` tokens with dimensions ``dims`` (vLLM's
    rule: the tuned token count nearest ``tokens``, ties to the smaller, among the shapes whose
    other dimensions equal ``dims``). ValueError when ``dims`` matches no tuned shape or leaves
    shapes of several other dimensions."""
    if TOKEN_DIM is None:
        raise ValueError("this block has no token dimension: dispatch by exact shape name (kf_shape=...) "
                         f"among {sorted(SHAPES)}")
    unknown = sorted(set(dims) - set(DIMS))
    if unknown:
        raise ValueError(f"unknown dimension(s) {unknown}; the tuned shapes have {sorted(DIMS)}")
    rows = [(s, d) for s, d in SHAPES.items() if all(d["dims"].get(k) == v for k, v in dims.items())]
    if not rows:
        tuned = sorted({tuple((k, d["dims"].get(k)) for k in sorted(dims)) for d in SHAPES.values()})
        raise ValueError(f"no tuned shape has {dims}: the tuned values of {sorted(dims)} are {tuned} "
                         "(run(..., kf_shape=<a tuned shape>) runs that shape's winner anyway)")
    keys = set(DIM_AXES) or {k for d in SHAPES.values() for k, v in d["dims"].items() if isinstance(v, int)}
    others = {tuple((k, v) for k, v in sorted(d["dims"].items()) if k != TOKEN_DIM and k in keys) for _, d in rows}
    if len(others) != 1:
        differ = sorted({k for o in others for k, _ in o} - set(dims))
        raise ValueError(f"pass the dimensions {differ} that pick one shape family (matching: {sorted(others)})")
    best = None
    for shape, d in rows:
        key = (abs(d["dims"][TOKEN_DIM] - tokens), d["dims"][TOKEN_DIM])
        if best is None or key < best[0]:
            best = (key, shape)
    return best[1]


def winner_for(tokens, **dims):
    """The candidate id of the winner that serves ``tokens`` tokens (see shape_for)."""
    return SHAPES[shape_for(tokens, **dims)]["candidate"]


def config_for(tokens, **dims):
    """The triton.Config of the winner that serves ``tokens`` tokens (see shape_for)."""
    return CONFIGS[SHAPE_CONFIGS[shape_for(tokens, **dims)]]


def jit_kernel(name):
    """The @triton.jit kernel ``name`` of AUTOTUNE_CONFIGS, from the winner module that defines it:
    wrap it as triton.autotune(configs=AUTOTUNE_CONFIGS[name], key=[...])(jit_kernel(name)) and
    launch it without those meta-parameters, its grid a function of META. Meta-parameters in
    AUTOTUNE_HOST_BOUND[name] are also read by the winner's host code (a grid, a padding): the
    caller computes those from the config too, or leaves them out of the tuning."""
    return getattr(_module(AUTOTUNE_MODULES[name]), name.split(":")[-1])


def run(*args, kf_shape=None, **kwargs):
    """The block's run: forwards to the winner of the call's token count (read off the arguments,
    DIM_AXES), or of the tuned shape ``kf_shape`` when given."""
    if len(args) > len(ARG_NAMES):
        raise TypeError(f"run takes at most {len(ARG_NAMES)} positional arguments ({', '.join(ARG_NAMES)})")
    kwargs.update(zip(ARG_NAMES, args))
    if kf_shape is not None:
        if kf_shape not in SHAPES:
            raise ValueError(f"kf_shape {kf_shape!r} is no tuned shape; choose one of {sorted(SHAPES)}")
        shape = kf_shape
    else:
        if TOKEN_DIM is None or TOKEN_DIM not in DIM_AXES:
            raise ValueError("the token count cannot be read off the arguments of this block: pass kf_shape=<a tuned "
                             f"shape> (one of {sorted(SHAPES)})")
        seen = {k: kwargs[n] if a is None else kwargs[n].shape[a] for k, (n, a) in DIM_AXES.items()}
        shape = shape_for(seen.pop(TOKEN_DIM), **seen)
    _interpreter_bf16(kwargs)
    return _module(SHAPES[shape]["module"]).run(**kwargs)


def _interpreter_bf16(kwargs):
    """Triton's CPU interpreter (TRITON_INTERPRET=1) stores bf16 as raw bits and computes on them
    (errors around 1e10). On a bf16 call there, apply kernelforge's fix (what the search verified
    with), or refuse when it cannot be applied."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" or not any(
            str(getattr(v, "dtype", "")) == "torch.bfloat16" for v in kwargs.values()):
        return
    try:
        from kernelforge.devices.interpreter import needs_bf16_fix, patch_bf16
    except ImportError:
        raise RuntimeError("bf16 in Triton's CPU interpreter (TRITON_INTERPRET=1) is computed wrongly without "
                           "kernelforge's interpreter fix: install kernelforge beside this folder (the fix is "
                           "applied on the first call) or run on a GPU") from None
    if not patch_bf16() and needs_bf16_fix():
        raise RuntimeError("bf16 in Triton's CPU interpreter: kernelforge's fix does not apply to this Triton "
                           "(see the warning above); run on a GPU")
'''


def dispatcher_text(data: Report, block_id: str, rows: list[ShapeRow], modules: dict[str, str],
                    layout: tuple[tuple[str, ...], dict[str, tuple[str, int | None]]],
                    autotune: AutotuneTable | None = None) -> str:
    """The source of ``<block>.py``: the shape table and the dispatch of :data:`_DISPATCHER`."""
    names, axes = layout
    tokens = token_dim(rows)
    points: list[dict[str, Any]] = []
    for r in rows:
        if r.params not in points:
            points.append(r.params)
    dims = sorted({k for r in rows for k, v in (r.dims or {}).items() if isinstance(v, (int, str))})
    env = data.env(next(b for b in data.blocks if b.block == block_id))
    read = ", ".join(f"{d} from {n}" + ("" if a is None else f".shape[{a}]") for d, (n, a) in axes.items()) or "none"
    about = [
        f"kernelforge export of job {data.job} ({data.job_file}), block {block_id}: the dispatcher.",
        "",
        "run(...) forwards each call to the winner tuned for the call's token count "
        + (f"({tokens}; vLLM's rule: the nearest tuned count, ties to the smaller, among the shapes whose other "
           "dimensions match the call)." if tokens else
           "-- this block has NO token dimension: pass kf_shape=<a tuned shape name> (exact name only)."),
        "",
        f"Dimensions read off the arguments: {read}. Winner modules (loaded lazily from this folder): "
        f"{', '.join(sorted(set(modules.values())))}.",
        "",
        f"Measured on {env.get('device_name', '?')} (triton {env.get('triton', '?')}, torch {env.get('torch', '?')}, "
        f"dtype {data.dtype}); see kernelforge-export-triton.json for each shape's speedup and confirmation.",
    ]
    header = [
        '"""' + "\n".join(textwrap.fill(line, 100, break_on_hyphens=False) for line in about),
        '"""',
        "",
        "import importlib.util as _ilu",
        "import sys as _sys",
        "from pathlib import Path as _Path",
        "",
        "import triton",
        "",
        f"TOKEN_DIM = {tokens!r}",
        f"DIMS = {tuple(dims)!r}",
        f"ARG_NAMES = {names!r}",
        f"DIM_AXES = {axes!r}",
        "SHAPES = {",
        *[f"    {r.shape!r}: {{'dims': {_plain(r.dims)!r}, 'candidate': {r.winner!r}, 'module': {modules[r.shape]!r}}},"
          for r in rows],
        "}",
        "CONFIGS = [",
        *[f"    {config_expr(p)}," for p in points],
        "]",
        "SHAPE_CONFIGS = {",
        *[f"    {r.shape!r}: {points.index(r.params)}," for r in rows],
        "}",
        "# For @triton.autotune: per @triton.jit kernel, each distinct launch of the winners (see jit_kernel).",
        "AUTOTUNE_CONFIGS = {",
        *[f"    {k!r}: [{', '.join(c.expr() for c in v)}]," for k, v in (autotune.configs if autotune else {}).items()],
        "}",
        f"AUTOTUNE_MODULES = {autotune.modules if autotune else {}!r}",
        f"AUTOTUNE_HOST_BOUND = {autotune.host_bound if autotune else {}!r}",
    ]
    return "\n".join(header) + _DISPATCHER


def _plain(dims: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (dims or {}).items() if isinstance(v, (int, str))}


def triton_modules(data: Report, store: Store,
                   catalog: Catalog | None = None) -> tuple[dict[str, str], list[ExportEntry]]:
    """File name -> text: per block, its distinct winners' sources and the dispatcher ``<block>.py``.
    Without ``catalog`` no dimension is read off the arguments (``run`` needs ``kf_shape``)."""
    files: dict[str, str] = {}
    entries: list[ExportEntry] = []
    for block in data.blocks:
        found = winner_files(block, store, files)
        rows, modules = [r for r, _ in found], {r.shape: name for r, name in found}
        if not rows:
            continue
        layout: tuple[tuple[str, ...], dict[str, tuple[str, int | None]]] = ((), {})
        if catalog is not None:
            layout = argument_layout(catalog.block(block.block), data.dtype)
        dispatcher = f"{slug(block.block)}.py"
        table = autotune_table({name: (files[name], r.params) for r, name in found})
        files[dispatcher] = dispatcher_text(data, block.block, rows, modules, layout, table)
        entries.extend(provenance(dispatcher, block.block, r) for r in rows)
    if not files:
        raise UserError(f"job {data.job}: no timed winner stored; run the search first")
    return files, entries
