"""The block contract as the harness reads it: which tensors a candidate writes, what each is
compared with, and how messages name them (see :mod:`kernelforge.block` for the contract itself).

A block's outputs are the tensors of :meth:`~kernelforge.block.Block.make_output` (one tensor is
the output ``out``) plus its in-place inputs (:attr:`~kernelforge.block.Block.inplace`). Every
mistake of a block against the contract is a :class:`~kernelforge.block.HarnessError` naming the
block: it is never the candidate's verdict.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from kernelforge.block import OUT, Block, HarnessError, Shape, Tolerance


def allocate(block: Block, shape: Shape, dtype: torch.dtype, device: str | torch.device) -> dict[str, torch.Tensor]:
    """Fresh outputs of ``block`` at ``shape`` by name (``{"out": tensor}`` for a v1 block)."""
    made = block.make_output(shape, dtype, device)
    return _named(made, f"{block.id}: make_output")


def _named(value: Any, where: str) -> dict[str, torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return {OUT: value}
    if not isinstance(value, Mapping) or not value:
        raise HarnessError(f"{where} must return a tensor or a non-empty dict of tensors by name, "
                           f"not {type(value).__name__}")
    named = dict(value)
    for name, tensor in named.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise HarnessError(f"{where}: {name!r} is not a keyword name")
        if not isinstance(tensor, torch.Tensor):
            raise HarnessError(f"{where}: {name!r} is a {type(tensor).__name__}, not a tensor")
    return named


@dataclass(frozen=True)
class Outputs:
    """What a candidate of one block writes at one shape: ``names`` (the outputs, in
    :meth:`~kernelforge.block.Block.make_output` order) and ``inplace`` (inputs it updates).

    Built by :meth:`of`, which checks the block's declarations against one set of inputs and
    outputs. Everything a check reads goes through here, so a second output and an in-place
    input get exactly the defenses of a single ``out``.
    """

    block_id: str
    names: tuple[str, ...]
    inplace: tuple[str, ...]

    @classmethod
    def of(cls, block: Block, inputs: Mapping[str, Any], outputs: Mapping[str, torch.Tensor]) -> "Outputs":
        """The outputs of ``block`` given one call's ``inputs`` and ``outputs`` (from :func:`allocate`)."""
        inplace = tuple(block.inplace)
        clash = sorted(set(outputs) & set(inputs))
        if clash:
            raise HarnessError(f"{block.id}: output names {clash} are also input names")
        for name in inplace:
            if not isinstance(inputs.get(name), torch.Tensor):
                raise HarnessError(f"{block.id}: in-place name {name!r} is not a tensor input of make_inputs")
        return cls(block.id, tuple(outputs), inplace)

    @property
    def named(self) -> bool:
        """Whether messages name the output: always, except for a v1 block (one ``out``)."""
        return self.names != (OUT,) or bool(self.inplace)

    @property
    def all(self) -> tuple[str, ...]:
        """Every tensor the candidate writes: the outputs, then the in-place inputs."""
        return self.names + self.inplace

    def label(self, name: str) -> str:
        """The prefix of a message about ``name`` (empty for a v1 block's ``out``)."""
        return f"{name}: " if self.named else ""

    def watched(self, inputs: Mapping[str, Any], outputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors the candidate writes, by name (the live tensors, not copies)."""
        return {**outputs, **{name: inputs[name] for name in self.inplace}}

    def results(self, inputs: Mapping[str, Any], outputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What one call produced: the outputs themselves and copies of the in-place inputs
        (which the harness restores before the next call)."""
        return {**outputs, **{name: inputs[name].clone() for name in self.inplace}}

    def restore(self, inputs: Mapping[str, Any], pristine: Mapping[str, torch.Tensor]) -> None:
        """Put the in-place inputs back to their pristine values, in place (same pointers)."""
        for name in self.inplace:
            inputs[name].copy_(pristine[name])

    def untouchable(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """The tensor inputs that must come back bit for bit unchanged (all but the in-place ones)."""
        return {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in self.inplace}

    def expected(self, block: Block, pristine_inputs: Mapping[str, Any],
                 written: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The block's reference on ``pristine_inputs``, by name, checked to have one entry of
        the right shape for every tensor in ``written`` (the results of a call)."""
        ref = block.reference(**pristine_inputs)
        if isinstance(ref, torch.Tensor) and self.named:
            raise HarnessError(f"{self.block_id}: reference returned one tensor, but the block writes "
                               f"{', '.join(self.all)}: return a dict with one entry per name")
        named = _named(ref, f"{self.block_id}: reference")
        if set(named) != set(self.all):
            raise HarnessError(f"{self.block_id}: reference returned {sorted(named)}; expected one entry for "
                               f"each of {sorted(self.all)}")
        for name, tensor in named.items():
            if tuple(tensor.shape) != tuple(written[name].shape):
                raise HarnessError(f"{self.block_id}: reference {name!r} has shape {tuple(tensor.shape)}, "
                                   f"the candidate writes {tuple(written[name].shape)}")
            if written[name].is_floating_point():
                if tensor.dtype != torch.float32:
                    raise HarnessError(f"{self.block_id}: reference {name!r} is {tensor.dtype}; a floating-point "
                                       "output's reference is computed and returned in torch.float32 (compare "
                                       "in the output's dtype and a rounding error becomes the tolerance)")
                finite = torch.isfinite(tensor)
                if not bool(finite.all()):
                    where = tuple(int(i) for i in (~finite).nonzero()[0].tolist())
                    raise HarnessError(f"{self.block_id}: reference {name!r} has {int((~finite).sum())} NaN or Inf "
                                       f"value(s) (the first at {where}); a reference must be finite, or every "
                                       "candidate compares equal to it")
        return named

    def tolerance(self, block: Block, name: str, dtype: torch.dtype, device_type: str) -> Tolerance:
        """The tolerance of floating-point output ``name``: a :class:`~kernelforge.block.Tolerance`
        of finite values at least 0, else the block's mistake (a NaN bound passes everything)."""
        tolerance = block.output_tolerance(name, dtype, device_type)
        values = (tolerance.rel_norm, tolerance.atol, tolerance.rtol) if isinstance(tolerance, Tolerance) else ()
        if not values or not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in values):
            raise HarnessError(f"{self.block_id}: tolerance of {name!r} at {dtype} is {tolerance!r}; it must be a "
                               "Tolerance(rel_norm, atol, rtol) of finite numbers >= 0")
        return tolerance
