"""The objective choice (time, energy, time-energy) and the energy ratio, on hand-built results."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kernelforge.errors import UserError
from kernelforge.objective import Objective, energy_ratio, time_ratio
from kernelforge.result import Status, StoredResult


def row(cid: str, shape: str, seconds: float, joules: float | None, status: Status = Status.OK,
        method: str = "cuda-events") -> StoredResult:
    return StoredResult(candidate_id=cid, block="b", shape=shape, dtype="bfloat16", device="NVIDIA H200", env_key="k",
                        status=status, rel_error=0.0, median_s=seconds, p20_s=seconds, p80_s=seconds, samples=10,
                        timing_method=method, timing_label="", joules=joules, flops=None, bytes=None, message="",
                        env={}, job="j", created=0.0)


BASE = {"s1": row("base", "s1", 2e-3, 1.0), "s2": row("base", "s2", 4e-3, 2.0)}


def test_objective_parses_the_three_choices():
    assert [Objective.parse(v, "x") for v in ("time", "energy", "time-energy")] == list(Objective)
    assert str(Objective.TIME_ENERGY) == "time-energy"


def test_unknown_objective_names_the_field_and_the_choices():
    with pytest.raises(UserError) as info:
        Objective.parse("watts", "job.toml [job] objective")
    message = str(info.value)
    assert message.startswith("job.toml [job] objective: 'watts'")
    assert all(f'"{c}"' in message for c in ("time", "energy", "time-energy"))


def test_energy_ratio_is_the_geometric_mean_of_joule_ratios():
    cand = [row("c", "s1", 1e-3, 0.5), row("c", "s2", 8e-3, 8.0)]  # energy ratios 0.5 and 4
    assert energy_ratio(cand, BASE) == pytest.approx(math.sqrt(0.5 * 4.0))
    assert time_ratio(cand, BASE) == pytest.approx(math.sqrt(0.5 * 2.0))


def test_energy_ratio_is_none_without_energy_or_when_not_comparable():
    assert energy_ratio([row("c", "s1", 1e-3, None)], BASE) is None  # not measured (interpreter, no NVML)
    assert energy_ratio([row("c", "s1", 1e-3, 0.5)], {"s1": row("base", "s1", 2e-3, None)}) is None
    assert energy_ratio([row("c", "s1", 1e-3, 0.5, Status.WRONG)], BASE) is None
    assert energy_ratio([row("c", "s1", 1e-3, 0.5, method="cuda-graph")], BASE) is None
    assert energy_ratio([row("c", "s3", 1e-3, 0.5)], BASE) is None  # the baseline lacks the shape
    assert energy_ratio([], BASE) is None


def job_file(tmp_path, job_lines: str, strategy_lines: str = "") -> Path:
    path = tmp_path / "job.toml"
    path.write_text(f'[job]\nname = "t"\n{job_lines}\n[strategy]\nevaluations = 2\n{strategy_lines}\n'
                    '[[blocks]]\nid = "toy/axpy"\n')
    return path


def test_job_objective_defaults_to_time_and_parses_each_choice(tmp_path):
    from kernelforge.job import load_job
    assert load_job(job_file(tmp_path, "")).objective is Objective.TIME
    job = load_job(job_file(tmp_path, 'objective = "energy"'))
    assert job.objective is Objective.ENERGY and job.strategy.name == "auto"  # one objective: the default stays
    job = load_job(job_file(tmp_path, 'objective = "time-energy"', 'name = "nsga2"'))
    assert (job.objective, job.strategy.name) == (Objective.TIME_ENERGY, "nsga2")


def test_time_energy_defaults_to_tpe_and_refuses_a_single_objective_strategy(tmp_path):
    from kernelforge.job import load_job
    assert load_job(job_file(tmp_path, 'objective = "time-energy"')).strategy.name == "tpe"
    with pytest.raises(UserError) as info:
        load_job(job_file(tmp_path, 'objective = "time-energy"', 'name = "auto"'))
    message = str(info.value)
    assert "[strategy] name: 'auto'" in message and all(n in message for n in ("tpe", "nsga2", "optuna-random"))
    assert "gp" not in message.split("two:")[1]


def test_a_bad_job_objective_names_the_file_and_field(tmp_path):
    from kernelforge.job import load_job
    with pytest.raises(UserError, match=r"job.toml \[job\] objective: 'joules'"):
        load_job(job_file(tmp_path, 'objective = "joules"'))
