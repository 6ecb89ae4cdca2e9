"""The moe/gpt_oss_experts block: its reference, inputs and shapes, its baseline template in the
interpreter (conftest enables it), and that deliberate bugs (tests/mutants) are caught."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from kernelforge.devices import interpreter
from kernelforge.block import Shape, Tolerance
from kernelforge.template import Template
from kernelforge.execute.judge.compare import compare
from kernel_helpers import load_block_module, module_at, run_once

REPO = Path(__file__).resolve().parents[2]
BLOCK_ID = "moe/gpt_oss_experts"
BLOCK_DIR = REPO / "kernels" / BLOCK_ID
MUTANT_DIR = REPO / "tests" / "mutants" / BLOCK_ID




MODULE = load_block_module(BLOCK_ID)
BLOCK = MODULE.GptOssExperts(BLOCK_ID)
SMOKE = BLOCK.shapes("smoke")
CHECK = BLOCK.shapes("check")


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The reference runs many small ops; on the shared 2-core machine two OpenMP threads made it
    up to 700x slower under load (measured: 737 ms vs 0.95 ms for smoke/T16-E8)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _template(path: Path) -> Template:
    return Template.from_file(path, BLOCK_ID)


BASELINE = _template(BLOCK_DIR / "baseline.py.j2")


def _kernel(template: Template, **changes):
    return module_at(template, {**template.baseline, **changes})


def _bf16_fixed() -> bool:
    is_patched = getattr(interpreter, "is_patched", None)
    return bool(is_patched and is_patched())


def _errors(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> tuple[float, float]:
    """(relative norm error, worst elementwise error / its allowance); inf when not finite."""
    rel, excess, _ = compare(out, ref, tol)
    return rel, excess


def _run(module, shape: Shape, dtype: torch.dtype, seed: int = 1, distribution: str = "normal"):
    return run_once(module, BLOCK, shape, dtype, distribution, seed)


def _naive_fp64(x, topk_ids, topk_weights, w1, b1, w2, b2):
    """Token by token, slot by slot, in fp64: the math of BLOCKS.md written as plainly as possible."""
    T, H = x.shape
    out = torch.zeros(T, H, dtype=torch.float64)
    for t in range(T):
        for k in range(topk_ids.shape[1]):
            e = int(topk_ids[t, k])
            h = w1[e].double() @ x[t].double() + b1[e].double()
            glu, lin = h[0::2], h[1::2]
            glu = torch.clamp(glu, max=7.0)
            lin = torch.clamp(lin, min=-7.0, max=7.0)
            a = glu * torch.sigmoid(1.702 * glu) * (lin + 1.0)
            y = w2[e].double() @ a + b2[e].double()
            out[t] += float(topk_weights[t, k]) * y
    return out


# -- reference and inputs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, distribution",
    [(SMOKE[1], "normal"), (CHECK[2], "large"), (CHECK[4], "outliers"), (CHECK[0], "normal")],
    ids=lambda v: getattr(v, "name", v),
)
def test_reference_matches_naive_fp64(shape, distribution):
    inputs = BLOCK.make_inputs(shape, torch.float32, "cpu", 3, distribution)
    ref = BLOCK.reference(**inputs)
    naive = _naive_fp64(**inputs)
    assert ref.dtype == torch.float32 and ref.shape == (shape["T"], shape["H"])
    assert ((ref.double() - naive).norm() / naive.norm()).item() < 1e-6
    assert torch.allclose(ref.double(), naive, rtol=1e-5, atol=1e-5 * naive.abs().max().item())


def test_reference_does_not_modify_inputs():
    inputs = BLOCK.make_inputs(CHECK[1], torch.float16, "cpu", 5)
    before = {k: v.clone() for k, v in inputs.items()}
    BLOCK.reference(**inputs)
    for k, v in inputs.items():
        assert torch.equal(v, before[k]), k


def test_inputs_are_seeded_typed_and_exercise_the_clamp():
    shape = SMOKE[0]
    a = BLOCK.make_inputs(shape, torch.float16, "cpu", 7)
    b = BLOCK.make_inputs(shape, torch.float16, "cpu", 7)
    c = BLOCK.make_inputs(shape, torch.float16, "cpu", 8)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["x"], c["x"]) and not torch.equal(a["topk_ids"], c["topk_ids"])
    T, E, K, H, I = (shape[d] for d in ("T", "E", "TOPK", "H", "I"))
    expected = {"x": ((T, H), torch.float16), "topk_ids": ((T, K), torch.int32),
                "topk_weights": ((T, K), torch.float32), "w1": ((E, 2 * I, H), torch.float16),
                "b1": ((E, 2 * I), torch.float16), "w2": ((E, H, I), torch.float16), "b2": ((E, H), torch.float16)}
    assert {k: (tuple(v.shape), v.dtype) for k, v in a.items()} == expected
    assert torch.allclose(a["topk_weights"].sum(1), torch.ones(T)) and (a["topk_weights"] > 0).all()
    out = BLOCK.make_output(shape, torch.bfloat16, "cpu")
    assert out.shape == (T, H) and out.dtype == torch.bfloat16

    def clamped_fraction(distribution):
        inp = BLOCK.make_inputs(shape, torch.float32, "cpu", 7, distribution)
        e = inp["topk_ids"][:, 0].long()
        h = torch.einsum("th,tnh->tn", inp["x"], inp["w1"][e]) + inp["b1"][e]
        return ((h[:, 0::2] > 7).float().mean() + (h[:, 1::2].abs() > 7).float().mean()).item() / 2

    normal, large = clamped_fraction("normal"), clamped_fraction("large")
    assert 0.01 < normal < 0.2 and large > 2 * normal


@pytest.mark.parametrize("routing", ["uniform", "skewed", "one", "sparse"])
def test_routing_generators(routing):
    T, E, K = 256, 32, 4
    shape = Shape.of(f"t/{routing}", T=T, E=E, TOPK=K, H=64, I=64, ROUTING=routing)
    ids = BLOCK.make_inputs(shape, torch.float16, "cpu", 11)["topk_ids"]
    assert ids.dtype == torch.int32 and ids.shape == (T, K)
    assert ids.min() >= 0 and ids.max() < E
    assert (ids.sort(dim=1).values.diff(dim=1) > 0).all(), "expert ids repeat within a token"
    counts = torch.bincount(ids.flatten().long(), minlength=E)
    if routing == "uniform":
        assert (counts > 0).all() and counts.max() < 3 * T * K / E
    elif routing == "skewed":
        assert counts.topk(K).values.sum() > 0.6 * T * K  # a few experts take most tokens
    elif routing == "one":
        assert (ids == 0).any(dim=1).all()
        assert (ids.sort(dim=1).values == ids[0].sort().values).all()
        assert (counts > 0).sum() == K
    else:
        assert (counts == 0).any() and (counts > 0).sum() > K


def test_shapes_and_counts():
    sets = BLOCK.shape_sets()
    assert {"smoke", "check", "gpt-oss-120b", "gpt-oss-20b"} <= set(sets)
    assert BLOCK.shapes("gpt-oss-120b/T256")[0]["E"] == 128
    assert [s["T"] for s in sets["gpt-oss-20b"]] == [1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    for shape in SMOKE:
        assert 4 <= shape["E"] <= 8 and 8 <= shape["T"] <= 33 and 64 <= min(shape["H"], shape["I"])
    assert {s["ROUTING"] for s in CHECK} >= {"skewed", "one", "sparse"} and 1 in {s["T"] for s in CHECK}
    compile_shape = BLOCK.compile_shape()
    assert all(compile_shape[d] % 64 == 0 for d in ("T", "H", "I"))

    shape = BLOCK.shapes("gpt-oss-120b/T1")[0]
    c = BLOCK.counts(shape, torch.bfloat16)
    H = I = 2880
    assert c.flops == 1 * 4 * (2 * H * 2 * I + 2 * I * H)
    per_expert = (3 * H * I + 2 * I + H) * 2
    assert c.bytes == pytest.approx(4 * per_expert + 2 * H * 2 + 4 * 8)
    big = BLOCK.counts(BLOCK.shapes("gpt-oss-120b/T4096")[0], torch.bfloat16)
    assert big.bytes == pytest.approx(128 * per_expert + 2 * 4096 * H * 2 + 4096 * 4 * 8, rel=1e-6)
    one = Shape.of("one", T=64, E=8, TOPK=4, H=64, I=64, ROUTING="one")
    assert BLOCK.expected_experts(one) == 4
    skewed = Shape.of("sk", T=4096, E=128, TOPK=4, H=64, I=64, ROUTING="skewed")
    uniform = Shape.of("un", T=4096, E=128, TOPK=4, H=64, I=64, ROUTING="uniform")
    assert 4 < BLOCK.expected_experts(skewed) < BLOCK.expected_experts(uniform)


# -- the baseline template ----------------------------------------------------------------------------


def test_discovered_by_the_catalog(catalog):
    block = catalog.block(BLOCK_ID)
    assert block.family == "moe" and type(block).__name__ == "GptOssExperts"
    assert catalog.baseline(BLOCK_ID).id == f"{BLOCK_ID}/baseline"


def test_baseline_template_header():
    assert BASELINE.role == "baseline" and BASELINE.origin == "human"
    gemm1 = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8, "num_warps": 4,
             "num_stages": 3}
    gemm2 = {"BLOCK_SIZE_N2": 64, "BLOCK_SIZE_K2": 32, "GROUP_SIZE_M2": 8, "num_warps2": 4, "num_stages2": 3}
    assert BASELINE.baseline == {**gemm1, **gemm2}  # vLLM's default for M > E, for both GEMMs
    assert "get_default_config" in BASELINE.baseline_source
    module = _kernel(BASELINE)
    assert list(inspect.signature(module.run).parameters) == [
        "x", "topk_ids", "topk_weights", "w1", "b1", "w2", "b2", "out"]


def test_space_covers_vllms_tuner_for_both_gemms():
    """vLLM's tuner space (benchmarks/kernels/benchmark_moe.py get_configs_compute_bound, CUDA) is
    inside the space for GEMM1 and for GEMM2, and its shared-memory constraints keep every point of
    vLLM's tuned file but drop tiles that cannot fit on H100/H200."""
    tuner = {"BLOCK_SIZE_M": [16, 32, 64, 128, 256], "BLOCK_SIZE_N": [32, 64, 128, 256],
             "BLOCK_SIZE_K": [64, 128, 256], "GROUP_SIZE_M": [1, 16, 32, 64], "num_warps": [4, 8],
             "num_stages": [2, 3, 4, 5]}
    gemm2 = {"BLOCK_SIZE_N": "BLOCK_SIZE_N2", "BLOCK_SIZE_K": "BLOCK_SIZE_K2", "GROUP_SIZE_M": "GROUP_SIZE_M2",
             "num_warps": "num_warps2", "num_stages": "num_stages2"}
    for name, values in tuner.items():
        assert set(values) <= set(BASELINE.space.values(name)), name
        if name in gemm2:
            assert set(values) <= set(BASELINE.space.values(gemm2[name])), gemm2[name]
    huge = {**BASELINE.baseline, "BLOCK_SIZE_M": 256, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 256, "num_stages": 2}
    assert not BASELINE.space.contains(huge)  # GEMM1: (256 + 256) * 256 * 2 stages * 2 B > 232448
    assert not BASELINE.space.contains({**BASELINE.baseline, "BLOCK_SIZE_M": 256, "BLOCK_SIZE_N2": 256,
                                        "BLOCK_SIZE_K2": 256, "num_stages2": 2})  # GEMM2's own constraint
    # 32/64/256 with 5 stages (vLLM's file at 512 tokens) measured 196608 bytes: below BM 64, num_stages - 1.
    assert BASELINE.space.contains({**BASELINE.baseline, "BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64,
                                    "BLOCK_SIZE_K": 256, "num_stages": 5, "GROUP_SIZE_M": 1})


def _launches(point: dict, shape: Shape) -> dict[str, tuple]:
    """kernel name -> (grid, launch keyword arguments) of one call of the template at ``point``;
    the kernels are replaced by recorders (only the host-side alignment runs)."""
    from kernelforge.candidate import Candidate, load_module

    module = load_module(Candidate.from_template(BASELINE, {**BASELINE.baseline, **point}).source,
                         name_hint="kf_moe_launches")
    seen: dict[str, tuple] = {}

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.setdefault(self.name, (grid, kwargs))

    module._gemm1_swiglu_kernel = Recorder("gemm1")
    module._gemm2_kernel = Recorder("gemm2")
    module._topk_sum_kernel = Recorder("sum")
    inputs = BLOCK.make_inputs(shape, torch.float16, "cpu", 0)
    module.run(**inputs, out=BLOCK.make_output(shape, torch.float16, "cpu"))
    return seen


def test_gemm1_and_gemm2_launch_with_their_own_parameters():
    shape = SMOKE[0]  # T 16, E 8, H 128, I 128
    point = {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 16, "num_warps": 8,
             "num_stages": 2, "BLOCK_SIZE_N2": 32, "BLOCK_SIZE_K2": 128, "GROUP_SIZE_M2": 1, "num_warps2": 4,
             "num_stages2": 5}
    seen = _launches(point, shape)
    (grid1, kw1), (grid2, kw2) = seen["gemm1"], seen["gemm2"]
    assert (kw1["BLOCK_SIZE_M"], kw1["BLOCK_SIZE_N"], kw1["BLOCK_SIZE_K"], kw1["GROUP_SIZE_M"]) == (32, 128, 32, 16)
    assert (kw1["num_warps"], kw1["num_stages"], kw1["HALF_N"]) == (8, 2, 64)
    assert (kw2["BLOCK_SIZE_M"], kw2["BLOCK_SIZE_N"], kw2["BLOCK_SIZE_K"], kw2["GROUP_SIZE_M"]) == (32, 32, 128, 1)
    assert (kw2["num_warps"], kw2["num_stages"]) == (4, 5)
    # GEMM1's N tile is BLOCK_SIZE_N rows of W1 = 64 activation columns: I / 64 = 2 tiles per M-tile;
    # GEMM2 tiles H = 128 by BLOCK_SIZE_N2 = 32: 4 per M-tile. Both walk the same M-tiles.
    num_pid_m = grid2[0] // 4
    assert grid1 == (num_pid_m * 2,) and grid2 == (num_pid_m * 4,)


POINTS = {
    "baseline": {},
    # vLLM's default for M <= E (decode) for both GEMMs: many small tiles, more padding rows, and
    # GEMM1's narrowest tile (BLOCK_SIZE_N 32 rows of W1: 16 activation columns).
    "small": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
              "BLOCK_SIZE_N2": 32, "BLOCK_SIZE_K2": 64, "GROUP_SIZE_M2": 1},
    # GEMM1 and GEMM2 at different tiles (a wide GEMM1 tile, a narrow, deep GEMM2 one).
    "split": {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 16,
              "BLOCK_SIZE_N2": 32, "BLOCK_SIZE_K2": 128, "GROUP_SIZE_M2": 1},
    # Tiles larger than every expert's token list and than H, I (all-masked edges).
    "large": {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 16, "num_stages": 2,
              "BLOCK_SIZE_N2": 128, "BLOCK_SIZE_K2": 128, "GROUP_SIZE_M2": 16, "num_stages2": 2},
}
# Every smoke shape at the baseline and the small point; the split and large points (the large one is
# the slowest in the interpreter) on the cheapest smoke shape only, to keep this file within its time budget.
POINT_CASES = [(s, p) for s in SMOKE for p in ("baseline", "small")] + [(SMOKE[1], "split"), (SMOKE[1], "large")]


@pytest.mark.interpreter
@pytest.mark.parametrize("shape, point", POINT_CASES, ids=lambda v: str(v))
def test_baseline_matches_reference_fp16(shape, point):
    out, ref = _run(_kernel(BASELINE, **POINTS[point]), shape, torch.float16)
    rel, elem = _errors(out, ref, BLOCK.tolerance(torch.float16, "cpu"))
    assert rel <= BLOCK.tolerance(torch.float16, "cpu").rel_norm and elem <= 1.0, (rel, elem)


@pytest.mark.interpreter
@pytest.mark.parametrize("shape", CHECK, ids=str)
def test_baseline_on_held_out_shapes_fp16(shape):
    # At the shape's own baseline point (vLLM's M <= E default on check/T1 and check/T7).
    out, ref = _run(module_at(BASELINE, dict(BASELINE.baseline_for(shape).point)), shape, torch.float16)
    rel, elem = _errors(out, ref, BLOCK.tolerance(torch.float16, "cpu"))
    assert rel <= BLOCK.tolerance(torch.float16, "cpu").rel_norm and elem <= 1.0, (rel, elem)


@pytest.mark.interpreter
# numpy's exp overflows (to inf, giving sigmoid 0 as it should) for glu below about -52.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_baseline_fp32_large_values():
    out, ref = _run(_kernel(BASELINE), CHECK[4], torch.float32, distribution="large")
    rel, elem = _errors(out, ref, BLOCK.tolerance(torch.float32, "cpu"))
    assert rel <= 1e-5 and elem <= 1.0, (rel, elem)


@pytest.mark.interpreter
@pytest.mark.skipif(not _bf16_fixed(), reason="the interpreter's bf16 fix is not active")
@pytest.mark.parametrize("shape", SMOKE, ids=str)
def test_baseline_matches_reference_bf16(shape):
    out, ref = _run(_kernel(BASELINE), shape, torch.bfloat16)
    tol = BLOCK.tolerance(torch.bfloat16, "cpu")
    rel, elem = _errors(out, ref, tol)
    assert rel <= tol.rel_norm and elem <= 1.0, (rel, elem)


# -- mutants: each deliberate bug must fail the tolerance --------------------------------------------

MUTANTS = sorted(MUTANT_DIR.glob("*.py.j2"))


def test_mutants_exist():
    names = {p.name.removesuffix(".py.j2") for p in MUTANTS}
    assert {"skip_last_slot", "no_clamp", "halves", "no_b2", "drop_expert0"} <= names


@pytest.mark.interpreter
@pytest.mark.parametrize("path", MUTANTS, ids=lambda p: p.name.removesuffix(".py.j2"))
def test_mutant_is_caught(path):
    template = _template(path)
    assert template.role == "variant"
    out, ref = _run(_kernel(template), SMOKE[1], torch.float16)
    rel, elem = _errors(out, ref, BLOCK.tolerance(torch.float16, "cpu"))
    assert rel > 10 * BLOCK.tolerance(torch.float16, "cpu").rel_norm and elem > 10.0, (rel, elem)


@pytest.mark.parametrize("layout", ["tp", "ep"])
def test_parallel_sets_are_one_rank_of_the_layout(layout):
    # Issue 32: shape sets per TP and EP degree from the model's dimensions (no hand-edited block.py).
    # Tensor parallel: a rank holds every expert's I / TP slice; expert parallel: E / EP whole
    # experts (full I). Those are the E and N of vLLM's config file for the layout.
    sets = BLOCK.shape_sets()
    for model, full in (("gpt-oss-120b", sets["gpt-oss-120b-vllm"]), ("gpt-oss-20b", sets["gpt-oss-20b-vllm"])):
        for n in (2, 4, 8):
            shapes = sets[f"{layout}{n}-{model}"]
            rank = {"tp": lambda f: (f["E"], f["I"] // n), "ep": lambda f: (f["E"] // n, f["I"])}[layout]
            assert [s["T"] for s in shapes] == [s["T"] for s in full]
            assert all(((s["E"], s["I"]), s["H"], s["TOPK"]) == (rank(f), f["H"], f["TOPK"])
                       for s, f in zip(shapes, full))
            assert all(s.name.startswith(f"{layout}{n}-{model}/T") for s in shapes)


def test_parallel_layouts_are_generated_where_they_divide_the_model():
    # Generated, not listed: a layout exists only where it divides the model (and a rank keeps at
    # least TOPK experts to route each token to).
    assert MODULE.parallel_layouts(8, 96, 4) == {"tp2": (8, 48), "tp4": (8, 24), "tp8": (8, 12), "ep2": (4, 96)}
    assert MODULE.parallel_layouts(12, 90, 2) == {"tp2": (12, 45), "ep2": (6, 90), "ep4": (3, 90)}


def test_a_job_chooses_a_parallel_layout_by_its_shape_set(tmp_path, catalog):
    from kernelforge.job import load_job
    from kernelforge.search.plan import plan_studies

    path = tmp_path / "ep.toml"
    path.write_text('[job]\nname = "ep"\ndevice = "cuda"\n\n[strategy]\nevaluations = 2\n\n'
                    '[[blocks]]\nid = "moe/gpt_oss_experts"\nshapes = "ep8-gpt-oss-120b"\n')
    job = load_job(path, catalog)
    (study, *_) = plan_studies(job, catalog)
    assert [s.name for s in study.shapes][:2] == ["ep8-gpt-oss-120b/T1", "ep8-gpt-oss-120b/T2"]
    assert {(s["E"], s["I"]) for s in study.shapes} == {(16, 2880)}
