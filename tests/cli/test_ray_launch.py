"""``kernelforge search JOB --ray ADDRESS`` on a real local Ray cluster with 2 fake GPUs (the
``ray_address`` fixture): one worker task per GPU, their output relayed, SIGTERM cancels them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelforge.errors import UserError
from toy_job import CLI, FIXTURES, toy_job



def job_file(tmp_path: Path, name: str, evaluations: int) -> Path:
    return toy_job(tmp_path, name, evaluations, seed=5)


def ray_search(tmp_path: Path, address: str, name: str, evaluations: int, *options: str,
               **popen) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.Popen([*CLI, "search", str(job_file(tmp_path, name, evaluations)), "--storage",
                             f"sqlite:///{tmp_path / (name + '.db')}", *(options or ("--no-compile",)), "--no-report",
                             "--ray", address], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**env, "PYTHONUNBUFFERED": "1"}, **popen)


def events(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]  # the relayed stream stays JSON lines


def test_without_ray_the_error_names_the_extra(monkeypatch):
    from kernelforge.cli.launch.ray_cluster import connect

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(UserError, match=r"pip install kernelforge\[ray\]"):
        connect("auto")


def test_no_cluster_at_the_address_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([*CLI, "search", str(job_file(tmp_path, "none", 1)), "--ray", "127.0.0.1:1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.startswith("kernelforge: --ray 127.0.0.1:1: no Ray cluster answers")
    assert "Traceback" not in proc.stderr


@pytest.mark.interpreter
def test_one_worker_per_gpu_of_the_cluster(tmp_path, ray_address):
    proc = ray_search(tmp_path, ray_address, "ray2", 3)
    stdout, stderr = proc.communicate(timeout=900)
    seen = events(stdout)
    # Two GPUs: two workers, w1 and w2, each a real search.
    assert {e["worker"] for e in seen} | {line[1:3] for line in stderr.splitlines() if line.startswith("[w")} \
        == {"w1", "w2"}, stderr
    assert any(e["event"] == "evaluated" for e in seen), stderr
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr


@pytest.mark.interpreter
def test_two_ray_workers_cooperate_on_one_job(tmp_path, ray_address):
    from kernelforge.store.store import Store

    # With compiles: each worker sends them to the cluster's CPU workers (RayCompilePool).
    proc = ray_search(tmp_path, ray_address, "raycoop", 4, "--progress", "jsonl")
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr
    evaluated = [e for e in events(stdout) if e["event"] == "evaluated" and e["status"] != "resumed"]
    assert len(evaluated) == 4 and len({e["candidate"] for e in evaluated}) == 4
    assert {e["worker"] for e in evaluated} == {"w1", "w2"}
    store = Store(f"sqlite:///{tmp_path / 'raycoop.db'}", create=False)
    keys = [(r.candidate_id, r.shape, r.env_key) for r in store.results()]
    compiled = store.compiles({r.candidate_id for r in store.results()}, "float16")
    store.close()
    assert len(keys) == len(set(keys)) == (4 + 1) * 3
    assert len({c.candidate_id for c in compiled}) == 4 + 1 and all(c.status == "ok" for c in compiled)


def _searches_of(job: Path) -> list[int]:
    """Pids of live processes running a search of ``job`` (the workers, children of Ray's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(job).encode() in cmdline and b"--ray" not in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.interpreter
def test_sigterm_to_the_driver_cancels_the_tasks_and_stops_their_workers(tmp_path, ray_address):
    proc = ray_search(tmp_path, ray_address, "raystop", 60)
    job = tmp_path / "raystop.toml"
    try:
        for line in proc.stdout:
            if json.loads(line)["event"] == "evaluated":
                break
        assert _searches_of(job)
        proc.send_signal(signal.SIGTERM)
        proc.stdout.read()
        assert proc.wait(timeout=300) == 143, proc.stderr.read()
        deadline = time.monotonic() + 120  # a bound for a loaded machine, not a timing
        while _searches_of(job) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _searches_of(job) == []
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.interpreter
def test_the_ray_compile_pool_compiles_on_the_cluster_in_the_sandbox(ray_address):
    import ray

    from kernelforge.candidate import Candidate
    from kernelforge.catalog import Catalog
    from kernelforge.compile.ray_pool import RayCompilePool

    source = Candidate.from_template(Catalog.discover(FIXTURES).baseline("toy/axpy")).source
    ray.init(address=ray_address, log_to_driver=False, include_dashboard=False)
    try:
        pool = RayCompilePool(timeout=300)
        compiled = pool.submit(source, "toy/axpy", FIXTURES, "float16", "sm_90")
        rejected = pool.submit("import os\n" + source, "toy/axpy", FIXTURES, "float16", "sm_90")
        assert rejected.done() and rejected.result().status == "rejected"  # answered without a task
        report = compiled.result(timeout=600)
        assert report.status == "ok", report
        assert report.kernels and report.kernels[0].registers
        pool.shutdown()
    finally:
        ray.shutdown()
