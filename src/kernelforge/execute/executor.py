"""The executor seam: where a candidate is verified and timed.

Search and confirmation talk only to an :class:`Executor`; which one runs is decided once, by
:func:`make_executor`. Implementations:

- :class:`kernelforge.execute.worker.executor.WorkerExecutor`: the default; candidate code runs in a
  sandboxed worker process (crash, hang and memory isolation, no secrets);
- :class:`kernelforge.execute.inprocess.InProcessExecutor`: this process, for trusted debugging
  (``--in-process``) and tests;
- :class:`kernelforge.execute.replay.ReplayExecutor`: answers from a recorded database and runs
  nothing (``--device replay:PATH``).

Nothing outside this module asks which implementation it holds: what differs between them is in
the protocol (``runs_code``, ``kind``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from kernelforge.errors import UserError

if TYPE_CHECKING:
    import torch

    from kernelforge.block import Block, Shape
    from kernelforge.execute.timing.rounds import TimingPlan
    from kernelforge.result import Evaluation


@runtime_checkable
class Executor(Protocol):
    """Verifies and times candidates on one device.

    Contract (every implementation runs the executor contract tests):

    - ``kind`` names where timings come from (``cuda``, ``interpret`` or ``replay``); per-kind
      settings (how many candidates to confirm, how many pairs) are keyed on it.
    - ``runs_code`` is False when nothing is executed (replay): then nothing is compiled and
      nothing is re-timed.
    - :meth:`prepare` is called once before the first evaluation; :meth:`describe` then gives the
      environment (device name, versions, ...) that every result is stored under.
    - :meth:`evaluate` returns exactly one :class:`~kernelforge.result.Evaluation` per shape, in
      order, whatever the candidate does: failures are data, never exceptions. ``plan`` fixes the
      timing method of each shape it names (the baseline's, :class:`~kernelforge.execute.timing.rounds.TimingPlan`):
      a candidate is timed with that method or not at all.
    - :meth:`pair_speedups` re-times baseline and candidate interleaved, ``pairs`` times, and
      returns baseline/candidate time ratios (empty when nothing can be timed).
    - :meth:`close` releases processes and memory; it may be called more than once.
    """

    kind: str
    runs_code: bool

    def prepare(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...

    def evaluate(self, block: "Block", source: str, shapes: list["Shape"], dtype: "torch.dtype", *,
                 plan: "TimingPlan | None" = None) -> list["Evaluation"]: ...

    def pair_speedups(self, block: "Block", baseline_source: str, candidate_source: str, shape: "Shape",
                      dtype: "torch.dtype", pairs: int) -> list[float]: ...

    def close(self) -> None: ...


def make_executor(device_name: str, *, in_process: bool = False, secrets: tuple[str, ...] = (),
                  storage: str | None = None) -> Executor:
    """The executor of a job's device: ``cuda``, ``interpret``, ``replay:PATH`` or the waiting
    replay ``replay:PATH?wait=F`` (see :func:`parse_replay`).

    ``in_process`` runs candidates in this process (trusted debugging); ``secrets`` names extra
    environment variables the worker must never see (the LLM key's variable); ``storage``: the
    URL of the database the results go to, which a replay never reads (a replay into the database
    it replays would store its answers beside the measurements, and the report would show those).
    """
    check_device(device_name, storage)
    if device_name.startswith("replay:"):
        from kernelforge.execute.replay import ReplayExecutor

        path, wait = parse_replay(device_name)
        return ReplayExecutor(path, wait=wait)
    from kernelforge.devices.registry import get_device

    device = get_device(device_name)
    if in_process:
        from kernelforge.execute.inprocess import InProcessExecutor

        return InProcessExecutor(device)
    from kernelforge.execute.worker.executor import WorkerExecutor

    return WorkerExecutor(device, extra_secrets=secrets)


def check_device(device_name: str, storage: str | None = None) -> None:
    """Raise UserError, before anything is created, when ``device_name`` cannot serve a search
    storing into ``storage``: an unknown name, a CUDA device where torch sees no GPU, a recording
    that is not there, or the database the search stores into (a replay into the database it
    replays would store its answers beside the measurements, and the report would show those)."""
    from kernelforge.fields import device_name as checked_name

    checked_name("device", device_name)
    if not device_name.startswith("replay:"):
        from kernelforge.devices.cuda import require_visible

        require_visible(device_name)
        return
    from kernelforge.execute.replay import require_recording
    from kernelforge.storage_url import sqlite_file

    path, _ = parse_replay(device_name)
    require_recording(path)
    own = sqlite_file(storage) if storage else None
    if own is not None and own.resolve() == Path(path).resolve():
        raise UserError(f"device replay:{path} is the database this search stores into: a replay would store "
                        "what it replays beside what was measured, and the report would show the replay; give "
                        "the replay its own storage (--storage sqlite:///reports/JOB-replay.db) or job name")


def parse_replay(device_name: str) -> tuple[str, float | None]:
    """``replay:PATH`` -> (PATH, None); ``replay:PATH?wait=F`` -> (PATH, F), F a positive factor on
    the recorded device time each evaluation then sleeps. The one parse of a replay device name."""
    spec = device_name.split(":", 1)[1]
    path, sep, query = spec.rpartition("?")
    if not sep or not query.startswith("wait="):
        return spec, None
    text = query.removeprefix("wait=")
    try:
        wait = float(text)
    except ValueError:
        wait = -1.0
    if not wait > 0 or wait == float("inf"):
        raise UserError(f"--device {device_name}: wait={text!r} must be a positive number (the factor on the "
                        "recorded device time each evaluation waits), e.g. replay:PATH?wait=1")
    return path, wait
