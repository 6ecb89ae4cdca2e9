"""``kernelforge export``: vLLM fused_moe configs, a Triton dispatcher by token count, and the
winning sources, from a real MoE search in the interpreter and from a stored H200 search."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelforge.catalog import Catalog
from kernelforge.cli.main import main
from kernelforge.report.export.formats import GEMM2_KEYS, VLLM_KEYS, vllm_device_name, vllm_file_name
from kernelforge.report.collect import collect
from kernelforge.store.store import Store
import kf_synthetic_store as synthetic  # tests/fixtures (pytest pythonpath)
from kf_searches import searched

ROOT = Path(__file__).resolve().parents[3]
KERNELS = ROOT / "kernels"
PRESET_TOKENS = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096)


# The smallest real MoE search: one smoke shape (T 8, E 4, I 128), tuned per shape like vLLM, one
# evaluation beyond the baseline. (The whole smoke set takes about 50 s in the interpreter here.)
MOE_JOB = """
[job]
name = "moeexport"
device = "interpret"
dtype = "bfloat16"
tune = "per-shape"
seed = 2
storage = "sqlite:///{db}"

[strategy]
name = "tpe"
evaluations = 1

[[blocks]]
id = "moe/gpt_oss_experts"
shapes = "smoke/T8-E4"
"""


def export(job_file: Path, fmt: str, out: Path, *options: str):
    result = CliRunner().invoke(main, ["--kernels", str(KERNELS), "export", str(job_file), "--format", fmt,
                                       "--out", str(out), *options], catch_exceptions=False)
    return result


@pytest.fixture(scope="module")
def h200(tmp_path_factory):
    folder = tmp_path_factory.mktemp("h200export")
    catalog = Catalog.discover(KERNELS)
    path, expected = synthetic.build(folder, catalog)
    return {"path": path, "expected": expected, "catalog": catalog, "folder": folder}


@pytest.mark.interpreter
def test_vllm_export_of_a_real_moe_search(tmp_path):
    path = tmp_path / "moe.toml"
    job, catalog, store = searched(path, MOE_JOB.format(db=tmp_path / "moe.db"), KERNELS)
    data = collect(job, catalog, store)
    [row] = data.blocks[0].shapes
    env = data.environments[data.blocks[0].env_key]
    result = export(path, "vllm", tmp_path / "out")
    assert result.exit_code == 0, result.output
    name = vllm_file_name(4, 128, vllm_device_name(env))
    assert name.startswith("E=4,N=128,device_name=") and " " not in name
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([name, "kernelforge-export-vllm.json"])
    config = json.loads((tmp_path / "out" / name).read_text())
    assert list(config) == ["triton_version", "8"]  # vLLM's tuner writes the Triton version first
    assert config.pop("triton_version") == env["triton"]
    assert list(config["8"]) == list(VLLM_KEYS)
    assert all(type(v) is int for v in config["8"].values())
    # The exported values are the report's winner for T 8 (the baseline's point if nothing beat it);
    # a winner that configures GEMM2 apart cannot go into vLLM's one-configuration file: with only
    # the baseline beside it, the baseline's configuration is written, and the note says why.
    split = any(row.params[f"{k}2"] != row.params[k] for k in GEMM2_KEYS)
    shipped, shipped_id = (row.baseline_params, row.baseline) if split else (row.params, row.winner)
    assert config["8"] == {k: shipped[k] for k in VLLM_KEYS}
    assert ("exported the baseline's own configuration instead" in result.output) == split
    meta = json.loads((tmp_path / "out" / "kernelforge-export-vllm.json").read_text())
    [entry] = meta["entries"]
    assert entry["candidate"] == shipped_id and entry["token_count"] == "8"
    assert "Interpreter timings" in result.output  # the caveat is printed, not hidden


def test_vllm_export_of_a_stored_h200_search(h200, tmp_path):
    result = export(h200["path"], "vllm", tmp_path)
    assert result.exit_code == 0, result.output
    path = tmp_path / "E=128,N=2880,device_name=NVIDIA_H200.json"
    config = json.loads(path.read_text())
    assert config.pop("triton_version") == synthetic.ENV["triton"]
    assert list(config) == [str(t) for t in PRESET_TOKENS]
    for t in PRESET_TOKENS:
        want = h200["expected"][("moe/gpt_oss_experts", f"gpt-oss-120b/T{t}")]["params"]
        assert config[str(t)] == {k: want[k] for k in VLLM_KEYS}
    assert config["1"]["BLOCK_SIZE_M"] == 16 and config["4096"]["BLOCK_SIZE_M"] == 128  # per-T winners differ
    # vLLM's lookup: int keys, the closest token count to M.
    table = {int(k): v for k, v in config.items()}
    assert table[min(table, key=lambda m: abs(m - 5))] == config["8"]
    # Only MoE blocks go into fused_moe configs; the attention blocks are not exported there.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, "kernelforge-export-vllm.json"])


def test_triton_export_is_an_importable_module_with_configs(h200, tmp_path):
    import triton

    result = export(h200["path"], "triton", tmp_path)
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in tmp_path.iterdir())
    winners = sorted({f"{b.replace('/', '_')}__{e['winner']}.py" for (b, _), e in h200["expected"].items()})
    assert names == sorted(["attention_gpt_oss_decode.py", "attention_gpt_oss_prefill.py", "kernelforge-export-triton.json",
                            "moe_gpt_oss_experts.py", *winners])  # a dispatcher per block, a module per winner
    spec = importlib.util.spec_from_file_location("kf_export_moe", tmp_path / "moe_gpt_oss_experts.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["kf_export_moe"] = module  # triton.jit resolves globals through the module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("kf_export_moe", None)
    assert callable(module.run) and module.LOADED == {}  # the dispatcher; winners are imported on first use
    assert all(isinstance(c, triton.Config) for c in module.CONFIGS) and len(module.CONFIGS) == 2
    for t in PRESET_TOKENS:
        want = h200["expected"][("moe/gpt_oss_experts", f"gpt-oss-120b/T{t}")]["params"]
        config = module.CONFIGS[module.SHAPE_CONFIGS[f"gpt-oss-120b/T{t}"]]
        assert config.num_warps == want["num_warps"] and config.num_stages == want["num_stages"]
        assert config.kwargs == {k: v for k, v in want.items() if k not in ("num_warps", "num_stages")}
    # Token-count dispatch, as vLLM looks configs up: the nearest tuned T (5 -> 8, 3000 -> 2048, 1e6 -> 4096).
    for m, t in ((1, 1), (5, 8), (3000, 2048), (10 ** 6, 4096)):
        assert module.config_for(m, E=128, I=2880) is module.CONFIGS[module.SHAPE_CONFIGS[f"gpt-oss-120b/T{t}"]]
    assert module.config_for(5, E=128, I=2880).kwargs["BLOCK_SIZE_M"] == 16  # the decode winner
    assert module.config_for(3000, E=128, I=2880).kwargs["BLOCK_SIZE_M"] == 128
    with pytest.raises(ValueError):
        module.config_for(8, E=7)
    # Each token count goes to its own shape's winner (the decode winner is not the prefill one).
    for m, t in ((5, 8), (3000, 2048)):
        assert module.winner_for(m, E=128, I=2880) == h200["expected"][("moe/gpt_oss_experts", f"gpt-oss-120b/T{t}")]["winner"]
    assert module.winner_for(5, E=128, I=2880) != module.winner_for(3000, E=128, I=2880)


def test_source_export_writes_the_stored_winning_sources(h200, tmp_path):
    result = export(h200["path"], "source", tmp_path)
    assert result.exit_code == 0, result.output
    store = Store(f"sqlite:///{h200['folder'] / 'h200.db'}", create=False)
    winners = {(b, e["winner"]) for (b, _), e in h200["expected"].items()}
    for block, cid in winners:
        path = tmp_path / f"{block.replace('/', '_')}__{cid}.py"
        assert path.read_text() == store.candidate(cid).source
    assert len([p for p in tmp_path.iterdir() if p.suffix == ".py"]) == len(winners) == 4
    # Exported again after a winner changed: the earlier winner's file goes (a loader reads every
    # file of the folder), a file the export never wrote stays.
    (tmp_path / "notes.py").write_text("# mine")
    meta = json.loads((tmp_path / "kernelforge-export-source.json").read_text())
    assert meta["files"] == sorted(p.name for p in tmp_path.iterdir() if "__" in p.name)
    old = tmp_path / "attention_gpt_oss_decode__0123456789abcdef.py"
    old.write_text("# an earlier winner")
    (tmp_path / "kernelforge-export-source.json").write_text(json.dumps({**meta, "files": [*meta["files"], old.name]}))
    result = export(h200["path"], "source", tmp_path)
    assert result.exit_code == 0, result.output
    assert not old.exists() and (tmp_path / "notes.py").exists() and "removed 1 file(s)" in result.output
    assert len([p for p in tmp_path.iterdir() if "__" in p.name]) == 4


def test_vllm_export_of_a_job_without_moe_is_a_clear_error(h200, tmp_path):
    text = h200["path"].read_text()
    attention_only = tmp_path / "attn.toml"
    attention_only.write_text(text[: text.index('[[blocks]]\nid = "moe/gpt_oss_experts"')])
    result = export(attention_only, "vllm", tmp_path / "out")
    assert result.exit_code == 2
    assert "has no MoE block" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_vllm_export_of_a_winner_with_its_own_gemm2_configuration(tmp_path):
    """vLLM's fused_moe config holds one configuration for both GEMMs: a winner that configures
    GEMM2 apart is not written there (it would be shipped half-applied); the fastest measured
    candidate with one configuration is, and the note says why."""
    import dataclasses
    import time as clock

    from kernelforge.candidate import Candidate

    catalog = Catalog.discover(KERNELS)
    path, expected = synthetic.build(tmp_path, catalog, name="split")
    template = catalog.baseline("moe/gpt_oss_experts")
    shape = "gpt-oss-120b/T64"
    won = expected[("moe/gpt_oss_experts", shape)]
    split = Candidate.from_template(template, {**won["params"], "BLOCK_SIZE_N2": 128 if won["params"]["BLOCK_SIZE_N2"] != 128 else 64},
                                    origin="optuna")
    store = Store(f"sqlite:///{tmp_path / 'split.db'}")
    store.add_candidate(split, "split")
    like = next(r for r in store.results(block="moe/gpt_oss_experts") if r.shape == shape and r.candidate_id == won["winner"])
    store.add_result(dataclasses.replace(like, candidate_id=split.id, median_s=0.5 * like.median_s,
                                         p20_s=0.5 * like.p20_s, p80_s=0.5 * like.p80_s, created=clock.time()))
    store.close()
    result = export(path, "vllm", tmp_path / "out")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "out" / "E=128,N=2880,device_name=NVIDIA_H200.json").read_text())
    # The split winner is not written; the fastest single-configuration candidate (the previous
    # winner) stands for T 64, and the note says so.
    assert config["64"] == {k: won["params"][k] for k in VLLM_KEYS}
    output = " ".join(result.output.split())  # the console wraps long notes
    assert "GEMM2 apart from GEMM1" in output and "BLOCK_SIZE_N2=" in output
    assert f"exported the fastest single-configuration candidate {won['winner']}" in output
    # With SGLang's separate down-projection file, the split winner itself ships: GEMM1 in the
    # up file, its own GEMM2 configuration (BLOCK_SIZE_M shared) in the _down file.
    result = export(path, "vllm", tmp_path / "sgl", "--layout", "sglang", "--split-down")
    assert result.exit_code == 0, result.output
    folder = tmp_path / "sgl" / "configs" / "triton_3_4_0"
    up = json.loads((folder / "E=128,N=2880,device_name=NVIDIA_H200.json").read_text())
    down = json.loads((folder / "E=128,N=2880,device_name=NVIDIA_H200_down.json").read_text())
    assert up["64"] == {k: split.point[k] for k in VLLM_KEYS}
    assert down["64"] == {k: split.point[GEMM2_KEYS.get(k, k)] for k in VLLM_KEYS}
    assert down["64"]["BLOCK_SIZE_N"] != up["64"]["BLOCK_SIZE_N"]


def test_a_shape_where_the_winner_was_measured_slower_ships_its_baseline(h200):
    from dataclasses import replace

    from kernelforge.job import load_job
    from kernelforge.report.export.entry import shipped

    job = load_job(h200["path"], h200["catalog"])
    store = Store(f"sqlite:///{h200['folder'] / 'h200.db'}", create=False)
    data = collect(job, h200["catalog"], store)
    block = next(b for b in data.blocks if any(not r.winner_is_baseline for r in b.shapes))
    row = next(r for r in block.shapes if not r.winner_is_baseline)
    slower = replace(row, speedup=0.82, speedup_p20=0.79, speedup_p80=0.86, confirmed=True)
    doctored = replace(data, blocks=tuple(replace(b, shapes=tuple(slower if r is row else r for r in b.shapes))
                                          if b is block else b for b in data.blocks))
    out, notes = shipped(doctored, store)
    now = next(r for b in out.blocks if b.block == block.block for r in b.shapes if r.shape == row.shape)
    assert now.winner == row.baseline and now.winner_is_baseline and now.params == row.baseline_params
    assert notes == [f"{block.block} {row.shape}: the winner {row.winner} was measured slower than the shape's "
                     "baseline (0.790-0.860x); exported the baseline there"]
    assert shipped(data, store)[1] == [] and shipped(data, store)[0] == data  # nothing slower: nothing changes
