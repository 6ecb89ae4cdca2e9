"""``strategy-bench --markdown FILE``: one table per metric over every space, each figure the one the
bench's JSON of the same run holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelforge.cli.main import main
from kernelforge.strategies.bench.markdown import format_markdown
from markdown_tables import markdown_tables

PARAMS = {"bx": [16, 32, 48, 64, 96, 128], "tile": [1, 2, 3, 4], "flag": [0, 1]}


def write(path: Path, best_bx: int, device: str) -> Path:
    cache = {f"{bx},{tile},{flag}": {"time": 1.0 + abs(bx - best_bx) / 16 + abs(tile - 2) * 0.7 + flag * 0.3}
             for bx in PARAMS["bx"] for tile in PARAMS["tile"] for flag in PARAMS["flag"]}
    cache["128,4,1"] = {"time": "CompilationFailedConfig"}
    path.write_text(json.dumps({"device_name": device, "tune_params": PARAMS, "cache": cache}))
    return path


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    folder = tmp_path_factory.mktemp("caches")
    write(folder / "k_a.json", 64, "GPU A")
    write(folder / "k_b.json", 32, "GPU B")
    out = tmp_path_factory.mktemp("out")
    result = CliRunner().invoke(main, ["strategy-bench", str(folder), "--strategy", "auto,tpe,random", "--seeds", "3",
                                       "--budget", "30", "--jobs", "1", "--json", str(out / "b.json"),
                                       "--markdown", str(out / "b.md")])
    assert result.exit_code == 0, result.output
    return json.loads((out / "b.json").read_text()), (out / "b.md").read_text()


def interval(value: float, bounds: list[float]) -> str:
    return f"{value:.3f} ({bounds[0]:.3f}-{bounds[1]:.3f})"


def test_each_metric_is_one_table_over_the_spaces_with_the_runs_figures(bench):
    data, text = bench
    evaluations, checkpoints, areas, goals = markdown_tables(text)
    assert evaluations[0] == ["space", "feasible of grid", "auto", "tpe", "random", "auto / tpe", "95% interval"]
    assert [row[0] for row in evaluations[2:]] == ["k_a (GPU A)", "k_b (GPU B)"]
    expected_checkpoints = []
    for space, row, area_row in zip(data["spaces"], evaluations[2:], areas[2:]):
        by_name = {s["strategy"]: s for s in space["strategies"]}
        assert row[1] == f"{space['feasible']} of {space['grid_size']}"
        for name, cell in zip(("auto", "tpe", "random"), row[2:5]):
            median, hit = by_name[name]["median_evaluations"]["0.01"], by_name[name]["hit_rate"]["0.01"]
            assert cell == f"{'>30' if median > 30 else f'{median:g}'} ({round(100 * hit)}%)"
            assert area_row[1 + ("auto", "tpe", "random").index(name)] == interval(by_name[name]["area"],
                                                                                   by_name[name]["area_interval"])
        vs = by_name["auto"]["vs_tpe"]
        assert row[5] == f"{vs['bound']}{vs['fraction']:.2f}"
        assert row[6] == ("-" if vs["bound"] else f"{vs['interval'][0]:.2f}-{vs['interval'][1]:.2f}")
        for c in map(str, space["checkpoints"]):
            cells = [interval(by_name[n]["median_best_ratio_at"][c], by_name[n]["median_best_ratio_interval_at"][c])
                     for n in ("auto", "tpe", "random")]
            at = vs["at"].get(c)
            cells.append(interval(at["fraction"], at["interval"]) if at else "-")
            expected_checkpoints.append([row[0], c, *cells])
    assert checkpoints[0] == ["space", "evaluations", "auto", "tpe", "random", "auto / tpe"]
    assert checkpoints[2:] == expected_checkpoints and len(expected_checkpoints) == 4  # 10 and 25, two spaces
    assert areas[0] == ["space", "auto", "tpe", "random"]
    # The goals: auto's figures against tpe's and random's, from the same run.
    assert goals[0] == ["space", "strategy", "goal", "value", "tpe's or random's", "verdict"]
    for space in data["spaces"]:
        by_name = {s["strategy"]: s for s in space["strategies"]}
        mine = [row for row in goals[2:] if row[0].startswith(space["space"] + " ")]
        assert [row[1] for row in mine] == ["auto"] * 4  # three on evaluations, one at 25 (the budget is 30)
        assert mine[1][3:5] == [f"{round(100 * by_name[n]['hit_rate']['0.01'])}%" for n in ("auto", "tpe")]
        assert mine[3][3:5] == [f"{by_name[n]['median_best_ratio_at']['25']:.3f}" for n in ("auto", "tpe")]
        assert all(row[5] in ("met", "missed", "n/a") for row in mine)


def test_without_the_reference_no_fraction_is_shown_and_a_stop_is_said(tmp_path):
    write(tmp_path / "k_a.json", 64, "GPU A")
    out = tmp_path / "b.md"
    result = CliRunner().invoke(main, ["strategy-bench", str(tmp_path / "k_a.json"), "--strategy", "grid",
                                       "--seeds", "1", "--budget", "12", "--jobs", "1", "--stop", "--markdown", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "runs stopped within 1%: past a stop, the best at the stop" in text
    evaluations, checkpoints, areas = markdown_tables(text)
    assert evaluations[0] == ["space", "feasible of grid", "grid", "random"]
    assert checkpoints[0] == ["space", "evaluations", "grid", "random"] and areas[0] == ["space", "grid", "random"]
    assert format_markdown([]) == ""


def test_a_markdown_file_in_a_missing_folder_is_refused_before_any_run(tmp_path):
    write(tmp_path / "k_a.json", 64, "GPU A")
    result = CliRunner().invoke(main, ["strategy-bench", str(tmp_path / "k_a.json"), "--markdown",
                                       str(tmp_path / "nowhere" / "b.md")])
    assert result.exit_code != 0 and "--markdown" in result.output and "its folder does not exist" in result.output
    assert "Traceback" not in result.output
