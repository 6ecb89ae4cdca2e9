"""The Python API (kernelforge.api, docs/python-api.md): the README's example runs as written, the
overrides of open_job, the winner's metadata against the stored data, a winner with an in-place
input, and the errors of load_winner."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import kernelforge
from kernelforge import api
from kernelforge.errors import UserError
from kernelforge.store.store import Store
import kf_synthetic_store as synthetic  # tests/fixtures (pytest pythonpath)

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- api-example"


def readme_example() -> str:
    """The ```python block that follows the api-example marker in README.md."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.count(MARK) == 1, "README.md must mark exactly one Python API example"
    match = re.search(r"```python\n(.*?)\n```", text[text.index(MARK):], re.DOTALL)
    assert match, "no ```python block after the api-example marker in README.md"
    return match.group(1)


@pytest.mark.interpreter
def test_the_readme_example_runs(tmp_path, monkeypatch, capsys):
    # As a reader runs it: from a folder holding search/demo.toml, with the scratch database in
    # this test's folder (tempfile) and nothing written to the checkout's reports/.
    (tmp_path / "search").mkdir()
    shutil.copy(ROOT / "search" / "demo.toml", tmp_path / "search" / "demo.toml")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("KERNELFORGE_CACHE", str(tmp_path / "cache"))
    namespace = {"__name__": "readme_example"}
    exec(compile(readme_example(), "README.md (api-example)", "exec"), namespace)

    job, report, winner = namespace["job"], namespace["report"], namespace["winner"]
    assert [b.id for b in job.blocks] == ["attention/gpt_oss_decode"] and job.strategy.evaluations == 2
    dbs = list(scratch.glob("*/demo.db"))
    assert len(dbs) == 1 and job.storage == f"sqlite:///{dbs[0]}"
    assert not (tmp_path / "reports").exists()  # the API writes no report files
    row = report.block("attention/gpt_oss_decode").shapes[0]
    assert (winner.candidate_id, winner.params, winner.speedup) == (row.winner, row.params, row.speedup)
    assert winner.is_baseline == row.winner_is_baseline and winner.device == "interpret"
    printed = capsys.readouterr().out
    assert f"{row.shape} {row.winner} {row.speedup:.2f}x" in printed
    # The stored result of what was loaded passed verification there; results() reads the same.
    store = Store(job.storage_url, create=False)
    block = report.block("attention/gpt_oss_decode")
    assert store.find_result(winner.candidate_id, row.shape, job.dtype, block.env_key).ok
    assert api.results(job).block("attention/gpt_oss_decode").shapes == block.shapes
    # A rerun of the finished job searches nothing and reports the same winners.
    again = api.run(job)
    assert [r.winner for r in again.block("attention/gpt_oss_decode").shapes] == [r.winner for r in block.shapes]


@pytest.mark.interpreter
def test_the_readme_example_runs_as_a_saved_script(tmp_path):
    # Issue 32: saved to a file and run with python, unguarded, exactly as the README shows it. The
    # compile pool's spawned children must not re-run the script (multiprocessing's bootstrapping error).
    (tmp_path / "search").mkdir()
    shutil.copy(ROOT / "search" / "demo.toml", tmp_path / "search" / "demo.toml")
    script = tmp_path / "example.py"
    script.write_text(readme_example() + "\n", encoding="utf-8")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "KERNELFORGE_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT / "src"), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bootstrapping" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "geometric mean:" in done.stdout
    assert len(list(scratch.glob("*/demo.db"))) == 1  # one search, not one per spawned child


def test_the_package_reexports_the_api():
    assert kernelforge.load_winner is api.load_winner and kernelforge.run is api.run
    with pytest.raises(AttributeError):
        kernelforge.no_such_name


def test_open_job_overrides_and_their_errors():
    job = api.open_job("search/demo.toml", storage="sqlite:////tmp/x.db", evaluations=3,
                       blocks=["moe/gpt_oss_experts", "attention/gpt_oss_prefill"])
    assert job.storage_url == "sqlite:////tmp/x.db" and job.strategy.evaluations == 3
    assert [b.id for b in job.blocks] == ["attention/gpt_oss_prefill", "moe/gpt_oss_experts"]  # the job's order
    assert api.open_job(job, blocks="moe/gpt_oss_experts").blocks == job.blocks[1:]
    with pytest.raises(UserError, match="has blocks attention/gpt_oss_prefill, .*choose one or more"):
        api.open_job(job, blocks=["norm/fused_add_rmsnorm"])
    with pytest.raises(UserError, match="positive integer"):
        api.open_job(job, evaluations=0)
    with pytest.raises(UserError, match="SQLAlchemy URL"):
        api.open_job(job, storage="")
    with pytest.raises(UserError, match="no such job file or job name"):
        api.open_job("no-such-job")
    with pytest.raises(UserError, match=r"open_job\(blocks=123\): give a block id or a list of them"):
        api.open_job(job, blocks=123)


def test_the_api_takes_a_job_by_name_and_refuses_bad_arguments_before_writing(tmp_path, monkeypatch):
    db = tmp_path / "never.db"
    job = api.open_job("search/demo.toml", storage=f"sqlite:///{db}")
    with pytest.raises(UserError, match=r"run\(progress='jsonl'\): give a kernelforge.search.progress.Progress"):
        api.run(job, progress="jsonl")
    with pytest.raises(UserError, match="unknown device 'nonsense'; choose cuda, cuda:N, interpret or replay:PATH"):
        api.run(job, device="nonsense")
    with pytest.raises(UserError, match="device: 'cuda:x': cuda:N takes a GPU index"):
        api.run(job, device="cuda:x")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="device 'cuda': no CUDA GPU is visible to torch; on a CPU use the "
                                            "interpret device"):
            api.run(job, device="cuda")
    assert not db.exists()  # refused before the store was created
    with pytest.raises(UserError, match="job=3: give a Job from kernelforge.api.open_job, a job file or a job's"):
        api.results(3)
    with pytest.raises(UserError, match="no such job file or job name"):
        api.load_winner("no-such-job", "attention/gpt_oss_decode")


def test_load_winner_of_a_job_with_nothing_stored(tmp_path):
    job = api.open_job("search/demo.toml", storage=f"sqlite:///{tmp_path / 'missing.db'}")
    with pytest.raises(UserError, match="no results database at .*missing.db; run the search first"):
        api.load_winner(job, "attention/gpt_oss_decode")  # no database at all
    Store(f"sqlite:///{tmp_path / 'empty.db'}").close()
    job = api.open_job(job, storage=f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(UserError, match=r"attention/gpt_oss_decode of job demo has no verified winner at shape "
                                        r"smoke/full .*nothing is stored for it; run the job first"):
        api.load_winner(job, "attention/gpt_oss_decode")
    with pytest.raises(UserError, match="has no block 'norm/fused_add_rmsnorm'"):
        api.load_winner(job, "norm/fused_add_rmsnorm")
    with pytest.raises(UserError, match="no shape 'smoke/T9'.*smoke/full, smoke/window32"):
        api.load_winner(job, "attention/gpt_oss_decode", "smoke/T9")


def test_the_winners_metadata_is_the_stored_winners(tmp_path, catalog):
    # A GPU search's database (fixture rows "measured on an H200"): the winner is the variant.
    path, expected = synthetic.build(tmp_path, catalog)
    job = api.open_job(path, catalog=catalog)
    block = catalog.block("attention/gpt_oss_decode")
    shape = block.shapes("interactive")[1]
    winner = api.load_winner(job, block.id, shape.name, device="interpret", catalog=catalog)
    want = expected[(block.id, shape.name)]
    assert winner.candidate_id == want["winner"] != want["baseline"]
    assert winner.params == want["params"] and winner.params["NUM_KV_SPLITS"] == 16
    assert winner.speedup == pytest.approx(want["baseline_s"] / want["winner_s"])
    assert not winner.is_baseline and not winner.confirmed
    assert winner.template == "attention/gpt_oss_decode/baseline" and winner.shape == shape
    assert winner.timing_label == synthetic.ENV["timing"] and winner.dtype == torch.bfloat16
    assert (winner.device, winner.torch_device) == ("interpret", "cpu")
    assert winner.source == Store(job.storage_url, create=False).candidate(winner.candidate_id).source
    assert winner.candidate_id in repr(winner) and f"{winner.speedup:.3g}x" in repr(winner)
    if not torch.cuda.is_available():  # the job's own device is cuda
        with pytest.raises(UserError, match="no CUDA GPU is visible to torch; on a CPU use the interpret device"):
            api.load_winner(job, block.id, shape.name, catalog=catalog)
    # Inputs that are not this shape's are refused before the kernel runs (it was compiled for them).
    inputs = winner.make_inputs(seed=1)
    with pytest.raises(UserError, match=r"input k_cache is a tensor of shape \(1, 100, 8, 64\) in torch.bfloat16, but "
                                        r"this shape's is a tensor of shape \(1, 8800, 8, 64\)"):
        winner(**{**inputs, "k_cache": torch.zeros(1, 100, 8, 64, dtype=torch.bfloat16)})
    with pytest.raises(UserError, match="missing sinks; unknown x"):
        winner(**{k: v for k, v in inputs.items() if k != "sinks"}, x=1)
    with pytest.raises(UserError, match="input q is of type int"):
        winner(**{**inputs, "q": 1})
    with pytest.raises(UserError, match="make_inputs\\(distribution='nope'\\): choose one of normal"):
        winner.make_inputs(distribution="nope")


def test_a_winner_that_failed_verification_is_refused(tmp_path, catalog):
    path, expected = synthetic.build(tmp_path, catalog)
    job = api.open_job(path, catalog=catalog)
    shape = catalog.block("attention/gpt_oss_decode").shapes("interactive")[0]
    with Store(job.storage_url, create=False).engine.begin() as conn:
        conn.exec_driver_sql("UPDATE kf_results SET status = 'wrong', median_s = NULL WHERE shape = ?", (shape.name,))
    with pytest.raises(UserError, match=f"no verified winner at shape {shape.name} .*its status there is wrong"):
        api.load_winner(job, "attention/gpt_oss_decode", shape.name, device="interpret", catalog=catalog)


@pytest.mark.interpreter
def test_a_winner_with_an_in_place_input(tmp_path, monkeypatch, catalog):
    monkeypatch.setenv("KERNELFORGE_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "norm.toml"
    path.write_text('[job]\nname = "api-norm"\ndevice = "interpret"\ndtype = "bfloat16"\n'
                    '[strategy]\nname = "random"\nevaluations = 1\n'
                    '[[blocks]]\nid = "norm/fused_add_rmsnorm"\nshapes = "smoke/T3-H200"\n')
    job = api.open_job(path, storage=f"sqlite:///{tmp_path / 'norm.db'}", catalog=catalog)
    report = api.run(job, catalog=catalog, compile_ahead=False)
    winner = api.load_winner(job, "norm/fused_add_rmsnorm", catalog=catalog)
    assert winner.candidate_id == report.block("norm/fused_add_rmsnorm").shapes[0].winner
    inputs = winner.make_inputs(seed=5)
    pristine = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    got = winner(**inputs)
    want = winner.block.reference(**pristine)
    assert set(got) == set(want) == {"out", "residual"}
    assert got["residual"] is inputs["residual"]  # updated in place, as the kernel does
    assert not torch.equal(inputs["residual"], pristine["residual"])
    tol = winner.block.tolerance(winner.dtype, "cpu")
    for name, ref in want.items():
        assert got[name].dtype == torch.bfloat16
        torch.testing.assert_close(got[name].float(), ref, rtol=tol.rtol,
                                   atol=tol.atol * ref.pow(2).mean().sqrt().item())
