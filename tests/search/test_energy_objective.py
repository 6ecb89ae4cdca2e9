"""Tuning for energy or for time and energy: the objective in effect (decided once per run from
the environment), the values told, and interpreter searches that accept the option and tune for time."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kernelforge.catalog import Catalog
from kernelforge.job import load_job
from kernelforge.objective import Objective
from kernelforge.report.collect import collect
from kernelforge.report.markdown import to_markdown
from kernelforge.result import Status, StoredResult
from kernelforge.search.energy import NVML_ENERGY, objective_in_effect, objective_value
from kernelforge.search.search import Search
from kernelforge.search.plan import study_name
from kernelforge.store.store import Store
from kf_progress import Recorder

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"

JOB = """
[job]
name = "{name}"
device = "interpret"
dtype = "float16"
objective = "{objective}"

[strategy]
{strategy}
evaluations = 2

[[blocks]]
id = "toy/axpy"
shapes = "check"
templates = ["baseline"]
"""



def row(shape: str, seconds: float, joules: float | None) -> StoredResult:
    return StoredResult(candidate_id="c", block="b", shape=shape, dtype="bfloat16", device="NVIDIA H200", env_key="k",
                        status=Status.OK, rel_error=0.0, median_s=seconds, p20_s=seconds, p80_s=seconds, samples=10,
                        timing_method="cuda-events", timing_label="", joules=joules, flops=None, bytes=None,
                        message="", env={}, job="j", created=0.0)


def test_objective_value_per_objective_with_time_standing_in_for_missing_energy():
    base = {"s": row("s", 2e-3, 1.0)}
    cand = [row("s", 1e-3, 2.0)]  # twice as fast, twice the energy
    assert objective_value(Objective.TIME, cand, base) == pytest.approx(0.5)
    assert objective_value(Objective.ENERGY, cand, base) == pytest.approx(2.0)
    assert objective_value(Objective.TIME_ENERGY, cand, base) == pytest.approx((0.5, 2.0))
    unmeasured = [row("s", 1e-3, None)]  # NVML's counter did not move: the time ratio stands in
    assert objective_value(Objective.ENERGY, unmeasured, base) == pytest.approx(0.5)
    assert objective_value(Objective.TIME_ENERGY, unmeasured, base) == pytest.approx((0.5, 0.5))
    assert objective_value(Objective.TIME_ENERGY, [row("t", 1e-3, 1.0)], base) is None  # not comparable: failed


def write(tmp_path: Path, name: str, objective: str, strategy: str = "") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(JOB.format(name=name, objective=objective, strategy=strategy))
    return path


def test_energy_counts_only_where_nvml_measures_it(tmp_path):
    job = load_job(write(tmp_path, "e", "time-energy"))
    assert objective_in_effect(job, {"device": "cuda", "energy": NVML_ENERGY}) == (Objective.TIME_ENERGY, None)
    objective, warning = objective_in_effect(job, {"device": "cuda", "device_name": "NVIDIA H200",
                                                   "energy": "no energy: NVML did not start"})
    assert objective is Objective.TIME and warning.startswith("energy is not measurable on NVIDIA H200")
    assert "NVML did not start" in warning and warning.endswith("tuning for time")
    plain = load_job(write(tmp_path, "t", "time"))
    assert objective_in_effect(plain, {"device": "interpret"}) == (Objective.TIME, None)
    # Study names differ by objective (resume never mixes them); time keeps the names of earlier runs.
    assert study_name(job, "toy/axpy/baseline", "all").endswith("|time-energy")
    assert study_name(plain, "toy/axpy/baseline", "all") == "t|toy/axpy/baseline|all|float16"


@pytest.mark.interpreter
@pytest.mark.parametrize("objective, strategy", [("energy", 'name = "random"'), ("time-energy", "")])
def test_an_interpreter_search_accepts_the_objective_and_tunes_for_time(tmp_path, objective, strategy):
    catalog = Catalog.discover(FIXTURES)
    job = load_job(write(tmp_path, "j", objective, strategy), catalog)
    store = Store(f"sqlite:///{tmp_path / 'j.db'}")
    recorder = Recorder()
    outcome = Search(job, catalog, store, recorder, compile_enabled=False, in_process=True).run()
    assert outcome.evaluations == 2
    warnings = [d["message"] for k, d in recorder.events if k == "warning" and "energy" in d["message"]]
    assert len(warnings) == 1 and "energy is not measurable on" in warnings[0] and "tuning for time" in warnings[0]
    results = store.results(block="toy/axpy")
    assert results and all(r.ok and r.median_s and r.joules is None for r in results)
    report = collect(job, catalog, store)  # the report states the objective and why there is no front
    md = to_markdown(report)
    assert f"objective {objective}." in md and report.objective == objective
    assert "energy was not measurable on" in md and "(Triton interpreter): no Pareto front" in md
    if objective == "time-energy" and importlib.util.find_spec("optuna") is not None:
        import optuna

        names = optuna.get_all_study_names(store.url)
        assert names and all(n.endswith("|time-energy|as-time") for n in names)  # never a measured study's
        study = optuna.load_study(study_name=names[0], storage=store.url)
        assert len(study.directions) == 1 and study.trials


GPU = {"device": "cuda", "device_name": "NVIDIA H200", "energy": NVML_ENERGY, "timing": "CUDA events (median, p20/p80)"}


def recording(tmp_path: Path, catalog: Catalog) -> Path:
    """A recorded 'GPU' search of every toy point, with NVML energy: bigger blocks run faster and
    draw more energy per call (a real trade-off), so the two objectives disagree."""
    from kernelforge.candidate import Candidate
    from kernelforge.result import env_key

    db = tmp_path / "recorded.db"
    store = Store(f"sqlite:///{db}")
    template = catalog.baseline("toy/axpy")
    for point in template.space.points():
        candidate = Candidate.from_template(template, dict(point), origin="optuna")
        store.add_candidate(candidate, "rec")
        for index, shape in enumerate(catalog.block("toy/axpy").shapes("check")):
            t = (1 + index) * (1e-5 / point["BLOCK"] ** 0.5 + 1e-7 * point["num_warps"])
            joules = (1 + index) * (1e-4 * point["BLOCK"] ** 0.5 + 1e-5 * point["num_warps"])
            store.add_result(StoredResult(
                candidate_id=candidate.id, block="toy/axpy", shape=shape.name, dtype="float16", device="NVIDIA H200",
                env_key=env_key(GPU), status=Status.OK, rel_error=0.0, median_s=t, p20_s=t, p80_s=t, samples=20,
                timing_method="cuda-events", timing_label=GPU["timing"], joules=joules, flops=None, bytes=None,
                message="", env=GPU, job="rec", created=1.0))
    store.close()
    return db


@pytest.mark.skipif(importlib.util.find_spec("optuna") is None, reason="needs optuna")
def test_a_replayed_gpu_search_tells_time_and_energy_pairs(tmp_path):
    import optuna

    from kernelforge.objective import baseline_results, by_candidate, energy_ratio, time_ratio

    catalog = Catalog.discover(FIXTURES)
    path = write(tmp_path, "te", "time-energy")
    path.write_text(path.read_text().replace('device = "interpret"', f'device = "replay:{recording(tmp_path, catalog)}"')
                    .replace("evaluations = 2", "evaluations = 5"))
    job = load_job(path, catalog)
    store = Store(f"sqlite:///{tmp_path / 'te.db'}")
    recorder = Recorder()
    outcome = Search(job, catalog, store, recorder, compile_enabled=False, in_process=True).run()
    assert outcome.evaluations == 5
    assert not [d for k, d in recorder.events if k == "warning" and "energy" in d["message"]]  # measurable here
    [name] = optuna.get_all_study_names(store.url)
    assert name.endswith("|time-energy")
    study = optuna.load_study(study_name=name, storage=store.url)
    assert len(study.directions) == 2
    table = by_candidate(store.results(block="toy/axpy"))
    shapes = ["n1", "n7", "n63"]
    baseline_id = next(c.id for c in store.candidates("toy/axpy") if c.origin == "baseline")
    base = baseline_results(table, {s: baseline_id for s in shapes})
    told = {tuple(t.values) for t in study.trials if t.user_attrs.get("kernelforge") == "ok"}
    stored = {(time_ratio([rows[s] for s in shapes], base), energy_ratio([rows[s] for s in shapes], base))
              for rows in table.values()}
    assert len(told) >= 4 and len({round(e, 9) for _, e in told}) > 1
    for pair in told:  # every told pair is the (time, energy) ratio pair of a stored candidate
        assert any(pair == pytest.approx(s) for s in stored)
    front = collect(job, catalog, store).block("toy/axpy").pareto[0]
    assert len(front.front) >= 2 and front.note == ""  # a trade-off, drawn from the replayed joules
