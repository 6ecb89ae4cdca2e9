"""scripts/gpu_summary.py: the one table of a GPU-proof run, and its honesty about the interpreter;
scripts/gpu_check.sh's step budgets fit the 9 minutes."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


summary = load("gpu_summary")
proof_plan = load("proof_plan")


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
    return {"job": "h200-proof-moe-t64", "environments": {"k": {"device": device}},
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


def test_the_proof_plan_covers_the_mission_presets():
    jobs = sorted(str(p) for p in (ROOT / "search").glob("h200-proof*.toml"))
    shapes = {(block, shape) for _, block, shape in proof_plan.plan(jobs)}
    assert ("attention/gpt_oss_prefill", "gpt-oss/8k1k/full") in shapes
    assert ("attention/gpt_oss_decode", "gpt-oss/8k1k/b8/full") in shapes
    assert {s for b, s in shapes if b == "moe/gpt_oss_experts"} == {f"gpt-oss-120b/T{t}" for t in (1, 64, 4096)}


def test_the_gpu_step_budgets_fit_nine_minutes():
    """Sum of every step's `timeout` on the GPU path (one check per planned shape, one search and
    one report per job) is at most 540 s, so the whole proof ends within 9 minutes."""
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    gpu = script.split("reports/h200-", 1)[1].split("\nfi\n", 1)[0]
    flat = dict(re.findall(r"\bB_([A-Z]+)=(\d+)", gpu))
    maps = {m: dict(re.findall(r"\[([^\]]+)\]=(\d+)", body)) for m, body in re.findall(r"B_(\w+)_OF=\(([^)]*)\)", gpu)}
    jobs = re.search(r"JOBS=\(([^)]*)\)", gpu).group(1).split()
    rows = proof_plan.plan([str(ROOT / j) for j in jobs])
    names = list(dict.fromkeys(name for name, _, _ in rows))
    total = sum(int(flat[k]) for k in ("ENV", "WHEELS", "IMPORTS", "TESTS", "SUMMARY"))
    total += sum(int(maps["CHECK"].get(shape, flat["CHECK"])) for _, _, shape in rows)
    total += sum(int(maps["SEARCH"].get(name, flat["SEARCH"])) + int(flat["REPORT"]) for name in names)
    assert len(names) == len(jobs) and total <= 540
