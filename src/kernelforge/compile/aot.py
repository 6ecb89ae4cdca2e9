"""Ahead-of-time compilation of candidates for a real GPU target, with no GPU present.

A candidate is compiled the way Triton's JIT would compile it on the target GPU, but without a GPU
(CPU_TRITON.md section 2): its host code ``run(**inputs, out)`` is called on CPU tensors from the
block's :meth:`~kernelforge.block.Block.compile_shape` with :meth:`JITFunction.run
<triton.runtime.jit.JITFunction.run>` replaced by a recorder, so every ``kernel[grid](...)``
launch is captured instead of run. Each distinct (kernel, specialisation) is then specialised with
the target's backend exactly as the JIT does, compiled with ``triton.compile`` for the target
(ttir -> ttgir -> llir -> ptx -> cubin, or amdgcn -> hsaco) and measured: shared memory, registers,
spills, wgmma / TMA / cp.async use. A config over the target's shared-memory limit is
``rejected`` before any GPU time is spent; a kernel Triton cannot compile is a ``compile_error``.

The work runs in a child process (``spawn``) without ``TRITON_INTERPRET``: with that flag set
``@triton.jit`` makes interpreter functions that cannot be compiled, and a crashing or hanging
compile must never take the caller down. Public entry points:

- :func:`compile_candidate`: one candidate, one child process, a hard timeout.
- :class:`CompilePool`: a pool of compile workers for compiling upcoming candidates in the
  background.
- :func:`parse_target`, :func:`default_target`, :data:`TARGETS`: compile targets.

Triton's own cache (``TRITON_CACHE_DIR`` or its default) is used, so compiling an unchanged
kernel again costs about a millisecond plus the ptxas resource pass.
"""

from __future__ import annotations

import concurrent.futures as cf
import inspect
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from kernelforge.errors import UserError

# Nothing here imports triton at module level: this module is imported (by unpickling) in the
# compile child before the child has removed TRITON_INTERPRET, and triton must not see the flag.

STATUSES = ("ok", "compile_error", "rejected", "timeout")


# -- targets --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A GPU to compile for: Triton's ``GPUTarget`` fields plus the per-block limits we check."""

    name: str
    backend: str  # "cuda" | "hip"
    arch: int | str  # compute capability (90) or gfx name ("gfx942")
    warp_size: int
    shared_limit: int  # bytes of shared memory (LDS) one block may use, opt-in maximum
    description: str = ""
    max_threads: int = 1024
    tmem_columns: int | None = None  # Blackwell tensor memory per SM, in columns

    @property
    def is_cuda(self) -> bool:
        return self.backend == "cuda"

    def gpu_target(self) -> Any:
        """Triton's ``GPUTarget`` for this target."""
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


def _cuda(cc: int, shared: int, description: str, **extra: Any) -> Target:
    return Target(f"sm_{cc}", "cuda", cc, 32, shared, description, **extra)


#: Known compile targets. Shared-memory limits are the per-block opt-in maxima of the CUDA
#: programming guide (compute capability table) and of the CDNA ISA guides (64 KiB LDS on
#: CDNA2/3, 160 KiB on CDNA4). Each was compiled offline with Triton 3.9 here.
TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        _cuda(80, 166912, "NVIDIA A100 (Ampere)"),
        _cuda(86, 101376, "NVIDIA RTX 30xx / A10 / A40 (Ampere)"),
        _cuda(89, 101376, "NVIDIA L4 / L40 / RTX 40xx (Ada)"),
        _cuda(90, 232448, "NVIDIA H100 / H200 (Hopper, sm_90a)"),
        _cuda(100, 232448, "NVIDIA B200 / GB200 (Blackwell, sm_100a)", tmem_columns=512),
        _cuda(120, 101376, "NVIDIA RTX 50xx / RTX PRO 6000 (Blackwell, sm_120a)"),
        Target("gfx90a", "hip", "gfx90a", 64, 65536, "AMD MI200 (CDNA2)"),
        Target("gfx942", "hip", "gfx942", 64, 65536, "AMD MI300X / MI325X (CDNA3)"),
        Target("gfx950", "hip", "gfx950", 64, 163840, "AMD MI350X / MI355X (CDNA4)"),
    )
}

#: Used when there is no local GPU: the H100/H200 is what the project's kernels are tuned for.
FALLBACK_TARGET = "sm_90"


def parse_target(name: str | Target) -> Target:
    """The :class:`Target` called ``name``: ``sm_90`` (also ``sm_90a``, ``sm90``), ``gfx942``, ...

    Raises UserError naming the known targets when ``name`` is not one of them.
    """
    if isinstance(name, Target):
        return name
    key = str(name).strip().lower()
    match = re.fullmatch(r"sm_?(\d+)a?", key)
    if match:
        key = f"sm_{int(match.group(1))}"
    else:
        key = key.split(":")[0]  # torch's gcnArchName carries feature flags: gfx942:sramecc+:xnack-
    if key not in TARGETS:
        raise UserError(
            f"unknown compile target {name!r}; known targets: {', '.join(TARGETS)} "
            "(sm_XY is an NVIDIA compute capability, gfxNNN an AMD GPU)"
        )
    return TARGETS[key]


def default_target() -> str:
    """The local GPU's target (``sm_XY`` from its compute capability, or its gfx name on ROCm)
    when torch sees a GPU, else ``sm_90``.

    A local GPU that is not in :data:`TARGETS` is still returned by name, so that compiling for it
    fails with a clear message instead of silently checking another GPU's limits.
    """
    try:
        import torch

        if torch.cuda.is_available():
            if getattr(torch.version, "hip", None):
                return str(torch.cuda.get_device_properties(0).gcnArchName).split(":")[0]
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}"
    except Exception:  # a broken driver install is the same as no GPU for choosing a target
        pass
    return FALLBACK_TARGET


# -- records --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelResources:
    """What one compiled kernel needs on the target.

    ``registers`` are per thread (NVIDIA: from ``ptxas -v``; AMD: VGPRs from the amdgcn metadata).
    ``spill_stores``/``spill_loads`` are bytes on NVIDIA; on AMD both hold the number of spilled
    VGPRs plus SGPRs (the metadata counts registers, not bytes): non-zero means spilling on
    either. ``signature`` is the specialisation it was compiled for (argument types, ``:D`` for
    16-divisible arguments, constexpr values), ``compile_seconds`` the wall time of
    ``triton.compile`` (about 1 ms on a Triton cache hit).
    """

    name: str
    shared_bytes: int
    registers: int | None
    spill_stores: int | None
    spill_loads: int | None
    num_warps: int
    num_stages: int
    uses_wgmma: bool
    uses_tma: bool
    uses_cp_async: bool
    compile_seconds: float
    tmem_size: int = 0
    global_scratch_size: int = 0
    signature: str = ""

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads)


@dataclass(frozen=True)
class CompileReport:
    """The outcome of compiling one candidate for one target.

    ``status``: ``ok``; ``rejected`` (compiled, but a kernel exceeds a hard limit of the target:
    shared memory, tensor memory, threads per block; ``kernels`` still lists the resources);
    ``compile_error`` (Triton could not compile a kernel, or the candidate's host code failed);
    ``timeout`` (the compile process was killed). ``message`` says what went wrong in a few lines.
    ``seconds`` is the wall time of the whole compile step, process start included.
    """

    target: str
    kernels: tuple[KernelResources, ...]
    ok: bool
    status: str
    message: str = ""
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {', '.join(STATUSES)}")
        if self.ok != (self.status == "ok"):
            raise ValueError("ok must be True exactly when status is 'ok'")

    @classmethod
    def failed(cls, target: str, status: str, message: str, kernels: tuple = (), seconds: float = 0.0):
        return cls(target, tuple(kernels), False, status, message, seconds)

    def replace_seconds(self, seconds: float) -> "CompileReport":
        return CompileReport(self.target, self.kernels, self.ok, self.status, self.message, seconds)


# -- specialisation -------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Specialization:
    """Everything ``triton.compile`` needs for one launch, built as the JIT builds it.

    ``signature`` maps argument name -> type (``*fp16``, ``i32``, ``constexpr``); ``constexprs``
    maps argument path -> value (``(3,)`` -> 128, and every int argument equal to 1, which the JIT
    turns into a constant); ``attrs`` maps argument path -> ``[["tt.divisibility", 16]]`` for
    pointers with a 16-byte aligned address and ints divisible by 16 (plus ``tt.pointer_range``
    on AMD); ``options`` is the backend's options object (num_warps, num_stages, ...).
    """

    fn: Any
    signature: dict
    constexprs: dict
    attrs: dict
    options: Any

    @property
    def key(self) -> str:
        """Identifies the compiled kernel (like the JIT's kernel-cache key)."""
        return repr((sorted(self.signature.items()), sorted(self.constexprs.items(), key=repr),
                     sorted(self.attrs.items()), sorted(self.options.__dict__.items(), key=repr)))

    def describe(self) -> str:
        """``a:*fp16:D, n:i32:D, alpha:fp32, stride=1, BLOCK=128``: one entry per argument
        (``:D`` divisible by 16, ``:S`` AMD buffer range; ``=`` marks a compile-time constant)."""
        parts = []
        for i, (name, ty) in enumerate(self.signature.items()):
            if ty == "constexpr":
                value = self.constexprs.get((i,), "?")
                parts.append(f"{name}={getattr(value, 'value', value)!r}")
            else:
                flags = "".join(
                    {"tt.divisibility": "D", "tt.pointer_range": "S"}.get(attr[0], "?")
                    for attr in self.attrs.get((i,), [])
                )
                parts.append(f"{name}:{ty}" + (f":{flags}" if flags else ""))
        return ", ".join(parts)


_BACKENDS: dict[Target, Any] = {}


def _backend(target: Target) -> Any:
    if target not in _BACKENDS:
        from triton.compiler import make_backend

        _BACKENDS[target] = make_backend(target.gpu_target())
    return _BACKENDS[target]


def specialize(fn: Any, args: tuple, kwargs: dict, target: Target | str) -> Specialization:
    """Specialise JIT function ``fn`` for a launch ``fn[grid](*args, **kwargs)`` on ``target``.

    This is JITFunction.run's own path minus the driver: the binder that Triton generates for the
    kernel (``create_function_from_signature``, which calls the backend's specialisation on every
    argument: dtype, 16-byte alignment of pointers, divisibility by 16 of ints, ints equal to 1
    as constants), built with the *target's* backend instead of the local driver's, then the
    JIT's packing into signature / constexprs / attrs / options. The alignment attributes matter:
    without them the same attention config compiled to 255 registers with spills and no async
    copies, with them 177 registers and cp.async (CPU_TRITON.md); the GPT-OSS prefill baseline
    here: 254 registers and no cp.async without them, 162 and cp.async with them.
    """
    from triton import knobs
    from triton.runtime import jit as jit_module

    target = parse_target(target)
    backend = _backend(target)
    kwargs = dict(kwargs)
    # As JITFunction.run does before binding. Triton 3.9's run() also always passes two
    # instrumentation knobs; older versions lack some of them (fpsan_homomorphic_casts is new)
    # and their packing rejects unknown keywords, so they are passed only when set, which gives
    # options equal to the JIT's on either version (the defaults are "" and False).
    kwargs["debug"] = kwargs.get("debug", getattr(fn, "debug", None)) or knobs.runtime.debug
    for name in ("instrumentation_mode", "fpsan_homomorphic_casts"):
        value = getattr(knobs.compilation, name, None)
        if value:
            kwargs[name] = value
    binder = jit_module.create_function_from_signature(fn.signature, fn.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    pack = getattr(fn, "_pack_args", None)
    if pack is not None:  # newer Triton (3.9) factored the JIT's packing out of run(): use it
        options, signature, constexprs, attrs = pack(backend, kwargs, bound_args, specialization, options)
    else:
        options, signature, constexprs, attrs = _pack_args_36(fn, backend, kwargs, bound_args, specialization)
    return Specialization(fn, signature, constexprs, attrs, options)


def _pack_args_36(fn: Any, backend: Any, kwargs: dict, bound_args: dict, specialization: list):
    """The packing inlined in JITFunction.run of older Triton (3.4-3.6; 3.9 has ``_pack_args``),
    with 3.9's fix that a constexpr's value is never read as an attribute string. A test checks
    it equals ``_pack_args`` where both exist."""
    from triton._utils import find_paths_if, get_iterable_path

    options = backend.parse_options(kwargs)
    sigkeys = [p.name for p in fn.params]
    sigvals = [s[0] for s in specialization]
    signature = dict(zip(sigkeys, sigvals))
    for k in kwargs:
        if k not in options.__dict__ and k not in sigkeys:
            raise KeyError(f"Keyword argument {k} was specified but unrecognised")
    constexpr_paths = find_paths_if(sigvals, lambda _, val: val == "constexpr")
    constexprs = {path: get_iterable_path(list(bound_args.values()), path) for path in constexpr_paths}
    attrvals = ["" if s[0] == "constexpr" else s[1] for s in specialization]
    attr_paths = find_paths_if(attrvals, lambda _, x: isinstance(x, str))
    attrs = {path: backend.parse_attr(get_iterable_path(attrvals, path)) for path in attr_paths}
    return options, signature, constexprs, attrs


def compile_specialization(spec: Specialization, target: Target | str) -> Any:
    """``triton.compile`` of one specialisation for ``target``; returns Triton's CompiledKernel."""
    import triton
    from triton.compiler import ASTSource

    target = parse_target(target)
    source = ASTSource(spec.fn, spec.signature, spec.constexprs, spec.attrs)
    return triton.compile(source, target=target.gpu_target(), options=spec.options.__dict__)


# -- capture --------------------------------------------------------------------------------------


class _BindError(Exception):
    """A launch whose arguments the JIT could not bind/specialise (not a host-code failure)."""

    def __init__(self, kernel: str, error: BaseException):
        super().__init__(f"kernel {kernel}: cannot bind launch arguments: {type(error).__name__}: {error}")


@dataclass(frozen=True, eq=False)
class Launch:
    """One captured ``kernel[grid](*args, **kwargs)`` and its specialisation for the target."""

    fn: Any
    grid: Any
    spec: Specialization


@contextmanager
def recording_launches(target: Target | str) -> Iterator[list[Launch]]:
    """While active, ``kernel[grid](...)`` records a :class:`Launch` instead of launching.

    Yields the list the launches are appended to, one per distinct (kernel, specialisation), in
    launch order. ``JITFunction.run`` is replaced on the class, so launches through
    ``triton.heuristics`` wrappers are recorded too.
    """
    from triton.runtime.jit import JITFunction

    target = parse_target(target)
    launches: list[Launch] = []
    seen: set[tuple[int, str]] = set()
    original = JITFunction.run

    def record(self, *args, grid=None, warmup=False, **kwargs):
        try:
            spec = specialize(self, args, kwargs, target)
        except Exception as exc:
            raise _BindError(getattr(self, "__name__", repr(self)), exc) from exc
        key = (id(self), spec.key)
        if key not in seen:
            seen.add(key)
            launches.append(Launch(self, grid, spec))
        return None

    JITFunction.run = record
    try:
        yield launches
    finally:
        JITFunction.run = original


# -- resources ------------------------------------------------------------------------------------


def _ptxas_path(arch: int) -> str:
    """The ptxas Triton itself uses for ``arch`` (3.9 uses its newer 'ptxas-blackwell' from sm_90,
    3.6 from sm_100): register counts must come from the same ptxas that built the cubin."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return get_ptxas(arch).path
    except (ImportError, AttributeError, TypeError):
        import triton.backends.nvidia as nvidia

        return str(Path(nvidia.__file__).parent / "bin" / "ptxas")


def _ptxas_extra_flags() -> list[str]:
    """Flags Triton's make_cubin passes that change code generation and vary by version
    (3.9 adds ``--regAllocOptLevel=2`` to work around a ptxas 13 bug; 3.6 does not)."""
    try:
        from triton.backends.nvidia.compiler import CUDABackend

        text = inspect.getsource(CUDABackend.make_cubin)
    except (ImportError, OSError, TypeError):
        return []
    return sorted(set(re.findall(r"--regAllocOptLevel=\d+", text)))


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def ptxas_usage(ptx: str, arch: int, *, fp_fusion: bool = True, extra_options: str | None = None) -> dict:
    """Registers and spill bytes of ``ptx`` from ``ptxas -v`` (about 0.1-0.3 s per kernel).

    Triton sets neither without a driver, so ptxas is run again with the flags Triton's
    make_cubin used: same binary, same fma and register-allocation flags.
    """
    from triton import knobs

    gpu_name = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    cmd = [_ptxas_path(arch), "-lineinfo", "-v"]
    if not fp_fusion:
        cmd.append("--fmad=false")
    if getattr(knobs.nvidia, "disable_ptxas_opt", False):
        cmd += ["--opt-level", "0"]
    cmd += _ptxas_extra_flags()
    if extra_options:
        cmd += extra_options.split()
    with tempfile.TemporaryDirectory(prefix="kf_ptxas_") as tmp:
        path = Path(tmp) / "kernel.ptx"
        path.write_text(ptx)
        result = subprocess.run(
            cmd + [f"--gpu-name={gpu_name}", str(path), "-o", str(Path(tmp) / "kernel.cubin")],
            capture_output=True, text=True, timeout=600,
        )
    if result.returncode != 0:
        raise RuntimeError(f"ptxas -v failed: {_first_lines(result.stderr)}")
    log = result.stderr + result.stdout
    regs = [int(n) for n in _PTXAS_REGS.findall(log)]
    spills = [(int(s), int(l)) for s, l in _PTXAS_SPILLS.findall(log)]
    return {
        "registers": max(regs) if regs else None,
        # noinline device functions get their own "Function properties" block: sum them all
        "spill_stores": sum(s for s, _ in spills),
        "spill_loads": sum(l for _, l in spills),
    }


def amdgcn_usage(amdgcn: str) -> dict:
    """VGPR count and spilled register counts from the kernel metadata in amdgcn text."""

    def field(name: str) -> int | None:
        values = [int(v) for v in re.findall(rf"^\s*\.{name}:\s*(\d+)", amdgcn, re.MULTILINE)]
        return max(values) if values else None

    spilled = (field("vgpr_spill_count") or 0) + (field("sgpr_spill_count") or 0)
    return {"registers": field("vgpr_count"), "spill_stores": spilled, "spill_loads": spilled}


def kernel_resources(kernel: Any, spec: Specialization, target: Target, seconds: float) -> KernelResources:
    """Measure one CompiledKernel: metadata, then ptxas (NVIDIA) or amdgcn metadata (AMD)."""
    meta = kernel.metadata
    if target.is_cuda:
        ptx = kernel.asm["ptx"]
        usage = ptxas_usage(
            ptx, int(target.arch), fp_fusion=bool(getattr(meta, "enable_fp_fusion", True)),
            extra_options=getattr(meta, "ptx_options", None),
        )
        # Cheap substring tests on the PTX: wgmma = Hopper warp-group MMA, cp.async.bulk.tensor =
        # TMA, cp.async.c[ag] = Ampere-style asynchronous global->shared copies.
        wgmma, tma = "wgmma." in ptx, "cp.async.bulk.tensor" in ptx
        cp_async = re.search(r"cp\.async\.c[ag]", ptx) is not None
    else:
        usage = amdgcn_usage(kernel.asm.get("amdgcn", ""))
        wgmma = tma = cp_async = False
    return KernelResources(
        name=meta.name,
        shared_bytes=int(meta.shared or 0),
        registers=usage["registers"],
        spill_stores=usage["spill_stores"],
        spill_loads=usage["spill_loads"],
        num_warps=int(meta.num_warps),
        num_stages=int(meta.num_stages),
        uses_wgmma=wgmma,
        uses_tma=tma,
        uses_cp_async=cp_async,
        compile_seconds=round(seconds, 4),
        tmem_size=int(getattr(meta, "tmem_size", 0) or 0),
        global_scratch_size=int(getattr(meta, "global_scratch_size", 0) or 0),
        signature=spec.describe(),
    )


def jit_registers(module: Any) -> dict[str, int]:
    """Registers per kernel name that the JIT itself compiled for the JIT functions of ``module``,
    read from their kernel caches after the module ran on a real GPU (the driver sets ``n_regs``
    when it loads a kernel). For checking on a GPU that :func:`specialize` specialises like the
    JIT: the registers of the same kernel must be equal (tests/test_gpu.py)."""
    from triton.runtime.jit import JITFunction

    found: dict[str, int] = {}
    for value in list(vars(module).values()):
        fn = value
        for _ in range(4):  # unwrap @triton.autotune / @triton.heuristics (their .fn)
            if fn is None or isinstance(fn, JITFunction):
                break
            fn = getattr(fn, "fn", None)
        if not isinstance(fn, JITFunction):
            continue
        for cache in list(getattr(fn, "device_caches", {}).values()):
            kernel_cache = cache[0]  # (kernel_cache, ...) in every version since 3.3
            for kernel in list(kernel_cache.values()):
                if hasattr(kernel, "result") and not hasattr(kernel, "metadata"):
                    kernel = kernel.result()  # an async-compile future
                registers = getattr(kernel, "n_regs", None)
                if registers is not None:
                    found[kernel.metadata.name] = int(registers)
    return found


def limit_problems(kernel: KernelResources, spec: Specialization | None, target: Target) -> list[str]:
    """Why ``kernel`` cannot launch on ``target`` (empty when it can)."""
    problems = []
    if kernel.shared_bytes > target.shared_limit:
        blocks = []
        if spec is not None:
            blocks = [name for name, ty in spec.signature.items() if ty == "constexpr" and name.startswith("BLOCK")]
        knobs_hint = " or ".join(filter(None, ["/".join(blocks), "num_stages"]))
        problems.append(
            f"kernel {kernel.name} needs {kernel.shared_bytes} bytes of shared memory; {target.name} allows "
            f"{target.shared_limit} per block (reduce {knobs_hint})"
        )
    if target.tmem_columns is not None and kernel.tmem_size > target.tmem_columns:
        problems.append(
            f"kernel {kernel.name} needs {kernel.tmem_size} columns of tensor memory; {target.name} has "
            f"{target.tmem_columns}"
        )
    threads = kernel.num_warps * target.warp_size
    if threads > target.max_threads:
        problems.append(
            f"kernel {kernel.name} uses {kernel.num_warps} warps = {threads} threads; {target.name} allows "
            f"{target.max_threads} per block (reduce num_warps)"
        )
    return problems


# -- the compile step (runs in the child) ---------------------------------------------------------


def _first_lines(text: str, limit: int = 12, chars: int = 1500) -> str:
    lines = [line.rstrip() for line in str(text).strip().splitlines() if line.strip()]
    out = "\n".join(lines[:limit])
    if len(lines) > limit:
        out += f"\n... ({len(lines) - limit} more lines)"
    return out[:chars]


def _compilation_error_text(exc: BaseException) -> str | None:
    """Triton's CompilationError as 'at line L of kernel: <code>' plus the reason. Its str() is 12
    lines of kernel source and a caret with the reason last; a nested error (an inlined
    @triton.jit helper) is chained through __cause__, so the innermost one is reported."""
    try:
        from triton.compiler.errors import CompilationError
    except ImportError:
        return None
    chain, seen = [], set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    errors = [e for e in chain if isinstance(e, CompilationError)]
    if not errors:
        return None
    inner = errors[-1]
    where = ""
    lineno = getattr(inner.node, "lineno", None)
    if lineno and inner.src:
        lines = inner.src.split("\n")
        code = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
        func = re.match(r"\s*def\s+(\w+)", inner.src)
        where = f" at line {lineno} of {func.group(1) if func else 'the kernel'}: {code}"
    reason = next((e.error_message for e in reversed(errors) if e.error_message), None)
    if reason is None:
        others = [e for e in chain if not isinstance(e, CompilationError)]
        reason = f"{type(others[-1]).__name__}: {others[-1]}" if others else ""
    return f"{type(inner).__name__}{where}\n{reason}".strip()


def _error_text(exc: BaseException, captured: str = "") -> str:
    """The compiler's message, not its traceback. MLIR pass failures print their diagnostics to
    stderr (``captured``) and raise a bare 'PassManager::run failed'; ptxas failures carry the
    ptxas log in the exception."""
    text = _compilation_error_text(exc) or f"{type(exc).__name__}: {exc}"
    diagnostics = [
        line for line in captured.splitlines()
        if re.search(r"\berror\b|LLVM ERROR|Assertion", line, re.IGNORECASE)
    ]
    if diagnostics:
        text += "\n" + "\n".join(diagnostics[:6])
    return _first_lines(text)


def _where_in(exc: BaseException, path: str | None) -> str:
    """' (candidate line N: code)' for the innermost traceback frame in the candidate's file."""
    if not path:
        return ""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    if not frames:
        return ""
    frame = frames[-1]
    return f" (candidate line {frame.lineno}: {(frame.line or '').strip()})"


@contextmanager
def _captured_output() -> Iterator[callable]:
    """Send fds 1 and 2 to a temp file (the C++ compiler prints diagnostics there and Triton prints
    whole PTX listings on ptxas failures); yields a function returning what was written."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)

        def read() -> str:
            sys.stdout.flush()
            sys.stderr.flush()
            sink.seek(0)
            return sink.read().decode("utf-8", "replace")

        try:
            yield read
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _prepare_process() -> None:
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

    Prefer :func:`compile_candidate` (isolation, timeout). Raises UserError for mistakes of the
    caller (unknown block or dtype); every problem of the candidate is a report.
    """
    start = time.perf_counter()
    tgt = parse_target(target)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile_here needs a process without TRITON_INTERPRET; use compile_candidate")
    from kernelforge.block import DTYPES
    from kernelforge.candidate import load_module
    from kernelforge.catalog import Catalog

    block = Catalog.discover(kernels_root).block(block_id)
    if dtype_name not in DTYPES:
        raise UserError(f"unknown dtype {dtype_name!r}; choose from {', '.join(DTYPES)}")
    dtype = DTYPES[dtype_name]

    def failed(status: str, message: str, kernels: list | tuple = ()) -> CompileReport:
        return CompileReport.failed(tgt.name, status, message, tuple(kernels), time.perf_counter() - start)

    shape = block.compile_shape()
    inputs = block.make_inputs(shape, dtype, "cpu", seed=0)
    out = block.make_output(shape, dtype, "cpu")

    try:
        module = load_module(source, name_hint=block_id)
    except SyntaxError as exc:
        return failed("compile_error", f"candidate source has a syntax error at line {exc.lineno}: {exc.msg}")
    except Exception as exc:
        return failed("compile_error", f"candidate module failed to import: {_error_text(exc)}")
    path = getattr(module, "__file__", None)
    if not callable(getattr(module, "run", None)):
        return failed("compile_error", "candidate defines no run(**inputs, out) function")

    with recording_launches(tgt) as launches:
        try:
            module.run(**inputs, out=out)
        except _BindError as exc:
            return failed("compile_error", _first_lines(str(exc)) + _where_in(exc, path))
        except Exception as exc:
            hint = ""
            if "active drivers" in str(exc) or "CUDA" in str(exc):
                hint = ("\n(host code cannot use a GPU when compiling ahead of time: no @triton.autotune, "
                        "torch.cuda calls or benchmarking in run())")
            return failed("compile_error", f"run() raised {_error_text(exc)}{_where_in(exc, path)}{hint}")
    if not launches:
        return failed("compile_error", f"run() launched no Triton kernel at the compile shape {shape}")

    kernels: list[KernelResources] = []
    problems: list[str] = []
    for launch in launches:
        name = getattr(launch.fn, "__name__", "kernel")
        with _captured_output() as captured:
            t0 = time.perf_counter()
            try:
                compiled = compile_specialization(launch.spec, tgt)
            except Exception as exc:
                error = _error_text(exc, captured())
                return failed("compile_error", f"kernel {name} failed to compile for {tgt.name}:\n{error}", kernels)
            seconds = time.perf_counter() - t0
            try:
                resources = kernel_resources(compiled, launch.spec, tgt, seconds)
            except Exception as exc:
                return failed("compile_error", f"kernel {name}: resource report failed: {_error_text(exc)}", kernels)
        kernels.append(resources)
        problems += limit_problems(resources, launch.spec, tgt)
    if problems:
        return failed("rejected", "; ".join(problems), kernels)
    return CompileReport(tgt.name, tuple(kernels), True, "ok", "", time.perf_counter() - start)


# -- process isolation ----------------------------------------------------------------------------


def _dtype_name(dtype: Any) -> str:
    from kernelforge.block import DTYPES

    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
        if name in DTYPES:
            return name
    else:
        for name, value in DTYPES.items():
            if value == dtype:
                return name
    raise UserError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")


#: Whether triton had been imported when the compile child's entry ran (see _environment_probe).
_TRITON_PREIMPORTED: bool | None = None


def _child_main(conn: Any, work: Any, args: tuple) -> None:
    """Entry point of a compile child: drop the interpreter, run ``work(*args)``, answer over
    ``conn`` with ("result", value), ("user_error", message) or ("crash", text)."""
    global _TRITON_PREIMPORTED
    _TRITON_PREIMPORTED = "triton" in sys.modules
    try:
        _prepare_process()
        result = ("result", work(*args))
    except UserError as exc:
        result = ("user_error", str(exc))
    except BaseException as exc:  # anything else is a bug in the compile step, not the candidate
        result = ("crash", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}")
    try:
        conn.send(result)
    finally:
        conn.close()


def _environment_probe() -> dict:
    """What a compile child sees (for tests): the interpreter flag, whether triton was imported
    before the child's entry (by spawn re-importing the parent's main module), and the class
    ``@triton.jit`` produces there."""
    from kernelforge.candidate import load_module

    module = load_module("import triton\n\n\n@triton.jit\ndef _probe(x):\n    pass\n", "probe")
    return {
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"),
        "triton_preimported": _TRITON_PREIMPORTED,
        "jit_class": type(module._probe).__name__,
    }


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _ChildFailed(Exception):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


def _run_in_child(work: Any, args: tuple, timeout: float) -> Any:
    """``work(*args)`` in a fresh spawned process without TRITON_INTERPRET; its return value.

    Raises UserError (re-raised from the child), or _ChildFailed with status ``timeout`` (the
    child was killed) or ``compile_error`` (it died, or the work itself failed).
    """
    ctx = mp.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child_main, args=(sender, work, args), name="kernelforge-aot", daemon=True)
    process.start()
    sender.close()
    try:
        if not receiver.poll(timeout):
            raise _ChildFailed("timeout", f"compile did not finish within {timeout:g} s; the compile process was killed")
        try:
            kind, value = receiver.recv()
        except (EOFError, OSError):
            process.join(5)
            raise _ChildFailed(
                "compile_error", f"the compile process died ({_describe_exit(process.exitcode)}) while compiling"
            ) from None
    finally:
        receiver.close()
        if process.is_alive():
            process.kill()
        process.join(10)
    if kind == "user_error":
        raise UserError(value)
    if kind == "crash":
        raise _ChildFailed("compile_error", f"internal error in the compile step: {value}")
    return value


def compile_candidate(
    source: str,
    block_id: str,
    kernels_root: str | Path,
    dtype: Any,
    target: str | None = None,
    timeout: float = 120,
) -> CompileReport:
    """Compile candidate ``source`` of block ``block_id`` (found under ``kernels_root``) in
    ``dtype`` for ``target`` (default :func:`default_target`) in a fresh child process, and report
    its kernels' resources.

    The child is started with multiprocessing's ``spawn``: nothing of the caller's state is
    inherited, and the child removes TRITON_INTERPRET before it imports triton, so this works
    from a process running the interpreter (the test suite). Like any spawn-based code, a script
    calling this must guard its entry with ``if __name__ == "__main__":``. The child is killed
    after ``timeout`` seconds (status ``timeout``; the budget includes about 3 s of process start
    and torch import). A child that crashes (a segfault in the compiler) gives ``compile_error``;
    the caller is never taken down.

    Raises UserError for mistakes of the caller: unknown target, block or dtype.
    """
    start = time.perf_counter()
    tgt = parse_target(target if target is not None else default_target())
    args = (source, block_id, str(Path(kernels_root).resolve()), _dtype_name(dtype), tgt.name)
    try:
        report = _run_in_child(compile_here, args, timeout)
    except _ChildFailed as exc:
        return CompileReport.failed(tgt.name, exc.status, str(exc), seconds=time.perf_counter() - start)
    return report.replace_seconds(time.perf_counter() - start)


class _Timeout(BaseException):
    """Raised by the pool worker's alarm; a BaseException so that host code's ``except Exception``
    cannot swallow it."""


def _pool_initializer() -> None:
    """Prepare a pool worker: no interpreter, and everything a compile imports imported now, so
    that a task's timeout never lands in the middle of an import (torch's lazy imports cannot be
    retried once interrupted: the next task in that worker would fail)."""
    _prepare_process()
    import torch  # noqa: F401
    import triton.compiler  # noqa: F401
    import triton.runtime.jit  # noqa: F401

    from kernelforge import block
    from kernelforge import candidate
    from kernelforge import catalog


def _pool_task(args: tuple, timeout: float) -> CompileReport:
    """One compile in a pool worker, with a soft timeout (an alarm that interrupts Python code:
    a hanging host loop, a slow pass returning to Python) and a hard one 30 s later (faulthandler
    exits the worker if a native call never returns; the pool then breaks, see CompilePool)."""
    import faulthandler

    start = time.perf_counter()

    def on_alarm(signum, frame):
        raise _Timeout()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    faulthandler.dump_traceback_later(timeout + 30, exit=True)
    try:
        return compile_here(*args)
    except _Timeout:
        return CompileReport.failed(args[4], "timeout", f"compile did not finish within {timeout:g} s",
                                    seconds=time.perf_counter() - start)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()


class CompilePool:
    """Worker processes that compile candidates in the background while others are verified.

    ``submit`` returns a Future of a :class:`CompileReport`. Workers are spawned without the
    interpreter flag and reused (one torch import each, then about 0.4-1.3 s per new config and
    1 ms per Triton cache hit). A compile that hangs in Python code is stopped after ``timeout``
    with status ``timeout``; one that hangs in native code, or crashes its worker, kills the
    worker: every future pending in the pool then fails with
    ``concurrent.futures.process.BrokenProcessPool`` (not a verdict on those candidates:
    resubmit them, or compile the suspect alone with :func:`compile_candidate`), and the next
    ``submit`` replaces the broken pool with a fresh one. A UserError of the caller (unknown
    block, dtype or target) is the future's exception.
    """

    def __init__(self, max_workers: int | None = None, timeout: float = 120):
        self.max_workers = max_workers or max(1, (os.cpu_count() or 2) - 1)
        self.timeout = timeout
        self._executor: cf.ProcessPoolExecutor | None = None

    def _new_executor(self) -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(
            max_workers=self.max_workers,
            mp_context=mp.get_context("spawn"),
            initializer=_pool_initializer,
        )

    def submit(
        self, source: str, block_id: str, kernels_root: str | Path, dtype: Any, target: str | None = None
    ) -> cf.Future:
        """Queue one compile; see :func:`compile_candidate` for the arguments."""
        tgt = parse_target(target if target is not None else default_target())
        args = (source, block_id, str(Path(kernels_root).resolve()), _dtype_name(dtype), tgt.name)
        if self._executor is None:
            self._executor = self._new_executor()
        try:
            return self._executor.submit(_pool_task, args, self.timeout)
        except BrokenProcessPool:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = self._new_executor()
            return self._executor.submit(_pool_task, args, self.timeout)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=wait, cancel_futures=cancel_futures)
            self._executor = None

    def __enter__(self) -> "CompilePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown(wait=True, cancel_futures=True)


__all__ = [
    "CompilePool",
    "CompileReport",
    "FALLBACK_TARGET",
    "KernelResources",
    "Launch",
    "Specialization",
    "TARGETS",
    "Target",
    "compile_candidate",
    "compile_here",
    "compile_specialization",
    "default_target",
    "jit_registers",
    "kernel_resources",
    "parse_target",
    "recording_launches",
    "specialize",
]
