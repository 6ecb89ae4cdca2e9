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
    name = "auto"                 # auto | tpe | random | grid | gp | cmaes | nsga2 | optuna-random (strategies.names)
    evaluations = 8               # per block (per block and shape with tune = "per-shape")
    max_minutes = 3.0             # optional wall-clock cap for the whole job
    warm_start = ["h100-run"]     # optional: first ask the best points of these jobs ("shapes": other shapes)

    [[blocks]]
    id = "attention/gpt_oss_prefill"
    shapes = "smoke"              # a shape set or a shape name of the block
    templates = ["baseline"]      # names within the block; default: all of them

    [llm]                         # optional: the LLM candidate generator (see LLMSpec)
    base_url = "http://127.0.0.1:8000/v1"   # any OpenAI-compatible chat-completions endpoint
    model = "my-model"
    api_key_env = "OPENAI_API_KEY"          # the NAME of the variable holding the key, never the key

Every mistake names the file, the field and the fix.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from enum import Enum
from typing import Any, Sequence
from urllib.parse import urlsplit

from kernelforge.block import DTYPES, Shape
from kernelforge.errors import UserError
from kernelforge.redact import redact_url, register, register_url
from kernelforge.strategies.names import STRATEGY_NAMES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

class Tune(str, Enum):
    """How configurations relate to shapes: the one place that groups a block's shapes into studies.

    ``ALL_SHAPES``: one configuration serves every shape of the block (objective: geometric-mean
    time ratio to the baseline). ``PER_SHAPE``: each shape gets its own, as vLLM tunes per token
    count.
    """

    ALL_SHAPES = "all-shapes"
    PER_SHAPE = "per-shape"

    def __str__(self) -> str:
        return self.value

    def groups(self, shapes: Sequence[Shape]) -> list[list[Shape]]:
        """The shape groups of one block: one study (and one winner) per group."""
        return [list(shapes)] if self is Tune.ALL_SHAPES else [[s] for s in shapes]

    def scope(self, group: Sequence[Shape]) -> str:
        """The name of a group in study names and reserves: ``all``, or the shape's name."""
        return "all" if self is Tune.ALL_SHAPES else group[0].name

    def shape_filter(self, group: Sequence[Shape]) -> str | None:
        """The shape a group's stored results are filtered by (None: every shape)."""
        return group[0].name if self is Tune.PER_SHAPE else None


TUNE_MODES = tuple(t.value for t in Tune)

_JOB_KEYS = {"name", "description", "device", "target", "dtype", "seed", "storage", "tune"}
_STRATEGY_KEYS = {"name", "evaluations", "max_minutes", "warm_start"}
_BLOCK_KEYS = {"id", "shapes", "templates"}
_LLM_KEYS = {"base_url", "model", "api_key_env", "max_calls", "max_tokens", "max_minutes", "concurrency",
             "timeout_s", "max_retries", "repair_turns", "temperature", "response_tokens", "tune_share",
             "tune_evaluations", "guide_points"}


@dataclass(frozen=True)
class BlockSpec:
    """One block of a job: which shapes and which of its templates to search."""

    id: str
    shapes: str = "smoke"
    templates: tuple[str, ...] = ()  # template names within the block; empty = all


@dataclass(frozen=True)
class StrategySpec:
    name: str = "auto"
    evaluations: int = 16
    max_minutes: float | None = None
    warm_start: tuple[str, ...] = ()  # where the first points come from (kernelforge.search.warm)


#: The most points ``[llm] guide_points`` may ask the LLM for (one answer; a longer list is a
#: bigger prompt and answer for points the job's strategy would find anyway).
MAX_GUIDE_POINTS = 64


@dataclass(frozen=True)
class LLMSpec:
    """The ``[llm]`` table: an OpenAI-compatible chat-completions endpoint that writes new templates.

    The API key is read from the environment variable named ``api_key_env`` when the search starts
    and is never stored, logged or reported (its value is registered with :mod:`kernelforge.redact`
    as soon as the job names the variable); empty means no key (a local server). Budgets bound
    the generator (``max_calls`` requests, ``max_tokens`` prompt + completion tokens, ``max_minutes``
    of wall time); ``concurrency`` requests are in flight at most, each with ``timeout_s`` and up
    to ``max_retries`` retries. A template that fails gets up to ``repair_turns`` follow-up turns
    with its error. ``tune_share`` of each block's evaluations is reserved for what the LLM writes
    (its templates, each tuned by the job's strategy for up to ``tune_evaluations`` more points,
    and the points it proposes); whatever the LLM leaves unused goes back to the human templates.

    ``guide_points``: how many points of each study's space the LLM is asked for once, after the
    baseline points, before the job's strategy takes over (:mod:`kernelforge.llm.advisor`,
    :mod:`kernelforge.strategies.guided`); 0 (the default) asks for none.

    ``replay`` is set by ``kernelforge search --llm replay[:PATH]``: the storage URL whose stored
    transcripts answer instead of the endpoint.
    """

    base_url: str = ""
    model: str = ""
    api_key_env: str = ""
    max_calls: int = 20
    max_tokens: int = 400_000
    max_minutes: float | None = 30.0
    concurrency: int = 2
    timeout_s: float = 180.0
    max_retries: int = 3
    repair_turns: int = 2
    temperature: float = 0.7
    response_tokens: int | None = None
    tune_share: float = 0.5
    tune_evaluations: int = 4
    guide_points: int = 0
    replay: str | None = None


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
    tune: Tune = Tune.ALL_SHAPES
    description: str = ""
    llm: LLMSpec | None = None

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
    _unknown(str(path), raw, {"job", "strategy", "blocks", "llm"})
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
    register_url(storage)  # its password is masked in everything written from now on

    strategy_name = _typed(f"{path} [strategy] name", strategy.get("name", "auto"), str, '"auto"')
    if strategy_name not in STRATEGY_NAMES:
        close = difflib.get_close_matches(strategy_name, STRATEGY_NAMES, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UserError(f"{path} [strategy] name: {strategy_name!r} is not one of {', '.join(STRATEGY_NAMES)}{hint}")
    evaluations = _typed(f"{path} [strategy] evaluations", strategy.get("evaluations", 16), int, "a positive integer")
    if evaluations < 1:
        raise UserError(f"{path} [strategy] evaluations: must be at least 1, got {evaluations}")
    max_minutes = strategy.get("max_minutes")
    if max_minutes is not None:
        _typed(f"{path} [strategy] max_minutes", max_minutes, (int, float), "a number of minutes")
        if max_minutes <= 0:
            raise UserError(f"{path} [strategy] max_minutes: must be positive, got {max_minutes}")
    warm_start = warm_sources(strategy.get("warm_start", []), f"{path} [strategy] warm_start")

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

    llm = None
    if "llm" in raw:
        # base_url and model may come from the command line (--llm URL --llm-model NAME): checked
        # when the search starts (require_llm_endpoint).
        llm = parse_llm(_typed(f"{path} [llm]", raw["llm"], dict, "a table"), f"{path} [llm]",
                        require_endpoint=False)

    return Job(
        name=name, path=path, blocks=tuple(blocks),
        strategy=StrategySpec(strategy_name, evaluations, float(max_minutes) if max_minutes is not None else None,
                              warm_start),
        device=device, target=target, dtype=dtype, seed=seed, storage=storage, tune=Tune(tune),
        description=str(job.get("description", "")), llm=llm,
    )


def warm_sources(values: Any, where: str) -> tuple[str, ...]:
    """Warm-start sources (job names, or ``shapes``: :mod:`kernelforge.search.warm`), each once, in order."""
    _typed(where, values, list, 'a list of job names, e.g. ["h100-run"], or "shapes" (other shapes of the template)')
    for value in values:
        if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*", value):
            raise UserError(f'{where}: {value!r} is not a job name (letters, digits, "-", "_", ".") or "shapes"')
    return tuple(dict.fromkeys(values))


def parse_llm(table: dict[str, Any], where: str, *, require_endpoint: bool = True) -> LLMSpec:
    """Validate an ``[llm]`` table (``where`` names it in messages). Without ``require_endpoint``
    base_url and model may be missing (the command line supplies them)."""
    _unknown(where, table, _LLM_KEYS)
    defaults = LLMSpec()
    base_url = _typed(f"{where} base_url", table.get("base_url", ""), str, 'a URL such as "http://127.0.0.1:8000/v1"')
    register_url(base_url)
    model = _typed(f"{where} model", table.get("model", ""), str, 'a model name such as "gpt-4.1"')
    if require_endpoint and not base_url:
        raise UserError(f'{where}: missing base_url, e.g. base_url = "https://api.openai.com/v1"')
    if base_url:
        check_base_url(base_url, f"{where} base_url")
    if require_endpoint and not model:
        raise UserError(f'{where}: missing model, e.g. model = "gpt-4.1"')
    key_env = _typed(f"{where} api_key_env", table.get("api_key_env", ""), str,
                     'the name of an environment variable, e.g. "OPENAI_API_KEY"')
    if key_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key_env):
        # Never echo the value: it may be the key itself, pasted in by mistake.
        raise UserError(f"{where} api_key_env: must be the NAME of an environment variable (letters, digits, _), "
                        "not the key itself; put the key in that variable")
    if key_env:
        register(os.environ.get(key_env))  # masked from the moment the job names it, before any request

    def integer(name: str, low: int) -> int:
        value = _typed(f"{where} {name}", table.get(name, getattr(defaults, name)), int, "an integer")
        if value < low:
            raise UserError(f"{where} {name}: must be at least {low}, got {value}")
        return value

    def number(name: str, low: float, high: float | None = None, *, allow_zero: bool = False) -> float:
        value = _typed(f"{where} {name}", table.get(name, getattr(defaults, name)), (int, float), "a number")
        if value < low or (value == low and not allow_zero) or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"above {low}"
            raise UserError(f"{where} {name}: must be {bound}, got {value}")
        return float(value)

    max_minutes = table.get("max_minutes", defaults.max_minutes)
    if "max_minutes" in table:
        max_minutes = number("max_minutes", 0.0)
    guide_points = integer("guide_points", 0)
    if guide_points > MAX_GUIDE_POINTS:
        raise UserError(f"{where} guide_points: must be between 0 and {MAX_GUIDE_POINTS} (points the LLM is asked "
                        f"for once per study; 0 asks for none), got {guide_points}")
    response_tokens = table.get("response_tokens")
    if response_tokens is not None:
        response_tokens = integer("response_tokens", 1)
    return LLMSpec(
        base_url=base_url, model=model, api_key_env=key_env,
        max_calls=integer("max_calls", 1), max_tokens=integer("max_tokens", 1), max_minutes=max_minutes,
        concurrency=integer("concurrency", 1), timeout_s=number("timeout_s", 0.0),
        max_retries=integer("max_retries", 0), repair_turns=integer("repair_turns", 0),
        temperature=number("temperature", 0.0, 2.0, allow_zero=True), response_tokens=response_tokens,
        tune_share=number("tune_share", 0.0, 1.0), tune_evaluations=integer("tune_evaluations", 0),
        guide_points=guide_points,
    )


def require_llm_endpoint(job: Job) -> None:
    """A job's live LLM generator needs an endpoint and a model: say which is missing, and where."""
    spec = job.llm
    if spec is None or spec.replay is not None:
        return
    if not spec.base_url:
        raise UserError(f'{job.path} [llm]: missing base_url, e.g. base_url = "https://api.openai.com/v1" '
                        "(or pass --llm URL)")
    if not spec.model:
        raise UserError(f'{job.path} [llm]: missing model, e.g. model = "gpt-4.1" (or pass --llm-model NAME)')


def check_base_url(url: str, where: str) -> None:
    """An endpoint URL must be http(s)://host[...]; the message never repeats credentials in it."""
    register_url(url)
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UserError(f"{where}: {redact_url(url)!r} is not an http(s) URL; give the endpoint's base URL, "
                        "e.g. http://127.0.0.1:8000/v1")


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
