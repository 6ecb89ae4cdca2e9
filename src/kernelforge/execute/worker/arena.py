"""Memory shared between the trusted process and a worker, on the CPU: an anonymous arena.

The trusted process (the executor's side) owns an :class:`Arena`: a ``memfd`` (anonymous shared
memory, no name in any file system) mapped into it, handed to the worker when the worker is started
(an inherited file descriptor: the request pipes cannot carry descriptors), and mapped there too
(:class:`ArenaView`). The trusted side places a call's tensors in it (:meth:`Arena.share`: same
shape, strides and dtype as the tensor given, at a fresh offset), tells the worker where each one
is (a :class:`Slot`, a few integers in the request), and reads the candidate's outputs back as raw
bytes (:meth:`Arena.snapshot`) into memory the worker cannot reach.

The worker could try to pull the memory from under the trusted side: the arena is sealed against
shrinking (``F_SEAL_SHRINK``, then ``F_SEAL_SEAL`` so no other seal can be added), so a reading of
the trusted side never faults. It may only grow, which the trusted side does when a shape needs
more (the worker maps the size each request names).

Slots are handed out from the start again at every step (:meth:`Arena.reset`), so a shape's
tensors sit at the same addresses on every call of that shape (call 3 writes new values into the
same buffers), and the arena never holds more than the largest step.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import resource
from dataclasses import dataclass

import torch

from kernelforge.errors import UserError

#: Slots start at multiples of this many bytes (Triton specialises pointers divisible by 16).
ALIGN = 256
#: Bytes the arena starts with: a sparse file, costing memory only where written.
INITIAL_BYTES = 256 * 2**20

_DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16,
    torch.int32, torch.int64, torch.bool, torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2)}


def dtype_named(name: str) -> torch.dtype:
    """The torch dtype of a :class:`Slot`'s ``dtype`` name (``"bfloat16"``)."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"no shared tensors of dtype {name!r}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """The name a :class:`Slot` records for ``dtype``."""
    name = str(dtype).removeprefix("torch.")
    dtype_named(name)
    return name


def storage_elements(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements of storage a tensor of ``shape`` and ``stride`` spans (0 when it is empty)."""
    if any(size == 0 for size in shape):
        return 0
    return 1 + sum((size - 1) * step for size, step in zip(shape, stride))


@dataclass(frozen=True)
class Slot:
    """Where one shared tensor lives in the arena: byte ``offset``, ``dtype`` name, ``shape`` and
    ``stride`` (in elements). Picklable and small: it is what a request carries for a tensor."""

    offset: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of the arena the tensor spans."""
        return storage_elements(self.shape, self.stride) * dtype_named(self.dtype).itemsize


def tensor_at(buffer: mmap.mmap, slot: Slot) -> torch.Tensor:
    """The tensor ``slot`` describes, over ``buffer`` (no copy): writes go to the shared memory."""
    dtype = dtype_named(slot.dtype)
    count = storage_elements(slot.shape, slot.stride)
    if count == 0:  # nothing to share: an empty tensor of the right shape
        return torch.empty(slot.shape, dtype=dtype)
    flat = torch.frombuffer(buffer, dtype=dtype, count=count, offset=slot.offset)
    return flat.as_strided(slot.shape, slot.stride)


def _resize(fd: int, size: int) -> None:
    """Give the arena ``fd`` ``size`` bytes; a refusal (the process's file-size limit, which applies
    to a memfd too) is one line saying which limit and how to lift it."""
    try:
        os.ftruncate(fd, size)
    except OSError as exc:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if exc.errno == errno.EFBIG and limit != resource.RLIM_INFINITY:
            why = (f"the file-size limit of this process (RLIMIT_FSIZE, set by ulimit -f) is {limit} bytes, below "
                   "that; raise it (ulimit -f unlimited) or run the search with --in-process")
        else:
            why = f"{exc.strerror}; free memory, or run the search with --in-process"
        raise UserError(f"cannot size the memory shared with the evaluation worker to {size} bytes: {why}") from None


class Arena:
    """The trusted side of the shared arena (see the module docstring). :attr:`fd` is inherited by
    the worker; :meth:`close` releases it."""

    def __init__(self, size: int = INITIAL_BYTES):
        self.fd = os.memfd_create("kernelforge-arena", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
        try:
            _resize(self.fd, size)
        except UserError:
            os.close(self.fd)
            raise
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
        self.size = size
        self._map = mmap.mmap(self.fd, size)
        self._next = 0
        #: id of every shared tensor handed out since the last reset -> (its slot, the tensor)
        self._slots: dict[int, tuple[Slot, torch.Tensor]] = {}

    def reset(self) -> None:
        """Hand out slots from the start again (a new step): earlier shared tensors are dead."""
        self._next = 0
        self._slots.clear()

    def _grow(self, needed: int) -> None:
        size = max(2 * self.size, needed)
        _resize(self.fd, size)
        # A new, larger mapping of the same file: tensors over the old one still see the same bytes.
        self._map = mmap.mmap(self.fd, size)
        self.size = size

    def share(self, tensor: torch.Tensor, *, values: bool = True) -> torch.Tensor:
        """A tensor in the arena with ``tensor``'s shape, strides and dtype (its values copied when
        ``values``); the candidate is called with it."""
        slot = Slot(self._next, dtype_name(tensor.dtype), tuple(tensor.shape), tuple(tensor.stride()))
        end = slot.offset + slot.nbytes
        if end > self.size:
            self._grow(end)
        self._next = -(-end // ALIGN) * ALIGN
        shared = tensor_at(self._map, slot)
        if values:
            shared.copy_(tensor)
        self._slots[id(shared)] = (slot, shared)
        return shared

    def slot(self, tensor: torch.Tensor) -> Slot:
        """The slot of a tensor :meth:`share` returned (since the last reset)."""
        try:
            return self._slots[id(tensor)][0]
        except KeyError:
            raise ValueError("a tensor that is not in the shared arena was passed to the worker") from None

    @staticmethod
    def snapshot(tensor: torch.Tensor) -> torch.Tensor:
        """A private copy of a shared tensor's bytes (contiguous, same dtype and shape)."""
        return tensor.detach().clone(memory_format=torch.contiguous_format)

    def close(self) -> None:
        """Release the descriptor (mappings still referenced stay valid until dropped)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ArenaView:
    """The worker's side: the arena mapped from the inherited descriptor ``fd``. :meth:`tensor`
    builds the tensor of a slot, after mapping the size the request names (the trusted side grows
    the arena; it never shrinks)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.size = 0
        self._map: mmap.mmap | None = None

    def ensure(self, size: int) -> None:
        """Map at least ``size`` bytes."""
        if size > self.size:
            self._map = mmap.mmap(self.fd, size)
            self.size = size

    def tensor(self, slot: Slot) -> torch.Tensor:
        """The shared tensor of ``slot``."""
        if self._map is None or slot.offset + slot.nbytes > self.size:
            raise ValueError(f"slot at {slot.offset} is outside the mapped arena ({self.size} bytes)")
        return tensor_at(self._map, slot)
