"""The ``replay`` executor: answers a search's evaluations from a recorded results database.

A search run with ``--device replay:reports/<job>/kernelforge.db`` on a CPU sees the statuses and
timings a real GPU produced, so strategies can be developed and compared without a device. A
candidate the recording never measured comes back as ``runtime_error`` with a message saying so.
Nothing is run, compiled or re-timed (``runs_code`` is False). Recorded Kernel Tuner caches
(other kernels, other spaces) are replayed by ``strategy-bench``.

A *waiting* replay (``--device replay:PATH?wait=F``) also sleeps, for each evaluation, the device
time of what it replays: per shape the recorded median times the recorded samples (the time the
GPU spent timing it; nothing for a failed or unrecorded shape), times ``F``. It stands in for a busy
GPU (how many evaluations per minute several workers reach); it is a different environment from a
plain replay (its device name says the factor, so its results have their own env key).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from kernelforge.block import DTYPES, Block, Shape
from kernelforge.candidate import source_id
from kernelforge.errors import UserError
from kernelforge.result import Evaluation
from kernelforge.result import Status, Timing, Verification
from kernelforge.result import StoredResult
from kernelforge.store.store import Store


class ReplayExecutor:
    """Looks evaluations up in a recorded kernelforge database instead of running them
    (an :class:`~kernelforge.execute.executor.Executor` of kind ``replay``)."""

    kind = "replay"
    runs_code = False

    def __init__(self, path: str | Path, wait: float | None = None, sleep: Callable[[float], None] = time.sleep):
        """``wait``: the waiting replay's factor (None: answer at once); ``sleep`` is injectable
        for tests (a fake clock)."""
        self.path = Path(path)
        self.wait = wait
        self.sleep = sleep
        require_recording(self.path)
        self.store = Store(f"sqlite:///{self.path}", create=False)
        self._env: dict[str, Any] | None = None
        self._index: dict[tuple[str, str, str], StoredResult] = {}
        self._shapes: dict[tuple[str, str], set[str]] = {}  # (block, dtype) -> the shapes recorded
        # Indexed by the hash of the source (what evaluate is given): a candidate id also hashes its
        # template's id; a result without a stored candidate keeps its id (older recordings: the same).
        by_source = {c.id: source_id(c.source) for c in self.store.candidates()}
        first_key = None
        for row in self.store.results():
            # One recording may hold several devices: replay the first one seen, consistently (by
            # env_key: the env of each run also holds its own held-out seed).
            if self._env is None:
                self._env, first_key = row.env, row.env_key
            if row.env_key == first_key:
                key = by_source.get(row.candidate_id, row.candidate_id)
                self._index.setdefault((key, row.shape, row.dtype), row)
                self._shapes.setdefault((row.block, row.dtype), set()).add(row.shape)

    def prepare(self) -> None:
        if self._env is None:
            raise UserError(f"replay:{self.path}: the recording holds no results")

    def describe(self) -> dict[str, Any]:
        env = dict(self._env or {})
        recorded = env.get("device_name", "?")
        # The device name is part of the env key: a waiting replay's results are its own.
        waiting = f" waiting x{self.wait:g}" if self.wait is not None else ""
        described = {
            **env,
            "device": "replay",
            "device_name": f"replay of {recorded}{waiting}",
            "recorded_device": recorded,
            "recording": str(self.path),
            "timing": f"replayed from {self.path.name} (measured on {recorded}){waiting}",
        }
        if self.wait is not None:
            described["replay_wait"] = self.wait
        return described

    def device_seconds(self, rows: list[StoredResult | None]) -> float:
        """The recorded device time of ``rows`` (one per shape): median x samples of each timed,
        successful row; 0 for a failed or unrecorded one."""
        return sum(row.median_s * (row.samples or 0) for row in rows
                   if row is not None and row.ok and row.median_s is not None)

    def evaluate(self, block: Block, source: str, shapes: list[Shape], dtype, *,
                 plan=None) -> list[Evaluation]:
        """The recorded evaluations of the candidate whose source is ``source`` (looked up by its
        source's hash), one per shape. ``plan`` (a timing plan) is ignored: nothing
        is timed, the recorded methods are replayed."""
        candidate_id = source_id(source)
        dtype_name = _dtype_name(dtype)
        self._check_recorded(block, shapes, dtype_name)
        label = f"replayed from {self.path.name} (measured on {(self._env or {}).get('device_name', '?')})"
        out = []
        rows = [self._index.get((candidate_id, shape.name, dtype_name)) for shape in shapes]
        if self.wait is not None:
            self.sleep(self.wait * self.device_seconds(rows))
        for shape, row in zip(shapes, rows):
            counts = block.counts(shape, DTYPES[dtype_name])
            if row is None:
                verdict = Verification(Status.RUNTIME_ERROR, message=f"{shape.name}: not in the recording {self.path.name}")
                out.append(Evaluation(shape, verdict, counts))
                continue
            verdict = Verification(row.status, row.rel_error, row.excess, 0, row.message)
            timing = None
            if row.median_s is not None:
                timing = Timing(row.median_s, row.p20_s or row.median_s, row.p80_s or row.median_s,
                                row.samples or 0, f"replay:{row.timing_method}", label, row.joules)
            out.append(Evaluation(shape, verdict, counts, timing))
        return out

    def _check_recorded(self, block: Block, shapes: list[Shape], dtype_name: str) -> None:
        """A UserError, before anything is answered (so nothing is stored), when the recording holds
        no result of ``block`` in ``dtype_name`` at one of ``shapes``: another block's or shape
        set's recording, not a candidate the recording never measured."""
        recorded = self._shapes.get((block.id, dtype_name))
        if not recorded:
            held = ", ".join(sorted(f"{b} ({d})" for b, d in self._shapes)) or "nothing"
            raise UserError(f"replay:{self.path}: the recording holds no result of {block.id} in {dtype_name}; it "
                            f"holds {held}: replay a recording of this block and dtype")
        missing = [shape.name for shape in shapes if shape.name not in recorded]
        if missing:
            raise UserError(f"replay:{self.path}: the recording holds no result of {block.id} at shape {missing[0]}; "
                            f"it holds {', '.join(sorted(recorded))}: replay the shape set it was recorded with")

    def pair_speedups(self, block: Block, baseline_source: str, candidate_source: str, shape: Shape, dtype,
                      pairs: int) -> list[float]:
        """Nothing can be re-timed from a recording."""
        return []

    def close(self) -> None:
        self.store.close()


def require_recording(path: str | Path) -> None:
    """Raise UserError when ``path`` is no file to replay (said before anything is created)."""
    if not Path(path).is_file():
        raise UserError(f"replay:{path}: no such recording; give the path of a kernelforge.db of an earlier search")


def _dtype_name(dtype) -> str:
    """The name of a dtype (a torch dtype or already its name, as in :data:`DTYPES`)."""
    if isinstance(dtype, str):
        return dtype
    return next(name for name, value in DTYPES.items() if value == dtype)
