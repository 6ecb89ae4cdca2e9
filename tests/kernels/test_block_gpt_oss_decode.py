"""attention/gpt_oss_decode: the block's reference, counts and inputs, its baseline template in the
interpreter at several points of its space, and the mutants the checks must catch."""

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

from kernelforge.baselines import cdiv, flash_attn_num_splits
from kernelforge.devices import interpreter
from kernelforge.block import DISTRIBUTIONS, Shape, Tolerance
from kernelforge.template import Template
from kernelforge.execute.judge.compare import within
from kernel_helpers import module_at as _module, run_once as _run

BLOCK_ID = "attention/gpt_oss_decode"
REPO = Path(__file__).resolve().parents[2]
MUTANTS = sorted((REPO / "tests" / "mutants" / BLOCK_ID).glob("*.py.j2"))


@pytest.fixture(scope="module")
def block(catalog):
    return catalog.block(BLOCK_ID)


@pytest.fixture(scope="module")
def baseline(catalog):
    return catalog.baseline(BLOCK_ID)


def _small_shapes(block) -> list[Shape]:
    return block.shapes("smoke") + block.shapes("check")


# -- an independent formulation of the math ------------------------------------------------------


def naive_decode(q, k_cache, v_cache, lengths, sinks, sm_scale, window) -> torch.Tensor:
    """fp64, one sequence and one head at a time: the sink is an extra logit whose probability is
    dropped after the softmax."""
    batch, h_q, d = q.shape
    group = h_q // k_cache.shape[2]
    out = torch.zeros(batch, h_q, d, dtype=torch.float64)
    for b in range(batch):
        i = int(lengths[b]) - 1  # position of the query
        keys = [j for j in range(i + 1) if window == 0 or i - j < window]
        for h in range(h_q):
            k = k_cache[b, keys, h // group].double()
            v = v_cache[b, keys, h // group].double()
            logits = torch.cat([sm_scale * (k @ q[b, h].double()), sinks[h].double().view(1)])
            p = torch.softmax(logits, dim=0)[:-1]
            out[b, h] = p @ v
    return out


# -- reference, inputs, counts --------------------------------------------------------------------


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reference_matches_naive(block, dtype, distribution):
    for shape in _small_shapes(block):
        inputs = block.make_inputs(shape, dtype, "cpu", seed=3, distribution=distribution)
        ref = block.reference(**inputs)
        assert ref.dtype == torch.float32 and ref.shape == (shape["B"], shape["H_Q"], shape["D"])
        expected = naive_decode(**inputs)
        rel = ((ref.double() - expected).norm() / expected.norm()).item()
        assert rel < 1e-5, f"{shape.name}: reference differs from the naive fp64 form by {rel:.3g}"


def test_reference_chunks_over_batch(block, monkeypatch):
    """The memory bound (one chunk of sequences at a time) gives the same result as one chunk."""
    shape = block.shapes("check/ragged/full")[0]
    inputs = block.make_inputs(shape, torch.float32, "cpu", seed=5)
    whole = block.reference(**inputs)
    module = sys.modules[type(block).__module__]
    monkeypatch.setattr(module, "_REF_CHUNK_ELEMS", 1)
    assert torch.allclose(block.reference(**inputs), whole, rtol=1e-6, atol=1e-6)



def test_inputs_are_seeded_and_junk_outside_allowed_keys(block):
    shape = block.shapes("smoke/window32")[0]
    a = block.make_inputs(shape, torch.float16, "cpu", seed=7)
    b = block.make_inputs(shape, torch.float16, "cpu", seed=7)
    c = block.make_inputs(shape, torch.float16, "cpu", seed=8)
    for name in ("q", "k_cache", "v_cache", "lengths", "sinks"):
        assert torch.equal(a[name], b[name]), name
    assert not torch.equal(a["q"], c["q"])
    assert a["lengths"].dtype == torch.int32 and a["sinks"].dtype == torch.float32
    assert a["sm_scale"] == 0.125 and a["window"] == 32
    # Rows a correct kernel must not read hold large junk; the allowed rows hold the drawn values.
    for i, n in enumerate(shape["LENGTHS"]):
        pos = torch.arange(shape["S_MAX"])
        allowed = (pos >= n - 32) & (pos < n)
        for cache in (a["k_cache"], a["v_cache"]):
            assert cache[i][~allowed].abs().min() >= 16 and cache[i][allowed].abs().max() < 16
    out = block.make_output(shape, torch.float16, "cpu")
    assert out.shape == (2, 8, 64) and out.dtype == torch.float16


def test_counts_match_brute_force(block):
    extra = [
        Shape.of("w", B=3, H_Q=64, H_KV=8, D=64, S_MAX=300, LENGTHS=(1, 128, 300), WINDOW=128),
        Shape.of("f", B=3, H_Q=64, H_KV=8, D=64, S_MAX=300, LENGTHS=(1, 128, 300), WINDOW=0),
    ]
    for shape in _small_shapes(block) + extra:
        for dtype in (torch.bfloat16, torch.float32):
            elem = 2 if dtype == torch.bfloat16 else 4
            keys = 0
            for n in shape["LENGTHS"]:
                i = n - 1
                keys += sum(1 for j in range(shape["S_MAX"])
                            if j <= i and (shape["WINDOW"] == 0 or i - j < shape["WINDOW"]))
            flops = keys * shape["H_Q"] * (2 * shape["D"] + 2 * shape["D"])  # q.k and p*v per key and head
            kv = keys * shape["H_KV"] * shape["D"] * elem * 2
            q_out = shape["B"] * shape["H_Q"] * shape["D"] * elem * 2
            counts = block.counts(shape, dtype)
            assert counts.flops == flops and counts.bytes == kv + q_out, shape.name


def test_shape_sets(block):
    sets = block.shape_sets()
    assert {"smoke", "check", "interactive", "rag", "coding", "long_context", "8k1k"} <= set(sets)
    for name in ("interactive", "rag", "coding", "long_context", "8k1k"):
        shapes = sets[name]
        assert {s["B"] for s in shapes} == {1, 8, 32, 64} and {s["WINDOW"] for s in shapes} == {0, 128}
        for s in shapes:
            assert (s["H_Q"], s["H_KV"], s["D"]) == (64, 8, 64)
            assert s.name.startswith(f"gpt-oss/{name}/b") and len(s["LENGTHS"]) == s["B"]
    assert block.shapes("gpt-oss/interactive/b32/full")[0]["LENGTHS"] == (8800,) * 32
    compile_shape = block.compile_shape()
    assert (compile_shape["H_Q"], compile_shape["H_KV"]) == (64, 8) and compile_shape["S_MAX"] % 16 == 0


# -- the baseline template in the interpreter -----------------------------------------------------




def test_baseline_is_the_catalog_baseline(baseline):
    assert baseline.role == "baseline" and baseline.origin == "human"
    assert dict(baseline.baseline) == {"BLOCK_N": 32, "NUM_KV_SPLITS": 8, "num_warps": 4, "num_stages": 2}


@pytest.mark.interpreter
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_baseline_point_fp16(block, baseline, distribution):
    module = _module(baseline, dict(baseline.baseline))
    shapes = block.shapes("smoke") + (block.shapes("check") if distribution == "normal" else [])
    for shape in shapes:
        out, ref = _run(module, block, shape, torch.float16, distribution)
        ok, why = within(out, ref, block.tolerance(torch.float16, "cpu"))
        assert ok, f"{shape.name} {distribution}: {why}"


# -- per-shape baselines: FlashAttention-2's split count ----------------------------------------


def fa2_arguments(shape: Shape) -> tuple[int, int, int, int]:
    """What FlashAttention-2's mha_fwd_kvcache passes to num_splits_heuristic for this decode call
    on a 132-SM H100/H200 (the derivation is in the baseline template's header): full layers are
    GQA-packed (H_KV heads of H_Q / H_KV query rows), window layers are not (H_Q heads of 1 row);
    twice the SM count; 256-key blocks over the cache's length; at most 128 splits."""
    if shape["WINDOW"] == 0:
        rows = shape["B"] * shape["H_KV"] * cdiv(shape["H_Q"] // shape["H_KV"], 64)
    else:
        rows = shape["B"] * shape["H_Q"] * cdiv(1, 64)
    return rows, 2 * 132, cdiv(shape["S_MAX"], 256), 128


def _every_shape(block) -> list[Shape]:
    return [s for shapes in block.shape_sets().values() for s in shapes] + [block.compile_shape()]


def test_baseline_splits_follow_flash_attention_2(block, baseline):
    fixed = {k: v for k, v in baseline.baseline.items() if k != "NUM_KV_SPLITS"}
    for shape in _every_shape(block):
        resolved = baseline.baseline_for(shape)
        splits = resolved.point["NUM_KV_SPLITS"]
        assert splits == flash_attn_num_splits(*fa2_arguments(shape)), shape.name
        assert splits in baseline.space.values("NUM_KV_SPLITS"), f"{shape.name}: {splits} is not in the space"
        assert not baseline.space.problems(dict(resolved.point)), shape.name
        assert {k: resolved.point[k] for k in fixed} == fixed, f"{shape.name}: only the split count follows FA2"
        assert resolved.rule == (0 if shape["WINDOW"] == 0 else 1), shape.name
        assert "num_splits_heuristic" in resolved.source and "flash_api.cpp" in resolved.source
    assert "SGLang" in baseline.baseline_source


#: FlashAttention-2's split rule for mha_fwd_kvcache, re-typed as numbers (tests/fixtures/vllm/README.md,
#: "../flash_attention").
FA2 = tomllib.loads((REPO / "tests" / "fixtures" / "flash_attention" / "num_splits_heuristic.toml").read_text())


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def fa2_splits(batch: int, h_q: int, h_kv: int, d: int, seqlen_k: int, window: int) -> int:
    """The split count FA2's mha_fwd_kvcache picks for one decode token per sequence, evaluated from
    the fixture's numbers (not kernelforge.baselines): the GQA packing, set_params_splitkv's
    arguments and num_splits_heuristic, in C++ float where FA2 uses float."""
    pack, kv, rule = FA2["gqa_packing"], FA2["splitkv"], FA2["heuristic"]
    left = window - 1 if window else -1
    swapped = h_q > h_kv and (left < 0 or pack["window_packs"]) and d % pack["head_size_multiple"] == 0
    seqlen_q, heads = (h_q // h_kv, h_kv) if swapped else (pack["seqlen_q"], h_q)
    block_n = next((n for bound, n in kv["block_n_bounds"] if d <= bound), kv["block_n_above"])
    rows = batch * heads * -(-seqlen_q // kv["m_block"])
    sms = FA2["device"]["sm_count"] * kv["sm_multiplier"]
    blocks = -(-seqlen_k // block_n)
    if rows >= _f32(_f32(rule["fill_fraction"]) * sms):
        return 1
    eligible = [s for s in range(1, min(kv["max_splits"], sms, blocks) + 1)
                if s == 1 or -(-blocks // s) != -(-blocks // (s - 1))]
    eff = {}
    for s in eligible:
        waves = _f32(rows * s / sms)
        eff[s] = _f32(waves / math.ceil(waves))
    best = max(eff.values())
    return next((s for s in eligible if eff[s] >= rule["efficiency_fraction"] * best), 1)


def test_baseline_reads_back_against_flash_attention_2s_source(block, baseline):
    """Every shape (all sets and the compile shape) resolves to the count FA2 computes, read from the
    fixture re-typed from flash_api.cpp at the commit the template's rules cite."""
    for shape in _every_shape(block):
        resolved = baseline.baseline_for(shape)
        expected = fa2_splits(shape["B"], shape["H_Q"], shape["H_KV"], shape["D"], shape["S_MAX"], shape["WINDOW"])
        assert resolved.point["NUM_KV_SPLITS"] == expected, shape.name
        assert FA2["commit"][:8] in resolved.source and "flash_api.cpp" in resolved.source, resolved.source


@pytest.mark.parametrize("args, splits", [
    ((1, 64, 8, 64, 8800, 0), 18),       # packed: 8 rows of 264 SM slots, 35 blocks of 256 keys
    ((26, 64, 8, 64, 8800, 0), 5),       # 208 rows, under 0.8 * 264 = 211.2: the heuristic runs
    ((27, 64, 8, 64, 8800, 0), 1),       # 216 rows >= 211.2: 1 split at once
    ((211, 1, 1, 64, 8800, 0), 5),       # 211 rows: just under the fill bound
    ((212, 1, 1, 64, 8800, 0), 1),       # 212 rows: just over it
    ((1, 64, 8, 64, 8800, 128), 4),      # a window is not packed: 64 rows
    ((1, 64, 8, 64, 256, 0), 1),         # one 256-key block: no count but 1 is eligible
    ((1, 64, 8, 128, 8800, 0), 23),      # head dim 128: 128-key blocks (69 of them)
    ((1, 8, 8, 64, 1 << 20, 0), 29),     # no GQA: not packed, 8 rows; 4096 blocks, capped at 128 tries
], ids=["b1-full", "b26-full", "b27-full", "rows211", "rows212", "b1-window", "one-block", "d128", "mha"])
def test_fa2_rule_edges(args, splits):
    """The fixture's rule at its edges, against the project's own implementation (an independent
    formulation) and the counts worked by hand."""
    assert fa2_splits(*args) == splits
    b, h_q, h_kv, d, s, window = args
    packed = h_q > h_kv and window == 0
    rows = b * (h_kv if packed else h_q) * cdiv(h_q // h_kv if packed else 1, 64)
    assert flash_attn_num_splits(rows, 264, cdiv(s, 256 if d <= 64 else 128), 128) == splits


#: Split counts worked out by hand from FA2's heuristic at the real presets (264 = 2 x 132 SMs): a
#: wrong argument in the template (132 SMs, 128-key blocks, no GQA packing) changes some of them.
FA2_SPLITS = {
    "gpt-oss/interactive/b1/full": 18,
    "gpt-oss/8k1k/b1/full": 18,
    "gpt-oss/rag/b1/full": 33,
    "gpt-oss/coding/b1/full": 27,
    "gpt-oss/long_context/b1/full": 29,
    "gpt-oss/interactive/b8/full": 4,
    "gpt-oss/long_context/b32/full": 1,
    "gpt-oss/interactive/b1/window128": 4,
    "gpt-oss/rag/b8/window128": 1,
    "smoke/full": 1,
}


def test_baseline_split_counts_at_presets(block, baseline):
    for name, splits in FA2_SPLITS.items():
        assert baseline.baseline_for(block.shapes(name)[0]).point["NUM_KV_SPLITS"] == splits, name


@pytest.mark.interpreter
@pytest.mark.parametrize("splits, names", [(3, ("smoke", "check")), (29, ("check/ragged/full",))],
                         ids=["S3", "S29"])
def test_split_counts_that_are_not_powers_of_two(block, baseline, splits, names):
    """FA2's counts (18, 27, 29, 33) are not powers of two: stage 2 must merge any number of splits,
    including splits that get no keys (the ragged check shape's short sequences)."""
    module = _module(baseline, {**dict(baseline.baseline), "NUM_KV_SPLITS": splits})
    for shape in (s for name in names for s in block.shapes(name)):
        out, ref = _run(module, block, shape, torch.float16)
        ok, why = within(out, ref, block.tolerance(torch.float16, "cpu"))
        assert ok, f"{shape.name} with {splits} splits: {why}"


OTHER_POINTS = [
    {"BLOCK_N": 128, "NUM_KV_SPLITS": 1, "num_warps": 8, "num_stages": 3},
    {"BLOCK_N": 16, "NUM_KV_SPLITS": 32, "num_warps": 2, "num_stages": 1},
    {"BLOCK_N": 64, "NUM_KV_SPLITS": 4, "num_warps": 4, "num_stages": 1},
]


@pytest.mark.interpreter
@pytest.mark.parametrize("point", [None, OTHER_POINTS[0]], ids=["baseline", "N128-S1"])
def test_baseline_bf16(block, baseline, point):
    if interpreter.needs_bf16_fix() and not interpreter.is_patched():
        pytest.skip("this Triton's interpreter computes bf16 wrongly and kernelforge's fix is not applied")
    point = point or dict(baseline.baseline)
    module = _module(baseline, point)
    for shape in block.shapes("smoke"):
        out, ref = _run(module, block, shape, torch.bfloat16)
        ok, why = within(out, ref, block.tolerance(torch.bfloat16, "cpu"))
        assert ok, f"{shape.name} at {point}: {why}"


# -- mutants: each deliberate bug must be caught -------------------------------------------------


def test_mutants_exist():
    names = {p.name[: -len(".py.j2")] for p in MUTANTS}
    assert {"sink_dropped", "window_129", "last_key_excluded", "one_past_end", "sink_per_split"} <= names


@pytest.mark.interpreter
@pytest.mark.parametrize("path", MUTANTS, ids=lambda p: p.name[: -len(".py.j2")])
def test_mutant_is_caught(block, path):
    template = Template.from_file(path, BLOCK_ID)
    assert template.role == "variant"
    module = _module(template, dict(template.baseline))
    tol = block.tolerance(torch.float16, "cpu")
    # "Clearly wrong": outside ten times the tolerance, not just outside it.
    clear = Tolerance(rel_norm=10 * tol.rel_norm, atol=10 * tol.atol, rtol=10 * tol.rtol)
    seen = []
    for shape in _small_shapes(block):
        out, ref = _run(module, block, shape, torch.float16)
        ok, why = within(out, ref, clear)
        if not ok:
            return
        seen.append(f"{shape.name}: {why}")
    pytest.fail(f"mutant {path.name} passes every smoke and check shape: {'; '.join(seen)}")
