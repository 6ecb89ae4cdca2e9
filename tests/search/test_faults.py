"""Faults of the search itself and of its inputs: candidates that crash, hang or hog memory;
SIGKILL at random moments; two searches on one database; a full disk; a read-only folder; bad
job files and templates. Each ends in a stored status or one clear line, never a traceback, and
nothing stored is lost or stored twice."""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from kernelforge.baseline_timing import BaselineSeries, baseline_at
from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.cli.main import main
from kernelforge.errors import UserError
from kernelforge.job import load_job
from kernelforge.result import Status
from kernelforge.search.search import Search
from kernelforge.store.store import Store
from kf_progress import Recorder
from toy_job import job_text, write_job
from kills import kill_at_a_random_moment

pytestmark = pytest.mark.interpreter

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "kernels"
FAULTY = ROOT / "tests" / "fixtures" / "faulty_kernels"
CLI = [sys.executable, "-m", "kernelforge", "--kernels", str(FIXTURES)]




def job_file(folder: Path, name: str = "toy", block: str = "toy/axpy", evaluations: int = 9,
             dtype: str = "float16") -> Path:
    return write_job(folder, name, block=block, evaluations=evaluations, dtype=dtype, shapes="smoke")


def rows(db: Path, query: str) -> list:
    with sqlite3.connect(db) as conn:
        return conn.execute(query).fetchall()


# -- misbehaving candidates ----------------------------------------------------------------------


def test_a_search_survives_crashing_hanging_and_memory_hungry_candidates(tmp_path, monkeypatch):
    """toy/faulty's MODE parameter selects a segfault, a hang and a 6 GiB allocation; a grid
    search visits every point, completes its budget, records each with its status, and the
    honest candidates get real timings and speedups."""
    # Long enough that honest calls and the allocation failure finish on a loaded machine (a 3 s
    # limit timed the 6 GiB allocation out under load); the hang still hits it.
    monkeypatch.setenv("KERNELFORGE_RUN_TIMEOUT", "30")
    monkeypatch.setenv("KERNELFORGE_WORKER_MEMORY_GB", "4")
    catalog = Catalog.discover(FAULTY)
    job = load_job(job_file(tmp_path, "faulty", "toy/faulty", evaluations=5, dtype="float32"), catalog)
    store = Store(f"sqlite:///{tmp_path / 'faulty.db'}")
    recorder = Recorder()
    outcome = Search(job, catalog, store, recorder, compile_enabled=False).run()
    assert outcome.evaluations == 4 and not outcome.stopped  # 5 points, the baseline answered from the store
    by_mode = {}
    for candidate in store.candidates("toy/faulty"):
        [result] = store.results(candidate_id=candidate.id)
        by_mode[(candidate.params["MODE"], candidate.params["BLOCK"])] = result
    assert set(by_mode) == {("ok", 64), ("ok", 256), ("segfault", 256), ("hang", 256), ("hog", 256)}
    assert by_mode[("segfault", 256)].status is Status.RUNTIME_ERROR
    assert "SIGSEGV" in by_mode[("segfault", 256)].message
    assert by_mode[("hang", 256)].status is Status.TIMEOUT
    assert "did not finish within 30 s" in by_mode[("hang", 256)].message
    assert by_mode[("hog", 256)].status is Status.RUNTIME_ERROR
    assert "allocate" in by_mode[("hog", 256)].message
    for mode in ("segfault", "hang", "hog"):
        assert by_mode[(mode, 256)].median_s is None
    base, other = by_mode[("ok", 256)], by_mode[("ok", 64)]
    assert base.ok and other.ok and base.median_s > 0 and other.median_s > 0
    # The speedups the search reported are the stored times' ratio (the baseline as timed most
    # recently before the candidate: it is re-timed beside the candidates); no faulty one is reported.
    reported = {d["candidate"]: d["speedup"] for k, d in recorder.events if k == "evaluated" and d.get("candidate")}
    other_id = next(c.id for c in store.candidates() if c.params == {"MODE": "ok", "BLOCK": 64})
    series = BaselineSeries({other.shape: base}, store.baseline_timings("toy/faulty"))
    assert reported[other_id] == pytest.approx(baseline_at(series, other).median_s / other.median_s)
    assert all(speedup is None for cid, speedup in reported.items() if cid != other_id)
    assert {c.candidate_id for c in store.confirmations()} <= {other_id}


# -- SIGKILL at random moments -------------------------------------------------------------------


def _search(folder: Path, job: Path, *extra: str, progress: str = "quiet") -> subprocess.Popen:
    return subprocess.Popen([*CLI, "search", str(job), "--progress", progress, "--no-compile", "--no-report", *extra],
                            cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _content(db: Path) -> tuple[list, list]:
    results = rows(db, "select candidate_id, shape, dtype, status from kf_results")
    candidates = rows(db, "select id, params from kf_candidates")
    return sorted(results), sorted(candidates)


def test_random_sigkills_then_a_finish_equal_an_uninterrupted_run(tmp_path):
    """Ten SIGKILLs at random moments, then a run to the end: the same candidates and results as a
    search never interrupted, none stored twice. Grid order makes "the same" well defined.

    The kills land at random moments (:func:`kills.kill_at_a_random_moment`). The killed
    runs evaluate in-process (--in-process: no 2 s worker start-up each; a worker killed with its
    search is tests/test_worker.py's); the final run uses the worker.
    """
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"
    reference.mkdir()
    interrupted.mkdir()
    catalog = Catalog.discover(FIXTURES)
    reference_job = load_job(job_file(reference, evaluations=6), catalog)
    Search(reference_job, catalog, Store(f"sqlite:///{reference / 'kf.db'}"), Recorder(), compile_enabled=False,
           in_process=True).run()
    db = "reports/toy/kernelforge.db"
    expected = _content(reference / "kf.db")
    assert len(expected[0]) == 7 and {r[3] for r in expected[0]} == {"ok"}  # the baseline and 6

    job = job_file(interrupted, evaluations=6)
    rng = random.Random(20240611)
    killed = 0
    for attempt in range(10):
        proc = _search(interrupted, job, "--in-process", progress="jsonl")
        killed += kill_at_a_random_moment(proc, rng, attempt)
        proc.wait(timeout=60)
        proc.stdout.close()
        if (interrupted / db).exists():
            results = rows(interrupted / db, "select candidate_id, shape, dtype from kf_results")
            assert len(results) == len(set(results)), "a result was stored twice"
    assert killed >= 8  # the search was really interrupted, not left to finish
    proc = _search(interrupted, job)
    assert proc.wait(timeout=300) == 0
    proc.stdout.close()
    assert _content(interrupted / db) == expected
    assert rows(interrupted / db, "select count(*) from kf_locks") == [(0,)]


# -- two searches on one database ----------------------------------------------------------------


def test_the_job_lock_names_a_live_lead_and_is_taken_over_when_it_died(tmp_path):
    url = f"sqlite:///{tmp_path / 'kf.db'}"
    store = Store(url)
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import time\nfrom kernelforge.store.store import Store\nStore({url!r}).acquire_job_lock('toy')\n"
                               "print('held', flush=True)\ntime.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=rf"job 'toy' is being searched by process {holder.pid} on host"):
            store.acquire_job_lock("toy")
        assert store.take_job_lock("toy").pid == holder.pid  # the live lead's row, not a lock
        other = store.acquire_job_lock("another-job")  # jobs do not block each other
        other.release()
        # A search of the job while a live lead holds its lock works beside it, as a worker: it
        # evaluates its share and leaves the confirmation to the lead.
        result = CliRunner().invoke(main, ["--kernels", str(FIXTURES), "search", str(job_file(tmp_path)),
                                           "--storage", url, "--no-compile", "--progress", "jsonl", "--no-report"],
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert "the lead worker confirms" in result.output
        assert rows(tmp_path / "kf.db", "select count(*) from kf_confirmations") == [(0,)]
        (evaluated,), = rows(tmp_path / "kf.db", "select count(distinct candidate_id) from kf_results")
        assert evaluated > 1  # the baseline and the search's own candidates
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    lock = store.acquire_job_lock("toy")
    assert lock.taken_over and str(holder.pid) in lock.taken_over
    assert store.acquire_job_lock("toy").holder == lock.holder  # re-entrant for its holder
    lock.release()
    assert store.job_lock("toy") is None


# -- a full disk and a read-only folder ----------------------------------------------------------


def _cap_file_size(store: Store) -> None:
    """Simulate a full disk: SQLite's max_page_count caps the file at its current size, and a
    write that needs one more page fails with SQLITE_FULL ("database or disk is full"), the error
    a full disk gives. (Simulated: the disk itself is not filled.)"""
    with store.engine.connect() as conn:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar()

    @sa.event.listens_for(store.engine, "connect")
    def cap(dbapi_connection, _record):
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")

    store.engine.dispose()


def test_a_full_disk_is_one_clear_error_and_keeps_what_was_stored(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    catalog = Catalog.discover(FIXTURES)
    path = job_file(tmp_path, evaluations=3)
    db = tmp_path / "toy.db"
    Search(load_job(path, catalog), catalog, Store(f"sqlite:///{db}"), Recorder(), compile_enabled=False,
           in_process=True).run()
    before = _content(db)
    assert len(before[0]) == 4  # the baseline and 3 candidates
    path.write_text(path.read_text().replace("evaluations = 3", "evaluations = 6"))
    store = Store(f"sqlite:///{db}")
    _cap_file_size(store)
    # Fill the last free bytes so the next write needs a new page.
    with pytest.raises(UserError) as failure:
        for i in range(200):
            store.add_candidate(Candidate("toy/axpy", "toy/axpy/filler", (("i", i),), f"# {i}\n" + "#" * 4000))
    message = str(failure.value)
    assert "database or disk is full" in message and str(db) in message and "everything stored so far is kept" in message
    with pytest.raises(UserError, match="database or disk is full"):
        Search(load_job(path, catalog), catalog, store, Recorder(), compile_enabled=False, in_process=True).run()
    during = _content(db)[0]
    assert set(before[0]) <= set(during) and len(during) < 7  # nothing lost; what fitted is whole
    Search(load_job(path, catalog), catalog, Store(f"sqlite:///{db}"), Recorder(), compile_enabled=False,
           in_process=True).run()
    after = _content(db)[0]
    assert set(before[0]) <= set(after) and len(after) == 7


def test_a_database_locked_too_long_is_one_clear_error(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'kf.db'}")

    @sa.event.listens_for(store.engine, "connect")
    def impatient(dbapi_connection, _record):  # 0.2 s instead of the store's 30 s busy timeout
        dbapi_connection.execute("PRAGMA busy_timeout = 200")

    store.engine.dispose()
    other = sqlite3.connect(tmp_path / "kf.db", timeout=1)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        with pytest.raises(UserError, match="stayed locked by another process"):
            store.add_candidate(Candidate("toy/axpy", "toy/axpy/x", (("BLOCK", 64),), "def run(out):\n    pass\n"))
    finally:
        other.rollback()
        other.close()


def _obey_permissions() -> None:
    """preexec_fn: make root obey file permission bits in the child (root bypasses them through
    CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER; dropping them from the bounding set
    removes them from the child after exec)."""
    if os.geteuid() != 0:
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2, 3):
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_a_read_only_report_folder_is_one_clear_error(tmp_path):
    """For real: the report folder is made read-only with chmod, and the commands run without
    root's power to ignore permissions."""
    probe = tmp_path / "probe"
    probe.mkdir(mode=0o555)
    try:
        denied = subprocess.run([sys.executable, "-c", f"open({str(probe / 'x')!r}, 'w')"], capture_output=True,
                                preexec_fn=_obey_permissions).returncode != 0
    except OSError:
        denied = False
    if not denied:
        pytest.skip("cannot run a process that obeys file permissions here")
    job = job_file(tmp_path, evaluations=2)
    first = subprocess.run([*CLI, "search", str(job), "--no-compile", "--progress", "quiet"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    folder = tmp_path / "reports" / "toy"
    db = folder / "kernelforge.db"
    stored = rows(db, "select candidate_id, shape, status from kf_results")
    for path in [*folder.iterdir(), folder]:
        os.chmod(path, 0o555 if path.is_dir() else 0o444)
    try:
        job.write_text(job.read_text().replace("evaluations = 2", "evaluations = 4"))
        again = subprocess.run([*CLI, "search", str(job), "--no-compile", "--progress", "quiet"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=300, preexec_fn=_obey_permissions)
        flat = " ".join(again.stderr.split())
        assert again.returncode == 1, again.stderr  # a storage failure: status 1
        assert "Traceback" not in again.stderr and str(folder.resolve()) in flat and "writable" in flat
        report = subprocess.run([*CLI, "report", str(job)], cwd=tmp_path, capture_output=True, text=True,
                                timeout=300, preexec_fn=_obey_permissions)
        assert report.returncode == 1 and "Traceback" not in report.stderr
        assert "writable" in " ".join(report.stderr.split())
    finally:
        for path in [folder, *folder.iterdir()]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
    assert rows(db, "select candidate_id, shape, status from kf_results") == stored


# -- bad input -----------------------------------------------------------------------------------

TEMPLATE = """{{#-
[template]
role = "baseline"
constraints = {constraints}

[space]
BLOCK = [64, 256]

[baseline]
BLOCK = 256
-#}}
import triton
import triton.language as tl


@triton.jit
def _axpy(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (alpha * x + y).to(out_ptr.dtype.element_ty), mask=mask)


def run(x, y, alpha, out):
    n = x.numel()
    _axpy[(triton.cdiv(n, {{{{ BLOCK }}}}),)](x, y, out, alpha, n, BLOCK={{{{ BLOCK // ({body}) }}}})
"""

BAD_INPUTS = {
    "malformed job": ("job", "[job\nname = 'toy'", "not valid TOML"),
    "unknown block": ("job", job_text("toy", block="toy/axpi", evaluations=2, shapes="smoke"),
                      "unknown block 'toy/axpi' (did you mean toy/axpy?)"),
    "unknown template": ("job", job_text("toy", evaluations=2, shapes="smoke")
                         + 'templates = ["fastest"]\n', "has no template 'fastest'"),
    "render fails at a point": ("template", TEMPLATE.format(constraints="[]", body="(BLOCK - 64) // 192"),
                                "rendering failed at {'BLOCK': 64}: ZeroDivisionError"),
    "no valid point": ("template", TEMPLATE.format(constraints='["BLOCK > 256"]', body="1"),
                       "violates constraint 'BLOCK > 256'"),
    "unknown parameter in a constraint": ("template", TEMPLATE.format(constraints='["BLOCK_N <= BLOCK"]', body="1"),
                                          "names unknown parameter(s) BLOCK_N"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_clear_line_and_loses_nothing(tmp_path, monkeypatch, case):
    kind, text, fragment = BAD_INPUTS[case]
    monkeypatch.chdir(tmp_path)
    kernels = tmp_path / "kernels"
    shutil.copytree(FIXTURES / "toy" / "axpy", kernels / "toy" / "axpy", ignore=shutil.ignore_patterns("*.j2"))
    good = TEMPLATE.format(constraints="[]", body="1")
    (kernels / "toy" / "axpy" / "baseline.py.j2").write_text(good)
    path = job_file(tmp_path, evaluations=1)
    url = f"sqlite:///{tmp_path / 'kf.db'}"

    def search():
        # In-process: what is tested is the handling of the input, not the isolation (no worker start).
        return CliRunner().invoke(main, ["--kernels", str(kernels), "search", str(path), "--storage", url,
                                         "--no-compile", "--progress", "quiet", "--no-report", "--in-process"],
                                  catch_exceptions=False)

    first = search()
    assert first.exit_code == 0, first.output
    before = rows(tmp_path / "kf.db", "select candidate_id, shape, status from kf_results")
    if kind == "job":
        path.write_text(text)
    else:
        (kernels / "toy" / "axpy" / "baseline.py.j2").write_text(text)
        path.write_text(path.read_text().replace("evaluations = 1", "evaluations = 2"))
    result = search()
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.split())  # rich wraps long lines at spaces
    assert fragment in flat and "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) <= 3  # one message (rich may wrap it)
    assert set(before) <= set(rows(tmp_path / "kf.db", "select candidate_id, shape, status from kf_results"))
