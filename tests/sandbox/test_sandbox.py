"""The OS sandbox, proven inside the real processes that run candidates: the evaluation worker
(candidates run with the policy switched off, so only the sandbox stands in the way, and report
what happened in their exception) and the sandboxed compile pool's processes (stdlib functions
submitted to them after the sandbox is applied). Honest work still runs in both."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import textwrap
import uuid
from pathlib import Path

import pytest
import torch

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.compile.sandboxed import SandboxedCompilePool
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.sandbox.landlock import elf_interpreter
from kernelforge.sandbox.roles import (ENVIRONMENT_ALLOWLIST, NOT_PASSED, SET_IN_SANDBOX, is_passed,
                                         sandbox_environment, sandbox_plan, sandbox_warning)
from kernelforge.execute.worker.executor import WorkerExecutor
from kernelforge.result import Status

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "kernels"
CATALOG = Catalog.discover(FIXTURES)
BLOCK = CATALOG.block("toy/axpy")
HONEST = Candidate.from_template(CATALOG.baseline("toy/axpy")).source
SHAPE = BLOCK.shapes("check")[:1]

PLAN = sandbox_plan()
pytestmark = pytest.mark.interpreter
needs_sandbox = pytest.mark.skipif(bool(PLAN.missing), reason=f"this machine's sandbox is {PLAN.label}")

#: errno of a refusal: EPERM from seccomp, EACCES from Landlock.
EPERM, EACCES = 1, 13


def probe(body: str) -> str:
    """A candidate whose ``run`` tries ``body`` and raises what happened (``denied: ... errno=N``
    or ``allowed``): the verdict's message carries it back from the worker."""
    return ("import os\nimport socket\n\n\ndef run(x, y, alpha, out):\n    try:\n"
            + textwrap.indent(textwrap.dedent(body).strip() + "\n", " " * 8)
            + "    except OSError as exc:\n"
            "        raise RuntimeError(f'denied: {type(exc).__name__} errno={exc.errno}') from None\n"
            "    raise RuntimeError('allowed')\n")


@pytest.fixture(scope="module")
def worker():
    """A worker judging with the policy off: nothing but the OS sandbox refuses the probes."""
    with WorkerExecutor(InterpretDevice(warmup=0, repeats=1), policy=False, held_out=False, run_timeout=60) as ex:
        yield ex


def outcome(worker: WorkerExecutor, body: str) -> str:
    [ev] = worker.evaluate(BLOCK, probe(body), SHAPE, torch.float16)
    assert ev.status is Status.RUNTIME_ERROR, ev.verification.message
    return ev.verification.message


@pytest.fixture
def home_secret():
    """A fake secret in the user's home folder, readable by this process."""
    path = Path.home() / f".kernelforge-sandbox-test-{uuid.uuid4().hex}"
    path.write_text("sk-fake-home-secret")
    try:
        yield path
    finally:
        path.unlink()


# -- the environment ------------------------------------------------------------------------------

def test_the_environment_is_built_from_the_allowlist_not_scrubbed():
    source = {"PATH": "/bin", "LANG": "C.UTF-8", "CUDA_VISIBLE_DEVICES": "1", "TRITON_DEBUG": "1",
              "FOO_API_KEY": "sk-fake", "KF_SANDBOX_HARMLESS": "1", "DATABASE": "postgresql://u:pw@db/kf",
              "TRITON_REMOTE_PASSWORD": "x", "TRITON_INTERPRET": "1", "TRITON_CACHE_DIR": "/home/u/.triton/cache",
              "HOME": "/home/u", "KERNELFORGE_CACHE": "/home/u/cache", "PYTHONPATH": "/opt/extra"}
    env = sandbox_environment("/tmp/kf-sandbox-T", read_roots=("/k1", "/k2"), source=source)
    assert {"PATH", "LANG", "CUDA_VISIBLE_DEVICES", "TRITON_DEBUG"} <= set(env)
    assert not {"FOO_API_KEY", "KF_SANDBOX_HARMLESS", "DATABASE", "TRITON_REMOTE_PASSWORD", "TRITON_INTERPRET"} & set(env)
    assert set(env) <= {name for name in source if is_passed(name)} | set(SET_IN_SANDBOX)
    folder = str(Path("/tmp/kf-sandbox-T").resolve())
    assert env["HOME"] == env["TMPDIR"] == env["KERNELFORGE_CACHE"] == folder
    assert env["TRITON_CACHE_DIR"].startswith(folder + os.sep)
    assert env["KERNELFORGE_SANDBOX_READ"] == os.pathsep.join(("/k1", "/k2"))
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(REPO / "src"), "/opt/extra"]


def test_every_allowlist_entry_says_why():
    assert all(entry.why and entry.pattern for entry in ENVIRONMENT_ALLOWLIST)
    assert all(value and why for value, why in SET_IN_SANDBOX.values())
    assert not any(is_passed(name) for name in (*NOT_PASSED, *SET_IN_SANDBOX))  # set, never copied


@needs_sandbox
def test_no_variable_outside_the_allowlist_reaches_the_worker(monkeypatch):
    monkeypatch.setenv("FOO_API_KEY", "sk-fake-parent-secret")
    monkeypatch.setenv("KF_SANDBOX_HARMLESS", "1")
    with WorkerExecutor(InterpretDevice()) as ex:
        info = ex.probe(BLOCK)
    allowed = set(SET_IN_SANDBOX) | {name for name in os.environ if is_passed(name)}
    for names in (info["exec_env"], info["env"]):  # the exec environment (/proc/self/environ) and os.environ
        assert "FOO_API_KEY" not in names and "KF_SANDBOX_HARMLESS" not in names
        # os.environ also holds what the worker set itself: the interpreter device's switch.
        assert set(names) - {"TRITON_INTERPRET"} <= allowed, set(names) - allowed


# -- denials inside the worker --------------------------------------------------------------------

@needs_sandbox
def test_a_socket_to_localhost_is_refused(worker):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # this process may connect
        message = outcome(worker, f"socket.create_connection(('127.0.0.1', {port}), timeout=5).close()")
    assert f"denied: PermissionError errno={EPERM}" in message


@needs_sandbox
def test_exec_and_fork_are_refused(worker):
    assert f"errno={EPERM}" in outcome(worker, "os.execv('/bin/true', ['true'])")
    assert f"errno={EPERM}" in outcome(worker, "pid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)")
    # subprocess, posix_spawn: every way to a new process
    assert "denied: PermissionError" in outcome(worker, "import subprocess\nsubprocess.run(['/bin/true'])")


@needs_sandbox
def test_writes_land_only_in_the_workers_own_folder(worker, tmp_path):
    outside = tmp_path / "outside.txt"
    assert f"denied: PermissionError errno={EACCES}" in outcome(worker, f"open({str(outside)!r}, 'w').write('x')")
    assert not outside.exists()
    assert outcome(worker, "open(os.path.join(os.getcwd(), 'inside.txt'), 'w').write('x')").endswith("allowed")


@needs_sandbox
def test_no_device_node_can_be_made(worker):
    """As root, a block device node made in its own folder would read the disk."""
    made = "import stat\nos.mknod(os.path.join(os.getcwd(), 'null'), stat.S_IFCHR | 0o600, os.makedev(1, 3))"
    assert "denied: PermissionError" in outcome(worker, made)


@needs_sandbox
@pytest.mark.skipif(PLAN.landlock_abi < 6, reason="Landlock scopes signals from ABI 6")
def test_the_search_cannot_be_signalled(worker):
    assert f"denied: PermissionError errno={EPERM}" in outcome(worker, "os.kill(os.getppid(), 0)")


@needs_sandbox
def test_a_secret_in_the_home_folder_cannot_be_read(worker, home_secret):
    assert home_secret.read_text() == "sk-fake-home-secret"  # this process can
    message = outcome(worker, f"open({str(home_secret)!r}).read()")
    assert f"denied: PermissionError errno={EACCES}" in message and "sk-fake" not in message


@needs_sandbox
def test_the_worker_runs_under_landlock_and_seccomp_and_results_record_it(worker):
    status = outcome(worker, "lines = open('/proc/self/status').read().splitlines()\n"
                             "raise RuntimeError(' '.join(l.split()[0] + l.split()[1] for l in lines "
                             "if l.startswith(('NoNewPrivs', 'Seccomp:'))))")
    assert "NoNewPrivs:1" in status and "Seccomp:2" in status  # 2: a filter is installed
    assert re.fullmatch(r"landlock-abi\d+\+seccomp", worker.describe()["sandbox"])
    assert worker.describe()["sandbox"] == PLAN.label and sandbox_warning(worker.describe()) is None


@needs_sandbox
def test_honest_work_still_runs_in_the_sandbox():
    with WorkerExecutor(InterpretDevice(warmup=0, repeats=1)) as ex:
        results = ex.evaluate(BLOCK, HONEST, BLOCK.shapes("check")[:2], torch.float16)
    assert [r.status for r in results] == [Status.OK] * 2, [r.verification.message for r in results]
    assert all(r.timing is not None for r in results)


def test_a_missing_layer_is_said_once_and_recorded(monkeypatch):
    monkeypatch.setenv("KERNELFORGE_SANDBOX", "off")
    plan = sandbox_plan()
    assert plan.label == "none: disabled by KERNELFORGE_SANDBOX=off"
    assert "none: disabled" in sandbox_warning({"sandbox": plan.label})
    assert sandbox_warning({"sandbox": "none: in-process (trusted code only)"}) is None  # chosen, not missing


# -- the compile pool ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pool():
    """A sandboxed pool started while the search holds a secret, after one honest compile of a
    shipped template for sm_90 (which runs ptxas)."""
    catalog = Catalog.discover(REPO / "kernels")
    block_id = "norm/fused_add_rmsnorm"
    source = Candidate.from_template(catalog.baseline(block_id)).source
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FOO_API_KEY", "sk-fake-parent-secret")
        mp.setenv("KF_SANDBOX_HARMLESS", "1")
        with SandboxedCompilePool(max_workers=1, timeout=120) as made:
            report = made.submit(source, block_id, catalog.root, "bfloat16", "sm_90").result()
            yield made, report


def in_pool(pool, function, *args):
    """What ``function(*args)`` returns (or raises) in a pool process."""
    made, _ = pool
    return made._executor.submit(function, *args).result(timeout=60)


@needs_sandbox
def test_the_pool_compiles_a_shipped_template_with_ptxas_in_its_sandbox(pool):
    _, report = pool
    assert report.ok, report.message
    assert report.kernels and all(k.registers is not None for k in report.kernels)  # ptxas's resource report


@needs_sandbox
def test_the_pool_processes_are_sandboxed(pool, tmp_path, home_secret):
    assert in_pool(pool, os.getenv, "FOO_API_KEY") is None and in_pool(pool, os.getenv, "KF_SANDBOX_HARMLESS") is None
    exec_env = in_pool(pool, Path.read_bytes, Path("/proc/self/environ"))
    assert b"FOO_API_KEY" not in exec_env and b"KF_SANDBOX_HARMLESS" not in exec_env and b"sk-fake" not in exec_env
    with socket.create_server(("127.0.0.1", 0)) as server:
        with pytest.raises(PermissionError) as refused:
            in_pool(pool, socket.create_connection, server.getsockname())
    assert refused.value.errno == EPERM
    with pytest.raises(PermissionError) as refused:  # processes may start, but only ptxas may be executed
        in_pool(pool, subprocess.run, ["/bin/true"])
    assert refused.value.errno == EACCES
    with pytest.raises(PermissionError):
        in_pool(pool, Path.write_text, tmp_path / "outside.txt", "x")
    with pytest.raises(PermissionError):
        in_pool(pool, Path.read_text, home_secret)


def test_the_loader_of_a_program_is_found():
    """ptxas is started through its ELF interpreter, which must be executable in the sandbox."""
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip("this Triton has no bundled ptxas")
    loader = elf_interpreter(str(ptxas))
    assert loader is None or Path(loader).exists()
    assert elf_interpreter(__file__) is None
