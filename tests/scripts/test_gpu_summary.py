"""scripts/gpu_summary.py: the one table of a GPU-proof run, and its honesty about the interpreter;
scripts/gpu_check.py: its step budgets fit 7 minutes, and every step streams its results."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


summary = load("gpu_summary")
gpu_check = load("gpu_check")


def check_json(status: str = "ok", method: str = "cuda-events", device: str = "NVIDIA H200") -> dict:
    timing = {"median_s": 2e-4, "p20_s": 1.9e-4, "p80_s": 2.1e-4, "samples": 50, "method": method,
              "label": method, "joules_per_call": 0.05}
    return {"environment": {"device": "cuda", "device_name": device},
            "results": [{"block": "moe/gpt_oss_experts", "shape": "gpt-oss-120b/T64", "dtype": "bfloat16",
                         "status": status, "flops": 4e11, "bytes": 4e9, "timing": timing if status == "ok" else None}]}


def results_json(device: str = "cuda", p20: float = 1.2) -> dict:
    shape = {"shape": "gpt-oss-120b/T64", "baseline_s": 2e-4, "best_s": 1.6e-4, "speedup": 1.25,
             "speedup_p20": p20, "speedup_p80": 1.3, "confirmed": True, "baseline_j": 0.05, "best_j": 0.04,
             "significant": p20 > 1, "baseline_source": "vLLM tuned config E=128,N=2880",
             "roofline": {"baseline": {"percent": 40.0}, "winner": {"percent": 50.0}}}
    library = [{"shape": "gpt-oss-120b/T64", "implementation": "torch", "median_s": 3.2e-4}]
    return {"job": "gpu-proof-moe", "environments": {"k": {"device": device}},
            "blocks": [{"block": "moe/gpt_oss_experts", "candidates": 7, "shapes": [shape], "library": library}]}


def write_run(folder: Path, check: dict, results: dict | None) -> Path:
    (folder / "check").mkdir(parents=True)
    (folder / "check" / "1.json").write_text(json.dumps(check))
    if results is not None:
        (folder / results["job"]).mkdir()
        (folder / results["job"] / "results.json").write_text(json.dumps(results))
    return folder


def test_a_gpu_run_shows_speedup_roofline_and_energy(tmp_path, capsys):
    assert summary.main([str(write_run(tmp_path / "run", check_json(), results_json()))]) == 0
    out = capsys.readouterr().out
    assert "GPU proof on NVIDIA H200" in out and "DRY RUN" not in out
    assert "1.25x" in out and "1.20-1.30" in out and "win" in out
    assert "40%->50%" in out and "0.05 J->0.04 J" in out
    assert "2.00x" in out and "library: torch" in out  # 320 us of the library over the best 160 us
    assert "vLLM tuned config E=128,N=2880" in out


def test_pairs_below_one_are_no_win(tmp_path, capsys):
    summary.main([str(write_run(tmp_path / "run", check_json(), results_json(p20=0.97)))])
    assert "no win" in capsys.readouterr().out


def test_interpreter_results_are_labelled_even_without_the_flag(tmp_path, capsys):
    run = write_run(tmp_path / "run", check_json(method="interpreter-wall", device="Triton interpreter on x86_64"),
                    results_json(device="interpret"))
    assert summary.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "DRY RUN (interpreter)" in out and "not GPU speed" in out and "GPU proof" not in out
    assert "2000.0" not in out  # no TFLOP/s computed over interpreter time


@pytest.mark.parametrize("check, results", [(check_json(status="wrong"), results_json()), (check_json(), None)])
def test_a_failed_check_or_a_missing_search_fails(tmp_path, check, results):
    assert summary.main([str(write_run(tmp_path / "run", check, results))]) == 1


def proof_shapes(jobs) -> set[tuple[str, str]]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    shapes = set()
    for job in jobs:
        for block in tomllib.loads((ROOT / job).read_text())["blocks"]:
            shapes |= {(block["id"], name) for name in block["shapes"].split(",")}
    return shapes


def test_the_proof_plan_covers_the_mission_presets():
    shapes = proof_shapes(gpu_check.GPU_JOBS)
    assert ("attention/gpt_oss_prefill", "gpt-oss/8k1k/full") in shapes
    assert ("attention/gpt_oss_decode", "gpt-oss/8k1k/b8/full") in shapes
    assert {s for b, s in shapes if b == "moe/gpt_oss_experts"} == {f"gpt-oss-120b/T{t}" for t in (1, 64, 4096)}
    # The dry run mirrors every block of the real run.
    assert {b for b, _ in proof_shapes(gpu_check.DRY_JOBS)} == {b for b, _ in shapes}


def test_the_gpu_step_budgets_fit_seven_minutes_in_the_issues_order():
    """Every step's limit together is at most 420 s (wheels included), each proof job has its
    search step, and the order is: environment, ceilings, cross-check, searches, tests."""
    names = [step.name for step in gpu_check.GPU_STEPS]
    assert sum(step.budget for step in gpu_check.GPU_STEPS) <= 420
    searches = [f"search-{Path(job).stem}" for job in gpu_check.GPU_JOBS]
    assert all(name in names for name in searches)
    order = ["env", "wheels", "ceilings", "crosscheck", *searches, "tests"]
    assert sorted(order, key=names.index) == order


def test_each_step_streams_the_whole_folder_to_out(tmp_path, monkeypatch):
    """After every step $OUT holds the packed folder and the step records, so a run killed later
    has returned everything before."""
    import tarfile

    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("OUT", str(out))
    monkeypatch.setenv("KF_GPU_CHECK_DEST", str(tmp_path / "reports" / "run"))
    run = gpu_check.Run(dry=True, python="python3")
    run.run("env", ["python3", "-c", "print('gpu none')"])  # before the folder exists: logs kept for it
    run.set_folder("gpu")
    run.run("imports", ["python3", "-c", "print('hello from a step')"])
    with tarfile.open(out / "proof.tar.gz") as tar:
        names = tar.getnames()
        steps = tar.extractfile("run/steps.tsv").read().decode()
        log = tar.extractfile("run/logs/imports.log").read().decode()
    assert "run/logs/env.log" in names and "hello from a step" in log
    assert [line.split("\t")[0] for line in steps.splitlines()] == ["step", "env", "imports"]
    assert (out / "steps.tsv").read_text() == steps and "hello from a step" in (out / "proof.log").read_text()
    rc, _ = run.run("sandbox", ["python3", "-c", "import time; time.sleep(30)"], budget=1)
    assert rc == 124 and "timed out" in (out / "steps.tsv").read_text()
