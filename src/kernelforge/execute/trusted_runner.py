"""A runner for trusted code of ours (the blocks' library references), in this process.

Candidates run through :func:`kernelforge.execute.judge.guard.run_call`, which rejects a call that
launches no Triton kernel, computes with torch on the host, or tampers with the harness. A library
reference does all of that by design (it calls FlexAttention or SDPA), so it runs here instead:
the plain call, whose exception is its ``runtime_error``. Every verdict is still the judge's, made
from the bytes the call wrote (poisoned outputs, repeated calls, fingerprints, the reference).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from kernelforge.execute.judge.fingerprint import poison_free_memory
from kernelforge.execute.judge.guard import CallReport, raised
from kernelforge.execute.runner import LocalRunner

if TYPE_CHECKING:
    from kernelforge.devices.base import Device


class TrustedRunner(LocalRunner):
    """A :class:`~kernelforge.execute.runner.LocalRunner` for trusted library code: a call is
    the plain call (its exception is its ``runtime_error``), without the candidate-only checks of
    :func:`~kernelforge.execute.judge.guard.run_call` (a library launches no Triton kernel of ours and
    computes with torch by design), and harness tampering is not watched (torch.compile may
    install hooks; the code is ours). Every verdict is still the judge's, from the bytes written."""

    def __init__(self, device: "Device"):
        super().__init__(device)
        self.trusted: dict[int, Any] = {}  # handle -> the library's run

    def adopt(self, run: Any) -> int:
        handle = super().adopt(run)
        self.trusted[handle] = run
        return handle

    def call(self, handle: int, args: Mapping[str, Any], watched: Sequence[str]) -> CallReport:
        poison_free_memory(self.torch_device, [args[n].numel() * args[n].element_size() for n in watched])
        try:
            self.trusted[handle](**args)
        except Exception as exc:  # a failure of the library is its verdict, not a crash of the search
            return CallReport.of(raised(exc))
        return CallReport()

    def tampering(self) -> list[str]:
        return []


__all__ = ["TrustedRunner"]
