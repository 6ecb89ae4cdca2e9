"""``benchmarks/anytime_variants.py``, the development loop of ``auto``'s anytime curve: it runs
(slices of) recorded spaces with the variant's settings in every worker process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "anytime_variants.py"


def write_space(path: Path) -> Path:
    params = {"bx": [16, 32, 48, 64], "tile": [1, 2, 3, 4], "flag": [0, 1]}
    cache = {f"{bx},{tile},{flag}": {"time": 1.0 + abs(bx - 32) / 16 + abs(tile - 2) + flag}
             for bx in params["bx"] for tile in params["tile"] for flag in params["flag"]}
    path.write_text(json.dumps({"device_name": "Test GPU", "tune_params": params, "cache": cache}))
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


def test_an_unknown_setting_is_refused():
    done = run("none.json", "--set", "no_such_thing=1")
    assert done.returncode == 2 and "AutoStrategy has no attribute 'no_such_thing'" in done.stderr
