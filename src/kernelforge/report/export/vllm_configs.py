"""fused_moe config files for vLLM and SGLang from a collected report (``kernelforge export JOB
--format vllm [--layout vllm|sglang] [--split-down]``).

One JSON file per (E, N) maps the token count M (a string) to ``{BLOCK_SIZE_M, BLOCK_SIZE_N,
BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages}``. N is the expert intermediate size I of the
measured shape (both loaders look configs up with ``E, _, N = w2.shape``, w2 [E, H, I] per
tensor-parallel shard: N = I at TP 1). The rules below restate, without copying, the loaders'
code:

- vLLM (``vllm/model_executor/layers/fused_moe/fused_moe.py``, ``get_config_file_name``):
  ``E={E},N={N},device_name={GPU}[,dtype={dtype}][,block_shape=[n,k]].json`` with GPU the CUDA
  device name, spaces -> ``_``, and every name with an ``H200`` word (``NVIDIA H200 NVL``,
  ``NVIDIA H200 141GB``) read as ``NVIDIA_H200``; the block shape is written without spaces.
  ``get_moe_configs`` drops a ``triton_version`` key and turns every other key into an int; the
  tuner (``benchmarks/kernels/benchmark_moe.py``, ``save_configs``; vLLM PR #24769) writes that
  key first, so the export does too, from the stored environment's Triton version.
- SGLang (``python/sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py``,
  ``get_config_file_name`` / ``get_moe_configs``): the same name without the H200 rule, the block
  shape as Python prints a list (``[128, 128]``), ``_down`` before ``.json`` for the separate
  down-projection (GEMM2) file, in ``configs/triton_<x_y_z>/``; its loader turns every key into
  an int, so no ``triton_version`` key is written there (the folder names the version).

The dtype part (both: ``get_config_dtype_str``): none for bf16/fp16 weights, ``float32`` for fp32,
``fp8_w8a8`` (with ``block_shape=[128,128]``) for the FP8 block-scaled experts. Other weight
formats (INT4, MXFP4) are not mapped to a fused_moe dtype: such blocks are skipped with a note.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from kernelforge.catalog import Catalog
from kernelforge.devices.hardware import timed_device_name
from kernelforge.errors import UserError
from kernelforge.quant.base import Bf16Weights
from kernelforge.quant.fp8 import BLOCK as FP8_BLOCK
from kernelforge.quant.fp8 import Fp8BlockWeights
from kernelforge.report.export.entry import ExportEntry, provenance
from kernelforge.report.records import BlockReport, Report, ShapeRow
from kernelforge.result import Status
from kernelforge.store.store import Store

#: The fused_moe config keys both loaders read, in the tuner's order.
VLLM_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
#: The MoE templates' GEMM2 parameters, by the GEMM1 key they mirror (BLOCK_SIZE_M is shared: both
#: GEMMs run over one moe_align_block_size sort, which SGLang also enforces for its _down file).
GEMM2_KEYS = {key: f"{key}2" for key in VLLM_KEYS if key != "BLOCK_SIZE_M"}


class Layout(enum.Enum):
    """Whose loader the files are written for."""

    VLLM = "vllm"
    SGLANG = "sglang"


@dataclasses.dataclass(frozen=True)
class ConfigDtype:
    """The dtype part of a config file name (None: no part) and the block shape (None: none)."""

    name: str | None
    block_shape: tuple[int, int] | None = None


def cuda_device_name(env: dict[str, Any]) -> str:
    """The GPU the stored timings measure (the recorded GPU for replayed timings; the device name
    the environment carries otherwise), as torch names it."""
    return timed_device_name(env) or str(env.get("device_name", "unknown"))


def vllm_device_name(env: dict[str, Any]) -> str:
    """The device part of a vLLM config file name, as vLLM's ``get_config_file_name`` computes it:
    spaces -> ``_``, any name with an ``H200`` word -> ``NVIDIA_H200``."""
    name = cuda_device_name(env).replace(" ", "_")
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def sglang_device_name(env: dict[str, Any]) -> str:
    """The device part of an SGLang config file name (its ``get_config_file_name``): spaces -> _."""
    return cuda_device_name(env).replace(" ", "_")


def config_dtype(block: object, job_dtype: str) -> ConfigDtype | None:
    """The fused_moe dtype of a block's routed-expert weights (``get_config_dtype_str``), or None
    when the weight format has no fused_moe dtype kernelforge maps."""
    fmt = getattr(block, "routed_format", None)
    if fmt is None or isinstance(fmt, Bf16Weights):
        return ConfigDtype("float32" if job_dtype == "float32" else None)
    if isinstance(fmt, Fp8BlockWeights):
        return ConfigDtype("fp8_w8a8", (FP8_BLOCK, FP8_BLOCK))
    return None


def vllm_file_name(E: int, N: int, device_name: str, dtype: ConfigDtype | None = None) -> str:
    """vLLM's config file name (``get_config_file_name``); ``device_name`` as :func:`vllm_device_name`."""
    dtype = dtype or ConfigDtype(None)
    part = f",dtype={dtype.name}" if dtype.name else ""
    shape = f",block_shape=[{dtype.block_shape[0]},{dtype.block_shape[1]}]" if dtype.block_shape else ""
    return f"E={E},N={N},device_name={device_name}{part}{shape}.json"


def sglang_file_name(E: int, N: int, device_name: str, dtype: ConfigDtype | None = None, down: bool = False) -> str:
    """SGLang's config file name (``get_config_file_name``, ``down_moe`` -> ``_down``)."""
    dtype = dtype or ConfigDtype(None)
    part = f",dtype={dtype.name}" if dtype.name else ""
    shape = f",block_shape={list(dtype.block_shape)}" if dtype.block_shape else ""
    return f"E={E},N={N},device_name={device_name}{part}{shape}{'_down' if down else ''}.json"


def sglang_folder(triton_version: str) -> str:
    """SGLang's per-Triton-version folder under ``configs/`` (``triton_3_4_0``)."""
    return f"configs/triton_{triton_version.replace('.', '_')}"


def gemm2_split(params: dict[str, Any]) -> list[str]:
    """The GEMM2 parameters of ``params`` that differ from the GEMM1 ones they mirror."""
    return [f"{k2}={params[k2]} vs {k}={params[k]}" for k, k2 in GEMM2_KEYS.items() if k2 in params and params[k2] != params[k]]


def down_config(params: dict[str, Any]) -> dict[str, int]:
    """The GEMM2 (down-projection) configuration of a point: BLOCK_SIZE_M shared, the rest from
    the ``...2`` parameters (the GEMM1 value where a template has none)."""
    return {k: int(params[GEMM2_KEYS[k]] if k in GEMM2_KEYS and GEMM2_KEYS[k] in params else params[k]) for k in VLLM_KEYS}


#: What every fused_moe export says of where its numbers come from.
TUNED_ON = ("tuned on kernelforge's fused-MoE kernel (its Triton templates in vLLM's fused_moe design: the same "
            "sort, tiles and configuration keys), not on vLLM's own fused_moe kernel, which kernelforge did not time")


def space_of(entries: list[ExportEntry]) -> dict[str, dict[str, Any]]:
    """Block -> which space its exported configurations come from: the templates, and whether each
    configuration came from a space with GEMM2 tied to GEMM1 (vLLM's: a template with no ``...2``
    parameters, such as ``vllm_tied``) or from the split space (GEMM2 tuned apart; exported only where
    GEMM2 equals GEMM1, or as the fastest such candidate)."""
    out: dict[str, dict[str, Any]] = {}
    for e in entries:
        tied = not any(k2 in e.params for k2 in GEMM2_KEYS.values())
        info = out.setdefault(e.block, {"templates": [], "tied": 0, "split": 0})
        if e.template and e.template not in info["templates"]:
            info["templates"].append(e.template)
        info["tied" if tied else "split"] += 1
    for info in out.values():
        info["space"] = ("tied: GEMM2 takes GEMM1's configuration (vLLM's space)" if not info["split"] else
                         "split: GEMM2 tuned apart from GEMM1 (the configurations exported have GEMM2 = GEMM1)"
                         if not info["tied"] else "mixed: tied and split templates")
        info["tuned_on"] = TUNED_ON
    return out


def _fastest_shippable(store: Store, block: BlockReport, row: ShapeRow) -> ShapeRow | None:
    """``row`` with its winner replaced by the fastest candidate measured on the shape (same
    device and versions) that uses one configuration for both GEMMs, the shape's baseline when
    none beats it, or None when the baseline itself is not shippable there. Unconfirmed."""
    base_s = row.search_baseline_s  # the search's timings only: the candidates compared have no pairs
    if base_s is None:
        return None
    params = {c.id: c for c in store.candidates(block.block)}
    best = None
    for r in store.results(block=block.block):
        c = params.get(r.candidate_id)
        if (c is None or r.shape != row.shape or r.env_key != block.env_key or r.status is not Status.OK
                or not r.median_s or (r.median_s >= base_s and c.id != row.baseline) or gemm2_split(c.params)
                or any(k not in c.params for k in VLLM_KEYS)):
            continue
        if best is None or r.median_s < best[0].median_s:
            best = (r, c)
    if best is None:
        return None
    r, c = best
    is_baseline = c.id == row.baseline
    best_s = base_s if is_baseline else r.median_s
    return dataclasses.replace(row, winner=c.id, template=c.template, params=dict(c.params), measured_by="search",
                               baseline_s=base_s, best_s=best_s, best_p20_s=r.p20_s, best_p80_s=r.p80_s,
                               best_samples=r.samples, speedup=base_s / best_s, speedup_p20=None, speedup_p80=None,
                               search_best_s=best_s, search_speedup=base_s / best_s, pair_speedup=None,
                               confirmed=False, pairs=0, significant=False, winner_is_baseline=is_baseline)


def _file_names(layout: Layout, E: int, N: int, env: dict[str, Any], dtype: ConfigDtype) -> tuple[str, str | None]:
    """(up file, down file or None) relative to the export folder."""
    if layout is Layout.VLLM:
        return vllm_file_name(E, N, vllm_device_name(env), dtype), None
    version = env.get("triton")
    if not version:
        raise UserError("--layout sglang needs the Triton version of the measurements (SGLang keeps configs in "
                        "configs/triton_<version>/), and the stored environment has none; re-run the search")
    folder, device = sglang_folder(str(version)), sglang_device_name(env)
    return (f"{folder}/{sglang_file_name(E, N, device, dtype)}", f"{folder}/{sglang_file_name(E, N, device, dtype, True)}")


def vllm_configs(data: Report, catalog: Catalog, store: Store, layout: Layout = Layout.VLLM, split_down: bool = False
                 ) -> tuple[dict[str, dict[str, Any]], list[str], list[ExportEntry]]:
    """File path -> JSON object for the MoE blocks of a collected report, the notes (what was
    skipped and why) and the provenance entries. ``split_down`` (SGLang only) writes each
    winner's GEMM2 configuration into the ``_down`` file beside the GEMM1 one."""
    if split_down and layout is not Layout.SGLANG:
        raise UserError("--split-down needs --layout sglang: vLLM's loader (fused_moe.py get_moe_configs) reads one "
                        "configuration per (E, N) for both GEMMs; SGLang reads a separate <name>_down.json")
    files: dict[str, dict[str, Any]] = {}
    chosen: dict[tuple[str, str], dict[str, Any]] = {}
    notes: list[str] = []
    entries: list[ExportEntry] = []
    moe_blocks = [b for b in data.blocks if b.block in catalog.blocks and catalog.block(b.block).family == "moe"]
    if not moe_blocks:
        raise UserError(f"job {data.job} has no MoE block; --format vllm writes fused_moe configs "
                        "(use --format triton or --format source for other blocks)")
    for block in moe_blocks:
        env = data.env(block)
        dtype = config_dtype(catalog.block(block.block), data.dtype)
        if dtype is None:
            fmt = type(getattr(catalog.block(block.block), "routed_format", None)).__name__
            notes.append(f"{block.block}: its expert weights ({fmt}) have no fused_moe config dtype kernelforge maps; skipped")
            continue
        for row in block.shapes:
            dims = row.dims or {}
            if not row.is_moe:
                notes.append(f"{block.block} {row.shape}: no T/E/I dimensions; skipped")
                continue
            if row.best_s is None:
                notes.append(f"{block.block} {row.shape}: no timed winner stored; skipped")
                continue
            missing = [k for k in VLLM_KEYS if k not in row.params]
            if missing:
                notes.append(f"{block.block} {row.shape}: the winner's template {row.template} has no "
                             f"{', '.join(missing)}; vLLM's fused_moe kernel cannot use it; skipped")
                continue
            split = gemm2_split(row.params)
            if split and not split_down:
                shippable = _fastest_shippable(store, block, row)
                note = (f"{block.block} {row.shape}: the winner configures GEMM2 apart from GEMM1 ({', '.join(split)}); "
                        "a fused_moe config file holds one configuration for both GEMMs (ship it with "
                        "--layout sglang --split-down, --format triton or --format source)")
                if shippable is None:
                    notes.append(f"{note}; no single-configuration candidate was measured there: skipped")
                    continue
                row = shippable
                notes.append(f"{note}; exported the baseline's own configuration instead" if row.winner_is_baseline
                             else f"{note}; exported the fastest single-configuration candidate {row.winner} "
                                  f"({row.speedup:.3f}x over the baseline) instead")
            name, down = _file_names(layout, int(dims["E"]), int(dims["I"]), env, dtype)
            key = str(int(dims["T"]))
            previous = chosen.get((name, key))
            # Both loaders key configs by token count only: when two stored shapes share E, N and T
            # (other routings), the uniform-routing one stands for the serving case.
            if previous is not None:
                if dims.get("ROUTING", "uniform") != "uniform" or previous["routing"] == "uniform":
                    notes.append(f"{block.block} {row.shape}: same E, N and T as {previous['shape']}; kept that one")
                    continue
            chosen[(name, key)] = {"shape": row.shape, "routing": dims.get("ROUTING", "uniform")}
            if layout is Layout.VLLM and name not in files and env.get("triton"):
                files[name] = {"triton_version": str(env["triton"])}
            files.setdefault(name, {})[key] = {k: int(row.params[k]) for k in VLLM_KEYS}
            entries.append(provenance(name, block.block, row, token_count=key))
            if down is not None and split_down:
                files.setdefault(down, {})[key] = down_config(row.params)
                entries.append(provenance(down, block.block, row, token_count=key))
    if not files:
        raise UserError(f"job {data.job}: no MoE winner could be exported ({'; '.join(notes) or 'nothing stored'})")
    for name, table in files.items():
        head = {k: v for k, v in table.items() if k == "triton_version"}
        files[name] = {**head, **dict(sorted(((k, v) for k, v in table.items() if k != "triton_version"),
                                             key=lambda kv: int(kv[0])))}
    return files, notes, entries
