"""Honest kernels written the way kernel engineers write them must pass the allowlist policy: the
idioms of FlashAttention, split-K GEMMs, persistent kernels and MoE loops, each as a complete
candidate module. A policy that refuses honest code makes the search blind, so every idiom a
shipped or LLM-written kernel may need is here."""

from __future__ import annotations

import pytest

from kernelforge.policy.checker import check_source

HEADER = "from __future__ import annotations\n\nimport math\n\nimport torch\nimport triton\nimport triton.language as tl\n\n"

HONEST = {
    "exp2_softmax": '''
LOG2E: tl.constexpr = 1.4426950408889634


@triton.jit
def _softmax(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    p = tl.exp2((x - m) * LOG2E)
    tl.store(out_ptr + row * stride + cols, (p / tl.sum(p, axis=0)).to(out_ptr.dtype.element_ty), mask=mask)


def run(x, out):
    rows, cols = x.shape
    _softmax[(rows,)](x, out, cols, x.stride(0), BLOCK=triton.next_power_of_2(cols), num_warps=4)
''',
    "two_pass_max": '''
@triton.jit
def _row_max(x_ptr, m_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.full([BLOCK], -float("inf"), tl.float32)
    for start in tl.range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc = tl.maximum(acc, tl.load(x_ptr + row * n + offs, mask=offs < n, other=-float("inf")).to(tl.float32))
    tl.store(m_ptr + row, tl.max(acc, 0))


@triton.jit
def _normalise(x_ptr, m_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.load(m_ptr + row)
    for start in tl.static_range(0, 4096, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n + offs, mask=offs < n, other=0.0)
        tl.store(out_ptr + row * n + offs, (x - m).to(out_ptr.dtype.element_ty), mask=offs < n)


def run(x, out):
    rows, n = x.shape
    m = torch.empty(rows, dtype=torch.float32, device=x.device)
    _row_max[(rows,)](x, m, n, BLOCK=256)
    _normalise[(rows,)](x, m, out, n, BLOCK=256)
''',
    "split_k_atomics": '''
@triton.jit
def _matmul_split_k(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rm[:, None] * sam + rk[None, :] * sak, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rk[:, None] * sbk + rn[None, :] * sbn, mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.atomic_add(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc, mask=mask, sem="relaxed")


def run(a, b, out):
    M, K = a.shape
    N = b.shape[1]
    acc = torch.zeros((M, N), dtype=torch.float32, device=a.device)
    grid = (triton.cdiv(M, 64), triton.cdiv(N, 64), 4)
    _matmul_split_k[grid](a, b, acc, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                          acc.stride(0), acc.stride(1), BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, SPLIT_K=4)
    out.copy_(acc)
''',
    "persistent_with_helper_and_upcast": '''
@triton.jit
def _tile_offsets(tile, BLOCK: tl.constexpr):
    return tile * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def _scaled_add(x, y, alpha):
    return alpha * x.to(tl.float32) + y.to(tl.float32)


@triton.jit
def _persistent(x_ptr, y_ptr, out_ptr, alpha, n, num_tiles, BLOCK: tl.constexpr):
    for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), num_stages=2):
        offs = _tile_offsets(tile, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        y = tl.load(y_ptr + offs, mask=mask, other=0.0)
        tl.store(out_ptr + offs, _scaled_add(x, y, alpha).to(out_ptr.dtype.element_ty), mask=mask)


def run(x, y, alpha, out):
    n = x.numel()
    tiles = triton.cdiv(n, 128)
    _persistent[(min(132, tiles),)](x, y, out, alpha, n, tiles, BLOCK=128)
''',
    "unsorted_moe_loop": '''
@triton.heuristics({"EVEN_H": lambda args: args["H"] % args["BLOCK_H"] == 0})
@triton.jit
def _moe_rows(x_ptr, ids_ptr, w_ptr, out_ptr, T, H, TOPK: tl.constexpr, BLOCK_H: tl.constexpr, EVEN_H: tl.constexpr):
    t = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    x = tl.load(x_ptr + t * H + cols, mask=mask, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for slot in tl.static_range(TOPK):
        e = tl.load(ids_ptr + t * TOPK + slot).to(tl.int64)
        w = tl.load(w_ptr + e * H + cols, mask=mask, other=0.0).to(tl.float32)
        acc += tl.where(mask, x * w, 0.0)
    tl.store(out_ptr + t * H + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def run(x, ids, w, out):
    T, H = x.shape
    topk = ids.shape[1]
    try:
        flat = ids.view(-1)
    except RuntimeError:
        flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w.shape[0])
    _moe_rows[(T,)](x, ids, w, out, T, H, TOPK=topk, BLOCK_H=triton.next_power_of_2(H))
''',
    "odd_masks_and_libdevice": '''
from triton.language.extra import libdevice


@triton.jit
def _gelu_tanh(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = (offs < n) & (offs % 7 != 6) | (offs == n - 1)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = 0.5 * x * (1.0 + libdevice.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def run(x, out):
    n = x.numel()
    scale = 1.0 / math.sqrt(max(1, x.shape[-1]))
    if n == 0:
        return
    _gelu_tanh[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024, num_warps=8, num_stages=1)
''',
}


@pytest.mark.parametrize("name", sorted(HONEST))
def test_an_honest_kernel_passes_the_policy(name):
    report = check_source(HEADER + HONEST[name])
    assert report.ok, report.message(limit=10)
