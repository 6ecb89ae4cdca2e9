"""Helpers shared by the per-block kernel tests: a template's module at a point (rendered and
loaded once per session) and one plain call of it beside the block's reference."""

from __future__ import annotations

from typing import Any

import torch

from kernelforge.candidate import Candidate, load_module

_MODULES: dict[str, Any] = {}


def module_at(template, point: dict | None = None):
    """The rendered module of ``template`` at ``point`` (its baseline point when omitted)."""
    candidate = Candidate.from_template(template, point)
    if candidate.id not in _MODULES:
        _MODULES[candidate.id] = load_module(candidate.source, name_hint=template.id)
    return _MODULES[candidate.id]


def run_once(module, block, shape, dtype: torch.dtype, distribution: str = "normal", seed: int = 0):
    """(output, fp32 reference) of one call on fresh inputs, the output poisoned with NaN first."""
    inputs = block.make_inputs(shape, dtype, "cpu", seed=seed, distribution=distribution)
    ref = block.reference(**inputs)
    out = block.make_output(shape, dtype, "cpu").fill_(float("nan"))
    module.run(**inputs, out=out)
    return out, ref


def check_dtype(block) -> torch.dtype:
    """The dtype generic tests verify a block in: float16 where the block is searched in it (the
    interpreter's fastest exact path), else the block's first dtype (a quantised-weight block is
    served with bf16 activations only)."""
    from kernelforge.block import DTYPES

    return torch.float16 if "float16" in block.dtypes else DTYPES[block.dtypes[0]]
