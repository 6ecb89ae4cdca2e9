"""Ahead-of-time compilation of candidates for a real GPU target, with no GPU present.

A candidate is compiled the way Triton's JIT would compile it on the target GPU, but without a GPU
(CPU_TRITON.md section 2): its host code ``run(**inputs, out)`` is called on CPU tensors from the
block's :meth:`~kernelforge.block.Block.compile_shape` with ``JITFunction.run`` replaced by a
recorder, so every ``kernel[grid](...)`` launch is captured instead of run. Each distinct (kernel,
specialisation) is then specialised with the target's backend exactly as the JIT does, compiled
with ``triton.compile`` for the target (ttir -> ttgir -> llir -> ptx -> cubin, or amdgcn -> hsaco)
and measured: shared memory, registers, spills, wgmma / TMA / cp.async use. A config over the
target's shared-memory limit is ``rejected`` before any GPU time is spent; a kernel Triton cannot
compile is a ``compile_error``.

Modules, in the order the work flows:

- :mod:`kernelforge.targets` (a noun, at the top level): the GPUs one can compile for and their limits
  (:func:`parse_target`, :func:`default_target`, :data:`TARGETS`).
- :mod:`~kernelforge.compile.specialise`: the JIT-identical specialisation of one launch, and
  recording the launches of host code.
- :mod:`~kernelforge.compile.resources`: measuring a compiled kernel, checking it against the
  target's limits, and the :class:`CompileReport` record.
- :mod:`~kernelforge.compile.messages`: compiler failures as short messages.
- :mod:`~kernelforge.compile.step`: the compile step in the current (non-interpreter) process.
- :mod:`~kernelforge.compile.pool`: the entry points, which run the step in spawned children
  with timeouts: :func:`compile_candidate` (one candidate) and :class:`CompilePool` (background).
- :mod:`~kernelforge.compile.sandboxed`: the search's pool for untrusted sources, whose processes
  run in the OS sandbox of :mod:`kernelforge.sandbox.roles` (with a Triton cache of their own).

Triton's own cache (``TRITON_CACHE_DIR`` or its default) is used, so compiling an unchanged kernel
again costs about a millisecond plus the ptxas resource pass.
"""

__all__ = ["pool", "sandboxed", "ray_pool", "resources"]
