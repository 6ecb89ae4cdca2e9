"""attention/mla_decode: the model constants and softmax scales, the reference against a naive fp64
loop, the paged inputs and their junk, counts, and the baseline template in the interpreter."""

from __future__ import annotations

import math
import struct
import sys
from pathlib import Path

import pytest
import torch

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from kernelforge.block import DISTRIBUTIONS, Shape
from kernelforge.devices.hardware import ceilings_for
from kernelforge.execute.judge.verify import verify
from kernelforge.result import Status

BLOCK_ID = "attention/mla_decode"


@pytest.fixture(scope="module")
def block(catalog):
    return catalog.block(BLOCK_ID)


@pytest.fixture(scope="module")
def constants(block):
    return sys.modules[type(block).__module__]


def _small_shapes(block) -> list[Shape]:
    return block.shapes("smoke") + block.shapes("check")


def naive_mla(q, kv_cache, block_table, lengths, sm_scale) -> torch.Tensor:
    """fp64, one sequence, head and token at a time: token j of sequence b is row j % 64 of page
    block_table[b, j // 64]; key = the whole 576-wide row, value = its first 512 columns."""
    batch, heads, _ = q.shape
    page = kv_cache.shape[1]
    out = torch.zeros(batch, heads, 512, dtype=torch.float64)
    for b in range(batch):
        rows = torch.stack([kv_cache[int(block_table[b, j // page]), j % page].double()
                            for j in range(int(lengths[b]))])
        for h in range(heads):
            p = torch.softmax(sm_scale * (rows @ q[b, h].double()), dim=0)
            out[b, h] = p @ rows[:, :512]
    return out


def _allowed_rows(inputs) -> torch.Tensor:
    """[NUM_PAGES, PAGE] bool: the cache rows some sequence reads."""
    kv, table, lengths = inputs["kv_cache"], inputs["block_table"], inputs["lengths"]
    allowed = torch.zeros(kv.shape[:2], dtype=torch.bool)
    for b, n in enumerate(lengths.tolist()):
        for j in range(n):
            allowed[int(table[b, j // kv.shape[1]]), j % kv.shape[1]] = True
    return allowed


# -- model constants ------------------------------------------------------------------------------


def test_softmax_scales_from_the_configs(constants):
    """qk_head_dim^-0.5 * (0.1 * mscale_all_dim * ln(factor) + 1)^2, recomputed by hand."""
    for name, factor in (("deepseek-r1", 40.0), ("kimi-k2.5", 64.0)):
        model = constants.MODELS[name]
        assert (model.kv_lora_rank, model.qk_rope_head_dim, model.qk_head_dim, model.key_dim) == (512, 64, 192, 576)
        assert model.yarn_factor == factor and model.mscale_all_dim == 1.0
        by_hand = 192 ** -0.5 * (0.1 * math.log(factor) + 1.0) ** 2
        assert model.softmax_scale == pytest.approx(by_hand, rel=1e-12)
        assert round(model.softmax_scale, 6) == constants.DOCUMENTED_SCALES[name]
        assert model.softmax_scale != pytest.approx(576 ** -0.5, rel=0.1)
    assert constants.MODELS["deepseek-r1"].heads == 128 and constants.MODELS["kimi-k2.5"].heads == 64


def test_inputs_carry_the_model_scale(block, constants):
    for shape in _small_shapes(block):
        inputs = block.make_inputs(shape, torch.float16, "cpu", seed=1)
        assert inputs["sm_scale"] == constants.MODELS[shape["MODEL"]].softmax_scale


# -- reference, inputs, counts --------------------------------------------------------------------


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_matches_naive(block, dtype, distribution):
    for shape in _small_shapes(block):
        inputs = block.make_inputs(shape, dtype, "cpu", seed=3, distribution=distribution)
        ref = block.reference(**inputs)
        assert ref.dtype == torch.float32 and ref.shape == (shape["B"], shape["H"], 512)
        expected = naive_mla(**inputs)
        rel = ((ref.double() - expected).norm() / expected.norm()).item()
        assert rel < 1e-4, f"{shape.name}: reference differs from the naive fp64 form by {rel:.3g}"


def test_pages_are_permuted_and_junk_is_everywhere_else(block, constants):
    shape = block.shapes("check/ragged-b5")[0]
    a = block.make_inputs(shape, torch.float16, "cpu", seed=7)
    b = block.make_inputs(shape, torch.float16, "cpu", seed=7)
    c = block.make_inputs(shape, torch.float16, "cpu", seed=8)
    for name in ("q", "kv_cache", "block_table", "lengths"):
        assert torch.equal(a[name], b[name]), name
    assert not torch.equal(a["q"], c["q"]) and not torch.equal(a["block_table"], c["block_table"])
    table, lengths = a["block_table"], a["lengths"]
    assert table.dtype == torch.int32 and lengths.dtype == torch.int32
    assert lengths.tolist() == list(shape["LENGTHS"]) and table.shape[1] % 16 == 0
    owned = [table[i, : -(-n // 64)] for i, n in enumerate(lengths.tolist())]
    flat = torch.cat(owned)
    assert len(set(flat.tolist())) == len(flat), "every page belongs to one sequence"
    assert not torch.equal(flat, torch.arange(len(flat), dtype=torch.int32)), "pages come from a permutation"
    # Unused entries (one spare per sequence at least) point at pages no sequence owns.
    unused = torch.cat([table[i, len(p):] for i, p in enumerate(owned)])
    assert len(unused) >= shape["B"] and not set(unused.tolist()) & set(flat.tolist())
    allowed = _allowed_rows(a)
    kv = a["kv_cache"]
    assert (kv[~allowed] == constants.JUNK).all() and kv[allowed].abs().max() < constants.JUNK
    assert (~allowed).any(dim=1).sum() > len(unused.unique()), "tails of last pages are junk too"


def test_junk_does_not_change_the_reference(block):
    shape = block.shapes("check/ragged-b5")[0]
    inputs = block.make_inputs(shape, torch.float32, "cpu", seed=2)
    ref = block.reference(**inputs)
    allowed = _allowed_rows(inputs)
    changed = dict(inputs, kv_cache=inputs["kv_cache"].clone())
    changed["kv_cache"][~allowed] = -1e4
    assert torch.equal(block.reference(**changed), ref)
    # ... while one allowed row does.
    changed["kv_cache"][allowed.nonzero()[0, 0], allowed.nonzero()[0, 1]] += 1.0
    assert not torch.equal(block.reference(**changed), ref)


def test_counts(block):
    for shape in _small_shapes(block):
        tokens, pages = sum(shape["LENGTHS"]), sum(-(-n // 64) for n in shape["LENGTHS"])
        counts = block.counts(shape, torch.bfloat16)
        assert counts.flops == 2 * shape["H"] * tokens * (576 + 512)
        q_out = shape["B"] * shape["H"] * (576 + 512) * 2
        assert counts.bytes == tokens * 576 * 2 + q_out + 4 * pages + 4 * shape["B"]
    # At 128 heads decode is compute-bound on an H200: about 1.9 * H FLOP per byte.
    h200 = ceilings_for("NVIDIA H200")
    deepseek = block.counts(block.shapes("deepseek-r1/long_context/b64")[0], torch.bfloat16)
    kimi = block.counts(block.shapes("kimi-k2.5/long_context/b64")[0], torch.bfloat16)
    assert deepseek.intensity == pytest.approx(1.89 * 128, rel=0.01)
    assert deepseek.intensity > h200.ridge(practical=False) > h200.ridge(practical=True)
    assert h200.bound(deepseek.flops, deepseek.bytes) == "compute"
    assert kimi.intensity < h200.ridge(practical=True)


def test_shape_sets(block, constants):
    sets = block.shape_sets()
    profiles = constants.MLA_PROFILES
    assert profiles == {"interactive": 8800, "rag": 33200, "coding": 68000, "long_context": 130000, "8k1k": 9216}
    for model, heads in (("deepseek-r1", 128), ("kimi-k2.5", 64)):
        names = {s.name for s in sets[model]}
        assert names == {f"{model}/{p}/b{b}" for p in profiles for b in (1, 8, 32, 64)}
        assert all(s["H"] == heads and s["MODEL"] == model for s in sets[model])
    for profile, length in profiles.items():
        shapes = sets[f"mla-{profile}"]
        assert len(shapes) == 8 and all(s["LENGTHS"] == (length,) * s["B"] for s in shapes)
    big = block.shapes("deepseek-r1/long_context/b64")[0]
    assert big["S_MAX"] == 130000 and big["PAGE"] == 64
    check = block.shapes("check")
    lengths = {n for s in check for n in s["LENGTHS"]}
    assert {1, 64, 65} <= lengths and any(n % 64 for n in lengths)
    assert any(s["H"] % 16 for s in check) and any(s["B"] == 5 for s in check)
    assert block.compile_shape()["H"] == 128


#: SGLang's Triton decode split rule, re-typed as numbers (tests/fixtures/vllm/README.md, "../sglang").
SGLANG = tomllib.loads((Path(__file__).resolve().parents[1] / "fixtures" / "sglang" / "triton_num_kv_splits.toml")
                       .read_text())


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def sglang_max_kv_splits(model: str) -> int:
    """TritonAttnBackend's max_kv_splits for an MLA model: _mla_decode_kv_splits_cap, from the fixture."""
    cap = SGLANG["max_kv_splits"]
    sms = SGLANG["device"]["sm_count"]
    ctx = SGLANG["context_len"][model]
    return max(cap["base"], min(_next_pow2(sms), _next_pow2(-(-ctx // cap["mla_min_block_kv"]))))


def sglang_splits(lengths: tuple[int, ...], heads: int, model: str, tp: int) -> list[int]:
    """get_num_kv_splits_triton per sequence, evaluated from the fixture's numbers (num_group 1)."""
    rule = SGLANG["heuristic"]
    max_splits = sglang_max_kv_splits(model)
    kv_heads = max(1, SGLANG["num_key_value_heads"][model] // tp)
    longest, shortest = max(lengths), min(lengths)
    if longest * rule["near_equal"][0] < shortest * rule["near_equal"][1]:
        shortest = longest
    chunk_1 = -(-longest // min(-(-longest // shortest), max_splits))
    scaled = _f32(max(_f32(math.log2(_f32(_f32(longest) / rule["ext_len_divisor"]))), rule["min_log2"]))
    ext_cores = int(_f32(SGLANG["device"]["sm_count"] * scaled))
    group = heads // kv_heads
    grid = len(lengths) * (heads if group == 1 else -(-heads // min(rule["block_h"], group)))
    chunk_2 = -(-longest // min(-(-ext_cores // grid), max_splits))
    return [max(-(-n // chunk_1), -(-n // chunk_2)) for n in lengths]


def _tp(shape) -> int:
    return 8 if "-tp8/" in shape.name else 1


def test_per_shape_baselines_follow_sglang(catalog, block):
    """Every preset (all lengths equal) resolves to the count SGLang's Triton backend computes, read
    from the fixture re-typed from SGLang at the commits the template's rules cite; shapes with
    unequal lengths (SGLang gives each sequence its own count, ours runs one) keep [baseline]."""
    template = catalog.baseline(BLOCK_ID)
    assert dict(template.baseline) == {"BLOCK_H": 16, "BLOCK_N": 32, "NUM_KV_SPLITS": SGLANG["max_kv_splits"]["base"],
                                       "num_warps": 4, "num_stages": 2, "MERGE_BLOCK": 1, "MERGE_WARPS": 4}
    assert sglang_max_kv_splits("deepseek-r1") == sglang_max_kv_splits("kimi-k2.5") == 256
    shapes = [s for ss in block.shape_sets().values() for s in ss] + [block.compile_shape()]
    presets = set()
    for shape in shapes:
        resolved = template.baseline_for(shape)
        if len(set(shape["LENGTHS"])) == 1 and shape["S_MAX"] in (8800, 9216, 33200, 68000, 130000):
            presets.add(shape.name)
            splits = set(sglang_splits(shape["LENGTHS"], shape["H"], shape["MODEL"], _tp(shape)))
            assert resolved.point["NUM_KV_SPLITS"] == splits.pop(), shape.name
            assert SGLANG["commit"][:8] in resolved.source and "metadata.py" in resolved.source, resolved.source
            assert SGLANG["caller_commit"][:8] in resolved.source and "triton_backend.py" in resolved.source
        else:
            assert resolved.point["NUM_KV_SPLITS"] == SGLANG["max_kv_splits"]["base"], shape.name
        assert template.space.contains(resolved.point), f"{shape.name}: {dict(resolved.point)} is outside the space"
    assert len(presets) == 2 * 5 * 4 * 2  # 2 models x 5 profiles x 4 batches, all heads and TP 8


#: Counts worked out by hand from SGLang's heuristic (132 SMs; token_grid = B * H because the models'
#: num_key_value_heads equal their heads): an independent check of the evaluator above.
SGLANG_SPLITS = {
    "deepseek-r1/interactive/b1": 8,          # cdiv(937, 128) = 8
    "kimi-k2.5/interactive/b1": 15,           # cdiv(937, 64) = 15; cdiv(8800, cdiv(8800, 15)) = 15
    "deepseek-r1-tp8/interactive/b1": 59,     # cdiv(937, 16) = 59
    "kimi-k2.5-tp8/long_context/b1": 182,     # cdiv(1450, 8) = 182
    "kimi-k2.5-tp8/long_context/b8": 23,      # cdiv(1450, 64) = 23
    "deepseek-r1/long_context/b8": 2,         # cdiv(1450, 1024) = 2
    "deepseek-r1/coding/b64": 1,
}


def test_sglang_split_counts_worked_by_hand(catalog, block):
    template = catalog.baseline(BLOCK_ID)
    for name, splits in SGLANG_SPLITS.items():
        shape = block.shapes(name)[0]
        assert template.baseline_for(shape).point["NUM_KV_SPLITS"] == splits, name
        assert sglang_splits(shape["LENGTHS"], shape["H"], shape["MODEL"], _tp(shape)) == [splits] * shape["B"], name


def test_sglang_rule_edges():
    """The fixture's rule at its edges: lengths within 25% count as equal (bound 1 is 1 split), a
    sequence 4x shorter than the longest raises bound 1, short contexts take log2 floor 1, the cap."""
    assert sglang_splits((100, 81), 128, "deepseek-r1", 1) == [1, 1]            # 100 * 8 < 81 * 10
    assert sglang_splits((1000, 250), 128, "deepseek-r1", 1) == [4, 1]          # bound 1: cdiv(1000, 250)
    assert sglang_splits((64,), 1, "deepseek-r1", 128) == [64]                  # log2(1) -> 1: 132 cores, 64 tokens
    assert sglang_splits((130000,), 1, "deepseek-r1", 128) == [256]             # capped at 256
    assert sglang_splits((8800,), 16, "deepseek-r1", 8) == [59]


# -- the baseline template in the interpreter -----------------------------------------------------


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_baseline_verifies(catalog, block, dtype):
    from kernelforge.candidate import Candidate
    from kernelforge.execute.runner import load_candidate

    module, failure = load_candidate(Candidate.from_template(catalog.baseline(BLOCK_ID)).source, "mla")
    assert failure is None
    results = verify(block, module.run, _small_shapes(block), dtype, "cpu", stop_at_first_failure=False)
    failed = [f"{s.name}: {v.status.value} {v.message}" for s, v in results if v.status is not Status.OK]
    assert not failed, failed


# -- the judge's margin on fp8 rounding of V (issue 29) --------------------------------------------

V_LOAD = "            v = tl.load(KV + row[:, None] + offs_lat[None, :], mask=mask_n[:, None], other=0.0)\n"
FP8_V = V_LOAD + ("            v = ((v.to(tl.float32).to(tl.int32, bitcast=True) + 0x80000) & -1048576)"
                  ".to(tl.float32, bitcast=True).to(KV.dtype.element_ty)\n")


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fp8_rounding_of_v_is_caught_with_a_wide_margin_and_the_baseline_passes_with_one(catalog, block, dtype):
    """The baseline's worst error over the smoke and check shapes is at most a third of the
    tolerance, and a kernel rounding V to fp8 (e4m3's mantissa) fails at three times it or more:
    the thin margin of issue 29 (2.5-2.8% against 2%) is gone, and no honest kernel is near the
    line. Interpreter numerics (CPU); the calls are the judge's own (verify: three calls each)."""
    from kernelforge.candidate import Candidate
    from kernelforge.devices.interpret import InterpretDevice
    from kernelforge.execute.evaluate import evaluate

    device = InterpretDevice()
    device.prepare()
    honest = Candidate.from_template(catalog.baseline(BLOCK_ID)).source
    assert V_LOAD in honest
    tol = block.tolerance(dtype, "cpu")
    shapes = _small_shapes(block)
    for ev in evaluate(block, honest, shapes, dtype, device, timed=False):
        assert ev.status is Status.OK, ev.verification.message
        assert ev.verification.rel_error <= tol.rel_norm / 3, (ev.shape.name, ev.verification.rel_error)
        assert ev.verification.excess <= 1 / 2.5, (ev.shape.name, ev.verification.excess)
    for ev in evaluate(block, honest.replace(V_LOAD, FP8_V), shapes, dtype, device, timed=False):
        assert ev.status is Status.WRONG, ev.verification.message
        assert ev.verification.rel_error >= 3 * tol.rel_norm, (ev.shape.name, ev.verification.rel_error)
