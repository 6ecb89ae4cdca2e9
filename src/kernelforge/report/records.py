"""The report's data: frozen records collected from the store (:mod:`kernelforge.report.collect`)
and rendered as REPORT.md, results.json and index.html.

results.json is :meth:`Report.to_json`: these records as plain data, with the same field names.
Times are seconds, speedups baseline time / winner time (above 1: the winner is faster); None
where nothing was measured. Every shape's baseline is the block's baseline template rendered at
that shape's baseline point (``Template.baseline_for``): shapes of one block can have different
baselines, each named with its source (:class:`ShapeBaseline`, :class:`BaselineSource`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from kernelforge.devices.hardware import Ceilings, RooflinePoint
from kernelforge.job import Tune
from kernelforge.report.projection.gpt_oss import Feasibility
from kernelforge.library import LibraryLine
from kernelforge.report.llm_section import LLMSection
from kernelforge.report.pareto import ParetoFront
from kernelforge.shipped import ShippedPath
from kernelforge.store.records import StoredCompile


@dataclass(frozen=True)
class Banner:
    """What is said above numbers that are not live GPU timings (``kind``: interpret or replay)."""

    kind: str
    device_name: str
    text: str


@dataclass(frozen=True)
class ShapeBaseline:
    """The human baseline of one shape: the candidate rendered at the shape's baseline point
    (``params``), and where that point comes from (``source``; ``rule``: the index of the
    template's ``[[baselines]]`` rule, None for the ``[baseline]`` fallback)."""

    shape: str
    candidate: str
    params: dict[str, Any]
    source: str
    rule: int | None


@dataclass(frozen=True)
class BaselineSource:
    """One distinct source of a block's baselines and the shapes it gives the baseline of."""

    source: str
    rule: int | None
    shapes: tuple[str, ...]


@dataclass(frozen=True)
class ShapeRoofline:
    """Where the baseline's and the winner's timings of one shape sit against the roofline."""

    baseline: RooflinePoint | None
    winner: RooflinePoint | None


class Confirmation(str, Enum):
    """What the interleaved re-timing said of a shape's winner (the value is the text shown)."""

    FASTER = "confirmed faster"  # confirmed, and the pairs' p20 is above 1
    NOISE = "within noise"  # confirmed, not significant
    PENDING = "not yet confirmed"  # no confirmation pairs stored


@dataclass(frozen=True, kw_only=True)
class ShapeRow:
    """One shape of a block: the shape's baseline (``baseline``: its candidate id, rendered at the
    shape's baseline point ``baseline_params`` from ``baseline_source``), the winner of the shape's
    study, and the speedup over that baseline with its p20-p80 spread.

    One row, one measurement (``measured_by``): ``baseline_s``, ``best_s`` and ``speedup`` always
    come from the same timings, and ``speedup == baseline_s / best_s``. ``"pairs"``: the
    confirmation's interleaved pairs (times: the pairs' medians; p20-p80 of the times and of the
    per-pair speedups; samples: the pairs). ``"search"``: the search's single measurement of each
    (times and bands of the stored results; speedup spread from the two bands). The search's
    figures are always kept apart as ``search_baseline_s``, ``search_best_s`` and
    ``search_speedup``, and ``pair_speedup`` is the median of the per-pair speedups (the statistic
    ``significant`` is decided on with the pairs' p20). ``winner_is_baseline``: the winner is this
    shape's baseline."""

    shape: str
    dims: dict[str, Any]
    baseline_s: float | None
    best_s: float | None
    baseline_p20_s: float | None
    baseline_p80_s: float | None
    best_p20_s: float | None
    best_p80_s: float | None
    baseline_samples: int | None
    best_samples: int | None
    baseline_j: float | None
    best_j: float | None
    winner_rel_error: float | None
    winner: str
    winner_is_baseline: bool
    params: dict[str, Any]
    template: str | None
    speedup: float | None
    speedup_p20: float | None
    speedup_p80: float | None
    confirmed: bool
    pairs: int  # interleaved re-timing pairs of the confirmation
    significant: bool  # confirmed faster: the pairs' p20 is above 1
    flops: float | None
    bytes: float | None
    timing_label: str | None
    timing_method: str | None
    roofline: ShapeRoofline
    baseline: str = ""
    baseline_source: str = ""
    baseline_params: dict[str, Any] = field(default_factory=dict)
    #: What the speedup is over: ``over experts`` when the baseline is what serving engines ship
    #: for the shape (or as strong), else what it is (:func:`kernelforge.shipped.baseline_claim`).
    claim: str = ""
    measured_by: str = "search"  # "pairs" (the confirmation) or "search": where the times and speedup come from
    search_baseline_s: float | None = None
    search_best_s: float | None = None
    search_speedup: float | None = None
    pair_speedup: float | None = None  # median of the per-pair speedups (None: not confirmed)
    # Every stored timing of this shape's baseline: the search's, and the baseline half of every
    # confirmation pair against it (whatever candidate was confirmed), in seconds.
    baseline_timings: tuple[float, ...] = ()

    @property
    def baseline_spread(self) -> float | None:
        """Slowest over fastest stored timing of the shape's baseline (None with fewer than two):
        how far the baseline itself drifted while the search and its confirmations ran."""
        if len(self.baseline_timings) < 2 or min(self.baseline_timings) <= 0:
            return None
        return max(self.baseline_timings) / min(self.baseline_timings)

    @property
    def is_moe(self) -> bool:
        """Whether the shape is one of a fused MoE: it has a token count T, experts E and an
        intermediate size I (what names a vLLM/SGLang fused_moe config file and its keys)."""
        return all(k in (self.dims or {}) for k in ("T", "E", "I"))

    @property
    def confirmation(self) -> Confirmation:
        """The shape's confirmation state (one of three; see :class:`Confirmation`)."""
        if not self.confirmed:
            return Confirmation.PENDING
        return Confirmation.FASTER if self.significant else Confirmation.NOISE


@dataclass(frozen=True)
class CandidateRow:
    """One evaluated candidate of a block, in the order it was first measured."""

    order: int
    id: str
    template: str
    origin: str
    parent: str | None
    status: str  # "ok", or the status of a shape it failed on
    geomean_speedup: float | None  # over the shapes it was measured on, when all of them passed
    shapes: int
    params: dict[str, Any]


@dataclass(frozen=True)
class Winner:
    """A candidate that beat the baseline on some shapes, with its source and its diff against
    the source of the baseline of the first of those shapes (``against``: that baseline's id)."""

    id: str
    template: str
    origin: str
    parent: str | None
    params: dict[str, Any]
    shapes: tuple[str, ...]
    source: str
    diff: str
    against: str = ""


@dataclass(frozen=True)
class CompileRow(StoredCompile):
    """A stored compile of the baseline or a winner (``role``)."""

    role: str = "winner"


@dataclass(frozen=True)
class Suspect:
    """A result faster than the datasheet roofline allows: a broken measurement or a cheat."""

    candidate: str
    shape: str
    median_s: float
    roofline_s: float


@dataclass(frozen=True)
class ProgressPoint:
    """One evaluation of the search's progress chart."""

    index: int
    candidate: str
    origin: str
    speedup: float | None
    status: str
    label: str


@dataclass(frozen=True)
class Progress:
    """Speedup of each evaluation in stored order and the best so far ((index, speedup) pairs)."""

    points: tuple[ProgressPoint, ...]
    best: tuple[tuple[int, float], ...]
    mode: Tune


@dataclass(frozen=True)
class RooflineMeta:
    """Which ceilings a block's timings are placed against (None: none apply), and why."""

    device: str | None
    ceilings: Ceilings | None
    note: str


@dataclass(frozen=True, kw_only=True)
class BlockReport:
    """Everything the report says about one block, in the environment of its latest baseline
    measurement (``env_key``). Sections an older report lacks have empty defaults.

    ``baseline`` is the candidate at the baseline template's ``[baseline]`` point (the fallback);
    each shape's own baseline is ``ShapeRow.baseline``, and ``baselines`` names every distinct
    source with the shapes it covers, in shape order."""

    block: str
    description: str
    shapes: tuple[ShapeRow, ...]
    geomean_speedup: float | None
    statuses: dict[str, int]
    origins: dict[str, int]
    candidates: int
    origin_status: dict[str, dict[str, int]] = field(default_factory=dict)
    env_key: str | None = None
    baseline: str = ""
    banner: Banner | None = None
    device_name: str | None = None
    candidate_rows: tuple[CandidateRow, ...] = ()
    progress: Progress | None = None
    winners: tuple[Winner, ...] = ()
    compiles: tuple[CompileRow, ...] = ()
    roofline: RooflineMeta | None = None
    suspects: tuple[Suspect, ...] = ()
    baselines: tuple[BaselineSource, ...] = ()
    # issue 11 (library reference, kernelforge.search.library): the fastest library result per shape.
    library: tuple[LibraryLine, ...] = ()
    # issue 31: what serving runs for these shapes and the state of its library line
    # (kernelforge.shipped: the block's entries that cover at least one of the job's shapes).
    shipped: tuple[ShippedPath, ...] = ()
    # the time-energy Pareto front per shape group (kernelforge.report.pareto).
    pareto: tuple[ParetoFront, ...] = ()


# -- the model-level projection --------------------------------------------------------------------

@dataclass(frozen=True)
class MissingShape:
    """A shape a projection needs and the job did not measure, and why."""

    block: str
    shape: str
    why: str


@dataclass(frozen=True)
class MissingGroup:
    """Missing shapes of one block with the same reason."""

    block: str
    why: str
    shapes: tuple[str, ...]


@dataclass(frozen=True)
class ComponentRow:
    """One block's part of a phase (see kernelforge.report.projection.model.Component); ``estimate``:
    a roofline estimate of the dense parts, not a measurement."""

    block: str
    label: str
    complete: bool
    calls: str
    baseline_s: float | None
    winner_s: float | None
    change_s: float | None
    baseline_j_per_token: float | None
    winner_j_per_token: float | None
    missing: tuple[str, ...]
    note: str
    estimate: bool = False


@dataclass(frozen=True)
class PhaseRow:
    """TTFT or TBT of one model (see kernelforge.report.projection.model.Phase)."""

    kind: str
    model: str
    batch: int | None
    tokens: int
    complete: bool
    baseline_s: float | None
    winner_s: float | None
    change_s: float | None
    speedup: float | None
    baseline_j_per_token: float | None
    winner_j_per_token: float | None
    components: tuple[ComponentRow, ...]


@dataclass(frozen=True)
class ProfileReport:
    """The projection of one workload profile: the phases with a measured part, what is missing,
    and the phases that do not fit the GPU's memory (``infeasible``, with the numbers: not projected)."""

    profile: str
    input_tokens: int
    output_tokens: int
    phases: tuple[PhaseRow, ...]
    missing: tuple[MissingShape, ...]
    missing_groups: tuple[MissingGroup, ...]
    measured_any: bool
    infeasible: tuple[Feasibility, ...] = ()


@dataclass(frozen=True)
class ProjectionReport:
    """The model-level projection of every profile; ``devices``: block -> the device measured."""

    profiles: tuple[ProfileReport, ...]
    devices: dict[str, str]
    not_measured: tuple[str, ...]
    measured_any: bool
    models: dict[str, str]  # model name -> its one-line summary
    estimated: tuple[str, ...] = ()  # parts included as roofline estimates (labelled as such)


# -- the whole report -------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Report:
    """The report of one job: its blocks, the environments the numbers came from (env_key ->
    device and versions), the banners of non-GPU timings and the model-level projection."""

    job: str
    job_file: str
    dtype: str
    tune: Tune | str
    strategy: str
    storage: str = ""
    blocks: tuple[BlockReport, ...]
    environments: dict[str, dict[str, Any]]
    banners: tuple[Banner, ...] = ()
    projection: ProjectionReport | None = None
    llm: LLMSection | None = None  # the LLM generator's calls, prompts and lineage (None: no calls)
    dashboard: str | None = None  # the shell command that opens the job's Optuna studies
    objective: str = "time"  # [job] objective (time, energy or time-energy)

    def block(self, block_id: str) -> BlockReport | None:
        """The block ``block_id`` of this report, or None."""
        return next((b for b in self.blocks if b.block == block_id), None)

    def env(self, block: BlockReport) -> dict[str, Any]:
        """The environment a block's numbers come from ({} when nothing was stored)."""
        return self.environments.get(block.env_key or "", {})

    def to_json(self) -> dict[str, Any]:
        """results.json: the records as plain data (tuples become lists when dumped)."""
        return asdict(self)
