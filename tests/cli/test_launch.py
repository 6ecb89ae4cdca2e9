"""Local workers of one job (kernelforge.cli.launch.local): the workers' command lines and
environments, the errors, real workers against one SQLite file, and the signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelforge.cli.main import main
from kernelforge.cli.launch import local as launch_module
from kernelforge.cli.launch.local import parse_gpus
from kernelforge.compile.pool import COMPILE_WORKERS_ENV
from kernelforge.cli.launch.supervise import STORAGE_ENV, Relay, Stop, WorkerSpec, exit_status
from kernelforge.errors import UserError
from toy_job import CLI, FIXTURES, toy_job



def job_file(tmp_path: Path, name="lw", device="interpret", evaluations=3) -> Path:
    return toy_job(tmp_path, name, evaluations, device=device, seed=3)


def planned(monkeypatch, args: list[str]) -> tuple[list[WorkerSpec], object]:
    """The workers ``kernelforge ARGS`` would start (nothing is started)."""
    seen: list[WorkerSpec] = []
    monkeypatch.setattr(launch_module, "run_local", lambda specs, relay, stop: seen.extend(specs) or 0)
    monkeypatch.setattr(launch_module, "finish", lambda *a, **k: None)
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    return seen, result


def test_one_worker_per_named_gpu_each_seeing_only_its_own(tmp_path, monkeypatch):
    path = job_file(tmp_path, device="cuda:3")
    db = tmp_path / "j.db"
    specs, result = planned(monkeypatch, ["--kernels", str(FIXTURES), "search", str(path), "--gpus", "0,1,5",
                                          "--storage", f"sqlite:///{db}", "--no-compile", "--progress", "live"])
    assert result.exit_code == 0, result.output
    assert [s.label for s in specs] == ["w1", "w2", "w3"]
    assert [dict(s.env)["CUDA_VISIBLE_DEVICES"] for s in specs] == ["0", "1", "5"]
    share = max(1, (os.cpu_count() or 1) // 3)
    assert all(dict(s.env)[COMPILE_WORKERS_ENV] == str(share) for s in specs)
    argv = specs[0].argv
    assert all(s.argv == argv for s in specs)
    # The same command without the launcher options; JSON progress, no report; the device is the
    # worker's one visible GPU; the storage in the environment (a URL may hold a password: `ps`
    # shows command lines).
    assert list(argv) == [sys.executable, "-m", "kernelforge", "--kernels", str(FIXTURES), "search", str(path),
                          "--device", "cuda", "--progress", "jsonl", "--no-compile", "--no-report"]
    assert all(dict(s.env)[STORAGE_ENV] == f"sqlite:///{db}" for s in specs)
    env = specs[1].environment({"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5"})
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["PATH"] == "/bin" and env["PYTHONUNBUFFERED"] == "1"


def test_workers_n_keeps_the_device_and_the_llm_options(tmp_path, monkeypatch):
    path = job_file(tmp_path)
    specs, result = planned(monkeypatch, ["--kernels", str(FIXTURES), "search", str(path), "--workers", "2",
                                          "--storage", f"sqlite:///{tmp_path / 'j.db'}", "--llm", "off",
                                          "--device", f"replay:{tmp_path / 'rec.db'}?wait=2"])
    assert result.exit_code == 0, result.output
    assert len(specs) == 2 and all("CUDA_VISIBLE_DEVICES" not in dict(s.env) for s in specs)
    argv = list(specs[0].argv)
    assert argv[argv.index("--device") + 1] == f"replay:{tmp_path / 'rec.db'}?wait=2"
    assert argv[argv.index("--llm") + 1] == "off"
    assert "--workers" not in argv and "--no-report" in argv


def test_parse_gpus():
    assert parse_gpus("all", lambda: ["0", "1"]) == ["0", "1"]
    assert parse_gpus("0, 1,5") == ["0", "1", "5"]
    for bad in ("x", "0,0", "1,,2"):
        with pytest.raises(UserError, match="--gpus"):
            parse_gpus(bad)


@pytest.mark.parametrize("args, message", [
    (["--gpus", "all", "--device", "cuda"], "no GPU found"),
    (["--gpus", "0,1"], "device is 'interpret'"),
    (["--workers", "2", "--storage", "sqlite://"], "in-memory SQLite"),
    (["--workers", "2", "--gpus", "0"], "choose one way"),
])
def test_a_launcher_mistake_is_one_line_and_exit_2(tmp_path, args, message):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU visible, on any host
    proc = subprocess.run([*CLI, "search", str(job_file(tmp_path)), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("kernelforge: ")


def test_exit_status_and_relay():
    stop = Stop()
    assert exit_status(stop, []) == 0
    assert exit_status(stop, [3, 1]) == 3
    assert exit_status(stop, [-9]) == 137
    stop._on_signal(signal.SIGTERM, None)
    assert exit_status(stop, [1]) == 143 and stop.forward_signal() == signal.SIGTERM
    stop._on_signal(signal.SIGINT, None)
    assert exit_status(stop, []) == 143 and stop.forward_signal() == signal.SIGKILL

    class Sink(list):
        def write(self, text):
            self.append(text)

        def flush(self):
            pass

    out, err = Sink(), Sink()
    relay = Relay("jsonl", out, err)
    relay.line("w2", "stdout", '{"event": "evaluated", "status": "ok"}\n')
    relay.line("w2", "stdout", "toy: 3 evaluations\n")
    relay.line("w1", "stderr", '{"not": "progress"}\n')
    assert [json.loads(line) for line in out] == [{"event": "evaluated", "status": "ok", "worker": "w2"}]
    assert err == ["[w2] toy: 3 evaluations\n", '[w1] {"not": "progress"}\n']
    assert relay.evaluations == 1


def _stored(db: Path) -> list[tuple[str, str, str]]:
    from kernelforge.store.store import Store

    store = Store(f"sqlite:///{db}", create=False)
    try:
        return [(r.candidate_id, r.shape, r.env_key) for r in store.results()]
    finally:
        store.close()


def _events(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]  # every stdout line is JSON


@pytest.mark.interpreter
def test_two_workers_cooperate_on_the_budget(tmp_path):
    db = tmp_path / "shared.db"
    proc = subprocess.run([*CLI, "search", str(job_file(tmp_path, evaluations=4)), "--workers", "2",
                           "--storage", f"sqlite:///{db}", "--no-compile", "--no-report"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    evaluated = [e for e in _events(proc.stdout) if e["event"] == "evaluated" and e["status"] != "resumed"]
    assert len(evaluated) == 4  # the budget, spent exactly
    # Both workers ran the job; how the 4 evaluations split between them is the scheduler's (on a
    # loaded host w2 may start after w1 has claimed all 4).
    assert {e["worker"] for e in _events(proc.stdout) if e["event"] == "start"} == {"w1", "w2"}
    assert {e["worker"] for e in evaluated} <= {"w1", "w2"}
    assert len({e["candidate"] for e in evaluated}) == 4  # nothing evaluated twice
    rows = _stored(db)
    assert len(rows) == len(set(rows)) == (4 + 1) * 3  # the baseline and 4 candidates, 3 shapes each


def _worker_pids(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.interpreter
@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_the_launcher_stops_every_worker(tmp_path, signum, status):
    proc = subprocess.Popen([*CLI, "search", str(job_file(tmp_path, evaluations=50)), "--workers", "2",
                             "--storage", f"sqlite:///{tmp_path / 's.db'}", "--no-compile", "--no-report"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        for line in proc.stdout:
            if json.loads(line)["event"] == "evaluated":
                break
        children = _worker_pids(proc.pid)
        assert children
        proc.send_signal(signum)
        proc.stdout.read()
        assert proc.wait(timeout=300) == status, proc.stderr.read()
        assert "Traceback" not in proc.stderr.read()
        deadline = time.monotonic() + 60  # reaped by the launcher: gone at once; a bound, not a timing
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in children)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_start_up_starts_no_worker_and_exits_with_its_status(tmp_path, monkeypatch, signum, status):
    # The signal lands while the launcher checks the job (start-up, before any worker): it is
    # recorded by the launcher's handler, no worker starts, and the status says which signal.
    started = []
    check = launch_module.check_shareable_storage
    monkeypatch.setattr(launch_module, "check_shareable_storage",
                        lambda url, **k: (os.kill(os.getpid(), signum), check(url, **k)))
    monkeypatch.setattr(launch_module, "start_worker", lambda *a, **k: started.append(a))
    monkeypatch.setattr(launch_module, "finish", lambda *a, **k: None)
    before = signal.getsignal(signum)
    result = CliRunner().invoke(main, ["--kernels", str(FIXTURES), "search", str(job_file(tmp_path)), "--workers", "2",
                                       "--storage", f"sqlite:///{tmp_path / 's.db'}"], catch_exceptions=False)
    assert result.exit_code == status and started == []
    assert signal.getsignal(signum) == before  # the launcher's handlers are gone with it
