"""``benchmarks/anytime_variants.py``, the development loop of ``auto``'s anytime curve: it runs
(slices of) recorded spaces with the variant's settings in every worker process."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "anytime_variants.py"


def write_space(path: Path, device: str = "Test GPU", best_tile: int = 2) -> Path:
    params = {"bx": [16, 32, 48, 64], "tile": [1, 2, 3, 4], "flag": [0, 1]}
    cache = {f"{bx},{tile},{flag}": {"time": 1.0 + abs(bx - 32) / 16 + abs(tile - best_tile) + flag}
             for bx in params["bx"] for tile in params["tile"] for flag in params["flag"]}
    path.write_text(json.dumps({"device_name": device, "tune_params": params, "cache": cache}))
    return path


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_a_variant_runs_on_slices_in_parallel_and_records_each(tmp_path):
    space = write_space(tmp_path / "toy.json")
    out = tmp_path / "variants.jsonl"
    done = run(str(space), "--seeds", "3", "--budget", "12", "--jobs", "2", "--stop", "--fix", "flag=0,1",
               "--set", "start=4", "--json", str(out))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["toy[flag=0]", "toy[flag=1]"]
    assert all("auto start=4" in line and "to1%" in line for line in lines)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["space"] for r in records] == ["toy[flag=0]", "toy[flag=1]"]
    assert all(r["seeds"] == [0, 1, 2] and len(r["to_1pct"]) == 3 for r in records)


def test_a_warm_start_runs_as_the_strategy_bench_runs_it(tmp_path):
    """``--warm-from``: only the other recordings of the kernel run (not the source itself), each
    run warm-started exactly as the strategy bench's (the same evaluations to 1%, seed by seed)."""
    from kernelforge.strategies.bench.recorded import load_kernel_tuner_cache
    from kernelforge.strategies.bench.run import run_one
    from kernelforge.strategies.transfer import rank_scores, warm_points

    source = write_space(tmp_path / "toy_a.json", device="GPU A", best_tile=3)
    target = write_space(tmp_path / "toy_b.json", device="GPU B", best_tile=2)
    out = tmp_path / "warm.jsonl"
    done = run(str(source), str(target), "--seeds", "4", "--budget", "20", "--stop", "--warm-from", str(source),
               "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["toy_b"]
    record = json.loads(out.read_text())
    assert record["warm_from"] == str(source) and "warm from toy_a" in record["variant"]
    a, b = load_kernel_tuner_cache(source), load_kernel_tuner_cache(target)
    expected = [run_one(b, "auto", seed, 20, stop=True, first=warm_points(a, b), transfer=rank_scores(a, b)).reached[0.01]
                for seed in range(4)]
    cold = [run_one(b, "auto", seed, 20, stop=True).reached[0.01] for seed in range(4)]
    assert record["to_1pct"] == expected != cold


def test_a_shuffled_source_keeps_its_configurations_and_times_and_loses_their_order(tmp_path):
    """``--shuffle-source SEED``: the warm start from a recording whose times were permuted (a source
    that says nothing), as the strategy bench would run one from such a file."""
    spec = importlib.util.spec_from_file_location("kf_test_anytime_variants", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    shuffled = script.shuffled
    from kernelforge.strategies.bench.recorded import load_kernel_tuner_cache
    from kernelforge.strategies.bench.run import run_one
    from kernelforge.strategies.transfer import warm_start

    source = write_space(tmp_path / "toy_a.json", device="GPU A", best_tile=3)
    a = dataclasses.replace(load_kernel_tuner_cache(source), records={
        **load_kernel_tuner_cache(source).records, (16, 1, 0): "RuntimeFailedConfig"})
    mixed = shuffled(a, 1)
    assert mixed.records.keys() == a.records.keys() and mixed.records[(16, 1, 0)] == "RuntimeFailedConfig"
    times = sorted(v for v in a.records.values() if isinstance(v, float))
    assert sorted(v for v in mixed.records.values() if isinstance(v, float)) == times
    assert mixed.records != a.records and shuffled(a, 1) == mixed and "shuffled, seed 1" in mixed.device

    target = write_space(tmp_path / "toy_b.json", device="GPU B", best_tile=2)
    out = tmp_path / "warm.jsonl"
    done = run(str(target), "--seeds", "3", "--budget", "20", "--stop", "--warm-from", str(source),
               "--shuffle-source", "5", "--json", str(out))
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert record["shuffle_source"] == 5 and "shuffled 5" in record["variant"]
    b = load_kernel_tuner_cache(target)
    warm = warm_start(shuffled(load_kernel_tuner_cache(source), 5), b)
    assert record["to_1pct"] == [run_one(b, "auto", seed, 20, stop=True, first=warm.first,
                                         transfer=warm.transfer).reached[0.01] for seed in range(3)]
    assert run(str(target), "--shuffle-source", "5").returncode == 2


def test_a_warm_start_from_another_kernel_is_one_clear_message(tmp_path):
    space = write_space(tmp_path / "toy.json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"device_name": "GPU C", "tune_params": {"n": [1, 2]},
                                 "cache": {"1": {"time": 1.0}, "2": {"time": 2.0}}}))
    done = run(str(space), "--warm-from", str(other))
    message = " ".join(done.stderr.split())
    assert done.returncode == 2 and "--warm-from" in message and "no space to bench is another recording" in message
    assert "Traceback" not in done.stderr


def test_an_unknown_setting_is_refused():
    done = run("none.json", "--set", "no_such_thing=1")
    assert done.returncode == 2 and "AutoStrategy has no attribute 'no_such_thing'" in done.stderr
