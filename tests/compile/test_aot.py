"""Ahead-of-time compilation for real GPU targets (kernelforge.compile), with no GPU.

The conftest turns the interpreter on in this process; compiles run in spawned children without it.
The blocks compiled here are test fixtures (tests/fixtures/kernels/demo/*): a scaled vector add
and a tl.dot matmul whose compile shape has 16-divisible strides.

Most candidates are compiled together in one CompilePool at module start so that the two
workers' start-up (torch import, about 3 s each) is paid once and compiles overlap.
"""

from __future__ import annotations

import json
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from kernelforge.compile.pool import CompilePool, compile_candidate, environment_probe, run_in_child
from kernelforge.compile.resources import CompileReport, jit_registers
from kernelforge.compile.specialise import pack_args_legacy, recording_launches, specialize, target_backend
from kernelforge.targets import TARGETS, default_target, parse_target
from kernelforge.catalog import Catalog
from kernelforge.errors import UserError

pytestmark = [pytest.mark.aot, pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
CATALOG = Catalog.discover(FIXTURES)

HOST_RAISES = '''

def run(x, y, alpha, out):
    scale = alpha * 2
    raise ValueError(f"host code failed on purpose (scale {scale})")
'''

HANGS = '''

def run(x, y, alpha, out):
    while True:
        pass
'''

NO_KERNEL = '''

def run(x, y, alpha, out):
    out.copy_(x + alpha * y)
'''

BAD_KEYWORD = '''

def run(x, y, alpha, out):
    _scaled_add[(4,)](x, y, out, x.numel(), alpha, BLOCK_SIZE=1024, BLOCK=64)
'''

CRASHES = '''

def run(x, y, alpha, out):
    import os
    os._exit(3)
'''


def render(block_id: str, **point) -> str:
    template = CATALOG.baseline(block_id)
    return template.render({**template.baseline, **point})


#: Every pool compile of this module: name -> (source, block, target).
POOL_JOBS = {
    "matmul_sm90": (render("demo/matmul"), "demo/matmul", "sm_90"),
    "vector_add_sm90": (render("demo/vector_add"), "demo/vector_add", "sm_90"),
    # (128x128 + 128x256) fp16 tiles x 3 buffers = 393216 bytes: over H100/H200's 232448
    "oversized": (render("demo/matmul", BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, num_warps=8, num_stages=4),
                  "demo/matmul", "sm_90"),
    "dot_k8": (render("demo/matmul", BLOCK_K=8), "demo/matmul", "sm_90"),
    "host_raises": (render("demo/vector_add") + HOST_RAISES, "demo/vector_add", "sm_90"),
    "no_kernel": (render("demo/vector_add") + NO_KERNEL, "demo/vector_add", "sm_90"),
    "bad_keyword": (render("demo/vector_add") + BAD_KEYWORD, "demo/vector_add", "sm_90"),
    "syntax_error": ("def run(x, y, alpha, out:\n    pass\n", "demo/vector_add", "sm_90"),
    "unknown_block": (render("demo/vector_add"), "demo/nope", "sm_90"),
    "matmul_gfx942": (render("demo/matmul"), "demo/matmul", "gfx942"),
}


@pytest.fixture(scope="module")
def pool_results():
    with CompilePool(max_workers=2, timeout=60) as pool:
        futures = {name: pool.submit(src, block, FIXTURES, "float16", target)
                   for name, (src, block, target) in POOL_JOBS.items()}
        results = {}
        for name, future in futures.items():
            try:
                results[name] = future.result(timeout=120)
            except Exception as exc:  # noqa: BLE001 - the tests below look at what failed
                results[name] = exc
        yield results


# -- targets ---------------------------------------------------------------------------------------


def test_targets_parse_and_unknown_names_list_the_known_ones():
    assert parse_target("sm_90a") is TARGETS["sm_90"]
    assert parse_target("SM90").shared_limit == 232448
    assert parse_target("sm_80").shared_limit == 166912
    assert parse_target("sm_89").shared_limit == 101376
    gfx = parse_target("gfx942:sramecc+:xnack-")
    assert (gfx.backend, gfx.warp_size, gfx.shared_limit) == ("hip", 64, 65536)
    with pytest.raises(UserError, match=r"unknown compile target 'sm_75'.*sm_90.*gfx942"):
        parse_target("sm_75")
    if not torch.cuda.is_available():
        assert default_target() == "sm_90"


# -- specialisation (in this process: nothing is compiled) ------------------------------------------


def _matmul_signature(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      alpha, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pass


def _launch_args(a, b, c, m, n, k):
    return (a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(), 0.5)


def _matmul_launch(m=256, n=256, k=256, offset=0):
    storage = torch.empty(m * k + offset, dtype=torch.float16)
    a = storage[offset:].view(m, k)
    b = torch.empty(k, n, dtype=torch.float16)
    c = torch.empty(m, n, dtype=torch.float16)
    return _launch_args(a, b, c, m, n, k), dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=3)


def test_specialisation_marks_aligned_pointers_and_16_divisible_ints():
    fn = JITFunction(_matmul_signature)
    args, kwargs = _matmul_launch()
    spec = specialize(fn, args, kwargs, "sm_90")
    names = list(spec.signature)
    divisible = [["tt.divisibility", 16]]
    for name in ("a_ptr", "b_ptr", "c_ptr"):
        assert spec.signature[name] == "*fp16"
        assert spec.attrs[(names.index(name),)] == divisible, name
    for name in ("M", "N", "K", "stride_am", "stride_bk", "stride_cm"):
        assert spec.signature[name] == "i32"
        assert spec.attrs[(names.index(name),)] == divisible, name
    # unit strides become constants, as the JIT does for every int argument equal to 1
    for name in ("stride_ak", "stride_bn", "stride_cn"):
        assert spec.signature[name] == "constexpr" and spec.constexprs[(names.index(name),)] == 1
    assert spec.signature["alpha"] == "fp32"
    assert spec.constexprs[(names.index("BLOCK_K"),)] == 32
    assert (spec.options.num_warps, spec.options.num_stages) == (4, 3)
    assert "a_ptr:*fp16:D" in spec.describe() and "stride_ak=1" in spec.describe()

    # a pointer 2 bytes off 16-byte alignment and odd sizes get no divisibility attribute
    args, kwargs = _matmul_launch(m=100, n=72, k=40, offset=1)
    spec = specialize(fn, args, kwargs, "sm_90")
    assert spec.attrs[(names.index("a_ptr"),)] == []
    assert spec.attrs[(names.index("b_ptr"),)] == divisible
    assert spec.attrs[(names.index("M"),)] == []
    assert spec.attrs[(names.index("stride_am"),)] == []


class _FakeDriver:
    """Just enough of a driver for JITFunction.run to reach its compile hook on a CPU machine."""

    def __init__(self, target):
        self.target = target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target


@pytest.mark.parametrize("target", ["sm_90", "sm_80", "gfx942"])
def test_specialisation_equals_what_the_jit_builds(monkeypatch, target):
    """Run Triton's real JITFunction.run against a fake driver for the target and stop it at its
    jit_cache_hook, which sees exactly what the JIT would compile: ours must be identical."""
    from triton.runtime.driver import driver

    if not hasattr(driver, "_active"):
        pytest.skip("this Triton's driver has no _active slot to put a fake driver in")
    tgt = parse_target(target)
    seen = {}

    def hook(**kwargs):
        seen.update(kwargs["compile"])
        return True  # the JIT then skips compiling and launching

    monkeypatch.setattr(driver, "_active", _FakeDriver(tgt.gpu_target()))
    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook", hook)
    for offset in (0, 1):
        args, kwargs = _matmul_launch(offset=offset)
        seen.clear()
        JITFunction(_matmul_signature)[(1,)](*args, **kwargs)
        spec = specialize(JITFunction(_matmul_signature), args, kwargs, tgt)
        assert seen["signature"] == spec.signature
        assert seen["constants"] == spec.constexprs
        assert seen["configs"][0] == spec.attrs
        jit_options = json.loads(seen["specialization_data"])["options"]
        assert jit_options == json.loads(json.dumps(spec.options.__dict__, default=vars))


@pytest.mark.skipif(not hasattr(JITFunction, "_pack_args"), reason="Triton < 3.7 has no _pack_args to compare with")
def test_packing_fallback_for_triton_36_equals_the_jit_packing():
    from triton.runtime.jit import create_function_from_signature

    fn = JITFunction(_matmul_signature)
    backend = target_backend(parse_target("sm_90"))
    args, kwargs = _matmul_launch()
    kwargs["debug"] = False
    bound, specialization, options = create_function_from_signature(fn.signature, fn.params, backend)(*args, **kwargs)
    ours = pack_args_legacy(fn, backend, kwargs, bound, specialization)
    theirs = fn._pack_args(backend, kwargs, bound, specialization, options)
    assert ours[1:] == theirs[1:]
    assert ours[0].__dict__ == theirs[0].__dict__


def test_recording_keeps_distinct_launches_and_restores_the_launcher():
    fn = JITFunction(_matmul_signature)
    original = JITFunction.run
    args, kwargs = _matmul_launch()
    with recording_launches("sm_90") as launches:
        grid = lambda meta: (4, 4)  # noqa: E731 - a callable grid is recorded, not called
        fn[grid](*args, **kwargs)
        fn[(4, 4)](*args, **kwargs)  # same specialisation: recorded once
        fn[(2, 4)](*args, **{**kwargs, "BLOCK_M": 128})
    assert JITFunction.run is original
    assert [launch.spec.constexprs[(13,)] for launch in launches] == [64, 128]
    assert launches[0].grid is grid


def test_jit_registers_reads_the_jit_kernel_caches():
    from types import SimpleNamespace

    fn = JITFunction(_matmul_signature)
    loaded = SimpleNamespace(n_regs=162, metadata=SimpleNamespace(name="_matmul_signature"))
    never_loaded = SimpleNamespace(metadata=SimpleNamespace(name="_other"))
    fn.device_caches[0] = ({"key": loaded, "other": never_loaded}, {}, None, None, None)
    module = SimpleNamespace(kernel=fn, helper=len, scale=2.0)
    assert jit_registers(module) == {"_matmul_signature": 162}


# -- compiling in a child process --------------------------------------------------------------------


def test_child_process_compiles_without_the_interpreter():
    import os

    assert os.environ.get("TRITON_INTERPRET") == "1"  # the conftest's interpreter, in this process
    probe = run_in_child(environment_probe, (), timeout=60)
    assert probe == {"TRITON_INTERPRET": None, "triton_preimported": False, "jit_class": "JITFunction"}


def test_compile_candidate_for_sm90_reports_resources():
    start = time.perf_counter()
    report = compile_candidate(render("demo/matmul"), "demo/matmul", FIXTURES, torch.float16, "sm_90", timeout=60)
    assert report.status == "ok" and report.ok, report.message
    assert report.target == "sm_90" and 0 < report.seconds <= time.perf_counter() - start
    (kernel,) = report.kernels
    assert kernel.name == "_matmul"
    # (64x32 + 32x64) fp16 tiles: 8 KiB per stage, 3 stages
    assert kernel.shared_bytes == 24576
    assert kernel.registers > 0 and kernel.spill_stores == 0 and kernel.spill_loads == 0 and not kernel.spills
    assert (kernel.num_warps, kernel.num_stages) == (4, 3)
    assert kernel.uses_wgmma and kernel.uses_cp_async
    assert "a_ptr:*fp16:D" in kernel.signature and "stride_am:i32:D" in kernel.signature
    assert kernel.compile_seconds > 0


def test_hanging_host_code_times_out():
    start = time.perf_counter()
    report = compile_candidate(render("demo/vector_add") + HANGS, "demo/vector_add", FIXTURES, "float16",
                                   "sm_90", timeout=5)
    assert report.status == "timeout" and not report.ok
    assert "5 s" in report.message
    assert time.perf_counter() - start < 20


# -- the pool ------------------------------------------------------------------------------------------


def test_pool_compiles_ok(pool_results):
    for name in ("matmul_sm90", "vector_add_sm90"):
        report = pool_results[name]
        assert isinstance(report, CompileReport) and report.status == "ok", (name, report)
    (kernel,) = pool_results["vector_add_sm90"].kernels
    assert kernel.name == "_scaled_add" and kernel.shared_bytes == 0 and kernel.registers > 0
    assert "alpha:fp32" in kernel.signature and "BLOCK_SIZE=1024" in kernel.signature


def test_config_over_the_shared_memory_limit_is_rejected(pool_results):
    report = pool_results["oversized"]
    assert report.status == "rejected" and not report.ok
    assert report.message == (
        "kernel _matmul needs 393216 bytes of shared memory; sm_90 allows 232448 per block "
        "(reduce BLOCK_M/BLOCK_N/BLOCK_K or num_stages)"
    )
    assert report.kernels[0].shared_bytes == 393216  # resources are still reported


def test_dot_with_k_below_16_is_a_compile_error(pool_results):
    report = pool_results["dot_k8"]
    assert report.status == "compile_error", report
    assert "kernel _matmul failed to compile for sm_90" in report.message
    assert "acc += tl.dot(a, b)" in report.message and "K >= 16" in report.message
    assert len(report.message.splitlines()) <= 5  # the compiler's message, not a traceback


def test_host_code_errors_are_compile_errors_with_the_message(pool_results):
    report = pool_results["host_raises"]
    assert report.status == "compile_error"
    assert "run() raised ValueError: host code failed on purpose (scale 1.0)" in report.message
    assert 'candidate line' in report.message and "raise ValueError" in report.message
    assert "launched no Triton kernel" in pool_results["no_kernel"].message
    bad = pool_results["bad_keyword"]
    assert bad.status == "compile_error" and "kernel _scaled_add: cannot bind launch arguments" in bad.message
    assert "BLOCK was specified but unrecognised" in bad.message
    assert pool_results["syntax_error"].status == "compile_error"
    assert "syntax error at line 1" in pool_results["syntax_error"].message


def test_unknown_block_is_the_callers_mistake(pool_results):
    error = pool_results["unknown_block"]
    assert isinstance(error, UserError) and "unknown block 'demo/nope'" in str(error)


def test_amd_gfx942(pool_results):
    from triton.backends import backends

    if "amd" not in backends:
        pytest.skip("this triton wheel has no AMD backend")
    report = pool_results["matmul_gfx942"]
    assert report.status == "ok", report.message
    (kernel,) = report.kernels
    assert kernel.shared_bytes > 0 and kernel.registers > 0 and kernel.spill_stores == 0
    assert not kernel.uses_wgmma
    assert "a_ptr:*fp16:DS" in kernel.signature  # AMD also marks buffers under 2 GiB (buffer ops)


def test_pool_times_out_hangs_and_recovers_from_a_crashed_worker():
    # A 3 s limit timed honest compiles out on a loaded machine; the hang still hits this one.
    with CompilePool(max_workers=1, timeout=30) as pool:
        hang = pool.submit(render("demo/vector_add") + HANGS, "demo/vector_add", FIXTURES, "float16", "sm_90")
        report = hang.result(timeout=60)
        assert report.status == "timeout", report
        crash = pool.submit(render("demo/vector_add") + CRASHES, "demo/vector_add", FIXTURES, "float16", "sm_90")
        with pytest.raises(BrokenProcessPool):
            crash.result(timeout=60)
        again = pool.submit(render("demo/vector_add"), "demo/vector_add", FIXTURES, "float16", "sm_90")
        assert again.result(timeout=60).status == "ok"
        # The suspect of a crash is compiled again alone, in a process of the pool's kind: its
        # death there is its own verdict, and an innocent candidate compiles.
        alone = pool.compile_alone(render("demo/vector_add") + CRASHES, "demo/vector_add", FIXTURES, "float16", "sm_90")
        assert alone.status == "compile_error" and "died while compiling this candidate alone" in alone.message
        innocent = pool.compile_alone(render("demo/vector_add"), "demo/vector_add", FIXTURES, "float16", "sm_90")
        assert innocent.status == "ok", innocent.message


def test_a_sandboxed_pool_compiles_a_suspect_alone_in_its_sandbox_never_outside():
    """A compile that killed a sandboxed pool's process (a crash, its memory limit) is compiled
    again in a single-use pool of the same kind, with the same memory limit and folders: here a
    limit too small to import torch, so the process dies again and the candidate gets a
    compile_error; an unsandboxed child (the search's environment, no limit) would have compiled it."""
    from kernelforge.compile.sandboxed import SandboxedCompilePool

    with SandboxedCompilePool(max_workers=1, timeout=60, memory_limit=64 * 2**20, kernels_roots=(str(FIXTURES),)) as pool:
        single = pool.single()
        assert type(single) is SandboxedCompilePool
        assert (single.memory_limit, single.kernels_roots, single.max_workers) == (pool.memory_limit, pool.kernels_roots, 1)
        report = pool.compile_alone(render("demo/vector_add"), "demo/vector_add", FIXTURES, "float16", "sm_90")
    assert report.status == "compile_error" and "died while compiling this candidate alone" in report.message
