"""Memory shared between the trusted process and a worker on a CUDA GPU: CUDA IPC.

UNTESTED IN THIS SESSION (written without a GPU; ``tests/execute/test_gpu_adversarial.py`` and
``scripts/gpu_check.py`` exercise it on a GPU host). Guarded: it is used only by a worker on a
``cuda`` device.

The trusted process allocates every tensor of a call in its own device memory
(:meth:`CudaShare.share`), and the worker opens the same memory through CUDA IPC
(``torch.multiprocessing.reductions.reduce_tensor`` here, its rebuild function there:
:func:`rebuild`). The trusted side reads the candidate's outputs itself (a device copy into its own
memory, :meth:`CudaShare.snapshot`) once the worker says its call returned; the worker synchronises
its current stream before saying so (work the timing events see is then finished), and the whole
device before it answers the following ``sync``, so work deferred to another stream shows as a
difference between the two snapshots.

CUDA IPC shares a whole allocation of the caching allocator, not one tensor: the worker could
read anything else allocated in the same segment. Shared tensors are therefore allocated from a
memory pool of their own (``torch.cuda.MemPool``), so the trusted side's private copies, its
references and its snapshots never sit in memory the worker can open.

Torch's IPC keeps a reference count in a small shared-memory file (under ``/dev/shm``) that the
worker opens when it rebuilds a tensor: a sandbox of the worker must leave that readable.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class CudaSlot:
    """What a request carries for one shared device tensor: the arguments of torch's rebuild
    function (an IPC handle, offsets, sizes), or only ``shape`` and ``dtype`` for an empty one."""

    args: tuple[Any, ...] | None
    shape: tuple[int, ...]
    dtype: torch.dtype


#: The share of each device in this process (see :meth:`CudaShare.of`).
_SHARES: dict[str, "CudaShare"] = {}


class CudaShare:
    """The trusted side's shared device tensors (see the module docstring)."""

    def __init__(self, device: str | torch.device):
        self.device = torch.device(device)
        #: where shared tensors are allocated: segments that hold nothing private
        self._pool = torch.cuda.MemPool() if hasattr(torch.cuda, "MemPool") else None
        #: id of every shared tensor handed out since the last reset -> the tensor (kept alive: the
        #: worker may hold its memory open)
        self._tensors: dict[int, torch.Tensor] = {}

    @classmethod
    def of(cls, device: str | torch.device) -> "CudaShare":
        """The one share of ``device`` in this process (its memory pool is reused by every
        worker and candidate, instead of a new pool each time)."""
        key = str(torch.device(device))
        if key not in _SHARES:
            _SHARES[key] = cls(device)
        return _SHARES[key]

    def reset(self) -> None:
        """A new step: forget the tensors of the previous one."""
        self._tensors.clear()
        torch.cuda.ipc_collect()

    def share(self, tensor: torch.Tensor, *, values: bool = True) -> torch.Tensor:
        """A device tensor of this process with ``tensor``'s shape, strides and dtype (values copied
        when ``values``), which the worker can open."""
        pool = torch.cuda.use_mem_pool(self._pool, self.device) if self._pool is not None else nullcontext()
        with pool:
            shared = torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype,
                                         device=self.device)
        if values:
            shared.copy_(tensor)
        self._tensors[id(shared)] = shared
        return shared

    def slot(self, tensor: torch.Tensor) -> CudaSlot:
        """The IPC description of a tensor :meth:`share` returned."""
        if id(tensor) not in self._tensors:
            raise ValueError("a tensor that is not shared with the worker was passed to it")
        if tensor.numel() == 0:
            return CudaSlot(None, tuple(tensor.shape), tensor.dtype)
        from torch.multiprocessing.reductions import reduce_tensor

        _rebuild, args = reduce_tensor(tensor)
        return CudaSlot(tuple(args), tuple(tensor.shape), tensor.dtype)

    def prepare_call(self) -> None:
        """Before a request: every write of this process (poison, restored inputs) is finished."""
        torch.cuda.synchronize(self.device)

    @staticmethod
    def snapshot(tensor: torch.Tensor) -> torch.Tensor:
        """A private device copy of a shared tensor (contiguous, same dtype and shape)."""
        return tensor.detach().clone(memory_format=torch.contiguous_format)

    def close(self) -> None:
        self.reset()


def rebuild(slot: CudaSlot, device: str | torch.device) -> torch.Tensor:
    """The worker's tensor for ``slot``: the trusted process's memory opened through CUDA IPC."""
    if slot.args is None:
        return torch.empty(slot.shape, dtype=slot.dtype, device=device)
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    return rebuild_cuda_tensor(*slot.args)
