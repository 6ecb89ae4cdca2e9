"""The Python API: open a job, run its search, read its results and load a block's winner as a
function, from a notebook or a script (docs/python-api.md).

A thin facade over what the command line does: :func:`run` is ``kernelforge search JOB`` in this
process (the same :class:`~kernelforge.search.search.Search`, store, job lock, resume and worker
process for the candidates; no signal handlers are installed and no report files are written),
:func:`results` is what ``kernelforge report JOB`` reads, and :func:`load_winner` imports the stored
source of a shape's winner and calls its ``run`` with outputs allocated as the harness allocates them.

Every mistake raises :class:`~kernelforge.errors.UserError` with one message saying what to fix.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import torch

from kernelforge.block import DISTRIBUTIONS, DTYPES, OUT, Block, Shape
from kernelforge.candidate import load_module
from kernelforge.catalog import Catalog, default_kernels_root
from kernelforge.errors import UserError
from kernelforge.execute.executor import check_device
from kernelforge.execute.judge.contract import Outputs, allocate
from kernelforge.policy.wall import refusal
from kernelforge.job import Job, job_path, load_job
from kernelforge.redact import redact_url, register_url
from kernelforge.report.collect import collect
from kernelforge.report.records import Report
from kernelforge.search.progress import Progress
from kernelforge.store.store import Store

__all__ = ["WinnerKernel", "load_winner", "open_job", "results", "run"]


@functools.lru_cache(maxsize=4)
def _catalog_at(root: Path) -> Catalog:
    return Catalog.discover(root)


def default_catalog() -> Catalog:
    """The catalog of ``$KERNELFORGE_KERNELS``, else of this checkout's ``kernels/`` (loaded once)."""
    return _catalog_at(default_kernels_root())


def open_job(job: str | Path | Job, *, storage: str | None = None, evaluations: int | None = None,
             blocks: Sequence[str] | None = None, catalog: Catalog | None = None) -> Job:
    """The job ``job`` (a job file, the name of a job under ``search/`` as on the command line, or a
    :class:`Job`) with overrides: ``storage`` (a SQLAlchemy URL, as ``--storage``), ``evaluations``
    (the strategy's budget per block) and ``blocks`` (a subset of the job's block ids, in the job's
    order). Nothing is read from or written to the storage."""
    catalog = catalog or default_catalog()
    if not isinstance(job, Job):
        job = load_job(job_path(str(job)), catalog)
    if storage is not None:
        if not isinstance(storage, str) or not storage:
            raise UserError(f"open_job(storage={storage!r}): give a SQLAlchemy URL such as 'sqlite:///results.db'")
        register_url(storage)  # its password is masked in everything written from now on
        job = replace(job, storage=storage)
    if evaluations is not None:
        if isinstance(evaluations, bool) or not isinstance(evaluations, int) or evaluations < 1:
            raise UserError(f"open_job(evaluations={evaluations!r}): the budget per block is a positive integer")
        job = replace(job, strategy=replace(job.strategy, evaluations=evaluations))
    if blocks is not None:
        if not isinstance(blocks, (str, list, tuple)) or not all(isinstance(b, str) for b in blocks):
            raise UserError(f"open_job(blocks={blocks!r}): give a block id or a list of them, e.g. "
                            "blocks=['attention/gpt_oss_decode']")
        wanted = [blocks] if isinstance(blocks, str) else list(blocks)
        known = [spec.id for spec in job.blocks]
        unknown = [b for b in wanted if b not in known]
        if unknown or not wanted:
            raise UserError(f"open_job(blocks={wanted!r}): job {job.name} ({job.path}) has blocks "
                            f"{', '.join(known)}; choose one or more of them")
        job = replace(job, blocks=tuple(spec for spec in job.blocks if spec.id in wanted))
    return job


def _opened(job: str | Path | Job, catalog: Catalog | None) -> Job:
    """``job`` as a :class:`Job`: a job file or a job's name is opened as :func:`open_job` opens it."""
    if isinstance(job, Job):
        return job
    if isinstance(job, (str, Path)):
        return open_job(job, catalog=catalog)
    raise UserError(f"job={job!r}: give a Job from kernelforge.api.open_job, a job file or a job's name")


def run(job: str | Path | Job, *, progress: Progress | None = None, catalog: Catalog | None = None,
        device: str | None = None, in_process: bool = False, compile_ahead: bool = True,
        reconfirm: bool = False, accept_block_change: bool = False) -> Report:
    """Run (or resume) the search of ``job`` as ``kernelforge search`` does, and return its report
    (:func:`results` once the search ends). ``progress`` receives the search's events (default:
    none); ``device``, ``in_process``, ``compile_ahead`` (False: ``--no-compile``), ``reconfirm`` and
    ``accept_block_change`` are the command line's options. A search stopped with Ctrl-C raises KeyboardInterrupt after
    everything measured is stored; running again continues it."""
    from kernelforge.search.warm import check_sources
    from kernelforge.start import preflight, run_search

    catalog = catalog or default_catalog()
    job = _opened(job, catalog)
    if progress is not None and not isinstance(progress, Progress):
        raise UserError(f"run(progress={progress!r}): give a kernelforge.search.progress.Progress (it receives "
                        "the search's events) or None")
    preflight(job, catalog, device)
    store = Store(job.storage_url)
    try:
        check_sources(store, job.name, job.strategy.warm_start)
        events = progress or Progress()
        outcome = run_search(job, catalog, store, events, device_name=device, compile_enabled=compile_ahead,
                             in_process=in_process, reconfirm=reconfirm, accept_block_change=accept_block_change)
        if outcome.stopped:
            raise KeyboardInterrupt(f"job {job.name} {outcome.reason}: everything measured is stored; "
                                    "run it again to continue")
        return collect(job, catalog, store)
    finally:
        store.close()


def results(job: str | Path | Job, *, catalog: Catalog | None = None) -> Report:
    """The report of what ``job``'s storage holds (``kernelforge report`` without the files): per
    block, each shape's baseline, winner, speedup and how it was confirmed. Nothing is measured."""
    catalog = catalog or default_catalog()
    job = _opened(job, catalog)
    store = Store(job.storage_url, create=False)
    try:
        return collect(job, catalog, store)
    finally:
        store.close()


@dataclass(frozen=True, eq=False)
class WinnerKernel:
    """The winner of one block at one shape, as a function with the block's interface: called with
    the keyword arguments of the block's reference (``block.make_inputs(...)``), it allocates the
    outputs, runs the winner's stored source on ``device`` and returns what the reference returns
    (one tensor, or a dict by output name with the in-place inputs' final values, which it updates
    in place as the kernel does). Outputs are in ``dtype``, the job's; the reference's are fp32."""

    block: Block
    shape: Shape
    dtype: torch.dtype
    device: str  # the device the kernel runs on: cuda, cuda:N or interpret
    torch_device: str  # where its tensors live: cpu for the interpreter, cuda:N on a GPU
    candidate_id: str
    template: str
    params: dict[str, Any]
    speedup: float | None  # over the shape's baseline, as the report gives it (None: not timed)
    confirmed: bool  # the speedup comes from the interleaved confirmation pairs
    is_baseline: bool  # nothing beat the baseline: the winner is the baseline itself
    timing_label: str | None  # what the timings are (interpreter wall time is no GPU speed)
    source: str
    entry: Any  # the winner's ``run``

    def make_inputs(self, seed: int = 0, distribution: str = "normal") -> dict[str, Any]:
        """Fresh inputs of this shape, dtype and device from the block's own input builder."""
        if distribution not in DISTRIBUTIONS:
            raise UserError(f"make_inputs(distribution={distribution!r}): choose one of {', '.join(DISTRIBUTIONS)}")
        return self.block.make_inputs(self.shape, self.dtype, self.torch_device, seed, distribution)

    @functools.cached_property
    def _expected(self) -> dict[str, Any]:
        """Input name -> (shape, dtype) of a tensor, or its type: what this shape's inputs are."""
        return {name: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else type(v)
                for name, v in self.make_inputs().items()}

    def _check(self, inputs: dict[str, Any]) -> None:
        """One line for inputs that are not this shape's: the kernel was specialised to it and
        would read or write past the tensors it was given."""
        expected = self._expected
        missing, unknown = sorted(set(expected) - set(inputs)), sorted(set(inputs) - set(expected))
        if missing or unknown:
            raise UserError(f"{self.block.id} winner at {self.shape.name}: takes the inputs {', '.join(expected)}"
                            + (f"; missing {', '.join(missing)}" if missing else "")
                            + (f"; unknown {', '.join(unknown)}" if unknown else "")
                            + " (make_inputs() builds them)")
        for name, value in inputs.items():
            want = expected[name]
            got = (tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else type(value)
            if isinstance(want, tuple) and got != want:
                raise UserError(f"{self.block.id} winner at {self.shape.name}: input {name} is {_described(got)}, "
                                f"but this shape's is {_described(want)}; the winner was chosen and compiled for "
                                f"shape {self.shape.name}: load_winner(..., shape=...) for another")

    def __call__(self, **inputs: Any) -> torch.Tensor | dict[str, torch.Tensor]:
        self._check(inputs)
        outputs = allocate(self.block, self.shape, self.dtype, self.torch_device)
        named = Outputs.of(self.block, inputs, outputs)
        self.entry(**inputs, **outputs)
        if self.torch_device != "cpu":
            torch.cuda.synchronize(self.torch_device)
        if not named.named:
            return outputs[OUT]
        return named.watched(inputs, outputs)

    def __repr__(self) -> str:
        point = " ".join(f"{k}={v}" for k, v in self.params.items())
        speed = f"{self.speedup:.3g}x" if self.speedup is not None else "untimed"
        return (f"<WinnerKernel {self.block.id} {self.shape.name} {self.candidate_id} ({self.template} [{point}]) "
                f"{speed} on {self.device}>")


def _described(kind: Any) -> str:
    """An input's kind in a message: ``a tensor of shape (3, 200) in torch.bfloat16``, or its type."""
    if isinstance(kind, tuple):
        return f"a tensor of shape {kind[0]} in {kind[1]}"
    return f"of type {kind.__name__}"


def load_winner(job: str | Path | Job, block_id: str, shape: str | None = None, *, device: str | None = None,
                catalog: Catalog | None = None) -> WinnerKernel:
    """The stored winner of block ``block_id`` at ``shape`` (a shape name of the job's shape set
    for the block; default its first) as a :class:`WinnerKernel`, run on ``device`` (default the
    job's; a replayed job's runs where this process can: cuda with a GPU, else interpret). The
    winner is the report's: the best verified candidate faster than the baseline, else the shape's
    baseline (``is_baseline``). Raises UserError when nothing passed verification at that shape
    under the report's device and versions (the job not run, or every candidate wrong)."""
    from kernelforge.devices.registry import default_device_name, get_device

    catalog = catalog or default_catalog()
    job = _opened(job, catalog)
    spec = next((s for s in job.blocks if s.id == block_id), None)
    if spec is None:
        raise UserError(f"job {job.name} has no block {block_id!r}; its blocks: "
                        f"{', '.join(s.id for s in job.blocks)}")
    block = catalog.block(block_id)
    shapes = block.shapes(spec.shapes)
    chosen = shapes[0] if shape is None else next((s for s in shapes if s.name == str(shape)), None)
    if chosen is None:
        raise UserError(f"block {block_id} of job {job.name} has no shape {shape!r} in its shape set "
                        f"{spec.shapes!r}; choose one of {', '.join(s.name for s in shapes)}")
    store = Store(job.storage_url, create=False)
    try:
        report = collect(job, catalog, store).block(block_id)
        row = next((r for r in report.shapes if r.shape == chosen.name), None) if report else None
        result = (store.find_result(row.winner, chosen.name, job.dtype, report.env_key)
                  if report is not None and report.env_key and row is not None else None)
        stored = store.candidate(row.winner) if result is not None and result.ok else None
    finally:
        store.close()
    if stored is None:
        why = (f"its status there is {result.status.value}" if result is not None else
               "nothing is stored for it; run the job first (kernelforge.api.run, or kernelforge search)")
        raise UserError(f"block {block_id} of job {job.name} has no verified winner at shape {chosen.name} "
                        f"in {redact_url(job.storage_url)}: {why}")
    why = refusal(stored.source)
    if why:
        raise UserError(f"the stored source of {stored.id} breaks the source policy ({why}); "
                        "the database was changed after the search: refusing to run it")
    name = device or job.device
    if name.startswith("replay:"):
        name = default_device_name()
    check_device(name)
    target = get_device(name)
    target.prepare()  # the interpreter flag must be set before the module's @triton.jit runs
    module = load_module(stored.source, f"winner_{block_id}")
    if not callable(getattr(module, "run", None)):
        raise UserError(f"the stored source of {stored.id} defines no run(...) entry point")
    return WinnerKernel(block=block, shape=chosen, dtype=DTYPES[job.dtype], device=name,
                        torch_device=str(target.torch_device), candidate_id=stored.id,
                        template=stored.template, params=dict(stored.params), speedup=row.speedup,
                        confirmed=row.confirmed, is_baseline=row.winner_is_baseline,
                        timing_label=row.timing_label, source=stored.source, entry=module.run)
