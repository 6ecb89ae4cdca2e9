"""The compile step itself, in the current process: load a candidate, record the launches of its
host code at the block's compile shape, compile each one for the target and report resources.

:func:`compile_here` must run where ``TRITON_INTERPRET`` is off (with it on, ``@triton.jit`` makes
interpreter functions that cannot be compiled); :func:`prepare_compiler_process` makes a fresh
process such a place. Callers normally go through :mod:`kernelforge.compile.pool`, which adds a
separate process and a timeout.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from kernelforge.compile.messages import captured_output, error_text, first_lines, syntax_error_text, where_in
from kernelforge.compile.resources import CompileReport, KernelResources, kernel_resources, limit_problems
from kernelforge.compile.specialise import BindError, compile_specialization, recording_launches
from kernelforge.targets import parse_target
from kernelforge.errors import UserError
from kernelforge.result import Status


def prepare_compiler_process() -> None:
    """Make this process a compiler, not an interpreter: drop TRITON_INTERPRET before triton reads
    it (it is read when ``@triton.jit`` decorates, i.e. when the candidate is loaded)."""
    os.environ.pop("TRITON_INTERPRET", None)
    import warnings

    # Triton 3.9 warns once per process that its fp-fusion default will change; the JIT on the
    # GPU uses the same default, so the warning says nothing about a candidate.
    warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
    import triton

    # The knob reads the environment lazily, so popping the variable is enough unless code run
    # before this entry (spawn re-running the parent's main module) set the knob itself.
    knobs = getattr(triton, "knobs", None)
    if knobs is not None and knobs.runtime.interpret:
        knobs.runtime.interpret = False


def compile_here(source: str, block_id: str, kernels_root: str | Path, dtype_name: str, target: str) -> CompileReport:
    """The compile step in the current process, which must not have the interpreter on.

    Prefer :func:`kernelforge.compile.pool.compile_candidate` (isolation, timeout). Raises
    UserError for mistakes of the caller (unknown block or dtype); every problem of the candidate
    is a report.
    """
    start = time.perf_counter()
    tgt = parse_target(target)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile_here needs a process without TRITON_INTERPRET; use compile_candidate")
    from kernelforge.block import DTYPES
    from kernelforge.candidate import load_module
    from kernelforge.catalog import Catalog
    from kernelforge.execute.judge.contract import allocate

    block = Catalog.discover(kernels_root).block(block_id)
    if dtype_name not in DTYPES:
        raise UserError(f"unknown dtype {dtype_name!r}; choose from {', '.join(DTYPES)}")
    dtype = DTYPES[dtype_name]

    def failed(status: Status, message: str, kernels: list | tuple = ()) -> CompileReport:
        return CompileReport.failed(tgt.name, status, message, tuple(kernels), time.perf_counter() - start)

    shape = block.compile_shape()
    inputs = block.make_inputs(shape, dtype, "cpu", seed=0)
    outputs = allocate(block, shape, dtype, "cpu")  # one tensor (out) or named outputs (contract v2)

    try:
        module = load_module(source, name_hint=block_id)
    except SyntaxError as exc:
        return failed(Status.COMPILE_ERROR, syntax_error_text(exc))
    except Exception as exc:
        return failed(Status.COMPILE_ERROR, f"candidate module failed to import: {error_text(exc)}")
    path = getattr(module, "__file__", None)
    if not callable(getattr(module, "run", None)):
        return failed(Status.COMPILE_ERROR, "candidate defines no run(**inputs, out) function")

    with recording_launches(tgt) as launches:
        try:
            module.run(**inputs, **outputs)
        except BindError as exc:
            return failed(Status.COMPILE_ERROR, first_lines(str(exc)) + where_in(exc, path))
        except Exception as exc:
            hint = ""
            if "active drivers" in str(exc) or "CUDA" in str(exc):
                hint = ("\n(host code cannot use a GPU when compiling ahead of time: no @triton.autotune, "
                        "torch.cuda calls or benchmarking in run())")
            return failed(Status.COMPILE_ERROR, f"run() raised {error_text(exc)}{where_in(exc, path)}{hint}")
    if not launches:
        return failed(Status.COMPILE_ERROR, f"run() launched no Triton kernel at the compile shape {shape}")

    kernels: list[KernelResources] = []
    problems: list[str] = []
    for launch in launches:
        name = getattr(launch.fn, "__name__", "kernel")
        with captured_output() as captured:
            t0 = time.perf_counter()
            try:
                compiled = compile_specialization(launch.spec, tgt)
            except Exception as exc:
                error = error_text(exc, captured())
                return failed(Status.COMPILE_ERROR, f"kernel {name} failed to compile for {tgt.name}:\n{error}", kernels)
            seconds = time.perf_counter() - t0
            try:
                resources = kernel_resources(compiled, launch.spec, tgt, seconds)
            except Exception as exc:
                return failed(Status.COMPILE_ERROR, f"kernel {name}: resource report failed: {error_text(exc)}", kernels)
        kernels.append(resources)
        problems += limit_problems(resources, launch.spec, tgt)
    if problems:
        return failed(Status.REJECTED, "; ".join(problems), kernels)
    return CompileReport(tgt.name, tuple(kernels), True, Status.OK, "", time.perf_counter() - start)
