"""A one-way mirror of a job's stored evaluations into Optuna studies, for optuna-dashboard.

The strategies keep Optuna studies only when they are Optuna-based (``auto``, the default, keeps
none), and those studies carry a value and a status per trial. The mirror writes, into the job's
own database (Optuna's tables beside kernelforge's), one study per template, shape group
(``all``, or one shape with ``tune = "per-shape"``), dtype and environment, named
``kernelforge/<job>/<template id>/<scope>/<dtype>/<env key>``: the trials of one study share one
objective, measured on one device with one set of versions, so they are comparable.

Each candidate evaluated on the study's shapes is one trial: its point as the parameters (with the
template's declared values as categorical distributions), the search's objective as the value
(:func:`kernelforge.objective.time_ratio`, the geometric-mean time ratio to each shape's own
baseline; lower is better), FAIL when it failed, was not timed or misses a shape of the group; and
as user attributes its candidate id, template, origin, parent, status, and per shape its stored
median time (``time_s/<shape>``, seconds) and status (``status/<shape>``), with the device and the
timing label (interpreter timings say so: they are not GPU speed).

Only stored measurements are read (through :class:`~kernelforge.store.store.Store`); nothing of
kernelforge's own tables is written. Re-running adds only the candidates not yet mirrored (by
their ``candidate_id``), and a study the mirror did not create (user attribute ``kind``) is never
touched. Optuna is imported lazily: the GPU image has none.
"""

from __future__ import annotations

import datetime
import importlib.util
import shlex
import warnings
from dataclasses import dataclass
from typing import Any, Sequence


from kernelforge.block import Shape
from kernelforge.catalog import Catalog
from kernelforge.errors import UserError
from kernelforge.store.failures import storage_error
from kernelforge.job import BlockSpec, Job
from kernelforge.baseline_timing import BaselineSeries
from kernelforge.objective import baseline_results, by_candidate, geomean_speedup, time_ratio
from kernelforge.redact import redact_url
from kernelforge.result import StoredResult
from kernelforge.search.plan import baseline_candidates
from kernelforge.space import Space
from kernelforge.strategies.optuna.strategy import optuna_choices
from kernelforge.store.records import StoredCandidate
from kernelforge.store.store import Store
from kernelforge.template import Template

#: The ``kind`` user attribute of every study the mirror creates: the only studies it writes to.
KIND = "kernelforge-mirror"
#: The name of the objective (Optuna's metric name) of every mirrored study.
OBJECTIVE = "time ratio to baseline (geomean over the study's shapes, lower is better)"

Table = dict[str, dict[str, StoredResult]]  # candidate id -> shape -> result


@dataclass(frozen=True)
class MirroredStudy:
    """One study of the mirror: its name, what it covers, how many trials it holds and how many
    this run added. ``skipped`` says why it was left alone (a study of that name that the mirror
    did not create), else empty."""

    name: str
    block: str
    template: str
    scope: str
    env_key: str
    trials: int
    added: int
    skipped: str = ""


def available() -> bool:
    """Whether Optuna (which the mirror writes through) is installed."""
    return importlib.util.find_spec("optuna") is not None


def dashboard_command(job: Job) -> str | None:
    """The shell command that opens the job's studies (``optuna-dashboard <storage URL>``, the
    password masked); None for an in-memory database, which no other process can open."""
    url = job.storage_url
    if url in ("sqlite://", "sqlite:///:memory:") or ":memory:" in url:
        return None
    return f"optuna-dashboard {shlex.quote(redact_url(url))}"


def study_name(job: Job, template_id: str, scope: str, env_key: str) -> str:
    """The name of the mirrored study of ``template_id`` over ``scope`` in environment ``env_key``."""
    return f"kernelforge/{job.name}/{template_id}/{scope}/{job.dtype}/{env_key}"


def mirror_studies(job: Job, catalog: Catalog, store: Store) -> list[MirroredStudy]:
    """Mirror every stored evaluation of ``job``'s blocks into Optuna studies in the job's storage
    (see the module docstring); returns the studies, in block, shape group and template order.

    Raises UserError when Optuna is not installed or the storage cannot be opened by Optuna."""
    if not available():
        raise UserError("the Optuna dashboard mirror needs the Python package 'optuna', which is not installed; "
                        "pip install optuna")
    import optuna  # lazily: the GPU image has no Optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage = optuna.storages.RDBStorage(store.url)
    except Exception as exc:  # noqa: BLE001 - a locked or unreachable database: the user's to fix
        failure = storage_error(exc, store.url)
        if failure is not None:
            raise failure from None
        raise UserError(f"cannot open the job's storage {redact_url(store.url)} with Optuna ({exc}); "
                        "check the URL and that the database is reachable") from None
    mirrored = []
    try:
        existing = {s.study_name: s for s in storage.get_all_studies()}
        for spec in job.blocks:
            mirrored.extend(_mirror_block(optuna, storage, existing, job, catalog, store, spec))
    except Exception as exc:  # noqa: BLE001 - a locked database, a full disk, a read-only file...
        failure = storage_error(exc, store.url)  # one line naming the database and the fix
        if failure is None:
            raise
        raise failure from None
    finally:
        storage.remove_session()
    return mirrored


def _mirror_block(optuna: Any, storage: Any, existing: dict[str, Any], job: Job, catalog: Catalog, store: Store,
                  spec: BlockSpec) -> list[MirroredStudy]:
    block = catalog.block(spec.id)
    shapes = block.shapes(spec.shapes)
    names = {s.name for s in shapes}
    baselines = baseline_candidates(catalog, block.id, shapes)  # shape name -> that shape's baseline
    rows = [r for r in store.results(block=block.id, dtype=job.dtype) if r.shape in names]
    env_key = report_env(rows, {s: c.id for s, c in baselines.items()})
    if env_key is None:
        return []
    table = by_candidate(r for r in rows if r.env_key == env_key)
    base = BaselineSeries(baseline_results(table, {s: c.id for s, c in baselines.items()}),
                          store.baseline_timings(block.id, job.dtype, env_key))  # as the search told them
    candidates = {c.id: c for c in store.candidates(block.id)}
    spaces = _spaces(catalog, store, block.id)
    out = []
    for group in job.tune.groups(shapes):
        scope = job.tune.scope(group)
        group_names = [s.name for s in group]
        measured = [cid for cid in table if cid in candidates and any(s in table[cid] for s in group_names)]
        measured.sort(key=lambda cid: (min(r.created for r in table[cid].values()), candidates[cid].created))
        by_template: dict[str, list[str]] = {}
        for cid in measured:
            by_template.setdefault(candidates[cid].template, []).append(cid)
        for template_id, ids in by_template.items():
            name = study_name(job, template_id, scope, env_key)
            out.append(_mirror_study(optuna, storage, existing.get(name), name, job, spec.id, template_id, scope,
                                     env_key, group, [candidates[cid] for cid in ids], table, base,
                                     spaces.get(template_id)))
    return out


def report_env(rows: Sequence[StoredResult], baseline_ids: dict[str, str]) -> str | None:
    """The environment a block is mirrored in: that of the latest measurement of a shape's
    baseline (as the report picks it: the latest search's device); None when none is stored."""
    base = [r for r in rows if baseline_ids.get(r.shape) == r.candidate_id]
    return max(base, key=lambda r: r.created).env_key if base else None


def _mirror_study(optuna: Any, storage: Any, frozen: Any, name: str, job: Job, block_id: str, template_id: str,
                  scope: str, env_key: str, group: list[Shape], candidates: list[StoredCandidate], table: Table,
                  base: dict[str, StoredResult], space: Space | None) -> MirroredStudy:
    record = dict(name=name, block=block_id, template=template_id, scope=scope, env_key=env_key)
    if frozen is not None and frozen.user_attrs.get("kind") != KIND:
        held = storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False)
        return MirroredStudy(**record, trials=len(held), added=0,
                             skipped="a study of that name exists and was not made by the mirror")
    if frozen is None:
        study = optuna.create_study(storage=storage, study_name=name, direction="minimize")
        first = next(iter(table[candidates[0].id].values()))
        attrs = {"kind": KIND, "job": job.name, "block": block_id, "template": template_id, "scope": scope,
                 "shapes": [s.name for s in group], "dtype": job.dtype, "env_key": env_key,
                 "device": first.device, "timing": first.timing_label or "",
                 "objective": OBJECTIVE, "source": "kernelforge's results database (mirrored; read-only copy)"}
        for key, value in attrs.items():
            study.set_user_attr(key, value)
        with warnings.catch_warnings():  # experimental in Optuna (since 3.2), and what optuna-dashboard reads
            warnings.simplefilter("ignore")
            study.set_metric_names([OBJECTIVE])
    else:
        study = optuna.load_study(study_name=name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    done = {t.user_attrs.get("candidate_id") for t in trials}
    added = 0
    for candidate in candidates:
        if candidate.id in done:
            continue
        study.add_trial(_trial(optuna, candidate, group, table[candidate.id], base, space))
        added += 1
    return MirroredStudy(**record, trials=len(trials) + added, added=added)


def _trial(optuna: Any, candidate: StoredCandidate, group: list[Shape], rows: dict[str, StoredResult],
           base: dict[str, StoredResult], space: Space | None) -> Any:
    """One candidate's evaluation on ``group`` as a finished Optuna trial."""
    names = [s.name for s in group]
    ordered = [rows[s] for s in names if s in rows]
    missing = [s for s in names if s not in rows]
    value = None if missing else time_ratio(ordered, base)
    status = next((r.status.value for r in ordered if not r.ok), "ok" if not missing else "not measured")
    attrs: dict[str, Any] = {
        "candidate_id": candidate.id, "template": candidate.template, "origin": candidate.origin,
        "parent": candidate.parent or "", "status": status,
        "device": ordered[0].device, "timing": ordered[0].timing_label or "",
    }
    speedup = None if missing else geomean_speedup(ordered, base)
    if speedup is not None:
        attrs["geomean_speedup"] = speedup
    if missing:
        attrs["missing_shapes"] = missing
    for r in ordered:
        attrs[f"status/{r.shape}"] = r.status.value
        if r.median_s is not None:
            attrs[f"time_s/{r.shape}"] = r.median_s
        b = base.get(r.shape)
        if b is not None and b.median_s is not None:
            attrs[f"baseline_time_s/{r.shape}"] = b.median_s
    params, distributions = _params(optuna, candidate.params, space)
    if len(params) < len(candidate.params):
        attrs["point"] = {k: v if isinstance(v, (bool, int, float, str)) or v is None else repr(v)
                          for k, v in candidate.params.items()}
    state = optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL
    trial = optuna.trial.create_trial(state=state, value=value, params=params, distributions=distributions,
                                      user_attrs=attrs)
    # When it was measured, not when it was mirrored.
    trial.datetime_start = datetime.datetime.fromtimestamp(min(r.created for r in ordered))
    trial.datetime_complete = datetime.datetime.fromtimestamp(max(r.created for r in ordered))
    return trial


def _params(optuna: Any, point: dict[str, Any], space: Space | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The point's parameters and their categorical distributions over the template's declared
    values (values Optuna cannot hold, such as tuples, as their repr); ({}, {}) without a space,
    and a parameter outside the declared values is left out."""
    if space is None:
        return {}, {}
    params, distributions = {}, {}
    for name, values in space.params:
        if name not in point or point[name] not in values:
            continue
        choices, back = optuna_choices(values)
        params[name] = point[name] if back is None else repr(point[name])
        distributions[name] = optuna.distributions.CategoricalDistribution(choices)
    return params, distributions


def _spaces(catalog: Catalog, store: Store, block_id: str) -> dict[str, Space]:
    """template id -> declared space: the block's templates that load (a file being edited does not
    stop the mirror: its trials carry their points only), and the stored LLM-written ones."""
    spaces = {t.id: t.space for t in catalog.listing(block_id).loaded}
    for stored in store.templates(block=block_id):
        if stored.id in spaces:
            continue
        try:
            template = Template.from_text(stored.text, template_id=stored.id, block_id=block_id,
                                          where=f"stored template {stored.id}")
        except Exception:  # noqa: BLE001 - a stored text that no longer parses: its trials carry the point only
            continue
        spaces[stored.id] = template.space
    return spaces
