"""The contract of a weight format and of an activation format, and the unquantised (bf16) ones.

A block whose weights are quantised stores each weight matrix ``[rows, cols]`` (``cols``: the
reduction dimension, as in ``y = W x``) as one or more tensors: the values under the weight's own
name and, where the format has them, scales under ``<name>_scale``. A stack of experts adds leading
dimensions (``[E, rows, cols]``). A :class:`WeightFormat` draws seeded weights in its layout,
dequantises them exactly to fp32 (the reference multiplies those values), and counts their bytes
(roofline figures include the scales).

An :class:`ActivationFormat` says what a served kernel does to an activation before it multiplies
it: FP8 serving quantises activations per token in groups of 128, bf16 serving rounds to bf16. The
reference applies it at the same points, so its tolerance does not have to absorb quantisation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Mapping

import torch

from kernelforge.block import random_tensor

#: The suffix of a weight's scale tensor (``w13`` -> ``w13_scale``).
SCALE = "_scale"


class WeightFormat(ABC):
    """How a weight matrix is stored. Implementations hold no state beyond their constants.

    - :meth:`draw` returns ``{suffix: tensor}`` for weights of shape ``lead + (rows, cols)``
      (suffix ``""``: the values; :data:`SCALE`: the scales), seeded by ``gen``, whose dequantised
      values have about ``std`` standard deviation; on a GPU large tensors are drawn there.
    - :meth:`dequantize` maps those tensors (any leading dimensions, e.g. one expert's slice)
      to the exact fp32 values they stand for.
    - :meth:`nbytes` is the storage of one ``rows x cols`` matrix, scales included.
    """

    #: A short name for reports and docs (``"fp8 e4m3, 128x128 block scales"``).
    label: str = ""

    @abstractmethod
    def draw(self, lead: tuple[int, ...], rows: int, cols: int, std: float, gen: torch.Generator,
             device: str | torch.device) -> dict[str, torch.Tensor]:
        """Seeded weights of shape ``lead + (rows, cols)`` in this format."""

    @abstractmethod
    def dequantize(self, parts: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The fp32 values of ``parts`` (the tensors :meth:`draw` returns, sliced alike)."""

    @abstractmethod
    def nbytes(self, rows: int, cols: int) -> float:
        """Bytes of one ``rows x cols`` matrix, scales included."""


class Bf16Weights(WeightFormat):
    """Unquantised weights in bf16."""

    label = "bf16"

    def draw(self, lead, rows, cols, std, gen, device):
        out = torch.empty((*lead, rows, cols), dtype=torch.bfloat16, device=device)
        flat = out.view(-1, rows, cols)
        for i in range(flat.shape[0]):  # one matrix at a time: bounded fp32 scratch
            flat[i].copy_(random_tensor((rows, cols), gen, "normal", scale=std, dtype=torch.bfloat16,
                                        device=device))
        return {"": out}

    def dequantize(self, parts):
        return parts[""].to(torch.float32)

    def nbytes(self, rows, cols):
        return 2.0 * rows * cols


class ActivationFormat(ABC):
    """What a served kernel does to an activation [tokens, features] before a matrix multiply."""

    label: str = ""
    #: Extra bytes per activation element a kernel writes and reads for it (scales), for counts.
    scale_bytes_per_element: float = 0.0

    @abstractmethod
    def round(self, x: torch.Tensor) -> torch.Tensor:
        """The fp32 values the multiply sees for the fp32 activation ``x`` [..., features]."""


class Bf16Activations(ActivationFormat):
    """Activations kept in bf16 (weight-only quantisation: W4A16, MXFP4 on Hopper)."""

    label = "bf16"

    def round(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).to(torch.float32)


class NativeActivations(ActivationFormat):
    """Activations kept in the dtype the block runs in, bf16 or fp16 (weight-only quantisation: W4A16,
    whose kernels compute in the activations' dtype): the values are already in it, nothing rounds."""

    label = "activation dtype"

    def round(self, x: torch.Tensor) -> torch.Tensor:
        return x


def parts_of(inputs: Mapping[str, object], name: str) -> dict[str, torch.Tensor]:
    """The tensors of weight ``name`` among a block's ``inputs`` (``name``, ``name_scale``) by suffix."""
    return {suffix: inputs[name + suffix] for suffix in ("", SCALE) if name + suffix in inputs}  # type: ignore[misc]


def named_parts(name: str, parts: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{suffix: tensor}`` as block inputs: ``{name + suffix: tensor}``."""
    return {name + suffix: tensor for suffix, tensor in parts.items()}


__all__ = ["ActivationFormat", "Bf16Activations", "Bf16Weights", "NativeActivations", "SCALE", "WeightFormat",
           "named_parts", "parts_of"]
