"""Timing one verified candidate on one shape: input sets, per-call value changes, in-place resets.

The device times the calls (:meth:`kernelforge.devices.base.Device.time`); this module makes them:
freshly generated input sets rotated so the L2 cache never holds the inputs, outputs allocated
once per set, one input value changed before every call (a cache keyed on input values never
hits, EVALUATION.md #4), and the block's in-place inputs restored from a copy before every call
when the block asks for it (:attr:`~kernelforge.block.Block.inplace_reset`), so every timed call
does the same work. What runs before a call is outside the timed region.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kernelforge.block import Block, Counts, Shape
from kernelforge.devices.base import Device
from kernelforge.execute.contract import allocate
from kernelforge.execute.guard import RunFn
from kernelforge.result import Timing

#: Input sets are rotated while timing so the L2 cache never holds the inputs; beyond this many,
#: the device flushes L2 instead (and large sets need no help: they do not fit in L2 anyway).
MAX_INPUT_SETS = 8
INPUT_SET_MEMORY_BUDGET = 16 * 2**30

#: One timing set: the inputs of a call and its outputs by name.
TimingSet = tuple[dict[str, Any], dict[str, torch.Tensor]]


def touch_inputs(inputs: dict[str, Any], call: int) -> None:
    """Change one element of each floating-point input tensor of a timing set, in place (its sign),
    before every call of a timing phase: identical inputs never come back, so a cache keyed on the
    input values misses every time (EVALUATION.md #4) and what is timed is the computation."""
    for tensor in inputs.values():
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.numel() and tensor.is_contiguous():
            flat = tensor.view(-1)
            flat[(call * 7919 + 13) % flat.numel()].neg_()


def input_set_count(counts: Counts, device: Device) -> int:
    """How many input sets to rotate through: enough that together they overflow a GPU's L2
    (about 2 x 64 MiB), within :data:`MAX_INPUT_SETS` and the memory budget; one in the
    interpreter (no cache to defeat, and its calls are slow)."""
    working_set = int(counts.bytes)
    l2_guess = 64 * 2**20
    n_sets = max(1, min(MAX_INPUT_SETS, math.ceil(2 * l2_guess / max(working_set, 1))))
    n_sets = max(1, min(n_sets, INPUT_SET_MEMORY_BUDGET // max(working_set, 1)))
    return 1 if device.name == "interpret" else n_sets


def time_candidate(block: Block, run: RunFn, shape: Shape, dtype: torch.dtype, device: Device, counts: Counts, *,
                   sets: list[TimingSet] | None = None) -> Timing:
    """Time ``run`` on ``shape`` (see the module docstring). The timing sets (inputs, outputs)
    are appended to ``sets`` when a list is given (for
    :func:`~kernelforge.execute.verify.verify_again`).

    Before call ``i`` the device runs the preparation of set ``i % len(sets)``: its in-place
    inputs are restored (when the block resets them) and one input value changes. The device
    counts ``i`` over all its calls but picks the set to call by the index within its current
    loop, so these can differ by a constant: still, within a loop every set is prepared once
    between two of its calls (with one set, before every call). CUDA-graph replays run no host
    code at all: there the in-place inputs keep being updated (the same work on drifting values).
    """
    made: list[TimingSet] = []
    saved: list[dict[str, torch.Tensor]] = []
    for i in range(input_set_count(counts, device)):
        inputs = block.make_inputs(shape, dtype, device.torch_device, seed=1000 + i)
        made.append((inputs, allocate(block, shape, dtype, device.torch_device)))
        saved.append({name: inputs[name].clone() for name in block.inplace} if block.inplace_reset else {})
    if sets is not None:
        sets.extend(made)
    calls = [lambda inputs=inputs, outputs=outputs: run(**inputs, **outputs) for inputs, outputs in made]

    def before(i: int) -> None:
        inputs = made[i % len(made)][0]
        for name, copy in saved[i % len(made)].items():
            inputs[name].copy_(copy)
        touch_inputs(inputs, i)

    return device.time(calls, working_set_bytes=int(counts.bytes), before=before)
