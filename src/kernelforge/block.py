"""Blocks: one computation of a model layer that kernels implement.

A block owns everything needed to judge an implementation of it: the exact PyTorch reference
(computed in fp32 for checking), a seeded input generator with several value distributions, the
named shape sets (``smoke``, ``check`` and real model presets), FLOP and byte counts for roofline
figures, and the dtype tolerances.

A block lives in ``kernels/<family>/<name>/block.py`` as one subclass of :class:`Block`; its id is
its folder path (``attention/gpt_oss_prefill``). Nothing registers it: discovery finds the folder.

The block contract (v2; a v1 block, with one output ``out`` and nothing in place, is a v2 block):

- :meth:`Block.make_output` returns either one tensor (the output is then named ``out``) or a dict
  mapping output names to freshly allocated tensors. Output names are keyword names of the
  candidate's ``run`` and must not be input names. Outputs may have any dtype (integer ones too: a
  router's indices) and any shape (odd last dimensions included).
- :attr:`Block.inplace` names the INPUTS (keys of :meth:`Block.make_inputs`) that the candidate
  updates in place (a fused add + RMSNorm updates ``residual``; a KV-cache write the cache). They
  are outputs too.
- :meth:`Block.reference` returns one tensor (v1: the single ``out``) or a dict with one entry per
  output name and one per in-place name (the expected final value of that input). The harness
  always calls it on pristine copies of the inputs (their values before the candidate ran).
- The candidate: a rendered template is a Python module with a function
  ``run(**inputs, **outputs)`` that gets every input (in-place ones included) and every output as
  keyword arguments, writes its results into the outputs and the in-place inputs, and returns
  nothing (v1: ``run(**inputs, out=...)``).
- Tolerance: :meth:`Block.tolerance` serves every floating-point output; a block may override
  :meth:`Block.output_tolerance` per output. Integer and bool outputs are compared exactly.
- Verification (:mod:`kernelforge.execute.judge.verify`) applies the same defenses to every output and
  every in-place input: outputs are poisoned before the call (floating: NaN; integer: the dtype's
  minimum, or maximum when unsigned; bool: a byte that is neither True nor False; the "new values"
  call instead fills them with an earlier call's results, as a timed call sees them); in-place inputs
  start from their generated values; every other input must come back bit for bit unchanged; the
  identity (pointer, shape, dtype, strides) of every output is checked, and so are a repeated call
  and new values under the same pointers, and a byte copy of every output on return compared
  with one after a full device synchronisation. A failure's message names the output
  (``residual: relative error 0.31 exceeds 0.02``) unless the block is v1.
- Timing allocates the outputs once per input set; in-place inputs are restored from a copy before
  every timed call (not timed) when :attr:`Block.inplace_reset` is True (the default), so the
  timed work stays the same on every call.
- :meth:`Block.counts` as in v1; its bytes count both the read and the write of in-place tensors.
- A block's mutants live in ``tests/mutants/<family>/<name>/*.py.j2`` and must all be reported
  ``wrong`` (or ``rejected``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import torch

from kernelforge.errors import UserError

if TYPE_CHECKING:
    from kernelforge.shipped import ShippedPath

#: Value distributions every block's input generator understands. ``normal``: unit normal;
#: ``large``: normal scaled up (exercises overflow in exp/accumulators); ``outliers``: normal with
#: a sparse set of large entries (exercises max-subtraction and rounding).
DISTRIBUTIONS: tuple[str, ...] = ("normal", "large", "outliers")

#: The dtypes kernels are searched in, by the names used on the command line and in job files.
DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}


@dataclass(frozen=True)
class Shape:
    """One problem size of a block: a name and its dimensions (ints, or tuples for ragged sizes).

    Dimension names are fixed per family (attention: B, H_Q, H_KV, S_Q, S_KV, D, ...; MoE: T, E,
    TOPK, H, I, ...). ``dims`` is stored as a sorted tuple so shapes are hashable and comparable.
    """

    name: str
    dims: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, name: str, **dims: Any) -> "Shape":
        """Build a shape from keyword dimensions; lists become tuples so the shape stays hashable."""
        frozen = {k: tuple(v) if isinstance(v, list) else v for k, v in dims.items()}
        return cls(name, tuple(sorted(frozen.items())))

    def __getitem__(self, key: str) -> Any:
        for k, v in self.dims:
            if k == key:
                return v
        raise KeyError(f"shape {self.name!r} has no dimension {key!r}")

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def as_dict(self) -> dict[str, Any]:
        return dict(self.dims)

    def __str__(self) -> str:
        return self.name


class HarnessError(RuntimeError):
    """The check itself is unsound: a bug in a block (a nearly constant reference, a reference
    that misses an output, output names that clash with inputs...), not in the candidate."""


#: The name of the output of a block whose :meth:`Block.make_output` returns one tensor (v1).
OUT = "out"


@dataclass(frozen=True)
class Tolerance:
    """How close a candidate's output must be to the fp32 reference.

    A result passes when all of these hold: no NaN or Inf; the relative error of the whole tensor
    ``||out - ref|| / ||ref||`` is at most ``rel_norm``; and every element satisfies
    ``|out - ref| <= atol * rms(ref) + rtol * |ref|`` (atol in units of the reference's RMS so the
    same tolerance serves inputs of any magnitude).
    """

    rel_norm: float
    atol: float
    rtol: float


#: Per-dtype tolerances (EVALUATION.md): bf16 has 8 bits of mantissa, fp16 11, fp32 24. The
#: elementwise bounds are a few ulps of the output dtype on top of accumulation error.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.bfloat16: Tolerance(rel_norm=2e-2, atol=4e-2, rtol=4e-2),
    torch.float16: Tolerance(rel_norm=2e-3, atol=8e-3, rtol=8e-3),
    torch.float32: Tolerance(rel_norm=1e-5, atol=1e-4, rtol=1e-4),
}

#: On a GPU fp32 dots run in tf32 unless the kernel asks otherwise (10-bit mantissa).
TF32_TOLERANCE = Tolerance(rel_norm=1e-2, atol=3e-2, rtol=3e-2)


@dataclass(frozen=True)
class Counts:
    """Work of one call at one shape: floating-point operations and bytes that must cross HBM."""

    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP per byte."""
        return self.flops / self.bytes if self.bytes else math.inf


class Block(ABC):
    """Base class of every block. Subclasses live in ``kernels/<family>/<name>/block.py``.

    Subclasses set :attr:`family` and :attr:`description`, and implement the
    abstract methods. ``id`` is assigned by discovery from the folder path.
    """

    family: str = ""
    description: str = ""
    #: dtypes the block is searched in (names as in :data:`DTYPES`).
    dtypes: tuple[str, ...] = ("bfloat16", "float16")
    #: Names of inputs (keys of :meth:`make_inputs`) the candidate updates in place; each is an
    #: output too, and :meth:`reference` returns its expected final value under the same name.
    inplace: tuple[str, ...] = ()
    #: Whether timing restores the in-place inputs from a copy before every timed call (the
    #: restore is not timed), so every timed call does the same work on the same values.
    inplace_reset: bool = True
    #: What serving engines run for this block on Hopper, per preset family
    #: (:class:`kernelforge.shipped.ShippedPath`): how a speedup over the baseline may be labelled.
    shipped: tuple["ShippedPath", ...] = ()
    #: Whether two calls on the same inputs must give bit-identical outputs (verification call 2).
    #: A block whose honest kernels use floating-point atomics sets False (then within tolerance).
    #: This is the block's rule: no template header can change it (issue 29).
    deterministic: bool = True

    def __init__(self, block_id: str):
        self.id = block_id

    def __repr__(self) -> str:
        return f"<Block {self.id}>"

    # -- shapes ---------------------------------------------------------------------------------

    @abstractmethod
    def shape_sets(self) -> Mapping[str, list[Shape]]:
        """Named shape sets. Must include ``smoke`` (tiny, interpreter-friendly) and ``check``
        (held-out odd sizes); the others are real presets named after models and workload
        profiles."""

    def shapes(self, name: str) -> list[Shape]:
        """The shapes of set ``name``, or the single preset shape called ``name``; several such
        names separated by commas give their shapes in order, each once
        (``gpt-oss-120b/T1,gpt-oss-120b/T64``).

        Raises UserError with the valid names when one does not exist.
        """
        if "," in name:
            picked = [shape for part in name.split(",") if part.strip() for shape in self.shapes(part.strip())]
            return list({shape.name: shape for shape in picked}.values())
        sets = self.shape_sets()
        if name in sets:
            return list(sets[name])
        for shapes in sets.values():
            for shape in shapes:
                if shape.name == name:
                    return [shape]
        raise UserError(
            f"block {self.id} has no shape set or shape named {name!r}; "
            f"shape sets: {', '.join(sets)}"
        )

    def compile_shape(self) -> Shape:
        """A representative shape used to build the signature for ahead-of-time compilation.

        Its sizes decide the JIT specialisation (16-byte divisibility of strides and ints), so it
        should have the alignment properties of real serving shapes. Default: the first smoke
        shape; blocks override it when smoke shapes are deliberately odd.
        """
        return self.shape_sets()["smoke"][0]

    # -- data ------------------------------------------------------------------------------------

    @abstractmethod
    def make_inputs(
        self,
        shape: Shape,
        dtype: torch.dtype,
        device: str | torch.device,
        seed: int,
        distribution: str = "normal",
    ) -> dict[str, Any]:
        """Fresh, seeded inputs for one call: keyword arguments of the candidate's ``run``.

        Tensors are freshly allocated on ``device``; scalars (window, scale, ...) are plain Python
        values. The same (shape, dtype, seed, distribution) gives the same values on any device.
        """

    @abstractmethod
    def make_output(self, shape: Shape, dtype: torch.dtype,
                    device: str | torch.device) -> torch.Tensor | dict[str, torch.Tensor]:
        """Uninitialised outputs of the exact shapes and dtypes a candidate must fill: one tensor
        (named ``out``) or a dict of freshly allocated tensors by output name (the keyword names
        of ``run``; never an input's name). Called for every call the harness makes."""

    @abstractmethod
    def reference(self, **inputs: Any) -> torch.Tensor | dict[str, torch.Tensor]:
        """The exact math of the block, computed in fp32 (or wider) from ``inputs``.

        Returns one tensor when :meth:`make_output` does and nothing is in place; else a dict with
        one entry per output name and one per :attr:`inplace` name (the expected final value of
        that input). Floating-point entries are fp32; integer outputs are compared exactly with
        the entry's values. Called on pristine copies of the inputs; must not modify them, and
        must keep memory bounded for the largest presets (chunk over queries or tokens where a
        naive form would not fit).
        """

    @abstractmethod
    def counts(self, shape: Shape, dtype: torch.dtype) -> Counts:
        """FLOPs and the minimum HBM bytes of one call, for roofline figures."""

    def tolerance(self, dtype: torch.dtype, device_type: str) -> Tolerance:
        """Tolerance for outputs of ``dtype``; fp32 on a GPU allows tf32 dots."""
        if dtype == torch.float32 and device_type == "cuda":
            return TF32_TOLERANCE
        return TOLERANCES[dtype]

    def output_tolerance(self, name: str, dtype: torch.dtype, device_type: str) -> Tolerance:
        """Tolerance of the floating-point output (or in-place input) ``name`` when the block
        runs in ``dtype`` (default: :meth:`tolerance`). Not used for integer or bool outputs:
        those must match exactly."""
        return self.tolerance(dtype, device_type)


def iter_shapes(block: Block) -> Iterator[tuple[str, Shape]]:
    """Every (set name, shape) pair of a block, in declaration order."""
    for set_name, shapes in block.shape_sets().items():
        for shape in shapes:
            yield set_name, shape


def generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A CPU generator seeded with ``seed``: inputs are drawn on the CPU and moved, so the same
    seed gives the same values on every device."""
    del device
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return gen


#: Tensors at least this large are drawn on the target device (seeded from the CPU generator):
#: drawing GPT-OSS-120b's expert weights on the CPU took about a minute per input set.
DEVICE_DRAW_MIN_ELEMENTS = 1 << 20


def random_tensor(
    shape: tuple[int, ...],
    gen: torch.Generator,
    distribution: str,
    *,
    scale: float = 1.0,
    dtype: torch.dtype,
    device: str | torch.device,
) -> torch.Tensor:
    """A tensor of the given distribution (see :data:`DISTRIBUTIONS`) in ``dtype`` on ``device``
    (a fresh allocation).

    Values are drawn in fp32 from ``gen`` on the CPU, so a seed gives the same values on every
    device; tensors of :data:`DEVICE_DRAW_MIN_ELEMENTS` or more bound for a GPU are instead drawn
    there from a generator seeded by ``gen`` (deterministic per device, and fast).
    """
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r}; choose from {', '.join(DISTRIBUTIONS)}")
    device = torch.device(device)
    numel = math.prod(shape)
    draw_on, draw_gen = torch.device("cpu"), gen
    if device.type != "cpu" and numel >= DEVICE_DRAW_MIN_ELEMENTS:
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        draw_on, draw_gen = device, torch.Generator(device=device)
        draw_gen.manual_seed(seed)
    x = torch.randn(shape, generator=draw_gen, dtype=torch.float32, device=draw_on)
    if distribution == "large":
        x.mul_(8.0)
    elif distribution == "outliers":
        # About 1 in 64 entries becomes 20x larger: stresses running-max and rounding paths.
        mask = torch.rand(shape, generator=draw_gen, device=draw_on) < (1.0 / 64.0)
        x = torch.where(mask, x * 20.0, x)
    if scale != 1.0:
        x.mul_(scale)
    return x.to(device=device, dtype=dtype)


__all__ = [
    "Block",
    "Counts",
    "DISTRIBUTIONS",
    "DTYPES",
    "HarnessError",
    "OUT",
    "Shape",
    "TF32_TOLERANCE",
    "TOLERANCES",
    "Tolerance",
    "generator",
    "iter_shapes",
    "random_tensor",
]
