"""Library references: each block's best library implementation, measured beside its baseline.

A block may ship ``kernels/<family>/<name>/library.py``: a plain Python module written by us
(trusted, not a candidate, not a template) whose ``run(...)`` has the candidates' signature and
calls the strongest implementation the torch install offers (FlexAttention, SDPA). It exposes
``backend(device)`` (the backend ``run`` uses there), ``LABELS`` (backend -> what it is) and a
module global ``BACKEND`` that pins one.

:func:`measure_library` verifies it with the judge every candidate meets
(:func:`kernelforge.execute.evaluate.evaluate`: poisoned outputs, repeated calls, new values under
the same pointers, fingerprints, the fp32 reference and the block's tolerance) and, on a GPU only,
times it with the same device timing (the shape's :class:`~kernelforge.execute.timing.rounds.TimingPlan`
method when given). It runs in this process through :class:`TrustedRunner`: the candidate-only
checks (a Triton launch, no torch compute on the host, harness tampering) would reject a library
by design (:mod:`kernelforge.execute.trusted_runner`). On the interpreter it only verifies: a CPU timing of SDPA against Triton-interpreter
timings would be meaningless, so nothing is stored and no ratio can be reported.

What is stored: one candidate per backend that ran, origin ``library``, whose source is the
module's text plus the line that pins the backend (the stored source is exactly what ran; its id
is its hash), and its results under the block key ``<block>@library`` (:func:`library_key`), so
nothing that ranks a block's candidates (confirmation, winners, LLM standings) ever sees them.
:func:`kernelforge.report.library.library_lines` reads them back for the report's reference line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from kernelforge.block import DTYPES, Block, Shape
from kernelforge.candidate import Candidate, load_module
from kernelforge.execute.evaluate import evaluate
from kernelforge.execute.trusted_runner import TrustedRunner
from kernelforge.library import LIBRARY_FILE, ORIGIN, library_key
from kernelforge.result import Evaluation, StoredResult
from kernelforge.textsafe import error_text

if TYPE_CHECKING:
    from kernelforge.catalog import Catalog
    from kernelforge.devices.base import Device
    from kernelforge.execute.timing.rounds import TimingPlan
    from kernelforge.search.context import RunContext
    from kernelforge.store.store import Store

#: What library results record as their sandbox.
TRUSTED_SANDBOX = "none: trusted library reference, in the search process"
#: The backend tried when the device's first choice fails everywhere, unless the library module
#: names its own (``FALLBACK``).
FALLBACK_BACKEND = "sdpa"


def times_on(device: "Device") -> bool:
    """Whether library references are timed on ``device``: where its timings are a GPU's
    (``measures_hardware``; an interpreter timing of a CPU library call next to Triton-interpreter
    timings would mean nothing)."""
    return device.measures_hardware


@dataclass(frozen=True)
class LibraryReference:
    """A block's ``library.py``: where it is and its text."""

    block_id: str
    path: Path
    text: str

    def pinned_source(self, backend: str) -> str:
        """The module's text with ``BACKEND`` pinned to ``backend``: the source that runs."""
        return f"{self.text.rstrip()}\n\n\n# Pinned by kernelforge.search.library: the backend that ran.\nBACKEND = {backend!r}\n"

    def module(self) -> ModuleType:
        """The module as written (no backend pinned)."""
        return load_module(self.text, f"library_{self.block_id}")

    def candidate(self, backend: str, label: str) -> Candidate:
        """The stored form of the reference run with ``backend`` (origin ``library``)."""
        return Candidate(block_id=library_key(self.block_id), template_id=f"{self.block_id}/library",
                         params=(("backend", backend), ("implementation", label)),
                         source=self.pinned_source(backend), origin=ORIGIN)


def find_library(catalog: "Catalog", block_id: str) -> LibraryReference | None:
    """The block's library reference, or None when its folder has no ``library.py``."""
    path = Path(catalog.root) / block_id / LIBRARY_FILE
    if not path.is_file():
        return None
    return LibraryReference(block_id, path, path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class LibraryMeasurement:
    """What measuring a block's library reference gave: the backend that ran and its label, the
    stored candidate's id, whether it was ``timed`` (GPU only) and ``stored``, and one evaluation
    per shape."""

    block_id: str
    backend: str
    implementation: str
    candidate_id: str
    timed: bool
    stored: bool
    evaluations: tuple[Evaluation, ...]

    @property
    def ok(self) -> bool:
        return bool(self.evaluations) and all(ev.verification.ok for ev in self.evaluations)


def measure_library(catalog: "Catalog", block: Block, shapes: list[Shape], dtype_name: str, device: "Device",
                    store: "Store | None", *, env: Mapping[str, Any], env_key: str, job: str | None = None,
                    plan: "TimingPlan | None" = None, held_out: Sequence[Shape] = (),
                    backend: str | None = None) -> LibraryMeasurement | None:
    """Verify (and on a GPU time) ``block``'s library reference on ``shapes`` in ``dtype_name``
    with ``device`` (prepared by the caller), and store the results when timed (``store`` not
    None) under ``env``/``env_key`` (the run's: the report compares within one env_key).

    The device's backend is tried first; when it fails on every shape, :data:`FALLBACK_BACKEND`
    is tried too (both are stored: the report's line takes the fastest that passed); ``backend``
    pins the one to try (tests: ``flex-eager`` on a CPU). ``held_out``: shapes verified, never
    timed, first (the block's ``check`` shapes in tests; none by default on a GPU, where each new
    shape costs FlexAttention a compile). Returns the
    last measurement made (None: the block has no library reference). Never raises for a library
    failure: it is a stored status like any other.
    """
    ref = find_library(catalog, block.id)
    if ref is None:
        return None
    module = ref.module()
    fallback = getattr(module, "FALLBACK", FALLBACK_BACKEND)  # a module names its own, else SDPA's
    tries = (backend,) if backend is not None else (module.backend(device.torch_device), fallback)
    timed = times_on(device)
    dtype = DTYPES[dtype_name]
    measurement = None
    for name in dict.fromkeys(tries):
        candidate = ref.candidate(name, module.LABELS[name])
        evaluations = evaluate(block, candidate.source, shapes, dtype, device, timed=timed, held_out=held_out,
                               policy=False, runner=TrustedRunner(device), plan=plan)
        stored = timed and store is not None
        if stored:
            store.add_candidate(candidate, job)
            for ev in evaluations:
                store.add_result(_row(candidate, ev, dtype_name, env, env_key, job))
        measurement = LibraryMeasurement(block.id, name, module.LABELS[name], candidate.id, timed, stored,
                                         tuple(evaluations))
        if any(ev.verification.ok for ev in evaluations):
            break
    return measurement


def measure_library_for_run(run: "RunContext", plans: Mapping[str, "TimingPlan"] | None = None
                            ) -> dict[str, LibraryMeasurement]:
    """Measure the library reference of every block of ``run``'s job that has one, on the job's
    shapes, with the run's device, store and environment, after the baselines (``plans``: block
    id -> the baselines' timing plan, :attr:`kernelforge.search.pipeline.Pipeline.plans`).
    Only a GPU run measures anything: on other executors (interpreter, replay) this returns {}.
    Blocks whose every shape already has a line in this environment are skipped; a reference
    that cannot even be loaded is a warning event, never an error of the search."""
    if not run.executor.runs_code:
        return {}
    from kernelforge.devices.registry import get_device

    device = get_device(run.executor.kind)
    if not times_on(device):
        return {}
    device.prepare()
    env = {**run.env, "sandbox": TRUSTED_SANDBOX}  # same env_key: it depends on device and versions only
    out = {}
    for spec in run.job.blocks:
        block = run.catalog.block(spec.id)
        shapes = block.shapes(spec.shapes)
        if find_library(run.catalog, block.id) is None:
            continue
        measured = {r.shape for r in run.store.results(block=library_key(block.id), dtype=run.dtype_name)
                    if r.env_key == run.env_key}
        if {s.name for s in shapes} <= measured:
            continue  # measured by an earlier run in this environment (a resumed search)
        try:
            m = measure_library(run.catalog, block, shapes, run.dtype_name, device, run.store, env=env,
                                env_key=run.env_key, job=run.job.name, plan=(plans or {}).get(block.id))
        except Exception as exc:  # the reference line is extra: its failure must not stop the search
            run.progress.event("warning", message=f"library reference of {block.id} not measured: "
                                                  f"{error_text(exc)}")
            continue
        if m is not None:
            out[block.id] = m
            run.progress.event("library", block=block.id, implementation=m.implementation, candidate=m.candidate_id,
                               times={ev.shape.name: ev.timing.median_s if ev.timing else None
                                      for ev in m.evaluations})
    return out


def _row(candidate: Candidate, ev: Evaluation, dtype_name: str, env: Mapping[str, Any], env_key: str,
         job: str | None) -> StoredResult:
    return StoredResult.of(candidate.id, candidate.block_id, ev, dtype=dtype_name,
                           device=str(env.get("device_name", env.get("device", "?"))), env=dict(env),
                           env_key=env_key, job=job)


__all__ = ["FALLBACK_BACKEND", "LibraryMeasurement", "LibraryReference",
           "find_library", "measure_library",
           "measure_library_for_run", "times_on"]
