"""``kernelforge strategy-bench PATH``: folder mode, JSON output, parallel runs, error messages."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelforge.cli.main import main
from kernelforge.errors import UserError
from kernelforge.strategies.bench.run import bench_spaces, default_strategies
from kernelforge.strategies.bench.report import format_summary, to_json
from kernelforge.strategies.bench.recorded import cache_files, load_kernel_tuner_cache

PARAMS = {"a": [1, 2, 3], "b": [0.5, 1.0]}


def write_cache(path: Path, records: dict) -> Path:
    text = json.dumps({"device_name": "Test GPU", "tune_params": PARAMS, "cache": records})
    path.write_bytes(gzip.compress(text.encode()) if path.name.endswith(".gz") else text.encode())
    return path


@pytest.fixture
def folder(tmp_path):
    write_cache(tmp_path / "alpha.json", {f"{a},{b}": {"time": float(a + 10 * b)} for a in (1, 2, 3) for b in (0.5, 1.0)})
    write_cache(tmp_path / "beta.json.gz", {"1,0.5": {"time": "RuntimeFailedConfig"}, "2,1.0": {"time": 3.0},
                                             "3,0.5": {"time": 1.5}})
    (tmp_path / "notes.txt").write_text("not a cache")
    return tmp_path


def figures(results):
    """Everything a bench measures except the times (which depend on the machine)."""
    out = []
    for result in results:
        for row in result.rows:
            out.append((result.name, row.strategy, dict(row.median_evaluations), dict(row.hit_rate),
                        dict(row.median_best_ratio_at), row.median_free_tells,
                        [(r.seed, r.evaluations, r.free_tells, r.best_time, dict(r.reached), dict(r.best_at))
                         for r in row.runs]))
    return out


def test_a_file_cut_off_or_with_one_time_is_replayed_and_said_to_be(folder):
    text = (folder / "alpha.json").read_text()
    (folder / "alpha.json").write_text(text[: text.index('"3,1.0"')])  # an interrupted run's file
    result = CliRunner().invoke(main, ["strategy-bench", str(folder), "--strategy", "grid", "--seeds", "1",
                                       "--budget", "10", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    assert f"note: {folder / 'alpha.json'} ends early" in result.output and "its 5 complete records" in result.output
    assert "beta.json.gz ends early" not in result.output
    assert "== alpha on Test GPU: 5 feasible" in result.output
    write_cache(folder / "beta.json.gz", {"1,0.5": {"time": 1e20}, "2,1.0": {"time": 1e20}})
    result = CliRunner().invoke(main, ["strategy-bench", str(folder / "beta.json.gz"), "--strategy", "grid",
                                       "--seeds", "1", "--budget", "10", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    assert "beta.json.gz every recorded time is 1e+20 ms: the first evaluation is always the optimum" in result.output


def test_folder_lists_every_cache_file(folder):
    assert [p.name for p in cache_files(folder)] == ["alpha.json", "beta.json.gz"]
    assert cache_files(folder / "alpha.json") == [folder / "alpha.json"]


def test_folder_mode_prints_every_space_and_writes_json(folder, tmp_path):
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "bench.json"  # not in the benched folder: it would be read as a recording
    result = CliRunner().invoke(main, ["strategy-bench", str(folder), "--strategy", "grid", "--seeds", "2",
                                       "--budget", "30", "--jobs", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "== alpha on Test GPU: 6 feasible" in result.output
    assert "== beta on Test GPU: 3 feasible (recorded) configurations of a 6-point grid" in result.output
    assert "best/opt @25" in result.output and "ask ms p95" in result.output
    data = json.loads(out.read_text())
    assert data["version"] == 1 and data["thresholds"] == [0.01, 0.05, 0.1]
    spaces = {s["space"]: s for s in data["spaces"]}
    assert set(spaces) == {"alpha", "beta"}
    beta = spaces["beta"]
    assert (beta["device"], beta["feasible"], beta["grid_size"], beta["optimum_ms"]) == ("Test GPU", 3, 6, 1.5)
    assert (beta["budget"], beta["seeds"], beta["checkpoints"]) == (30, 2, [10, 25])
    assert beta["optimum_point"] == {"a": 3, "b": 0.5}
    assert [s["strategy"] for s in beta["strategies"]] == ["grid", "random"]
    grid = beta["strategies"][0]
    # Grid order: (1,0.5) failed (an evaluation), (2,1.0)=3.0, (3,0.5)=1.5 the optimum at evaluation 3.
    assert grid["median_evaluations"] == {"0.01": 3, "0.05": 3, "0.1": 3}
    assert grid["hit_rate"] == {"0.01": 1.0, "0.05": 1.0, "0.1": 1.0}
    assert grid["median_best_ratio_at"] == {"10": 1.0, "25": 1.0}
    assert {"ask_ms_median", "ask_ms_p95", "median_free_tells", "seconds"} <= set(grid)
    run = grid["runs"][0]
    assert run["reached"] == {"0.01": 3, "0.05": 3, "0.1": 3}
    assert run["best_ms_at"] == {"10": 1.5, "25": 1.5} and run["evaluations"] == 3 and run["best_ms"] == 1.5
    assert [r["seed"] for r in grid["runs"]] == [0, 1]
    assert "vs_tpe" not in grid  # tpe was not benched


def test_json_has_no_infinities_when_nothing_succeeds(tmp_path):
    records = {f"{a},{b}": {"time": "CompilationFailedConfig"} for a in (1, 2, 3) for b in (0.5, 1.0)}
    records["3,1.0"] = {"time": 7.0}
    space = load_kernel_tuner_cache(write_cache(tmp_path / "needle.json", records))
    (result,) = bench_spaces([space], ["grid"], seeds=1, budget=2)  # grid order reaches 3,1.0 last
    grid = to_json([result])["spaces"][0]["strategies"][0]
    assert grid["median_best_ratio"] is None and grid["median_evaluations"]["0.01"] == 3  # budget + 1
    json.dumps(to_json([result]), allow_nan=False)


def test_summary_compares_with_tpe(folder):
    result = CliRunner().invoke(main, ["strategy-bench", str(folder / "alpha.json"), "--strategy", "tpe,grid",
                                       "--seeds", "1", "--budget", "3", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    summary = result.output.split("fraction of tpe's")[1]
    assert "alpha: grid " in summary and "random " in summary and "hit " in summary


def test_the_fraction_carries_its_interval(folder):
    spaces = [load_kernel_tuner_cache(folder / "alpha.json")]
    (result,) = bench_spaces(spaces, ["tpe", "grid"], seeds=3, budget=6, jobs=1)
    grid = next(s for s in to_json([result])["spaces"][0]["strategies"] if s["strategy"] == "grid")
    vs = grid["vs_tpe"]
    low, high = vs["interval"]
    assert vs["bound"] == "" and low <= vs["fraction"] <= high
    assert f"grid {vs['fraction']:.2f}x (95% {low:.2f}-{high:.2f}; hit" in format_summary([result])


def test_jobs_do_not_change_the_figures(folder):
    spaces = [load_kernel_tuner_cache(p) for p in cache_files(folder)]
    one = list(bench_spaces(spaces, ["tpe", "grid"], seeds=2, budget=4, jobs=1))
    two = list(bench_spaces(spaces, ["tpe", "grid"], seeds=2, budget=4, jobs=2))
    assert figures(one) == figures(two)
    assert [r.name for r in two] == ["alpha", "beta"]


def test_default_strategies_include_random_and_tpe():
    names = default_strategies()
    assert names[-2:] == ("tpe", "random")


@pytest.mark.parametrize("args, message", [
    (["{tmp}/missing"], "missing: no such file or folder"),
    (["{tmp}/empty"], "empty: the folder holds no cache file"),
    (["{tmp}/alpha.json", "--strategy", "nope"], "unknown strategy 'nope'"),
    (["{tmp}/alpha.json", "--strategy", ","], "--strategy names no strategy"),
    (["{tmp}/alpha.json", "--json", "{tmp}/no/such/out.json"], "its folder does not exist"),
    (["{tmp}/alpha.json", "--json", "{tmp}/alpha.json"], "is a recording this bench reads"),
    (["{tmp}/alpha.json", "--warm-from", "{tmp}/beta.json.gz", "--markdown", "{tmp}/beta.json.gz"],
     "is a recording this bench reads"),
    (["{tmp}", "--json", "{tmp}/results.json"], "whose every *.json and *.json.gz the bench reads"),
    (["{tmp}/alpha.json", "--json", "{tmp}/o.json", "--markdown", "{tmp}/o.json"], "name the same file"),
    (["{tmp}/alpha.json", "--markdown", ""], "--markdown: the file name is empty"),
    (["{tmp}/alpha.json", "--markdown", "/proc/kernelforge-bench.md"], "cannot write it"),
    (["{tmp}/alpha.json", "--first-seed", "4294967296"], "the last seed, 4294967296, is past 4294967295"),
    (["{tmp}/one.json"], "one: only one configuration is recorded"),
])
def test_cli_errors_are_one_line(folder, args, message):
    (folder / "empty").mkdir()
    write_cache(folder / "one.json", {"1,0.5": {"time": 1.0}})
    recordings = {p: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    args = [a.replace("{tmp}", str(folder)) for a in args]
    result = CliRunner().invoke(main, ["strategy-bench", *args, "--seeds", "1", "--budget", "2"])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output
    # Refused before any run: every recording as it was, and no result file.
    assert {p: p.read_bytes() for p in folder.iterdir() if p.is_file()} == recordings


def test_unknown_name_is_refused_before_any_run(folder):
    spaces = [load_kernel_tuner_cache(folder / "alpha.json")]
    with pytest.raises(UserError, match="unknown strategy"):
        list(bench_spaces(spaces, ["grid", "nope"], seeds=1, budget=2))


def _runs(result):
    return [(row.strategy, r.seed, r.evaluations, dict(r.reached), r.best_time) for row in result.rows for r in row.runs]


@pytest.fixture
def wide(tmp_path):
    """A 12x10 grid, every point recorded, one optimum: runs need a few dozen evaluations."""
    params = {"a": list(range(12)), "b": list(range(10))}
    records = {f"{a},{b}": {"time": 1.0 + abs(a - 7) + 0.5 * abs(b - 3) + 0.01 * ((a * b) % 5)}
               for a in params["a"] for b in params["b"]}
    path = tmp_path / "wide.json"
    path.write_text(json.dumps({"device_name": "Test GPU", "tune_params": params, "cache": records}))
    return load_kernel_tuner_cache(path)


def test_stop_keeps_every_threshold_and_ends_at_one_percent(wide):
    (full,) = bench_spaces([wide], ["auto", "random"], seeds=3, budget=120, jobs=1)
    (stopped,) = bench_spaces([wide], ["auto", "random"], seeds=3, budget=120, jobs=1, stop=True)
    assert stopped.stopped and not full.stopped
    for whole, cut in zip(_runs(full), _runs(stopped)):
        assert whole[:2] == cut[:2] and whole[3] == cut[3]  # same strategy, seed, evaluations to each threshold
        first = whole[3][0.01]
        assert first is not None and cut[2] == first < whole[2]  # it ended right there, the full run went on
    assert [r.median_evaluations for r in full.rows] == [r.median_evaluations for r in stopped.rows]
    assert to_json([stopped])["spaces"][0]["stopped_at_1pct"] is True


def test_first_seed_runs_the_same_runs_as_a_longer_bench(wide):
    (both,) = bench_spaces([wide], ["auto"], seeds=2, budget=40, jobs=1)
    (later,) = bench_spaces([wide], ["auto"], seeds=1, budget=40, jobs=2, first_seed=1)
    assert [run for run in _runs(both) if run[1] == 1] == _runs(later)
    with pytest.raises(ValueError):
        list(bench_spaces([wide], ["auto"], seeds=1, budget=40, first_seed=-1))


def test_cli_first_seed_and_stop(folder, tmp_path):
    out = tmp_path / "out.json"
    result = CliRunner().invoke(main, ["strategy-bench", str(folder / "alpha.json"), "--strategy", "grid",
                                       "--seeds", "2", "--first-seed", "3", "--stop", "--budget", "6", "--jobs", "1",
                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "seeds 3-4; each run stopped once within 1%" in result.output
    space = json.loads(out.read_text())["spaces"][0]
    assert space["stopped_at_1pct"] is True
    assert [r["seed"] for r in space["strategies"][0]["runs"]] == [3, 4]
