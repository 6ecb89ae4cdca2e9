"""Isolated evaluation: candidates run in a worker process; verdicts are made in this one.

A candidate can crash its process (the Triton interpreter segfaults on some out-of-bounds loads; an
illegal memory access poisons a CUDA context for good), hang, eat memory, try to read the search's
secrets, or change anything in its own process: the comparison, ``torch.equal``, the timer, the
harness's functions. :class:`WorkerExecutor` is an :class:`~kernelforge.execute.executor.Executor`
that splits the work between two processes:

- this one, the **trusted** process, runs the judge (:func:`kernelforge.execute.evaluate.evaluate`):
  it draws the inputs, keeps pristine private copies, computes the reference, poisons, compares,
  checks the timed calls and the wall clock, and decides every verdict;
- one long-lived **worker** process per device
  (:class:`~kernelforge.execute.worker.process.WorkerProcess` running
  :mod:`kernelforge.execute.worker.main`: a fresh interpreter that imports torch once, about 3 s,
  sets up the Triton interpreter or the CUDA context there, and serves candidate after candidate)
  only loads the candidate and calls ``run`` on tensors that live in memory shared with this
  process (:class:`~kernelforge.execute.worker.runner.WorkerRunner`). Nothing the candidate changes
  there can change a verdict: the outputs are read back here as raw bytes, and the expected output
  never exists in the worker.

Around that:

- every source first passes the static policy (:mod:`kernelforge.policy.checker`) here; a
  violation is ``rejected`` on every shape and nothing of the source runs;
- the worker runs in the sandbox of :mod:`kernelforge.sandbox.roles`: no secrets in its
  environment, its own temporary directory, a new session, an address-space limit (none on
  ``cuda``), no core dumps, killed by the kernel if the search dies;
- every answer is awaited within its step's limit: ``compile_timeout`` seconds for the import and
  ``run_timeout`` for every other step (a held-out shape, or a timed shape with its timing; on a
  GPU the first run step gets both: the JIT compiles there). A step that runs over is a
  ``timeout``: the worker is killed (its whole process group) and the rest of the candidate's
  shapes get the same verdict without being run. A worker that dies is a ``runtime_error`` naming
  the signal ("worker died with SIGSEGV while ...", with the candidate's line when the fault
  handler printed one); a CUDA error retires the worker at once, and a candidate that replaced a
  harness function, left a thread running or changed Triton's interpreter switch retires it after
  its verdict (it must not judge the candidates after it). Either way the next request starts a
  fresh worker, and the search goes on.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import torch

from kernelforge.block import Block, Shape
from kernelforge.errors import UserError
from kernelforge.execute.evaluate import evaluate, pair_speedups
from kernelforge.execute.judge.held_out import HeldOutDraw
from kernelforge.execute.timing.rounds import TimingPlan
from kernelforge.execute.worker.memory_watch import RETIRE_ADDRESS_SPACE_GROWTH, MemoryReading, retire_reason
from kernelforge.execute.worker.process import WorkerGone, WorkerProcess
from kernelforge.execute.worker.protocol import Init, Probe, Probed, Ready
from kernelforge.execute.worker.runner import WorkerRunner
from kernelforge.policy.wall import refusal
from kernelforge.result import Evaluation, Status, Verification
from kernelforge.sandbox.roles import default_memory_limit, sandbox_plan

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


def _init(device: Any, threads: int | None) -> Init:
    """What the worker needs to build its own copy of ``device``: its class (by name), the
    constructor arguments it was built with, and torch's thread count."""
    cls = type(device)
    params = inspect.signature(cls.__init__).parameters
    kwargs = {name: getattr(device, name) for name in params if name != "self" and hasattr(device, name)}
    return Init(f"{cls.__module__}:{cls.__qualname__}", kwargs, threads)


class WorkerExecutor:
    """Evaluates candidates in a worker process (see the module docstring).

    ``device`` is the search's device (its class and settings are rebuilt in the worker). Time
    limits are in seconds; ``memory_limit`` in bytes, each candidate's (None:
    :func:`default_memory_limit`; 0: none; never applied on ``cuda``). ``extra_secrets`` names more
    environment variables to withhold.
    The worker starts on the first request and is reused until it fails or :meth:`close`.
    Default limits can be set with ``$KERNELFORGE_COMPILE_TIMEOUT``, ``$KERNELFORGE_RUN_TIMEOUT``
    (seconds) and ``$KERNELFORGE_WORKER_MEMORY_GB``.
    """

    runs_code = True

    def __init__(self, device: Any, *, compile_timeout: float | None = None, run_timeout: float | None = None,
                 startup_timeout: float = STARTUP_TIMEOUT, memory_limit: int | None = None, policy: bool = True,
                 held_out: bool = True, extra_secrets: tuple[str, ...] = (), threads: int | None = None,
                 held_out_seed: int | None = None):
        self.device = device
        self.compile_timeout = _seconds("KERNELFORGE_COMPILE_TIMEOUT", COMPILE_TIMEOUT) if compile_timeout is None \
            else compile_timeout
        self.run_timeout = _seconds("KERNELFORGE_RUN_TIMEOUT", RUN_TIMEOUT) if run_timeout is None else run_timeout
        self.policy = policy
        #: the run's held-out draws (None: no held-out shapes); its seed is in :meth:`describe`
        self.held_out = HeldOutDraw(held_out_seed) if held_out else None
        if memory_limit is None:
            memory_limit = default_memory_limit()
        #: bytes of address space the worker may use; None on cuda (see the sandbox)
        self.memory_limit = int(memory_limit) if memory_limit and device.address_space_limit else None
        if threads is None:
            threads = torch.get_num_threads()  # as many as the search itself uses (tests: 1)
        self.threads = threads
        # The worker's address-space limit is the candidate's plus what an earlier candidate may
        # leave behind before the worker is retired (memory_watch): each candidate has its whole limit.
        limit = self.memory_limit + RETIRE_ADDRESS_SPACE_GROWTH if self.memory_limit else None
        self._process = WorkerProcess(_init(device, threads), memory_limit=limit,
                                      extra_secrets=tuple(extra_secrets), startup_timeout=startup_timeout,
                                      shared_arena=torch.device(device.torch_device).type == "cpu")
        #: a request is in flight (an interrupted request leaves the pipes mid-conversation)
        self._busy = False
        #: workers started so far (tests and progress read it)
        self.starts = 0
        self._at_start = MemoryReading(None, None)  # what the worker held when it started

    # -- the executor protocol ---------------------------------------------------------------------

    @property
    def kind(self) -> str:
        """Where timings come from: the device's name (``cuda`` or ``interpret``)."""
        return self.device.name

    def prepare(self) -> None:
        """Prepare the device in this process too (the worker prepares its own copy)."""
        self.device.prepare()

    def describe(self) -> dict[str, Any]:
        """The device's environment (name, versions, timing method) results are stored under, and
        the OS sandbox the worker applies (``sandbox``)."""
        return {**self.device.describe(), "sandbox": sandbox_plan().label,
                **({"held_out_seed": self.held_out.seed} if self.held_out else {})}

    @property
    def alive(self) -> bool:
        return self._process.alive

    @property
    def info(self) -> Ready | None:
        """What the current worker said when it was ready (pid, device, memory limit)."""
        return self._process.info

    def _ensure(self, root: str | None = None) -> WorkerProcess:
        if root is not None and root not in self._process.read_roots:  # its sandbox cannot read that folder
            self._kill()
            self._process.read_roots += (root,)
        if self._busy:  # the last request was interrupted (Ctrl-C): its answers would be read next
            self._kill()
        if not self._process.alive:
            if self._process.started:
                self._kill()
            self.starts += 1
            self._process.start()
            self._at_start = self._memory()
        return self._process

    def _holds_memory(self) -> str | None:
        """Why the worker must retire because of the memory a candidate left alive in it (None:
        it need not): its resident or virtual size, or the device memory it holds, grew past
        :mod:`~kernelforge.execute.worker.memory_watch`'s limits since it started, read from outside it.
        A fresh worker then serves the next candidate, so each candidate has the worker's limits
        to itself."""
        return retire_reason(self._at_start, self._memory())

    def _memory(self) -> MemoryReading:
        arena = self._process.arena
        return MemoryReading.of(self._process.pid, self.device, shared=arena.size if arena is not None else 0)

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

    def _runner(self, process: WorkerProcess, limit: float | None = None, label: str = "") -> WorkerRunner:
        runner = WorkerRunner(process, self.device, compile_timeout=self.compile_timeout, run_timeout=self.run_timeout)
        if limit is not None:
            runner.step(label, limit)
        return runner

    def evaluate(self, block: Block, source: str, shapes: list[Shape], dtype: torch.dtype, *,
                 plan: TimingPlan | None = None) -> list[Evaluation]:
        """Verify and time ``source`` on ``shapes``, the candidate running in the worker and the
        verdict made here: one :class:`~kernelforge.result.Evaluation` per shape, in order,
        whatever happens to the worker (see the module docstring). A block that breaks its
        contract raises :class:`~kernelforge.block.HarnessError`."""
        counts = {s.name: block.counts(s, dtype) for s in shapes}
        why = refusal(source) if self.policy else None
        if why:
            verdict = Verification(Status.REJECTED, message=why)
            return [Evaluation(s, verdict, counts[s.name]) for s in shapes]
        extra = self.held_out.draw(block, shapes, whole_pool=self.device.measures_hardware) if self.held_out else []
        process = self._ensure(_block_root(block))
        runner = self._runner(process)
        results: dict[str, Evaluation] = {}

        def keep(ev: Evaluation) -> None:
            results[ev.shape.name] = ev
            if runner.retire:  # a CUDA error poisons the worker's context: nothing more runs there
                raise _Retired(runner.retire)

        self._busy = True
        try:
            evaluate(block, source, shapes, dtype, self.device, held_out=extra,
                     runner=runner, on_result=keep, plan=plan)
            retire = runner.release() or self._holds_memory()
        except WorkerGone as exc:
            self._busy = False
            verdict = Verification(Status(exc.status), message=str(exc))
            return _complete(shapes, results, counts, verdict, first_only=True)
        except _Retired as exc:
            retire = str(exc)
        except BaseException:  # a harness error, or an interrupt mid-conversation: a fresh worker next time
            self._kill()
            raise
        self._busy = False
        if retire:
            self._kill()  # the next candidate gets a fresh worker
        verdict = Verification(Status.RUNTIME_ERROR, message=f"not run: the worker was retired ({retire})")
        return _complete(shapes, results, counts, verdict, first_only=True)

    def _confirmation_draw(self, block: Block, shape: Shape) -> list[Shape]:
        """A new held-out draw for confirming a candidate on ``shape`` (none without held-out shapes)."""
        return self.held_out.draw(block, [shape], whole_pool=self.device.measures_hardware) if self.held_out else []

    def pair_speedups(self, block: Block, baseline_source: str, candidate_source: str, shape: Shape,
                      dtype: torch.dtype, pairs: int) -> list[float]:
        """Interleaved baseline/candidate speedups on one shape, timed in the worker and checked
        here (:func:`~kernelforge.execute.evaluate.pair_speedups`); empty when the worker fails
        or a check does (the candidate is then not confirmed)."""
        if self.policy and (refusal(candidate_source) or refusal(baseline_source)):
            return []
        process = self._ensure(_block_root(block))
        runner = self._runner(process, self.compile_timeout + self.run_timeout * max(pairs, 1), "re-timing pairs")
        self._busy = True
        try:
            speedups = pair_speedups(block, baseline_source, candidate_source, shape, dtype, self.device, pairs,
                                     runner=runner, held_out=self._confirmation_draw(block, shape))
            retire = runner.release() or self._holds_memory()
        except WorkerGone:
            self._busy = False
            return []
        except BaseException:
            self._kill()
            raise
        self._busy = False
        if retire:
            self._kill()
        return speedups

    def probe(self, block: Block | None = None) -> dict[str, Any]:
        """What the worker sees (environment names, working directory, limits, pid): for tests.
        With ``block``, the worker is one whose sandbox can read that block's kernels folder."""
        process = self._ensure(None if block is None else _block_root(block))
        process.send(Probe())
        answer = process.receive(process.startup_timeout, "probing")
        return answer.info if isinstance(answer, Probed) else {}


class _Retired(Exception):
    """The worker must not run anything more for this candidate (its reason)."""


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
            skipped = Verification(verdict.status, message=f"not run: {verdict.message}")
            out.append(Evaluation(shape, skipped, counts[shape.name]))
    return out
