"""Every block names what serving engines ship for its presets (issue 31): each real preset is
covered by a shipped-path entry with a source and revision, a speedup is labelled "over experts"
only where the baseline is that path, and a library that cannot run on the GPU image says why."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from kernelforge.baselines import liger_num_warps, next_power_of_2
from kernelforge.catalog import Catalog
from kernelforge.shipped import ShippedPath, baseline_claim, covering, shipped_for

CATALOG = Catalog.discover(Path(__file__).resolve().parents[2] / "kernels")


@pytest.mark.parametrize("block_id", sorted(CATALOG.blocks))
def test_every_preset_has_a_shipped_path_with_a_revision(block_id):
    block = CATALOG.block(block_id)
    assert block.shipped, f"{block_id} declares no shipped path"
    for name, shapes in block.shape_sets().items():
        if name in ("smoke", "check"):
            continue
        for shape in shapes:
            entry = shipped_for(block.shipped, shape)
            assert entry is not None, f"{shape.name}: no shipped path"
            assert re.search(r"commit [0-9a-f]{7}", entry.source) or not entry.served, entry.source
            assert entry.on_image or entry.why_not, f"{block_id}: {entry.library} is not on the image: say why"
            assert entry.baseline_is_expert or entry.baseline_is, f"{block_id}: say what the baseline is"


def test_a_claim_is_over_experts_only_where_the_baseline_is_the_shipped_path():
    served = ShippedPath("m-tp8/", "vLLM", "tuned", "x (commit 0000000)", baseline_is_expert=True, library="L",
                         on_image=True, tokens=(0, 127))
    weaker = ShippedPath("*", "vLLM", "FA3", "y (commit 1111111)", baseline_is_expert=False,
                         baseline_is="a Triton fallback", library="FA3", on_image=False, why_not="not carried")
    block = CATALOG.block("moe/deepseek_r1_experts")
    small, large = block.shapes("deepseek-r1-tp8/T64")[0], block.shapes("deepseek-r1-tp8/T4096")[0]
    assert baseline_claim((weaker,), small) == "over a Triton fallback"
    assert baseline_claim((served, weaker), type(small)("m-tp8/T64", small.dims)) == "over experts"
    assert baseline_claim((served, weaker), type(large)("m-tp8/T4096", large.dims)) == "over a Triton fallback"
    assert baseline_claim((), small) == "over the Triton baseline"


def test_attention_and_mla_baselines_are_not_called_expert_kernels_on_hopper():
    """vLLM runs FlashAttention-3 with sinks for GPT-OSS and FlashMLA for MLA on Hopper: the Triton
    baselines are not those paths, so no speedup over them is called a speedup over experts."""
    for block_id in ("attention/gpt_oss_prefill", "attention/gpt_oss_decode", "attention/mla_decode"):
        block = CATALOG.block(block_id)
        shape = next(s for n, ss in block.shape_sets().items() if n not in ("smoke", "check") for s in ss)
        assert baseline_claim(block.shipped, shape) != "over experts"


@pytest.mark.parametrize("width, block, warps", [(64, 256, 4), (2048, 2048, 8), (2880, 4096, 8), (7168, 8192, 16),
                                                 (8192, 8192, 16)])
def test_the_norm_baseline_follows_ligers_rule_per_width(width, block, warps):
    """Liger-Kernel's calculate_settings: the row as one next_power_of_2(H) block, 4 warps, 8 from
    2048, 16 from 8192 (32 from 32768); clamped to the template's space (256-8192)."""
    assert next_power_of_2(width) == max(1, 1 << (width - 1).bit_length())
    assert liger_num_warps(next_power_of_2(width)) == (16 if width > 4096 else 8 if width > 1024 else 4)
    template = CATALOG.baseline("norm/fused_add_rmsnorm")
    shape = CATALOG.block("norm/fused_add_rmsnorm").shapes("smoke")[0]
    point = template.baseline_for(type(shape).of(f"w{width}", T=1, H=width, EPS=1e-5)).point
    assert (point["BLOCK_H"], point["num_warps"]) == (block, warps)


LIGER = tomllib.loads((Path(__file__).resolve().parents[1] / "fixtures" / "liger" / "calculate_settings.toml").read_text())


def _liger(width: int) -> tuple[int, int]:
    """Liger's calculate_settings(width), evaluated from the re-typed fixture."""
    block = 1 << max(0, (width - 1).bit_length())
    assert block <= LIGER["max_fused_size"]
    return block, next((w for bound, w in LIGER["warps_from"] if block >= bound), LIGER["default_warps"])


def test_the_norm_baseline_reads_back_against_ligers_source_at_every_preset():
    """Every real preset's point is Liger's rule (fixture re-typed from Liger-Kernel at the commit the
    template's source names), clamped to the template's space: blocks 256..8192, at most 16 warps."""
    template = CATALOG.baseline("norm/fused_add_rmsnorm")
    block = CATALOG.block("norm/fused_add_rmsnorm")
    assert LIGER["commit"][:7] in template.baseline_for(block.shapes("smoke")[0]).source
    shapes = [s for name, ss in block.shape_sets().items() if name not in ("smoke", "check") for s in ss]
    assert {s["H"] for s in shapes} >= {2880, 7168}
    for shape in shapes:
        size, warps = _liger(shape["H"])
        point = template.baseline_for(shape).point
        assert (point["BLOCK_H"], point["num_warps"]) == (min(8192, max(256, size)), min(16, warps)), shape.name
    assert _liger(7168) == (8192, 16) and _liger(2880) == (4096, 8)


def test_covering_keeps_the_entries_of_the_shapes_in_declared_order():
    block = CATALOG.block("moe/deepseek_r1_experts")
    tp8, ep8 = block.shapes("deepseek-r1-tp8")[:1], block.shapes("deepseek-r1-ep8")[:1]
    both = covering(block.shipped, ep8 + tp8)
    assert [p.presets for p in both] == [p.presets for p in block.shipped if p in both]
    assert {p.presets for p in both} == {"deepseek-r1-tp8/", "deepseek-r1-ep8/"}
    assert covering(block.shipped, tp8) == (shipped_for(block.shipped, tp8[0]),)
    assert covering(block.shipped, []) == ()
    for entry in (*both, ShippedPath("*", "e", "p", "s", baseline_is_expert=True, library="L", on_image=True)):
        status = entry.library_status
        assert status.startswith(f"{entry.library}: ")
        assert status.endswith("runs on the GPU image") if entry.on_image else entry.why_not in status


VLLM_ATTENTION = tomllib.loads((Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / "attention_shipped.toml")
                               .read_text())


@pytest.mark.parametrize("family", sorted(VLLM_ATTENTION))
def test_attention_shipped_paths_cite_the_vllm_file_and_revision_read(family):
    """The attention blocks' shipped entries name the vLLM file and a prefix of the revision the
    fixture records (the revision the reference store holds the file at)."""
    cited = VLLM_ATTENTION[family]
    for block_id in cited["blocks"]:
        block = CATALOG.block(block_id)
        for entry in block.shipped:
            assert f"vllm-project/vllm {cited['file']} (commit " in entry.source, (block_id, entry.source)
            revision = re.search(r"commit ([0-9a-f]{7,40})\)", entry.source).group(1)
            assert cited["commit"].startswith(revision), (block_id, revision, cited["commit"])
    if family == "mla":
        module = sys.modules[type(CATALOG.block("attention/mla_decode")).__module__]
        assert module.PAGE == cited["kernel_block_size"]  # FlashMLA's only kernel block size
