"""Job files: what a search does, as TOML under ``search/``.

::

    [job]
    name = "demo"                 # default: the file's stem; results go to reports/<name>/
    device = "interpret"          # cuda | interpret | replay:PATH (recorded measurements)
    target = "sm_90"              # ahead-of-time compile target (default: local GPU, else sm_90)
    dtype = "bfloat16"
    seed = 0
    storage = ""                  # any SQLAlchemy URL; default sqlite:///reports/<name>/kernelforge.db
    tune = "all-shapes"           # one config for all shapes (geomean speedup) or "per-shape"

    [strategy]
    name = "tpe"                  # tpe | random | grid | gp | cmaes | nsga2 | optuna-random
    evaluations = 8               # per block (per block and shape with tune = "per-shape")
    max_minutes = 3.0             # optional wall-clock cap for the whole job

    [[blocks]]
    id = "attention/gpt_oss_prefill"
    shapes = "smoke"              # a shape set or a shape name of the block
    templates = ["baseline"]      # names within the block; default: all of them

Every mistake names the file, the field and the fix.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .block import DTYPES
from .errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TUNE_MODES = ("all-shapes", "per-shape")
STRATEGIES = ("tpe", "random", "grid", "gp", "cmaes", "nsga2", "optuna-random")

_JOB_KEYS = {"name", "description", "device", "target", "dtype", "seed", "storage", "tune"}
_STRATEGY_KEYS = {"name", "evaluations", "max_minutes"}
_BLOCK_KEYS = {"id", "shapes", "templates"}


@dataclass(frozen=True)
class BlockSpec:
    """One block of a job: which shapes and which of its templates to search."""

    id: str
    shapes: str = "smoke"
    templates: tuple[str, ...] = ()  # template names within the block; empty = all


@dataclass(frozen=True)
class StrategySpec:
    name: str = "tpe"
    evaluations: int = 16
    max_minutes: float | None = None


@dataclass(frozen=True)
class Job:
    """A parsed, validated job file."""

    name: str
    path: Path
    blocks: tuple[BlockSpec, ...]
    strategy: StrategySpec
    device: str = "interpret"
    target: str | None = None
    dtype: str = "bfloat16"
    seed: int = 0
    storage: str = ""
    tune: str = "all-shapes"
    description: str = ""

    @property
    def report_dir(self) -> Path:
        return Path("reports") / self.name

    @property
    def storage_url(self) -> str:
        """The SQLAlchemy URL of the job's database."""
        return self.storage or f"sqlite:///{self.report_dir / 'kernelforge.db'}"


def _unknown(where: str, table: dict[str, Any], allowed: set[str]) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f"did you mean {close[0]}?" if close else f"allowed: {', '.join(sorted(allowed))}"
            raise UserError(f"{where}: unknown field {key!r} ({hint})")


def _typed(where: str, value: Any, kind: type | tuple[type, ...], example: str) -> Any:
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise UserError(f"{where}: expected {example}, got {value!r}")
    if not isinstance(value, kind):
        raise UserError(f"{where}: expected {example}, got {value!r}")
    return value


def load_job(path: str | Path, catalog=None) -> Job:
    """Read and validate a job file. With a catalog, block ids and template names are checked too."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: no such job file; jobs live under search/, e.g. search/demo.toml") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file; a job file is TOML") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML ({exc})") from None
    return parse_job(raw, path, catalog)


def parse_job(raw: dict[str, Any], path: Path, catalog=None) -> Job:
    """Validate an already-parsed TOML document (see :func:`load_job`)."""
    _unknown(str(path), raw, {"job", "strategy", "blocks"})
    job = _typed(f"{path} [job]", raw.get("job", {}), dict, "a table")
    strategy = _typed(f"{path} [strategy]", raw.get("strategy", {}), dict, "a table")
    _unknown(f"{path} [job]", job, _JOB_KEYS)
    _unknown(f"{path} [strategy]", strategy, _STRATEGY_KEYS)

    name = _typed(f"{path} [job] name", job.get("name", path.stem), str, 'a name such as "demo"')
    if not name or not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
        raise UserError(f"{path} [job] name: {name!r} must use letters, digits, '-', '_' or '.' (it names reports/<name>/)")
    device = _typed(f"{path} [job] device", job.get("device", "interpret"), str, '"cuda", "interpret" or "replay:PATH"')
    if not (device in ("cuda", "interpret") or device.startswith("cuda:") or device.startswith("replay:")):
        raise UserError(f"{path} [job] device: {device!r} is not cuda, interpret or replay:PATH")
    dtype = _typed(f"{path} [job] dtype", job.get("dtype", "bfloat16"), str, '"bfloat16"')
    if dtype not in DTYPES:
        raise UserError(f"{path} [job] dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    tune = _typed(f"{path} [job] tune", job.get("tune", "all-shapes"), str, '"all-shapes"')
    if tune not in TUNE_MODES:
        raise UserError(f"{path} [job] tune: {tune!r} is not one of {', '.join(TUNE_MODES)}")
    seed = _typed(f"{path} [job] seed", job.get("seed", 0), int, "an integer")
    target = job.get("target")
    if target is not None:
        _typed(f"{path} [job] target", target, str, '"sm_90"')
    storage = _typed(f"{path} [job] storage", job.get("storage", ""), str, 'a SQLAlchemy URL such as "sqlite:///x.db"')

    strategy_name = _typed(f"{path} [strategy] name", strategy.get("name", "tpe"), str, '"tpe"')
    if strategy_name not in STRATEGIES:
        close = difflib.get_close_matches(strategy_name, STRATEGIES, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UserError(f"{path} [strategy] name: {strategy_name!r} is not one of {', '.join(STRATEGIES)}{hint}")
    evaluations = _typed(f"{path} [strategy] evaluations", strategy.get("evaluations", 16), int, "a positive integer")
    if evaluations < 1:
        raise UserError(f"{path} [strategy] evaluations: must be at least 1, got {evaluations}")
    max_minutes = strategy.get("max_minutes")
    if max_minutes is not None:
        _typed(f"{path} [strategy] max_minutes", max_minutes, (int, float), "a number of minutes")
        if max_minutes <= 0:
            raise UserError(f"{path} [strategy] max_minutes: must be positive, got {max_minutes}")

    raw_blocks = raw.get("blocks")
    if not raw_blocks:
        raise UserError(f'{path}: no [[blocks]]; add at least one, e.g. [[blocks]] id = "moe/gpt_oss_experts"')
    _typed(f"{path} [[blocks]]", raw_blocks, list, "an array of tables [[blocks]]")
    blocks = []
    for index, entry in enumerate(raw_blocks, start=1):
        where = f"{path} [[blocks]] #{index}"
        _typed(where, entry, dict, "a table")
        _unknown(where, entry, _BLOCK_KEYS)
        if "id" not in entry:
            raise UserError(f'{where}: missing id, e.g. id = "attention/gpt_oss_decode"')
        block_id = _typed(f"{where} id", entry["id"], str, "a block id")
        shapes = _typed(f"{where} shapes", entry.get("shapes", "smoke"), str, 'a shape set name such as "smoke"')
        templates = entry.get("templates", [])
        _typed(f"{where} templates", templates, list, 'a list of template names, e.g. ["baseline"]')
        for t in templates:
            _typed(f"{where} templates", t, str, "template names")
        if catalog is not None:
            _check_block(where, catalog, block_id, shapes, templates)
        blocks.append(BlockSpec(block_id, shapes, tuple(templates)))
    ids = [b.id for b in blocks]
    if len(ids) != len(set(ids)):
        raise UserError(f"{path} [[blocks]]: a block is listed twice; list each block once")

    return Job(
        name=name, path=path, blocks=tuple(blocks),
        strategy=StrategySpec(strategy_name, evaluations, float(max_minutes) if max_minutes is not None else None),
        device=device, target=target, dtype=dtype, seed=seed, storage=storage, tune=tune,
        description=str(job.get("description", "")),
    )


def _check_block(where: str, catalog, block_id: str, shapes: str, templates: list[str]) -> None:
    try:
        block = catalog.block(block_id)
        block.shapes(shapes)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
    known = {t.id.rpartition("/")[2] for t in catalog.templates(block_id)}
    for name in templates:
        if name not in known:
            raise UserError(f"{where} templates: {block_id} has no template {name!r}; it has {', '.join(sorted(known))}")
