"""The moe/gpt_oss_experts baseline is what experts ship, per shape (issue 11): read vLLM's published
tuned file back (tests/fixtures/vllm/) and check that the baseline template resolves every MoE preset
shape, and every token count of the file, to the entry vLLM itself would pick, with GEMM2 at GEMM1's
values; shapes without a vLLM file get vLLM's default heuristic. Also: inputs are drawn on the device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernelforge.block import Shape
from kernelforge.template import Template
from kernel_helpers import load_block_module

REPO = Path(__file__).resolve().parents[2]
BLOCK_ID = "moe/gpt_oss_experts"
BLOCK_DIR = REPO / "kernels" / BLOCK_ID
VLLM_FILE = REPO / "tests" / "fixtures" / "vllm" / "E=128,N=2880,device_name=NVIDIA_H100_80GB_HBM3.json"

#: vLLM's config keys and the names of the same parameters for GEMM2 in the template.
GEMM1 = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
GEMM2 = {"BLOCK_SIZE_N": "BLOCK_SIZE_N2", "BLOCK_SIZE_K": "BLOCK_SIZE_K2", "GROUP_SIZE_M": "GROUP_SIZE_M2",
         "num_warps": "num_warps2", "num_stages": "num_stages2"}
#: vLLM's get_default_config (fused_moe.py): no num_warps/num_stages, so Triton's defaults 4 and 3.
DEFAULT_SMALL = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                 "num_warps": 4, "num_stages": 3}
DEFAULT_LARGE = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8,
                 "num_warps": 4, "num_stages": 3}




MODULE = load_block_module(BLOCK_ID)
BLOCK = MODULE.GptOssExperts(BLOCK_ID)
BASELINE = Template.from_file(BLOCK_DIR / "baseline.py.j2", BLOCK_ID)
#: Every shape of a model's sets (the decode-to-chunk presets and, where the block has them, prefill).
MODEL_SHAPES = {model: [s for name, shapes in BLOCK.shape_sets().items() if name.startswith(model) for s in shapes]
                for model in ("gpt-oss-120b", "gpt-oss-20b")}
PUBLISHED: dict[int, dict[str, int]] = {
    int(key): config for key, config in json.loads(VLLM_FILE.read_text()).items() if key != "triton_version"}


def _vllm_pick(tokens: int) -> dict[str, int]:
    """vLLM's lookup (try_get_optimal_moe_config): the entry whose key is nearest to M; min() over
    the keys in ascending order keeps the smaller key on a tie."""
    return PUBLISHED[min(sorted(PUBLISHED), key=lambda key: abs(key - tokens))]


def _both_gemms(config: dict[str, int]) -> dict[str, int]:
    """A vLLM configuration as a point of the template: GEMM2 at GEMM1's values (vLLM uses one for both)."""
    point = {name: config[name] for name in GEMM1}
    point.update({GEMM2[name]: config[name] for name in GEMM2})
    return point


def _shape(T: int, E: int = 128, I: int = 2880) -> Shape:
    return Shape.of(f"t/T{T}-E{E}-I{I}", T=T, E=E, TOPK=4, H=2880, I=I, ROUTING="uniform")


def test_fixture_is_the_published_file():
    assert sorted(PUBLISHED) == [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
    assert all(set(config) == set(GEMM1) for config in PUBLISHED.values())
    # Spot checks against the file as published (commit fb73c46): decode M-tiles of 16, 8 warps from 1024.
    assert PUBLISHED[1] == {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                            "num_warps": 4, "num_stages": 4}
    assert PUBLISHED[4096] == {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                               "num_warps": 8, "num_stages": 4}
    assert "fb73c46" in (VLLM_FILE.parent / "README.md").read_text()


@pytest.mark.parametrize("shape", MODEL_SHAPES["gpt-oss-120b"], ids=lambda s: s.name)
def test_120b_preset_baseline_is_vllms_tuned_config(shape):
    resolved = BASELINE.baseline_for(shape)
    assert dict(resolved.point) == _both_gemms(_vllm_pick(shape["T"]))
    assert resolved.rule == 0
    assert "E=128,N=2880,device_name=NVIDIA_H100_80GB_HBM3.json" in resolved.source
    assert "fb73c46" in resolved.source
    assert BASELINE.space.contains(resolved.point)


@pytest.mark.parametrize("tokens", sorted(PUBLISHED))
def test_every_key_of_the_file_reads_back(tokens):
    assert dict(BASELINE.baseline_for(_shape(tokens)).point) == _both_gemms(PUBLISHED[tokens])


@pytest.mark.parametrize("tokens, key", [(3, 2), (20, 16), (40, 32), (80, 64), (1280, 1024), (100_000, 4096)])
def test_between_keys_the_nearest_wins_and_ties_take_the_smaller(tokens, key):
    point = dict(BASELINE.baseline_for(_shape(tokens)).point)
    assert point == _both_gemms(PUBLISHED[key]) == _both_gemms(_vllm_pick(tokens))


@pytest.mark.parametrize("shape", MODEL_SHAPES["gpt-oss-20b"], ids=lambda s: s.name)
def test_20b_preset_baseline_is_vllms_default_heuristic(shape):
    """No vLLM file exists for E=32, N=2880 on Hopper: vLLM's get_default_config, by M <= E."""
    resolved = BASELINE.baseline_for(shape)
    small = shape["T"] <= shape["E"]
    assert dict(resolved.point) == _both_gemms(DEFAULT_SMALL if small else DEFAULT_LARGE)
    assert resolved.rule == (1 if small else None)
    assert "get_default_config" in resolved.source and ("M <= E" if small else "M > E") in resolved.source


def test_the_tuned_file_applies_only_to_its_expert_shape():
    # Another expert count or intermediate size (another model or tensor-parallel split): the default.
    assert dict(BASELINE.baseline_for(_shape(4096, E=64)).point) == _both_gemms(DEFAULT_LARGE)
    assert dict(BASELINE.baseline_for(_shape(4096, I=1440)).point) == _both_gemms(DEFAULT_LARGE)
    assert dict(BASELINE.baseline_for(_shape(8, I=1440)).point) == _both_gemms(DEFAULT_SMALL)


# -- inputs are drawn on the device --------------------------------------------------------------


def test_expert_weights_are_drawn_on_the_target_device(monkeypatch):
    """Every tensor of GPT-OSS-120b's inputs is asked for on the target device (a device generator
    draws it there: block.random_tensor), never drawn on the CPU and moved. The meta device stands
    in for a GPU: nothing is allocated."""
    asked: list[tuple[tuple[int, ...], str]] = []

    def spy(shape, gen, distribution, *, scale=1.0, dtype, device):
        asked.append((tuple(shape), torch.device(device).type))
        return torch.empty(shape, dtype=dtype, device=device)

    monkeypatch.setattr(MODULE, "random_tensor", spy)
    shape = BLOCK.shapes("gpt-oss-120b/T4096")[0]
    inputs = BLOCK.make_inputs(shape, torch.bfloat16, "meta", 0)
    assert {device for _, device in asked} == {"meta"}
    drawn = sum(torch.Size(dims).numel() for dims, _ in asked)
    assert drawn >= 3 * 128 * 2880 * 2880  # W1 and W2 of all 128 experts: about 3.2 G values
    assert all(tensor.device.type == "meta" for tensor in inputs.values())


def test_inputs_stay_deterministic_per_seed_on_the_cpu():
    shape = BLOCK.shapes("smoke")[0]
    a = BLOCK.make_inputs(shape, torch.bfloat16, "cpu", 3)
    b = BLOCK.make_inputs(shape, torch.bfloat16, "cpu", 3)
    assert all(torch.equal(a[name], b[name]) for name in a)
