"""The attention blocks' library references (kernels/attention/*/library.py) and their measuring
(kernelforge.search.library): each reference passes the block's own judge (fp32 reference,
tolerance, poisoned outputs, repeated calls) on smoke and check shapes; the FlexAttention block
masks cover exactly the allowed keys; results are stored apart from the block's candidates and
read back as the report's reference line; on the interpreter nothing is timed or stored.

The GPU test (``-m gpu``, skipped without CUDA) times the references at a real preset.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kernelforge.devices.registry import get_device
from kernelforge.result import Status, StoredResult
from kernelforge.library import ORIGIN, library_key
from kernelforge.report.library import library_lines
from kernelforge.search.library import find_library, measure_library, measure_library_for_run

ATTENTION = ("attention/gpt_oss_prefill", "attention/gpt_oss_decode")


@pytest.fixture(scope="module")
def interpret():
    device = get_device("interpret")
    device.prepare()
    return device


def _module(catalog, block_id, backend=None):
    ref = find_library(catalog, block_id)
    assert ref is not None
    return ref.module() if backend is None else _load_pinned(ref, backend)


def _load_pinned(ref, backend):
    from kernelforge.candidate import load_module

    return load_module(ref.pinned_source(backend), f"library_test_{backend}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("block_id", ATTENTION)
def test_sdpa_reference_passes_the_judge_on_smoke_and_check(catalog, interpret, block_id, dtype):
    block = catalog.block(block_id)
    m = measure_library(catalog, block, block.shapes("smoke"), dtype, interpret, None, env={}, env_key="k",
                        held_out=block.shapes("check"))
    assert m is not None and m.backend == "sdpa" and "SDPA" in m.implementation
    assert [ev.verification.status for ev in m.evaluations] == [Status.OK] * len(block.shapes("smoke")), \
        [ev.verification.message for ev in m.evaluations]
    # The interpreter only verifies: no timing, nothing stored.
    assert not m.timed and not m.stored and all(ev.timing is None for ev in m.evaluations)


@pytest.mark.parametrize("block_id,shapes", [
    ("attention/gpt_oss_prefill", ["check/q7_window128", "check/q129_full", "smoke/offset_window32"]),
    ("attention/gpt_oss_decode", ["check/ragged/full", "check/ragged/window128"]),
])
def test_flex_reference_passes_the_judge(catalog, interpret, block_id, shapes):
    """FlexAttention's sink (via log-sum-exp) and mask logic, run eagerly on the CPU: the compiled
    GPU path makes the same call."""
    block = catalog.block(block_id)
    picked = [s for name in shapes for s in block.shapes(name)]
    m = measure_library(catalog, block, picked, "float16", interpret, None, env={}, env_key="k",
                        backend="flex-eager")
    assert m.backend == "flex-eager"
    assert all(ev.verification.ok for ev in m.evaluations), [ev.verification.message for ev in m.evaluations]


@pytest.mark.parametrize("block_id,shape_name", [("attention/gpt_oss_prefill", "check/q7_window128"),
                                                ("attention/gpt_oss_decode", "check/ragged/window128")])
def test_compiled_flex_graph_traces(catalog, block_id, shape_name):
    """The GPU path's torch.compile graph (FlexAttention with the log-sum-exp, the block mask and
    its closures, the fused sink factor written into ``out``), traced on the CPU with the
    "aot_eager" backend (Inductor's CPU FlexAttention has no log-sum-exp): it compiles, matches
    the reference and is not recompiled on the next call."""
    block = catalog.block(block_id)
    module = _module(catalog, block_id, "flex")
    module.COMPILE_BACKEND = "aot_eager"
    shape = block.shapes(shape_name)[0]
    inputs = block.make_inputs(shape, torch.float16, "cpu", 1)
    ref = block.reference(**inputs)
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    for seed in (1, 2):
        out = block.make_output(shape, torch.float16, "cpu")
        module.run_flex(**block.make_inputs(shape, torch.float16, "cpu", seed), out=out)
        if seed == 1:
            assert float((out.float() - ref).norm() / ref.norm()) <= block.tolerance(torch.float16, "cpu").rel_norm
    assert counters["stats"]["unique_graphs"] - graphs == 1  # one graph, reused by the second call


@pytest.mark.parametrize("block_id", ATTENTION)
def test_a_reference_without_the_sink_is_wrong(catalog, block_id):
    """The judge sees the sink: the same library with every sink at -1e9 (dropped) fails."""
    block = catalog.block(block_id)
    module = _module(catalog, block_id, "sdpa")
    shape = block.shapes("smoke")[1]
    inputs = block.make_inputs(shape, torch.float16, "cpu", 0)
    out = block.make_output(shape, torch.float16, "cpu")
    module.run(**{**inputs, "sinks": torch.full_like(inputs["sinks"], -1e9)}, out=out)
    ref = block.reference(**inputs)
    assert float((out.float() - ref).norm() / ref.norm()) > block.tolerance(torch.float16, "cpu").rel_norm


@pytest.mark.parametrize("s_q,s_kv,window", [(128, 128, 0), (128, 128, 16), (64, 160, 0), (96, 200, 32),
                                             (1, 300, 0), (7, 263, 128), (129, 257, 128), (33, 33, 5)])
def test_prefill_tiles_cover_exactly_the_allowed_keys(catalog, s_q, s_kv, window):
    lib = _module(catalog, "attention/gpt_oss_prefill")
    tile = 16
    partial, full = lib.band_tiles(s_q, s_kv, window, tile)
    offset = s_kv - s_q
    pos = torch.arange(offset, offset + s_q).unsqueeze(1)
    dense = lib.allowed(pos, torch.arange(s_kv).unsqueeze(0), window)
    for m in range((s_q + tile - 1) // tile):
        rows = dense[m * tile:(m + 1) * tile]
        for n in range((s_kv + tile - 1) // tile):
            cells = rows[:, n * tile:(n + 1) * tile]
            listed = n in partial[m] or n in full[m]
            assert listed == bool(cells.any()), (m, n)
            if n in full[m]:
                assert cells.shape == (tile, tile) and bool(cells.all()) and n not in partial[m]
    if window == 0 and s_q >= tile:  # a causal band of whole tiles has interior tiles
        assert any(full), "no tile skips the mask: the sparse path is untested"


def test_decode_tiles_cover_each_sequence_range(catalog):
    lib = _module(catalog, "attention/gpt_oss_decode")
    lengths = torch.tensor([1, 7, 128, 129, 300, 256], dtype=torch.int32)
    for window in (0, 128, 5):
        mask = lib.block_mask(lengths, 300, window)
        counts, idx = mask.kv_num_blocks.view(-1).tolist(), mask.kv_indices.view(len(lengths), -1)
        for b, n in enumerate(lengths.tolist()):
            lo = max(0, n - window) if window else 0
            expected = list(range(lo // lib.TILE, (n - 1) // lib.TILE + 1))
            assert idx[b, :counts[b]].tolist() == expected, (window, n)


def test_pinned_sources_are_distinct_candidates_stored_apart(catalog):
    ref = find_library(catalog, "attention/gpt_oss_prefill")
    flex, sdpa = ref.candidate("flex", "F"), ref.candidate("sdpa", "S")
    assert flex.id != sdpa.id and flex.origin == ORIGIN
    assert flex.block_id == library_key("attention/gpt_oss_prefill") != "attention/gpt_oss_prefill"
    assert _load_pinned(ref, "sdpa").backend("cuda") == "sdpa"  # the pin wins over the device
    assert find_library(catalog, "moe/kimi_k25_experts") is None


def test_untimed_measurement_stores_nothing_and_lines_read_the_fastest(catalog, interpret, tmp_path):
    pytest.importorskip("sqlalchemy")
    from kernelforge.store.store import Store

    store = Store(f"sqlite:///{tmp_path / 'kf.db'}")
    block = catalog.block("attention/gpt_oss_decode")
    measure_library(catalog, block, block.shapes("smoke")[:1], "float16", interpret, store, env={}, env_key="k")
    assert store.counts().results == 0 and store.counts().candidates == 0
    ref = find_library(catalog, block.id)
    shape = block.shapes("smoke")[0].name
    for backend, median, status, env_key in (("flex", 2e-5, Status.OK, "k"), ("sdpa", 5e-5, Status.OK, "k"),
                                             ("flex-eager", 1e-6, Status.WRONG, "k"),
                                             ("sdpa", 1e-7, Status.OK, "other")):
        cand = ref.candidate(backend, f"label {backend}")
        store.add_candidate(cand)
        store.add_result(StoredResult(
            candidate_id=cand.id, block=cand.block_id, shape=shape, dtype="float16", device="H200", env_key=env_key,
            status=status, rel_error=0.0, median_s=median, p20_s=median, p80_s=median, samples=10,
            timing_method="cuda-graph", timing_label="", joules=None, flops=1.0, bytes=1.0, message="", env={},
            job="j", created=0.0, excess=None))
    lines = library_lines(store, block.id, [shape], "float16", "k")
    assert lines[shape].implementation == "label flex" and lines[shape].median_s == 2e-5
    assert lines[shape].speedup_of(1e-5) == pytest.approx(2.0)
    assert store.results(block=block.id) == []  # nothing a search ranks sees the library rows
    store.close()


def test_a_run_off_the_gpu_measures_nothing():
    run = SimpleNamespace(executor=SimpleNamespace(kind="interpret", runs_code=True))
    assert measure_library_for_run(run) == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("block_id,preset", [("attention/gpt_oss_prefill", "gpt-oss/interactive/window"),
                                             ("attention/gpt_oss_decode", "gpt-oss/8k1k/b8/full")])
def test_library_reference_is_timed_on_gpu(catalog, block_id, preset):
    device = get_device("cuda")
    device.prepare()
    block = catalog.block(block_id)
    m = measure_library(catalog, block, block.shapes("smoke")[:1] + block.shapes(preset), "bfloat16", device,
                        None, env={}, env_key="k")
    assert m.ok and m.timed, [ev.verification.message for ev in m.evaluations]
    assert all(ev.timing is not None and ev.timing.is_gpu for ev in m.evaluations)
    print(f"{block_id} {preset}: {m.implementation}: "
          + ", ".join(f"{ev.shape.name} {ev.timing.median_s * 1e6:.1f} us" for ev in m.evaluations))


REPORT_JOB = """
[job]
name = "libline"
device = "cuda"
dtype = "float16"
storage = "sqlite:///{db}"

[strategy]
name = "tpe"
evaluations = 2

[[blocks]]
id = "attention/gpt_oss_decode"
shapes = "smoke"
"""


def test_report_shows_the_library_line_and_never_ranks_it(catalog, tmp_path):
    """REPORT.md's reference line: library time and baseline-vs-library ratio per shape; the
    library, faster than the baseline here, is neither a candidate nor the winner."""
    pytest.importorskip("sqlalchemy")
    from kernelforge.job import load_job
    from kernelforge.report.collect import collect, shape_baselines
    from kernelforge.report.markdown import to_markdown
    from kernelforge.result import env_key
    from kernelforge.store.store import Store

    env = {"device": "cuda", "device_name": "NVIDIA H200", "capability": "sm_90", "torch": "2.11", "triton": "3.6",
           "timing": "CUDA events (median, p20/p80)"}
    block_id = "attention/gpt_oss_decode"
    shapes = catalog.block(block_id).shapes("smoke")
    store = Store(f"sqlite:///{tmp_path / 'l.db'}")
    ref = find_library(catalog, block_id)
    lib = ref.candidate("flex", "FlexAttention (test)")
    store.add_candidate(lib, "libline")
    base_ids = {s: b.candidate for s, b in shape_baselines(catalog, block_id, shapes).items()}
    from kernelforge.search.plan import baseline_candidates

    for c in {c.id: c for c in baseline_candidates(catalog, block_id, shapes).values()}.values():
        store.add_candidate(c, "libline")

    def row(cid, block, shape, seconds):
        return StoredResult(candidate_id=cid, block=block, shape=shape, dtype="float16", device="NVIDIA H200",
                            env_key=env_key(env), status=Status.OK, rel_error=1e-4, median_s=seconds,
                            p20_s=seconds, p80_s=seconds, samples=20, timing_method="cuda-graph", timing_label="t",
                            joules=None, flops=1.0, bytes=1.0, message="", env=env, job="libline", created=1.0)

    for s in shapes:
        store.add_result(row(base_ids[s.name], block_id, s.name, 40e-6))
        store.add_result(row(lib.id, lib.block_id, s.name, 20e-6))
    store.close()
    path = tmp_path / "libline.toml"
    path.write_text(REPORT_JOB.format(db=tmp_path / "l.db"))
    report = collect(load_job(path, catalog), catalog, Store(f"sqlite:///{tmp_path / 'l.db'}"))
    block = report.blocks[0]
    assert [line.shape for line in block.library] == [s.name for s in shapes]
    assert all(r.winner_is_baseline for r in block.shapes) and block.candidates == len(set(base_ids.values()))
    text = to_markdown(report)
    assert f"| {shapes[0].name} | FlexAttention (test) | " in text and "| 0.500x |" in text
    from kernelforge.report.html import render_html

    page = render_html(report)
    assert "<h3>Library reference</h3>" in page and "FlexAttention (test)" in page and "0.500x" in page


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_norms_library_reference_passes_the_judge(catalog, interpret, dtype):
    """The norm's library line (Inductor on a GPU; eager torch on a CPU) passes the block's judge,
    its in-place residual included, on smoke and held-out check shapes."""
    block = catalog.block("norm/fused_add_rmsnorm")
    m = measure_library(catalog, block, block.shapes("smoke"), dtype, interpret, None, env={}, env_key="k",
                        held_out=block.shapes("check"))
    assert m is not None and m.backend == "eager" and "eager" in m.implementation
    assert [ev.verification.status for ev in m.evaluations] == [Status.OK] * len(block.shapes("smoke")), \
        [ev.verification.message for ev in m.evaluations]
    module = _module(catalog, "norm/fused_add_rmsnorm")
    assert module.backend("cuda") == "inductor" and module.FALLBACK == "eager"
