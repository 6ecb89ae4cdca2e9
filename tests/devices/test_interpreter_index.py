"""The interpreter's scalar ``__index__`` fix (Triton 3.6 with NumPy 2.4): applied only where the
installed interpreter's own ``__index__`` fails on a one-element array."""

from __future__ import annotations

import numpy as np

from kernelforge.devices.interpreter_index import needs_scalar_index_fix, patch_scalar_index


def _numpy_refuses_one_element_arrays() -> bool:
    try:
        int(np.array([3]))
    except TypeError:
        return True
    return False


def _triton36_style(tensor, scope):
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))


def _triton39_style(tensor, scope):
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))


def test_the_fix_is_decided_by_behaviour():
    assert needs_scalar_index_fix(_triton36_style) is _numpy_refuses_one_element_arrays()
    assert needs_scalar_index_fix(_triton39_style) is False
    assert needs_scalar_index_fix(lambda tensor, scope: 1 / 0) is False  # unknown internals: left alone


def test_a_loop_bound_read_from_memory_runs_in_the_interpreter():
    import torch
    import triton
    import triton.language as tl

    from kernelforge.devices import interpreter

    interpreter.enable()
    patch_scalar_index()

    @triton.jit
    def total(lengths, out, BLOCK: tl.constexpr):
        end = tl.load(lengths)
        acc = 0
        for i in range(0, end, BLOCK):
            acc += i
        tl.store(out, acc)

    out = torch.zeros(1, dtype=torch.int32)
    total[(1,)](torch.tensor([10], dtype=torch.int32), out, BLOCK=4)
    assert out.item() == 0 + 4 + 8
