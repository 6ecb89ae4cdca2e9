"""Specialising a kernel launch exactly as Triton's JIT would on the target GPU, and capturing the
launches of a candidate's host code.

:func:`specialize` builds the signature, constants, attributes and options of one
``kernel[grid](...)`` launch with the *target's* backend (not the local driver's, of which there is
none), so that the kernel compiled ahead of time is the one the JIT would compile on that GPU.
:func:`recording_launches` runs host code with launches recorded instead of run, and
:func:`compile_specialization` compiles one specialisation for the target. Nothing here imports
triton at module level (see :mod:`kernelforge.compile.pool`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from kernelforge.targets import Target, parse_target


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


#: One backend object per target: making one loads the backend's compiler module.
_BACKENDS: dict[Target, Any] = {}


def target_backend(target: Target) -> Any:
    """Triton's compiler backend for ``target`` (``make_backend`` of its GPUTarget), cached."""
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
    backend = target_backend(target)
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
        options, signature, constexprs, attrs = pack_args_legacy(fn, backend, kwargs, bound_args, specialization)
    return Specialization(fn, signature, constexprs, attrs, options)


def pack_args_legacy(fn: Any, backend: Any, kwargs: dict, bound_args: dict, specialization: list):
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


class BindError(Exception):
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
            raise BindError(getattr(self, "__name__", repr(self)), exc) from exc
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
