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


_BLOCK_MODULES: dict[str, Any] = {}


def load_block_module(block_id: str):
    """A block's ``block.py`` as a module, loaded from its file (once per session), not through the
    catalog: a broken block elsewhere cannot fail the tests of this one."""
    if block_id not in _BLOCK_MODULES:
        import importlib.util
        from pathlib import Path

        path = Path(__file__).resolve().parents[1] / "kernels" / block_id / "block.py"
        spec = importlib.util.spec_from_file_location(f"kf_test_block_{block_id.replace('/', '_')}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _BLOCK_MODULES[block_id] = module
    return _BLOCK_MODULES[block_id]
