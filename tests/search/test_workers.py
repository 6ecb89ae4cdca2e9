"""Several workers on one job, as users start them (one `kernelforge search` process each, on one
host here): through a real PostgreSQL server and through one SQLite file they cooperate on one
search (the budget spent exactly, nothing evaluated twice, the same candidates a single worker
evaluates), a SIGKILLed worker's claims are finished by the others, SIGTERM stops a worker like
Ctrl-C with status 143, and rerunning a finished job changes nothing stored.

The toy block in the interpreter with the grid strategy: every worker asks the space in the same
order, so the candidates of a cooperative run must be exactly a single worker's.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa

from toy_job import CLI, toy_job

pytestmark = pytest.mark.interpreter

BUDGET = 6


def job(tmp_path: Path) -> Path:
    return toy_job(tmp_path, "many", BUDGET)


def worker(path: Path, url: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "search", str(path), "--storage", url, "--no-compile", "--no-report",
                             "--progress", "jsonl", *extra], cwd=path.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, list[dict], str]:
    out, err = proc.communicate(timeout=600)
    return proc.returncode, [json.loads(line) for line in out.splitlines() if line.startswith("{")], err


def evaluated(events: list[dict]) -> list[str]:
    return [e["candidate"] for e in events if e["event"] == "evaluated" and e.get("status") != "resumed"]


def content(url: str) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """The job's results (candidate, shape), its claims' states, and its open claims."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        results = conn.execute(sa.text("select candidate_id, shape from kf_results where job = 'many'")).all()
        claims = conn.execute(sa.text("select candidate_id, shapes, state from kf_claims where job = 'many'")).all()
        confirmations = conn.execute(sa.text("select candidate_id from kf_confirmations where job = 'many'")).all()
    engine.dispose()
    return [tuple(r) for r in results], [tuple(c) for c in claims], [tuple(c) for c in confirmations]


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> set[str]:
    """The candidates one worker alone evaluates for the job (the reference)."""
    tmp = tmp_path_factory.mktemp("single")
    code, events, err = finish(worker(job(tmp), f"sqlite:///{tmp / 'one.db'}"))
    assert code == 0, err
    ids = evaluated(events)
    assert len(ids) == BUDGET == len(set(ids))
    results, _, _ = content(f"sqlite:///{tmp / 'one.db'}")
    return {c for c, _ in results}


def check_one_search(url: str, reports: list[list[dict]], single: set[str]) -> None:
    """What several workers did is one search: each candidate evaluated once, the budget spent
    exactly, a single worker's candidates, every claim done, one lead's confirmation."""
    ids = [c for events in reports for c in evaluated(events)]
    assert len(ids) == len(set(ids)), "a candidate was evaluated by two workers"
    results, claims, _ = content(url)
    assert len(results) == len(set(results)), "a result was stored twice"
    assert {c for c, _ in results} == single
    assert all(state == "done" for _, _, state in claims)
    assert len({c for c, _, _ in claims}) == len(single)  # the baseline's claim and the budget's


def test_three_workers_on_postgresql_share_one_search(tmp_path, pg_url, single):
    path = job(tmp_path)
    procs = [worker(path, pg_url) for _ in range(3)]
    reports = []
    for proc in procs:
        code, events, err = finish(proc)
        assert code == 0, err
        reports.append(events)
    check_one_search(pg_url, reports, single)
    assert sum(len(evaluated(events)) for events in reports) <= BUDGET
    engine = sa.create_engine(pg_url)
    with engine.connect() as conn:  # confirmed once (by the lead): the job is finished
        assert conn.execute(sa.text("select count(*) from kf_finished where job = 'many'")).scalar() == 1
    engine.dispose()
    leads = [events for events in reports if any(e["event"] == "start" and e.get("lead") for e in events)]
    assert len(leads) <= 1  # one lead at a time (a lead that finished first may hand over: then none left)


@pytest.mark.parametrize("moment", ["start", "baseline", "evaluated"])
def test_a_sigkilled_lead_s_claims_are_finished_by_the_others(tmp_path, single, moment):
    url = f"sqlite:///{tmp_path / 'kf.db'}"
    path = job(tmp_path)
    victim = worker(path, url)  # the first to start: the lead
    # Killed as it starts measuring the baseline (holding its claim), once it measured it, or once
    # it has measured a candidate and claimed the next.
    for line in victim.stdout:
        if json.loads(line)["event"] == moment:
            break
    others = [worker(path, url) for _ in range(2)]
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    victim.stdout.close()
    victim.stderr.close()
    reports = []
    for proc in others:
        code, events, err = finish(proc)
        assert code == 0, err
        reports.append(events)
    results, claims, _ = content(url)
    assert {c for c, _ in results} == single  # nothing lost, nothing more
    assert len(results) == len(set(results))
    assert all(state == "done" for _, _, state in claims)
    engine = sa.create_engine(url)
    with engine.connect() as conn:  # the lead's lock was taken over and the job confirmed
        assert conn.execute(sa.text("select count(*) from kf_finished where job = 'many'")).scalar() == 1
        assert conn.execute(sa.text("select count(*) from kf_locks")).scalar() == 0
    engine.dispose()


def test_sigterm_stops_a_worker_like_ctrl_c_and_a_rerun_finishes_then_changes_nothing(tmp_path, single):
    url = f"sqlite:///{tmp_path / 'kf.db'}"
    path = job(tmp_path)
    proc = worker(path, url)
    for line in proc.stdout:
        if json.loads(line)["event"] == "evaluated":
            break
    proc.send_signal(signal.SIGTERM)
    code, events, err = finish(proc)
    assert code == 143, err
    assert any(e["event"] == "stopped" and e["message"].startswith("terminated") for e in events)
    _, claims, _ = content(url)
    assert all(state == "done" for _, _, state in claims), "open claims were released"
    code, _, err = finish(worker(path, url))
    assert code == 0, err
    before = content(url)
    assert {c for c, _ in before[0]} == single
    code, events, err = finish(worker(path, url))
    assert code == 0, err
    assert "already complete" in err and content(url) == before  # nothing re-timed, nothing appended
    assert [e["event"] for e in events] == ["end"]
    code, events, err = finish(worker(path, url, "--reconfirm"))
    assert code == 0, err
    assert len(content(url)[2]) > len(before[2]) or not before[2]  # --reconfirm re-times the winners


def test_three_tpe_workers_share_one_optuna_study_per_study(tmp_path):
    # Optuna's samplers keep their state in the job's database: three workers starting together on
    # a new file race to create Optuna's tables too, then share each study's trials.
    path = tmp_path / "tpe.toml"
    path.write_text(job(tmp_path).read_text().replace('name = "grid"', 'name = "tpe"')
                    .replace('seed = 0', 'seed = 0\ntune = "per-shape"'))
    url = f"sqlite:///{tmp_path / 'kf.db'}"
    reports = []
    for proc in [worker(path, url) for _ in range(3)]:
        code, events, err = finish(proc)
        assert code == 0, err
        reports.append(events)
    ids = [(e["candidate"], e["block"]) for events in reports for e in events
           if e["event"] == "evaluated" and e.get("status") != "resumed"]
    assert len(ids) == 3 * BUDGET  # one study per shape, each spending its budget exactly
    results, claims, _ = content(url)
    assert len(results) == len(set(results))
    for shape in ("n1", "n7", "n63"):  # the baseline and the budget's candidates, on every shape
        assert len({c for c, s in results if s == shape}) == BUDGET + 1
    assert all(state == "done" for _, _, state in claims)
    # Each shared study is the store's view: one finished trial per point, whichever worker measured it.
    import optuna

    summaries = optuna.get_all_study_summaries(storage=url)
    assert len(summaries) == 3
    for summary in summaries:
        trials = optuna.load_study(study_name=summary.study_name, storage=url).trials
        points = [tuple(sorted(t.params.items())) for t in trials]
        assert {t.state.name for t in trials} == {"COMPLETE"} and len(points) == len(set(points)) == BUDGET + 1
