"""The waiting replay (``--device replay:PATH?wait=F``): each evaluation sleeps the recorded device
time of what it replays (median x samples per successful shape) times F, measured with a fake
sleep, never wall time; and it is an environment of its own."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.errors import UserError
from kernelforge.execute.executor import make_executor, parse_replay
from kernelforge.execute.replay import ReplayExecutor
from kernelforge.result import Status, StoredResult, env_key
from kernelforge.store.store import Store

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
CATALOG = Catalog.discover(FIXTURES)
AXPY = CATALOG.block("toy/axpy")
SOURCE = Candidate.from_template(CATALOG.baseline("toy/axpy")).source
OTHER = SOURCE + "\n# another candidate\n"
SHAPES = AXPY.shapes("check")[:3]
ENV = {"device": "cuda", "device_name": "NVIDIA H200", "torch": "2.13.0", "triton": "3.9.0"}

# (status, median_s, samples) per shape, and the device time it stands for.
TIMES = [(Status.OK, 0.002, 50), (Status.OK, 0.0005, 200), (Status.WRONG, 0.001, 40)]
DEVICE_S = 0.002 * 50 + 0.0005 * 200  # the failed shape waits nothing


def _row(source: str, shape: str, status: Status, median: float | None, samples: int | None) -> StoredResult:
    return StoredResult(
        candidate_id=Candidate(AXPY.id, "toy/axpy/rec", (), source).id, block=AXPY.id, shape=shape, dtype="float16", device="cuda",
        env_key=env_key(ENV), status=status, rel_error=0.0, median_s=median, p20_s=median, p80_s=median,
        samples=samples, timing_method="cuda_events", timing_label="CUDA events", joules=None, flops=1.0,
        bytes=1.0, message="" if status is Status.OK else "wrong", env=ENV, job="rec", created=time.time())


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rec") / "kernelforge.db"
    store = Store(f"sqlite:///{path}")
    for source in (SOURCE, OTHER):
        store.add_candidate(Candidate(AXPY.id, "toy/axpy/rec", (), source))
    for shape, (status, median, samples) in zip(SHAPES, TIMES):
        store.add_result(_row(SOURCE, shape.name, status, median, samples))
    # OTHER: timed on the first shape only, the others failed before timing (no median).
    store.add_result(_row(OTHER, SHAPES[0].name, Status.OK, 0.004, 10))
    for shape in SHAPES[1:]:
        store.add_result(_row(OTHER, shape.name, Status.RUNTIME_ERROR, None, None))
    store.close()
    return path


class FakeSleep:
    def __init__(self):
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def test_each_evaluation_sleeps_its_recorded_device_time_times_the_factor(recording):
    sleep = FakeSleep()
    executor = ReplayExecutor(recording, wait=3.0, sleep=sleep)
    executor.prepare()
    evaluations = executor.evaluate(AXPY, SOURCE, SHAPES, torch.float16)
    assert [e.verification.status for e in evaluations] == [t[0] for t in TIMES]
    assert sleep.calls == [pytest.approx(3.0 * DEVICE_S)]
    executor.evaluate(AXPY, OTHER, SHAPES, torch.float16)
    assert sleep.calls[1] == pytest.approx(3.0 * 0.004 * 10)
    # A candidate the recording never measured waits nothing (it is a runtime_error at once).
    executor.evaluate(AXPY, SOURCE + "\n# unknown\n", SHAPES, torch.float16)
    assert sleep.calls[2] == 0
    assert sum(sleep.calls) == pytest.approx(3.0 * (DEVICE_S + 0.04))
    executor.close()


def test_a_plain_replay_never_sleeps(recording):
    sleep = FakeSleep()
    executor = ReplayExecutor(recording, sleep=sleep)
    executor.prepare()
    executor.evaluate(AXPY, SOURCE, SHAPES, torch.float16)
    assert sleep.calls == []
    executor.close()


def test_the_device_name_carries_the_factor_and_a_waiting_replay_is_its_own_environment(recording):
    plain = make_executor(f"replay:{recording}")
    waiting = make_executor(f"replay:{recording}?wait=2.5")
    other = make_executor(f"replay:{recording}?wait=1")
    for executor in (plain, waiting, other):
        executor.prepare()
    assert isinstance(waiting, ReplayExecutor) and waiting.wait == 2.5 and plain.wait is None
    assert waiting.path == recording == plain.path
    described = waiting.describe()
    assert described["replay_wait"] == 2.5 and "x2.5" in described["device_name"]
    assert "replay_wait" not in plain.describe()
    keys = {env_key(e.describe()) for e in (plain, waiting, other)}
    assert len(keys) == 3
    for executor in (plain, waiting, other):
        executor.close()


@pytest.mark.parametrize("spec", ["replay:x.db?wait=", "replay:x.db?wait=abc", "replay:x.db?wait=0",
                                  "replay:x.db?wait=-1", "replay:x.db?wait=inf"])
def test_a_bad_wait_factor_is_one_clear_error(spec):
    with pytest.raises(UserError, match="wait=.*positive number"):
        parse_replay(spec)


def test_the_parse():
    assert parse_replay("replay:reports/a/kernelforge.db") == ("reports/a/kernelforge.db", None)
    assert parse_replay("replay:/x/k.db?wait=0.5") == ("/x/k.db", 0.5)
    assert parse_replay("replay:odd?name.db") == ("odd?name.db", None)


@pytest.mark.interpreter
def test_a_search_on_a_waiting_replay_stores_results_under_its_own_env_key(tmp_path):
    from kernelforge.job import load_job
    from kernelforge.search.search import Search
    from kernelforge.search.progress import Progress

    def run(name: str, device: str) -> Store:
        path = tmp_path / f"{name}.toml"
        path.write_text(f'[job]\nname = "{name}"\ndevice = "{device}"\ndtype = "float16"\nseed = 1\n\n'
                        '[strategy]\nname = "grid"\nevaluations = 2\n\n[[blocks]]\nid = "toy/axpy"\nshapes = "check"\n')
        store = Store(f"sqlite:///{tmp_path / (name + '.db')}")
        Search(load_job(path, CATALOG), CATALOG, store, Progress(), compile_enabled=False).run()
        return store

    recorded = run("rec", "interpret")
    plain = run("plain", f"replay:{tmp_path / 'rec.db'}")
    # A tiny factor: the interpreter's recorded times are milliseconds; the sleep is real here.
    waiting = run("wait", f"replay:{tmp_path / 'rec.db'}?wait=0.001")
    plain_keys = {r.env_key for r in plain.results()}
    waiting_keys = {r.env_key for r in waiting.results()}
    assert len(plain_keys) == 1 and len(waiting_keys) == 1 and plain_keys != waiting_keys
    assert all(r.env["replay_wait"] == 0.001 and "waiting x0.001" in r.env["device_name"] for r in waiting.results())
    # Same answers as the plain replay.
    assert ({(r.candidate_id, r.shape): r.median_s for r in waiting.results()}
            == {(r.candidate_id, r.shape): r.median_s for r in plain.results()})
    for store in (recorded, plain, waiting):
        store.close()
