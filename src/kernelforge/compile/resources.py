"""What a compiled kernel needs on its target, and the record of one candidate's compile.

:func:`kernel_resources` measures a Triton ``CompiledKernel``: shared memory, registers and spills
(NVIDIA: ``ptxas -v`` run again with Triton's own flags, since no driver sets them; AMD: the amdgcn
metadata), warps, stages and the use of wgmma / TMA / cp.async. :func:`limit_problems` is the one
place a kernel is checked against the target's hard limits. :class:`CompileReport` is what every
compile returns. Nothing here imports triton at module level (see :mod:`kernelforge.compile.pool`).
"""

from __future__ import annotations

import inspect
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelforge.compile.messages import first_lines
from kernelforge.compile.specialise import Specialization
from kernelforge.targets import Target
from kernelforge.result import Status

#: The statuses a compile can end with (a compile never gives ``wrong`` or ``runtime_error``).
COMPILE_STATUSES = frozenset({Status.OK, Status.COMPILE_ERROR, Status.REJECTED, Status.TIMEOUT})


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

    ``status`` (one of :data:`COMPILE_STATUSES`; a plain string such as ``"ok"`` is converted):
    ``ok``; ``rejected`` (compiled, but a kernel exceeds a hard limit of the target: shared
    memory, tensor memory, threads per block; ``kernels`` still lists the resources);
    ``compile_error`` (Triton could not compile a kernel, or the candidate's host code failed);
    ``timeout`` (the compile process was killed). ``ok`` is True exactly when the status is ``ok``.
    ``message`` says what went wrong in a few lines. ``seconds`` is the wall time of the whole
    compile step, process start included.
    """

    target: str
    kernels: tuple[KernelResources, ...]
    ok: bool
    status: Status
    message: str = ""
    seconds: float = 0.0

    def __post_init__(self) -> None:
        try:
            status = Status(self.status)
        except ValueError:
            status = None
        if status not in COMPILE_STATUSES:
            names = ", ".join(sorted(s.value for s in COMPILE_STATUSES))
            raise ValueError(f"status {self.status!r} is not one of {names}")
        object.__setattr__(self, "status", status)
        if self.ok != (status is Status.OK):
            raise ValueError("ok must be True exactly when status is 'ok'")

    @classmethod
    def failed(cls, target: str, status: Status | str, message: str, kernels: tuple = (),
               seconds: float = 0.0) -> "CompileReport":
        """A report of a compile that did not succeed (``status`` is not ``ok``)."""
        return cls(target, tuple(kernels), False, status, message, seconds)

    def replace_seconds(self, seconds: float) -> "CompileReport":
        return CompileReport(self.target, self.kernels, self.ok, self.status, self.message, seconds)


@dataclass(frozen=True)
class RegisterUsage:
    """Registers per thread and spills of one kernel, as its target's tools report them."""

    registers: int | None
    spill_stores: int | None
    spill_loads: int | None


# -- measuring ------------------------------------------------------------------------------------


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


def ptxas_usage(ptx: str, arch: int, *, fp_fusion: bool = True, extra_options: str | None = None) -> RegisterUsage:
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
        raise RuntimeError(f"ptxas -v failed: {first_lines(result.stderr)}")
    log = result.stderr + result.stdout
    regs = [int(n) for n in _PTXAS_REGS.findall(log)]
    spills = [(int(s), int(l)) for s, l in _PTXAS_SPILLS.findall(log)]
    return RegisterUsage(
        registers=max(regs) if regs else None,
        # noinline device functions get their own "Function properties" block: sum them all
        spill_stores=sum(s for s, _ in spills),
        spill_loads=sum(l for _, l in spills),
    )


def amdgcn_usage(amdgcn: str) -> RegisterUsage:
    """VGPR count and spilled register counts from the kernel metadata in amdgcn text."""

    def field(name: str) -> int | None:
        values = [int(v) for v in re.findall(rf"^\s*\.{name}:\s*(\d+)", amdgcn, re.MULTILINE)]
        return max(values) if values else None

    spilled = (field("vgpr_spill_count") or 0) + (field("sgpr_spill_count") or 0)
    return RegisterUsage(registers=field("vgpr_count"), spill_stores=spilled, spill_loads=spilled)


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
        registers=usage.registers,
        spill_stores=usage.spill_stores,
        spill_loads=usage.spill_loads,
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
    JIT: the registers of the same kernel must be equal (tests/devices/test_gpu.py)."""
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
