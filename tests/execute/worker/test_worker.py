"""The worker process: candidates that segfault, hang or eat memory cost a restart, not the
caller; the worker never sees the caller's secrets; results already sent survive a later crash;
a killed caller takes its worker with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.errors import UserError
from kernelforge.execute.judge.held_out import INTERPRETER_HELD_OUT, HeldOutDraw
from kernelforge.result import Status
from kernelforge.execute.worker.memory_watch import RETIRE_ADDRESS_SPACE_GROWTH
from kernelforge.sandbox.roles import default_memory_limit, scrubbed_environment
from kernelforge.execute.worker.executor import WorkerExecutor

pytestmark = pytest.mark.interpreter

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "kernels"
CATALOG = Catalog.discover(FIXTURES)
BLOCK = CATALOG.block("toy/axpy")
HONEST = Candidate.from_template(CATALOG.baseline("toy/axpy")).source
CHECK = BLOCK.shapes("check")  # n1, n7, n63


def variant(old: str, new: str) -> str:
    assert old in HONEST
    return HONEST.replace(old, new)


#: An unmasked load 2**40 elements away: the interpreter dereferences it and dies with SIGSEGV.
SEGFAULT = variant("x = tl.load(x_ptr + offs, mask=mask)", "x = tl.load(x_ptr + offs + (1 << 40))")
HANG = variant("    n = x.numel()\n", "    n = x.numel()\n    while n > 0:\n        n = n + 1\n")
#: Segfaults only on the 63-element shape (the last of CHECK): its host code adds an offset of 2**40
#: elements to x there.
SEGFAULT_ON_N63 = (
    HONEST.replace("alpha, n, BLOCK: tl.constexpr", "alpha, n, far, BLOCK: tl.constexpr")
    .replace("tl.load(x_ptr + offs, mask=mask)", "tl.load(x_ptr + offs + far, mask=mask)")
    .replace("(x, y, out, alpha, n, BLOCK=", "(x, y, out, alpha, n, (1 << 40) if n == 63 else 0, BLOCK=")
)


@pytest.fixture(scope="module")
def executor():
    ex = WorkerExecutor(InterpretDevice(warmup=0, repeats=1), run_timeout=30, held_out=False)
    yield ex
    ex.close()


def test_scrubbed_environment_drops_secret_names_and_credential_values():
    env = {"PATH": "/bin", "HOME": "/root", "OPENAI_API_KEY": "k", "GITHUB_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "s",
           "DB_PASSWORD": "p", "MY_LLM_CRED": "c", "DATABASE_URL": "postgresql://u:pw@host/db", "HF_TOKEN": "h",
           "SSH_AUTH_SOCK": "/tmp/a", "KERNELFORGE_KERNELS": "/k", "CUDA_VISIBLE_DEVICES": "0", "PYTHONPATH": "/p",
           "my_private_key": "x", "NPM_PASS": "x"}
    kept = scrubbed_environment(env, extra_secrets=("MY_LLM_CRED",))
    assert set(kept) == {"PATH", "HOME", "KERNELFORGE_KERNELS", "CUDA_VISIBLE_DEVICES", "PYTHONPATH"}


def test_the_worker_runs_without_secrets_in_its_own_directory_under_a_memory_limit(monkeypatch):
    monkeypatch.setenv("KF_TEST_API_KEY", "sk-secret")
    monkeypatch.setenv("KF_TEST_TOKEN", "tok")
    monkeypatch.setenv("KF_TEST_URL", "postgresql://user:hunter2@db/kf")
    monkeypatch.setenv("KF_TEST_CRED", "named-by-the-job")
    monkeypatch.setenv("KF_TEST_PLAIN", "1")
    with WorkerExecutor(InterpretDevice(), memory_limit=6 * 2**30, extra_secrets=("KF_TEST_CRED",)) as ex:
        info = ex.probe()
    for names in (info["env"], info["exec_env"]):  # os.environ and the exec environment (/proc)
        # An allowlist (sandbox.ENVIRONMENT_ALLOWLIST): listed names pass, an unlisted one never does.
        assert "PATH" in names and "KF_TEST_PLAIN" not in names
        assert not {"KF_TEST_API_KEY", "KF_TEST_TOKEN", "KF_TEST_URL", "KF_TEST_CRED"} & set(names)
    assert info["cwd"] != os.getcwd() and Path(info["cwd"]).name.startswith("kernelforge-worker-")
    assert not Path(info["cwd"]).exists()  # removed on close
    assert info["rlimit_as"] == 6 * 2**30 + RETIRE_ADDRESS_SPACE_GROWTH  # the candidate's limit, whole (issue 29)
    assert info["interpret"] == "1" and info["threads"] == torch.get_num_threads()


def test_a_segfault_is_a_runtime_error_and_the_next_candidate_runs(executor):
    starts = executor.starts
    results = executor.evaluate(BLOCK, SEGFAULT, CHECK, torch.float16)
    assert [r.status for r in results] == [Status.RUNTIME_ERROR] * 3
    assert "worker died with SIGSEGV" in results[0].verification.message
    assert "candidate line" in results[0].verification.message
    assert all(r.verification.message.startswith("not run:") for r in results[1:])
    [ok] = executor.evaluate(BLOCK, HONEST, CHECK[:1], torch.float16)
    assert ok.status is Status.OK and executor.starts == starts + 1 + (starts == 0)


def test_a_hang_is_a_timeout_and_the_next_candidate_runs(executor):
    executor.run_timeout, saved = 2.0, executor.run_timeout
    try:
        results = executor.evaluate(BLOCK, HANG, CHECK, torch.float16)
    finally:
        executor.run_timeout = saved
    assert [r.status for r in results] == [Status.TIMEOUT] * 3
    assert "did not finish within 2 s" in results[0].verification.message
    [ok] = executor.evaluate(BLOCK, HONEST, CHECK[:1], torch.float16)
    assert ok.status is Status.OK


def test_results_sent_before_a_crash_are_kept(executor):
    assert SEGFAULT_ON_N63.count("far") == 2 and "(1 << 40) if n == 63" in SEGFAULT_ON_N63
    results = executor.evaluate(BLOCK, SEGFAULT_ON_N63, CHECK, torch.float16)
    assert [r.status for r in results] == [Status.OK, Status.OK, Status.RUNTIME_ERROR]
    assert results[0].timing is not None and "SIGSEGV" in results[2].verification.message


def test_a_memory_hog_fails_under_the_limit_instead_of_exhausting_the_machine():
    hog = variant("    n = x.numel()\n",
                  "    n = x.numel()\n    scratch = torch.empty((6 << 30,), dtype=torch.uint8, device=x.device)\n"
                  "    scratch.fill_(1)\n").replace("import triton\n", "import torch\nimport triton\n", 1)
    with WorkerExecutor(InterpretDevice(), memory_limit=4 * 2**30, held_out=False) as ex:
        [result] = ex.evaluate(BLOCK, hog, CHECK[:1], torch.float16)
        assert result.status is Status.RUNTIME_ERROR
        assert "allocate" in result.verification.message
        [ok] = ex.evaluate(BLOCK, HONEST, CHECK[:1], torch.float16)
        assert ok.status is Status.OK


def test_pair_speedups_run_in_the_worker(executor):
    speedups = executor.pair_speedups(BLOCK, HONEST, HONEST, CHECK[2], torch.float16, 2)
    assert len(speedups) == 2 and all(s > 0 for s in speedups)
    assert executor.pair_speedups(BLOCK, HONEST, SEGFAULT, CHECK[2], torch.float16, 1) == []


def test_a_killed_caller_takes_its_worker_with_it(tmp_path):
    """SIGKILL cannot be caught: the worker dies by PR_SET_PDEATHSIG even mid-candidate."""
    script = tmp_path / "caller.py"
    script.write_text(f"""
import sys, torch
from kernelforge.devices import interpreter
interpreter.enable()
from kernelforge.catalog import Catalog
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.execute.worker.executor import WorkerExecutor
block = Catalog.discover({str(FIXTURES)!r}).block("toy/axpy")
ex = WorkerExecutor(InterpretDevice(), run_timeout=600)
print(ex.probe(block)["pid"], flush=True)
ex.evaluate(block, {HANG!r}, block.shapes("check"), torch.float16)
""")
    caller = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        worker_pid = int(caller.stdout.readline())
        time.sleep(1.0)  # the worker is now inside the hanging candidate
        os.kill(worker_pid, 0)
        caller.send_signal(signal.SIGKILL)
        caller.wait(timeout=30)
        for _ in range(100):
            try:
                os.kill(worker_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(worker_pid, signal.SIGKILL)
            pytest.fail("the worker outlived its caller")
    finally:
        caller.kill()
        caller.stdout.close()


def test_a_killed_search_takes_its_compile_pool_with_it(tmp_path):
    """Pool processes hold their parent's stdout and both ends of their task queue: without
    PR_SET_PDEATHSIG they would outlive a SIGKILLed search forever."""
    script = tmp_path / "caller.py"
    script.write_text(f"""
import time
from kernelforge.compile.sandboxed import SandboxedCompilePool

if __name__ == "__main__":  # the pool spawns processes that import this file
    pool = SandboxedCompilePool(max_workers=1)
    report = pool.submit({HONEST!r}, "toy/axpy", {str(FIXTURES)!r}, "float16", "sm_90").result()
    print(report.status, *pool._executor._processes, flush=True)
    time.sleep(600)
""")
    caller = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        status, *pids = caller.stdout.readline().split()
        assert status == "ok" and pids
        caller.send_signal(signal.SIGKILL)
        caller.wait(timeout=30)
        for pid in map(int, pids):
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)
                pytest.fail("a compile pool process outlived its search")
    finally:
        caller.kill()
        caller.stdout.close()


def test_close_leaves_no_process():
    ex = WorkerExecutor(InterpretDevice())
    pid = ex.probe()["pid"]
    ex.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    ex.close()  # twice is fine


def test_held_out_shapes_are_off_the_timed_ones():
    draw = HeldOutDraw(seed=0)
    some = draw.draw(BLOCK, BLOCK.shapes("smoke"), whole_pool=False)
    assert len(some) == min(INTERPRETER_HELD_OUT, len(CHECK)) and {s.name for s in some} <= {s.name for s in CHECK}
    assert draw.draw(BLOCK, BLOCK.shapes("smoke"), whole_pool=True) == CHECK
    assert [s.name for s in draw.draw(BLOCK, CHECK, whole_pool=False)] == ["n1000"]


def test_the_held_out_draw_comes_from_the_runs_seed_not_the_candidates_text():
    """Issue 29: the draw was the source's hash, so a nonce comment steered it. Now it is the
    run's generator: the same sequence of draws for one seed whatever the sources, a new draw for
    each verification, and the seed in describe() (so stored with every result)."""
    from kernelforge.block import Shape

    class Many:
        id = "toy/many"

        def shapes(self, set_name):
            return [Shape(f"{set_name}{i}", (("N", i),)) for i in range(12)] if set_name == "check" else []

    block = Many()
    draws = [[s.name for s in HeldOutDraw(seed=7).draw(block, [], whole_pool=False)] for _ in range(2)]
    assert draws[0] == draws[1]
    one_run = HeldOutDraw(seed=7)
    sequence = [tuple(s.name for s in one_run.draw(block, [], whole_pool=False)) for _ in range(8)]
    assert len(set(sequence)) > 1  # a new draw each time (confirmation included)
    assert {HeldOutDraw().seed for _ in range(4)} != {HeldOutDraw().seed}  # per run, from secrets
    ex = WorkerExecutor(InterpretDevice(), held_out_seed=1234)
    try:
        assert ex.describe()["held_out_seed"] == 1234
    finally:
        ex.close()


def test_limits_from_the_environment(monkeypatch):
    monkeypatch.setenv("KERNELFORGE_RUN_TIMEOUT", "7")
    monkeypatch.setenv("KERNELFORGE_WORKER_MEMORY_GB", "5")
    ex = WorkerExecutor(InterpretDevice())
    assert ex.run_timeout == 7 and ex.memory_limit == 5 * 2**30
    monkeypatch.setenv("KERNELFORGE_RUN_TIMEOUT", "soon")
    with pytest.raises(UserError, match="KERNELFORGE_RUN_TIMEOUT"):
        WorkerExecutor(InterpretDevice())
    monkeypatch.setenv("KERNELFORGE_WORKER_MEMORY_GB", "0")
    monkeypatch.delenv("KERNELFORGE_RUN_TIMEOUT")
    assert WorkerExecutor(InterpretDevice()).memory_limit is None and default_memory_limit() is None


def test_the_worker_carries_verdicts_and_tracebacks_back(executor):
    raises = variant("    n = x.numel()\n", "    n = x.numel()\n    raise ValueError('boom ' + str(n))\n")
    results = executor.evaluate(BLOCK, raises, CHECK[:2], torch.float16)
    assert [r.status for r in results] == [Status.RUNTIME_ERROR] * 2
    assert results[0].verification.message == "n1: ValueError: boom 1"
    assert "raise ValueError('boom ' + str(n))" in results[0].verification.traceback
