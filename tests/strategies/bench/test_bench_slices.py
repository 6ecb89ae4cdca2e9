"""Slices of recorded spaces (``strategy-bench --fix NAME=V1,V2``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelforge.cli.main import main
from kernelforge.errors import UserError
from kernelforge.strategies.bench.recorded import load_kernel_tuner_cache
from kernelforge.strategies.bench.run import run_one
from kernelforge.strategies.bench.slices import Fix, parse_fix, slice_space, sliced
from kernelforge.strategies.transfer import warm_points

PARAMS = {"block": [16, 32, 48, 64], "shmem": [0, 1], "scale": [0.5, 1.0]}


def time_of(block: int, shmem: int, scale: float) -> float:
    # The whole space's optimum is block 64 without shared memory; with shmem=1 it is block 32.
    return abs(block - (32 if shmem else 64)) / 16 + 1.0 + shmem * 0.5 + scale


def write(path: Path, device: str = "Test GPU", drop: tuple = ()) -> Path:
    cache = {}
    for block in PARAMS["block"]:
        for shmem in PARAMS["shmem"]:
            for scale in PARAMS["scale"]:
                if (block, shmem, scale) in drop:
                    continue
                time = "CompilationFailedConfig" if (block, shmem) == (48, 1) else time_of(block, shmem, scale)
                cache[f"{block},{shmem},{scale}"] = {"time": time}
    path.write_text(json.dumps({"device_name": device, "tune_params": PARAMS, "cache": cache}))
    return path


@pytest.fixture
def space(tmp_path):
    return load_kernel_tuner_cache(write(tmp_path / "conv.json"))


def test_a_slice_holds_only_the_configurations_with_the_value(space):
    part = slice_space(space, [("shmem", "1")])
    assert part.name == "conv[shmem=1]" and part.device == space.device
    assert part.space.names == space.space.names  # every parameter kept: still a recording of the kernel
    assert part.space.values("shmem") == (1,) and part.space.values("block") == (16, 32, 48, 64)
    assert set(part.records) == {key for key in space.records if key[1] == 1}
    assert part.space.feasible == frozenset(part.records)
    assert part.records[(48, 1, 0.5)] == "CompilationFailedConfig"  # a recorded failure stays one
    assert part.optimum() == ({"block": 32, "shmem": 1, "scale": 0.5}, time_of(32, 1, 0.5))
    assert space.optimum()[0]["block"] == 64  # the whole space's optimum is elsewhere


def test_values_match_as_kernel_tuner_writes_them_or_as_the_same_number(space):
    assert slice_space(space, [("scale", "0.5")]).space.values("scale") == (0.5,)
    assert slice_space(space, [("scale", "1")]).records == slice_space(space, [("scale", "1.0")]).records
    with pytest.raises(UserError, match=r"--fix scale=2: conv has no such value of scale \(its values: 0.5, 1.0\)"):
        slice_space(space, [("scale", "2")])
    with pytest.raises(UserError, match=r"--fix tile=1: conv has no parameter tile \(its parameters: block, shmem, scale\)"):
        slice_space(space, [("tile", "1")])


def test_a_slice_with_no_recorded_time_is_refused(tmp_path):
    space = load_kernel_tuner_cache(write(tmp_path / "conv.json", drop=((48, 0, 0.5), (48, 0, 1.0))))
    with pytest.raises(UserError, match=r"--fix block=48: no configuration of conv with these values has a recorded time"):
        slice_space(space, [("block", "48")])  # left: block 48 with shmem=1, which failed to compile


def test_several_fixes_give_a_slice_per_combination(space, tmp_path):
    other = load_kernel_tuner_cache(write(tmp_path / "other.json", device="Other GPU"))
    parts = sliced([space, other], [Fix("shmem", ("0", "1")), Fix("scale", ("1.0",))])
    assert [part.name for part in parts] == ["conv[shmem=0,scale=1.0]", "conv[shmem=1,scale=1.0]",
                                             "other[shmem=0,scale=1.0]", "other[shmem=1,scale=1.0]"]
    assert all(len(part.records) == 4 for part in parts)
    assert sliced([space], []) == [space]


def test_spaces_without_the_parameter_are_left_out(space, tmp_path):
    path = tmp_path / "lone.json"
    path.write_text(json.dumps({"tune_params": {"x": [1, 2]}, "cache": {"1": {"time": 1.0}, "2": {"time": 2.0}}}))
    lone = load_kernel_tuner_cache(path)
    assert [part.name for part in sliced([space, lone], [Fix("shmem", ("1",))])] == ["conv[shmem=1]"]
    with pytest.raises(UserError, match=r"--fix: no space has the parameter\(s\) tile"):
        sliced([space, lone], [Fix("tile", ("1",))])
    with pytest.raises(UserError, match="names a parameter twice"):
        sliced([space], [Fix("shmem", ("1",)), Fix("shmem", ("0",))])


@pytest.mark.parametrize("text", ["", " ", "=1", "shmem=", "shmem=1,,0"])
def test_a_malformed_fix_is_refused_with_its_form(text):
    with pytest.raises(UserError, match=r"expected NAME, NAME=VALUE or NAME=V1,V2"):
        parse_fix(text)


def test_parse_fix_reads_name_and_values():
    assert parse_fix(" shmem = 0, 1") == Fix("shmem", ("0", "1"))
    with pytest.raises(UserError, match="--fix shmem=0,0: names 0 twice"):
        parse_fix("shmem=0,0")
    assert parse_fix(" shmem ") == Fix("shmem", ())  # every value


def test_a_fix_without_values_slices_each_space_at_each_of_its_own_timed_values(tmp_path):
    """``--fix NAME``: per space its own values of NAME (two recordings may list other values),
    leaving out a value none of whose configurations has a recorded time; named values are still
    refused there, as before."""
    wide = load_kernel_tuner_cache(write(tmp_path / "conv.json", drop=((48, 0, 0.5), (48, 0, 1.0))))
    params = {"block": [32, 64], "shmem": [0, 1], "scale": [1.0]}
    narrow_path = tmp_path / "narrow.json"
    narrow_path.write_text(json.dumps({"device_name": "Narrow GPU", "tune_params": params,
                                       "cache": {f"{b},{s},1.0": {"time": float(b + s)} for b in (32, 64) for s in (0, 1)}}))
    narrow = load_kernel_tuner_cache(narrow_path)
    parts = sliced([wide, narrow], [parse_fix("block")])
    # block 48 of conv has only a compile failure left: no slice; narrow has only 32 and 64.
    assert [part.name for part in parts] == ["conv[block=16]", "conv[block=32]", "conv[block=64]",
                                             "narrow[block=32]", "narrow[block=64]"]
    for part in parts:
        value = part.space.values("block")[0]
        whole = wide if part.name.startswith("conv") else narrow
        assert set(part.records) == {key for key in whole.records if key[0] == value}
    combined = sliced([wide], [parse_fix("shmem"), parse_fix("scale=1.0")])
    assert [part.name for part in combined] == ["conv[shmem=0,scale=1.0]", "conv[shmem=1,scale=1.0]"]
    with pytest.raises(UserError, match="--fix block=48: no configuration of conv"):
        sliced([wide], [parse_fix("block=48")])


def test_auto_and_tpe_search_a_slice(space):
    part = slice_space(space, [("shmem", "1")])
    for strategy in ("auto", "tpe"):
        run = run_one(part, strategy, seed=0, budget=len(part.records))
        assert run.best_time == part.optimum()[1]  # the whole slice told: its optimum, not the space's


def test_cli_benches_the_slices(tmp_path):
    folder = tmp_path / "spaces"
    folder.mkdir()
    write(folder / "conv.json")
    result = CliRunner().invoke(main, ["strategy-bench", str(folder), "--strategy", "grid", "--seeds", "1",
                                       "--budget", "8", "--jobs", "1", "--fix", "shmem=0,1"])
    assert result.exit_code == 0, result.output
    assert "== conv[shmem=0] on Test GPU: 8 feasible" in result.output
    assert "== conv[shmem=1] on Test GPU: 8 feasible" in result.output
    bad = CliRunner().invoke(main, ["strategy-bench", str(folder), "--fix", "shmem=2"])
    assert bad.exit_code != 0 and "--fix shmem=2: conv has no such value of shmem (its values: 0, 1)" in bad.output
    assert "Traceback" not in bad.output


def test_warm_from_never_benches_a_slice_of_its_source(tmp_path):
    folder = tmp_path / "spaces"
    folder.mkdir()
    source = write(folder / "conv.json")
    write(folder / "conv_other.json", device="Other GPU")
    result = CliRunner().invoke(main, ["strategy-bench", str(folder), "--strategy", "grid", "--seeds", "1",
                                       "--budget", "4", "--jobs", "1", "--warm-from", str(source), "--fix", "shmem=1"])
    assert result.exit_code == 0, result.output
    assert "== conv_other[shmem=1] on Other GPU" in result.output and "== conv[" not in result.output
    # The warm points of a slice are the source's best that the slice holds.
    target = slice_space(load_kernel_tuner_cache(folder / "conv_other.json"), [("shmem", "1")])
    points = warm_points(load_kernel_tuner_cache(source), target)
    assert points and all(point["shmem"] == 1 for point in points)
