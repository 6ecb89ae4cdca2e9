"""The in-process executor: candidates run in this process (trusted templates, debugging, tests)."""

from __future__ import annotations

from typing import Any

import torch

from kernelforge.block import Block, Shape
from kernelforge.devices.base import Device
from kernelforge.execute.evaluate import evaluate, pair_speedups
from kernelforge.execute.judge.held_out import HeldOutDraw
from kernelforge.execute.runner import LocalRunner
from kernelforge.execute.timing.rounds import TimingPlan
from kernelforge.result import Evaluation

#: What results of this executor record as their sandbox.
IN_PROCESS_SANDBOX = "none: in-process (trusted code only)"


class InProcessExecutor:
    """Evaluates candidates in this process: an :class:`~kernelforge.execute.executor.Executor`
    for trusted templates, debugging (``--in-process``, ``--trusted``) and tests. The judge is the
    same as the worker's (:func:`~kernelforge.execute.evaluate.evaluate`), with the candidate
    called by a :class:`~kernelforge.execute.runner.LocalRunner` in this process: nothing is
    isolated, so a candidate that patches this process can change its verdict, and a crash or hang
    takes this process with it. Untrusted code runs through
    :class:`kernelforge.execute.worker.executor.WorkerExecutor`.

    The static policy is still applied (``policy=False`` turns it off, for tests of the run-time
    defenses), as are the held-out shapes, the checks of the timed calls and the post-timing
    re-check.
    """

    runs_code = True

    def __init__(self, device: Device, *, policy: bool = True, held_out: bool = True, held_out_seed: int | None = None):
        self.device = device
        self.policy = policy
        #: the run's held-out draws (None: no held-out shapes); its seed is in :meth:`describe`
        self.held_out = HeldOutDraw(held_out_seed) if held_out else None

    @property
    def kind(self) -> str:
        """Where timings come from: the device's name (``cuda`` or ``interpret``)."""
        return self.device.name

    def prepare(self) -> None:
        """Make the device usable in this process (before any candidate is loaded)."""
        self.device.prepare()

    def describe(self) -> dict[str, Any]:
        """The device's environment (name, versions, timing method) results are stored under, and
        ``sandbox``: none (candidates run in this process)."""
        return {**self.device.describe(), "sandbox": IN_PROCESS_SANDBOX,
                **({"held_out_seed": self.held_out.seed} if self.held_out else {})}

    def evaluate(self, block: Block, source: str, shapes: list[Shape], dtype: torch.dtype, *,
                 plan: TimingPlan | None = None) -> list[Evaluation]:
        """Verify and time ``source`` on ``shapes`` (see :func:`~kernelforge.execute.evaluate.evaluate`)."""
        extra = self.held_out.draw(block, shapes, whole_pool=self.device.measures_hardware) if self.held_out else []
        runner = LocalRunner(self.device)
        try:
            return evaluate(block, source, shapes, dtype, self.device, held_out=extra,
                            policy=self.policy, runner=runner, plan=plan)
        finally:
            runner.release()  # the next candidate starts from Triton's defaults

    def pair_speedups(self, block: Block, baseline_source: str, candidate_source: str, shape: Shape,
                      dtype: torch.dtype, pairs: int) -> list[float]:
        """Interleaved baseline/candidate speedups (see :func:`~kernelforge.execute.evaluate.pair_speedups`)."""
        extra = self.held_out.draw(block, [shape], whole_pool=self.device.measures_hardware) if self.held_out else []
        return pair_speedups(block, baseline_source, candidate_source, shape, dtype, self.device, pairs, held_out=extra)

    def close(self) -> None:
        """Nothing to release (may be called more than once)."""
