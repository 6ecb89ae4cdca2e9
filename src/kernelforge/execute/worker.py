"""Isolated evaluation: candidates run in a worker process, never in the search's own.

A candidate can crash its process (the Triton interpreter segfaults on some out-of-bounds loads; an
illegal memory access poisons a CUDA context for good), hang, eat memory, or try to read the
search's secrets. :class:`WorkerExecutor` is an :class:`~kernelforge.execute.executor.Executor`
that runs each request in one long-lived worker process per device
(:class:`~kernelforge.execute.worker_process.WorkerProcess` running
:mod:`kernelforge.execute.worker_main`: a fresh interpreter that imports torch once, about 3 s,
sets up the Triton interpreter or the CUDA context there, and serves candidate after candidate):

- every source first passes the static policy (:mod:`kernelforge.execute.policy`) in the parent; a
  violation is ``rejected`` on every shape and nothing of the source runs;
- the worker runs in the sandbox of :mod:`kernelforge.execute.sandbox`: no secrets in its
  environment, its own temporary directory, a new session, an address-space limit (none on
  ``cuda``), no core dumps, killed by the kernel if the search dies;
- the worker announces each step (import, each held-out shape, each timed shape) and sends each
  shape's evaluation as soon as it exists (verdicts, tracebacks and timings as the in-process
  evaluation makes them). The parent gives the import ``compile_timeout`` seconds and every other
  step ``run_timeout`` (on a GPU the first run step gets both: the JIT compiles there). A step that
  runs over is a ``timeout``: the worker is killed (its whole process group) and the rest of the
  candidate's shapes get the same verdict without being run. A worker that dies is a
  ``runtime_error`` naming the signal ("worker died with SIGSEGV while ...", with the candidate's
  line when the fault handler printed one); a CUDA error in a result, or a failed synchronisation
  after a request, retires the worker after it answers, and so does a candidate that replaced a
  harness function or left a thread running (it was judged for that, but must not judge the
  candidates after it). Either way the next request starts a fresh worker, and the search goes on.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import torch

from kernelforge.block import DTYPES, Block, HarnessError, Shape
from kernelforge.errors import UserError
from kernelforge.execute.evaluate import held_out_shapes
from kernelforge.execute.policy import check_source
from kernelforge.execute.sandbox import default_memory_limit
from kernelforge.execute.worker_process import WorkerGone, WorkerProcess
from kernelforge.result import Evaluation, Status, Verification

#: Seconds a worker may take to start (import torch and triton, prepare the device).
STARTUP_TIMEOUT = 180.0
#: Seconds for importing a candidate (and, on a GPU, added to its first run step for JIT compile).
COMPILE_TIMEOUT = 120.0
#: Seconds for one run step: verifying a held-out shape, or verifying, timing and re-checking one
#: timed shape. Interpreter shapes of the shipped blocks take 0.3-3 s per step, GPU ones well
#: under a minute.
RUN_TIMEOUT = 300.0


def _seconds(variable: str, default: float) -> float:
    """A time limit from the environment (``KERNELFORGE_RUN_TIMEOUT=60``), else ``default``."""
    value = os.environ.get(variable)
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise UserError(f"{variable}={value!r} is not a number of seconds") from None
    if seconds <= 0:
        raise UserError(f"{variable}={value!r} must be a positive number of seconds")
    return seconds


def _block_root(block: Any) -> str:
    """The kernels folder a block was discovered in (its ``block.py`` is at ROOT/<block id>/)."""
    folder = Path(inspect.getfile(type(block))).resolve().parent
    for _ in block.id.split("/"):
        folder = folder.parent
    return str(folder)


def _device_spec(device: Any) -> tuple[str, dict[str, Any]]:
    """What the worker needs to build its own copy of ``device``: its class (by name) and the
    constructor arguments it was built with."""
    cls = type(device)
    params = inspect.signature(cls.__init__).parameters
    kwargs = {name: getattr(device, name) for name in params if name != "self" and hasattr(device, name)}
    return f"{cls.__module__}:{cls.__qualname__}", kwargs


def _dtype_name(dtype: Any) -> str:
    for name, value in DTYPES.items():
        if value == dtype or name == dtype:
            return name
    raise UserError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")


class WorkerExecutor:
    """Evaluates candidates in a worker process (see the module docstring).

    ``device`` is the search's device (its class and settings are rebuilt in the worker). Time
    limits are in seconds; ``memory_limit`` in bytes (None: :func:`default_memory_limit`; 0: none;
    never applied on ``cuda``). ``extra_secrets`` names more environment variables to withhold.
    The worker starts on the first request and is reused until it fails or :meth:`close`.
    Default limits can be set with ``$KERNELFORGE_COMPILE_TIMEOUT``, ``$KERNELFORGE_RUN_TIMEOUT``
    (seconds) and ``$KERNELFORGE_WORKER_MEMORY_GB``.
    """

    runs_code = True

    def __init__(self, device: Any, *, compile_timeout: float | None = None, run_timeout: float | None = None,
                 startup_timeout: float = STARTUP_TIMEOUT, memory_limit: int | None = None, policy: bool = True,
                 held_out: bool = True, extra_secrets: tuple[str, ...] = (), threads: int | None = None):
        self.device = device
        self.compile_timeout = _seconds("KERNELFORGE_COMPILE_TIMEOUT", COMPILE_TIMEOUT) if compile_timeout is None \
            else compile_timeout
        self.run_timeout = _seconds("KERNELFORGE_RUN_TIMEOUT", RUN_TIMEOUT) if run_timeout is None else run_timeout
        self.policy = policy
        self.held_out = held_out
        if memory_limit is None:
            memory_limit = default_memory_limit()
        #: bytes of address space the worker may use; None on cuda (see the sandbox)
        self.memory_limit = None if (not memory_limit or device.name == "cuda") else int(memory_limit)
        if threads is None:
            threads = torch.get_num_threads()  # as many as the search itself uses (tests: 1)
        self.threads = threads
        self._process = WorkerProcess(("init", _device_spec(device), threads), memory_limit=self.memory_limit,
                                      extra_secrets=tuple(extra_secrets), startup_timeout=startup_timeout)
        #: a request is in flight (an interrupted request leaves the pipes mid-conversation)
        self._busy = False
        #: workers started so far (tests and progress read it)
        self.starts = 0

    # -- the executor protocol ---------------------------------------------------------------------

    @property
    def kind(self) -> str:
        """Where timings come from: the device's name (``cuda`` or ``interpret``)."""
        return self.device.name

    def prepare(self) -> None:
        """Prepare the device in this process too (the worker prepares its own copy)."""
        self.device.prepare()

    def describe(self) -> dict[str, Any]:
        """The device's environment (name, versions, timing method) results are stored under."""
        return self.device.describe()

    @property
    def alive(self) -> bool:
        return self._process.alive

    @property
    def info(self) -> dict[str, Any]:
        """What the current worker said when it was ready (pid, device, memory limit)."""
        return self._process.info

    def _ensure(self) -> WorkerProcess:
        if self._busy:  # the last request was interrupted (Ctrl-C): its answers would be read next
            self._kill()
        if not self._process.alive:
            if self._process.started:
                self._kill()
            self.starts += 1
            self._process.start()
        return self._process

    def _kill(self) -> None:
        self._process.kill()
        self._busy = False

    def close(self) -> None:
        """Stop the worker (politely, then for sure) and remove its directory; idempotent."""
        self._process.close(polite=not self._busy)
        self._busy = False

    def __enter__(self) -> "WorkerExecutor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # a forgotten executor must not leave a process behind
        try:
            self._process.kill()
        except Exception:
            pass

    # -- requests ---------------------------------------------------------------------------------

    def evaluate(self, block: Block, source: str, shapes: list[Shape], dtype: torch.dtype, *,
                 deterministic: bool = True) -> list[Evaluation]:
        """Verify and time ``source`` on ``shapes`` in the worker: one
        :class:`~kernelforge.result.Evaluation` per shape, in order, whatever happens to the
        worker (see the module docstring). A block that breaks its contract raises
        :class:`~kernelforge.block.HarnessError` here, as in this process."""
        counts = {s.name: block.counts(s, dtype) for s in shapes}
        if self.policy:
            report = check_source(source)
            if not report.ok:
                verdict = Verification(Status.REJECTED, message=report.message())
                return [Evaluation(s, verdict, counts[s.name]) for s in shapes]
        extra = held_out_shapes(block, shapes, source, self.device.name) if self.held_out else []
        process = self._ensure()
        results: dict[str, Evaluation] = {}
        request = ("evaluate", _block_root(block), block.id, source, list(shapes), _dtype_name(dtype),
                   deterministic, list(extra))
        step, timeout, compiled = "sending the candidate", self.compile_timeout, False
        retire: str | None = None
        self._busy = True
        try:
            process.send(request)
            while True:
                kind, *rest = process.receive(timeout, step)
                if kind == "step":
                    step = rest[0]
                    if step == "compile":
                        step, timeout = "importing the candidate", self.compile_timeout
                    else:
                        # On a GPU the JIT compiles at the first launch: the first run step gets both.
                        jit = not compiled and self.device.name == "cuda"
                        timeout = self.run_timeout + (self.compile_timeout if jit else 0)
                        compiled = True
                        step = f"running {step}"
                elif kind == "result":
                    ev = rest[0]
                    results[ev.shape.name] = ev
                elif kind == "done":
                    retire = rest[0]
                    self._busy = False
                    break
                elif kind == "error":
                    error_kind, message = rest
                    self._kill()
                    if error_kind == "HarnessError":
                        raise HarnessError(message)
                    if error_kind == "UserError":
                        raise UserError(message)
                    verdict = Verification(Status.RUNTIME_ERROR, message=f"harness error in the worker: {message}"[:2000])
                    return _complete(shapes, results, counts, verdict)
        except WorkerGone as exc:
            self._busy = False
            verdict = Verification(Status(exc.status), message=str(exc)[:2000])
            return _complete(shapes, results, counts, verdict, first_only=True)
        if retire:
            self._kill()  # a CUDA error poisons the context: the next candidate gets a fresh worker
        verdict = Verification(Status.RUNTIME_ERROR, message=f"not run: the worker was retired ({retire})")
        return _complete(shapes, results, counts, verdict, first_only=True)

    def pair_speedups(self, block: Block, baseline_source: str, candidate_source: str, shape: Shape,
                      dtype: torch.dtype, pairs: int) -> list[float]:
        """Interleaved baseline/candidate speedups on one shape, in the worker; empty when the
        worker fails (the candidate is then not confirmed)."""
        if self.policy and (not check_source(candidate_source).ok or not check_source(baseline_source).ok):
            return []
        process = self._ensure()
        self._busy = True
        try:
            process.send(("pairs", _block_root(block), block.id, baseline_source, candidate_source, shape,
                          _dtype_name(dtype), pairs))
            kind, *rest = process.receive(self.compile_timeout + self.run_timeout * max(pairs, 1), "re-timing pairs")
        except WorkerGone:
            self._busy = False
            return []
        self._busy = False
        if kind != "pairs":
            self._kill()
            return []
        return list(rest[0])

    def probe(self) -> dict[str, Any]:
        """What the worker sees (environment names, working directory, limits, pid): for tests."""
        process = self._ensure()
        process.send(("probe",))
        kind, info = process.receive(process.startup_timeout, "probing")
        return info


def _complete(shapes: list[Shape], results: dict[str, Evaluation], counts: dict, verdict: Verification,
              first_only: bool = False) -> list[Evaluation]:
    """One evaluation per shape: those the worker sent, then ``verdict`` for the shape it was on
    and (not run, with a message saying so) the ones after it (all of them ``verdict`` unless
    ``first_only``)."""
    out = []
    first = True
    for shape in shapes:
        if shape.name in results:
            out.append(results[shape.name])
            continue
        if first or not first_only:
            out.append(Evaluation(shape, verdict, counts[shape.name]))
            first = False
        else:
            skipped = Verification(verdict.status, message=f"not run: {verdict.message}"[:2000])
            out.append(Evaluation(shape, skipped, counts[shape.name]))
    return out
