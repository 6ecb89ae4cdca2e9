"""The exported fused_moe config files, read back by a restatement of vLLM's and SGLang's loaders.

The two readers below restate (they do not import: neither project is installed here) what the
loaders do with a config folder, so a file they would not find or not parse fails here:

- vLLM, ``vllm/model_executor/layers/fused_moe/fused_moe.py``: ``get_config_file_name`` (the name
  from E, N, the device name with spaces -> ``_`` and any ``H200`` word -> ``NVIDIA_H200``, the
  dtype part), ``get_moe_configs`` (json.load, drop ``triton_version``, ``int(key)`` for every
  other key) and ``try_get_optimal_moe_config`` (the config of the token count nearest M,
  ``min(keys, key=lambda x: abs(x - M))``), whose values the fused_moe kernel reads as the int
  fields BLOCK_SIZE_M/N/K, GROUP_SIZE_M, num_warps, num_stages (``benchmark_moe.py`` sort_config).
- SGLang, ``python/sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py``:
  ``get_config_file_name`` (no H200 rule, ``_down`` for the down projection) and
  ``get_moe_configs`` (``configs/triton_<x_y_z>/<name>``, ``int(key)`` for every key).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelforge.catalog import Catalog
from kernelforge.cli.main import main
from kernelforge.report.export.vllm_configs import sglang_device_name, vllm_device_name
import kf_synthetic_store as synthetic  # tests/fixtures (pytest pythonpath)

ROOT = Path(__file__).resolve().parents[3]
KERNELS = ROOT / "kernels"
FIELDS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def vllm_name(E: int, N: int, torch_device_name: str, dtype: str | None) -> str:
    """vLLM's get_config_file_name, restated."""
    device = torch_device_name.replace(" ", "_")
    if "H200" in device.split("_"):
        device = "NVIDIA_H200"
    return f"E={E},N={N},device_name={device}" + (f",dtype={dtype}" if dtype else "") + ".json"


def vllm_load(folder: Path, E: int, N: int, torch_device_name: str, dtype: str | None) -> dict[int, dict]:
    """vLLM's get_moe_configs with VLLM_TUNED_CONFIG_FOLDER=folder, restated."""
    path = folder / vllm_name(E, N, torch_device_name, dtype)
    assert path.exists(), f"vLLM would not find {path.name}; the folder holds {sorted(p.name for p in folder.iterdir())}"
    table = json.loads(path.read_text())
    table.pop("triton_version", None)
    return {int(key): value for key, value in table.items()}


def sglang_load(root: Path, triton_version: str, E: int, N: int, torch_device_name: str, down: bool = False) -> dict[int, dict]:
    """SGLang's get_moe_configs with SGLANG_MOE_CONFIG_DIR=root, restated (bf16: no dtype part)."""
    name = f"E={E},N={N},device_name={torch_device_name.replace(' ', '_')}{'_down' if down else ''}.json"
    path = root / "configs" / f"triton_{triton_version.replace('.', '_')}" / name
    assert path.exists(), f"SGLang would not find {path}"
    return {int(key): value for key, value in json.loads(path.read_text()).items()}


def check_values(table: dict[int, dict]) -> None:
    for m, config in table.items():
        assert type(m) is int and m > 0
        assert list(config) == list(FIELDS), config
        assert all(type(v) is int and v > 0 for v in config.values()), config


def run_export(job: Path, out: Path, *options: str):
    return CliRunner().invoke(main, ["--kernels", str(KERNELS), "export", str(job), "--format", "vllm", "--out",
                                     str(out), *options], catch_exceptions=False)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """The stored H200 search, and one whose environment names the GPU "NVIDIA H200 NVL"."""
    catalog = Catalog.discover(KERNELS)
    folder = tmp_path_factory.mktemp("loader")
    plain = synthetic.build(folder, catalog)
    nvl = synthetic.build(folder, catalog, name="nvl", env={**synthetic.ENV, "device_name": "NVIDIA H200 NVL"})
    return {"plain": plain, "nvl": nvl}


@pytest.mark.parametrize("which", ["plain", "nvl"])
def test_vllm_finds_and_parses_the_exported_file(stored, which, tmp_path):
    job, expected = stored[which]
    result = run_export(job, tmp_path)
    assert result.exit_code == 0, result.output
    device = "NVIDIA H200" if which == "plain" else "NVIDIA H200 NVL"
    table = vllm_load(tmp_path, 128, 2880, device, None)
    check_values(table)
    assert json.loads(next(tmp_path.glob("E=*.json")).read_text())["triton_version"] == synthetic.ENV["triton"]
    assert sorted(table) == [1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    for m, config in table.items():
        want = expected[("moe/gpt_oss_experts", f"gpt-oss-120b/T{m}")]["params"]
        assert config == {k: want[k] for k in FIELDS}
    # try_get_optimal_moe_config: M=5 takes the T 8 entry, M=3000 the T 2048 one (nearest).
    assert table[min(table, key=lambda x: abs(x - 5))] == table[8]
    assert table[min(table, key=lambda x: abs(x - 3000))] == table[2048]


def test_sglang_finds_and_parses_the_exported_files(stored, tmp_path):
    job, _ = stored["nvl"]
    result = run_export(job, tmp_path, "--layout", "sglang", "--split-down")
    assert result.exit_code == 0, result.output
    up = sglang_load(tmp_path, synthetic.ENV["triton"], 128, 2880, "NVIDIA H200 NVL")
    down = sglang_load(tmp_path, synthetic.ENV["triton"], 128, 2880, "NVIDIA H200 NVL", down=True)
    check_values(up)
    check_values(down)
    assert sorted(up) == sorted(down)
    # Both GEMMs run over one alignment of the tokens: SGLang forces the down BLOCK_SIZE_M to the up one.
    assert all(up[m]["BLOCK_SIZE_M"] == down[m]["BLOCK_SIZE_M"] for m in up)


def test_device_names_follow_each_loader():
    for name in ("NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA H200 141GB"):
        assert vllm_device_name({"device": "cuda", "device_name": name}) == "NVIDIA_H200"
    assert vllm_device_name({"device": "cuda", "device_name": "NVIDIA GH200 480GB"}) == "NVIDIA_GH200_480GB"
    assert vllm_device_name({"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"}) == "NVIDIA_H100_80GB_HBM3"
    assert sglang_device_name({"device": "cuda", "device_name": "NVIDIA H200 NVL"}) == "NVIDIA_H200_NVL"
    # Replayed timings measure the recorded GPU, not the machine that replayed them.
    assert vllm_device_name({"device": "replay", "device_name": "cpu", "recorded_device": "NVIDIA H200 NVL"}) == "NVIDIA_H200"


def test_split_down_for_vllm_is_a_clear_error(stored, tmp_path):
    job, _ = stored["plain"]
    result = run_export(job, tmp_path / "out", "--split-down")
    assert result.exit_code == 2
    assert "--split-down needs --layout sglang" in result.output and "Traceback" not in result.output


TIED_JOB = """
[job]
name = "tied"
device = "cuda"
dtype = "bfloat16"
tune = "per-shape"
storage = "sqlite:///{db}"

[strategy]
name = "tpe"
evaluations = 2

[[blocks]]
id = "moe/gpt_oss_experts"
shapes = "gpt-oss-120b"
templates = ["vllm_tied"]
"""


def _tied_job(folder: Path, catalog: Catalog) -> tuple[Path, dict[int, dict]]:
    """A stored per-shape search of the MoE block in vLLM's tied space (template vllm_tied, GEMM2 =
    GEMM1): two tied candidates, the small tiles faster up to 64 tokens, the large tiles above.
    Returns the job file and token count -> the winner's point."""
    from kernelforge.candidate import Candidate
    from kernelforge.result import Status, StoredResult, env_key
    from kernelforge.store.store import Store

    db = folder / "tied.db"
    store = Store(f"sqlite:///{db}")
    block = catalog.block("moe/gpt_oss_experts")
    base_template, tied = catalog.baseline(block.id), catalog.template("moe/gpt_oss_experts/vllm_tied")
    assert not any(name.endswith("2") for name in tied.space.names)  # one configuration for both GEMMs
    small = Candidate.from_template(tied, {**tied.baseline, "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128,
                                           "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 4}, origin="optuna")
    large = Candidate.from_template(tied, {**tied.baseline, "BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64,
                                           "GROUP_SIZE_M": 16, "num_warps": 8, "num_stages": 3}, origin="optuna")
    expected, now = {}, 1000.0
    for shape in block.shapes("gpt-oss-120b"):
        base = Candidate.from_template(base_template, dict(base_template.baseline_for(shape).point), origin="baseline")
        winner = small if shape["T"] <= 64 else large
        loser = large if winner is small else small
        for c, t in ((base, 1e-3), (winner, 0.6e-3), (loser, 1.4e-3)):
            store.add_candidate(c, "tied")
            now += 1.0
            store.add_result(StoredResult(
                candidate_id=c.id, block=block.id, shape=shape.name, dtype="bfloat16",
                device=synthetic.ENV["device_name"], env_key=env_key(synthetic.ENV), status=Status.OK, rel_error=1e-3,
                median_s=t, p20_s=t, p80_s=t, samples=50, timing_method="cuda-events", timing_label="CUDA events",
                joules=None, flops=1.0, bytes=1.0, message="", env=synthetic.ENV, job="tied", created=now))
        expected[int(shape["T"])] = winner.point
    store.close()
    path = folder / "tied.toml"
    path.write_text(TIED_JOB.format(db=db))
    return path, expected


def test_a_tied_space_export_is_what_vllm_loads_per_token_count(tmp_path):
    # Issue 32: a job that searches vLLM's tied space exports its own winners (not the fallback to the
    # fastest tied candidate), vLLM's loader gets each token count's configuration back, and the
    # export says which space the configurations come from and what they were tuned on.
    catalog = Catalog.discover(KERNELS)
    job, expected = _tied_job(tmp_path, catalog)
    out = tmp_path / "export"
    result = run_export(job, out)
    assert result.exit_code == 0, result.output
    table = vllm_load(out, 128, 2880, "NVIDIA H200", None)
    check_values(table)
    assert sorted(table) == sorted(expected)
    for m, point in expected.items():
        looked_up = table[min(table, key=lambda x: abs(x - m))]  # try_get_optimal_moe_config at M = m
        assert looked_up == {k: point[k] for k in FIELDS}
    meta = json.loads((out / "kernelforge-export-vllm.json").read_text())
    space = meta["space"]["moe/gpt_oss_experts"]
    assert space["templates"] == ["moe/gpt_oss_experts/vllm_tied"] and space["space"].startswith("tied")
    assert "kernelforge's fused-MoE kernel" in space["tuned_on"] and "not on vLLM's own" in space["tuned_on"]
    assert not any("configures GEMM2 apart" in n for n in meta["notes"])
    assert "tied: GEMM2 takes GEMM1's configuration" in result.output
