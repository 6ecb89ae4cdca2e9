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
    objective = "time"            # time | energy | time-energy (two objectives: tpe by default)

    [strategy]
    name = "auto"                 # auto | tpe | random | grid | gp | cmaes | nsga2 | optuna-random (strategies.names)
    evaluations = 8               # per block (per block and shape with tune = "per-shape")
    max_minutes = 3.0             # optional wall-clock cap for the whole job
    baseline_every = 1            # re-time the baseline before every Nth evaluation (default: by device)
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
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from enum import Enum
from typing import Any, Sequence

from kernelforge.block import DTYPES, Shape
from kernelforge.errors import UserError
from kernelforge.llm_spec import LLMSpec, parse_llm
from kernelforge.fields import compile_target, count, device_name, dtype_name, positive_number
from kernelforge.fields import typed as _typed
from kernelforge.llm_spec import unknown_fields as _unknown
from kernelforge.objective import Objective
from kernelforge.redact import register_url
from kernelforge.storage_url import sqlite_file
from kernelforge.strategies.names import STRATEGIES, STRATEGY_NAMES

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

_JOB_KEYS = {"name", "description", "device", "target", "dtype", "seed", "storage", "tune", "objective"}
_STRATEGY_KEYS = {"name", "evaluations", "max_minutes", "warm_start", "baseline_every"}
_BLOCK_KEYS = {"id", "shapes", "templates"}

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
    #: re-time a shape group's baseline before every Nth evaluation (None: by device, kernelforge.search.retime)
    baseline_every: int | None = None


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
    objective: Objective = Objective.TIME

    @property
    def report_dir(self) -> Path:
        """Where the report is written: reports/<name>/, except for an LLM replay into another
        database than the one it replays (``--llm replay:PATH --storage OTHER``), whose report goes
        next to its own database (``<folder>/<stem>-report/`` for a SQLite file, else
        reports/<name>-replay/), never over the original search's."""
        home = Path("reports") / self.name
        replay = self.llm.replay if self.llm is not None else None
        if replay is None or not self.storage or self.storage in (replay, self._default_storage):
            return home
        db = sqlite_file(self.storage)
        if db is not None and db.name:
            return db.parent / f"{db.stem}-report"
        return Path("reports") / f"{self.name}-replay"

    @property
    def _default_storage(self) -> str:
        return f"sqlite:///{Path('reports') / self.name / 'kernelforge.db'}"

    @property
    def storage_url(self) -> str:
        """The SQLAlchemy URL of the job's database."""
        return self.storage or self._default_storage


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
    device = device_name(f"{path} [job] device", job.get("device", "interpret"))
    dtype = dtype_name(f"{path} [job] dtype", job.get("dtype", "bfloat16"))
    tune = _typed(f"{path} [job] tune", job.get("tune", "all-shapes"), str, '"all-shapes"')
    if tune not in TUNE_MODES:
        raise UserError(f"{path} [job] tune: {tune!r} is not one of {', '.join(TUNE_MODES)}")
    objective = Objective.parse(job.get("objective", "time"), f"{path} [job] objective")
    seed = count(f"{path} [job] seed", job.get("seed", 0), least=0, most=2**32 - 1,
                 example="an integer from 0 to 4294967295")
    target = job.get("target")
    if target is not None:
        compile_target(f"{path} [job] target", target)  # as `kernelforge compile --target` checks it
    storage = _typed(f"{path} [job] storage", job.get("storage", ""), str, 'a SQLAlchemy URL such as "sqlite:///x.db"')
    register_url(storage)  # its password is masked in everything written from now on

    strategy_name = _typed(f"{path} [strategy] name", strategy.get("name", "auto"), str, '"auto"')
    if strategy_name not in STRATEGY_NAMES:
        close = difflib.get_close_matches(strategy_name, STRATEGY_NAMES, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UserError(f"{path} [strategy] name: {strategy_name!r} is not one of {', '.join(STRATEGY_NAMES)}{hint}")
    strategy_name = _objective_strategy(objective, strategy_name, "name" in strategy, path)
    evaluations = count(f"{path} [strategy] evaluations", strategy.get("evaluations", 16))
    max_minutes = strategy.get("max_minutes")
    if max_minutes is not None:
        max_minutes = positive_number(f"{path} [strategy] max_minutes", max_minutes, "a number of minutes")
    warm_start = warm_sources(strategy.get("warm_start", []), f"{path} [strategy] warm_start")
    baseline_every = strategy.get("baseline_every")
    if baseline_every is not None:
        baseline_every = count(f"{path} [strategy] baseline_every", baseline_every,
                               example="a number of evaluations, e.g. 1 (the baseline beside every candidate)")

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
        if "templates" in entry and not templates:
            raise UserError(f"{where} templates: [] names no template; list the templates to search, or leave "
                            "templates out to search every template of the block")
        if catalog is not None:
            _check_block(where, catalog, block_id, shapes, templates, dtype)
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
                              warm_start, baseline_every),
        device=device, target=target, dtype=dtype, seed=seed, storage=storage, tune=Tune(tune),
        description=str(job.get("description", "")), llm=llm, objective=objective,
    )


def _objective_strategy(objective: Objective, name: str, explicit: bool, path: Path) -> str:
    """The strategy of a job tuning for ``objective``: time-energy needs one that takes two
    objectives (the default becomes "tpe"); an explicit single-objective one is refused."""
    if objective is not Objective.TIME_ENERGY or STRATEGIES[name].objectives == 2:
        return name
    if not explicit:
        return "tpe"
    two = ", ".join(s.name for s in STRATEGIES.values() if s.objectives == 2)
    raise UserError(f'{path} [strategy] name: {name!r} tunes one objective; objective = "time-energy" needs a '
                    f"strategy that takes two: {two} (or leave [strategy] name out for tpe)")


def warm_sources(values: Any, where: str) -> tuple[str, ...]:
    """Warm-start sources (job names, or ``shapes``: :mod:`kernelforge.search.warm`), each once, in order."""
    if isinstance(values, str):
        raise UserError(f'{where}: expected a list, got {values!r}; write [{json.dumps(values)}] (job names, or '
                        '"shapes" for the template\'s other shapes)')
    _typed(where, values, list, 'a list of job names, e.g. ["h100-run"], or ["shapes"] (other shapes of the template)')
    for value in values:
        if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*", value):
            raise UserError(f'{where}: {value!r} is not a job name (letters, digits, "-", "_", ".") or "shapes"')
    return tuple(dict.fromkeys(values))


def require_llm_endpoint(job: Job) -> None:
    """A job's live LLM generator needs an endpoint and a model: say which is missing, and where."""
    spec = job.llm
    if spec is None or spec.replay is not None:
        return
    for index, model in enumerate(spec.models, start=1):
        if not model.base_url:
            raise UserError(f'{job.path} [[llm.models]] #{index} ({model.model}): missing base_url (there or in '
                            '[llm]), e.g. base_url = "https://api.openai.com/v1" (or pass --llm URL --llm-model NAME)')
    if spec.models:
        return
    if not spec.base_url:
        raise UserError(f'{job.path} [llm]: missing base_url, e.g. base_url = "https://api.openai.com/v1" '
                        "(or pass --llm URL)")
    if not spec.model:
        raise UserError(f'{job.path} [llm]: missing model, e.g. model = "gpt-4.1" (or pass --llm-model NAME)')


def _check_block(where: str, catalog, block_id: str, shapes: str, templates: list[str], dtype: str) -> None:
    try:
        block = catalog.block(block_id)
        block.shapes(shapes)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
    if dtype not in block.dtypes:
        raise UserError(f"{where}: {block_id} is searched in {', '.join(block.dtypes)} (its block.py dtypes), not "
                        f"the job's dtype {dtype}; set [job] dtype to one of those")
    known = catalog.listing(block_id).names
    for name in templates:
        if name not in known:
            raise UserError(f"{where} templates: {block_id} has no template {name!r}; it has {', '.join(known)}")
    catalog.templates(block_id, templates or None)  # what the job searches loads (a broken file says why)


#: Where job files live, relative to the working directory (as reports/ is).
JOBS_DIR = Path("search")


def known_jobs() -> dict[str, list[Path]]:
    """Job name -> the job files of that name, for every ``search/*.toml`` (the name is ``[job] name``,
    else the stem)."""
    found: dict[str, list[Path]] = {}
    for path in sorted(JOBS_DIR.glob("*.toml")):
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
            name = raw.get("job", {}).get("name", path.stem)
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
            name = path.stem  # a broken file still counts under its stem; loading it says what is wrong
        found.setdefault(str(name), []).append(path)
    return found


def job_path(name_or_path: str) -> Path:
    """The job file ``name_or_path`` means: a path to a file, ``search/<name>.toml``, or the job
    under ``search/`` whose ``[job] name`` it is."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    if path.exists():
        raise UserError(f"{name_or_path}: is {'a folder' if path.is_dir() else 'not a regular file'}; give a job "
                        "file (a .toml) or a job's name")
    named = JOBS_DIR / f"{name_or_path}.toml"
    if named.is_file():
        return named
    jobs = known_jobs()
    if len(jobs.get(name_or_path, [])) > 1:
        raise UserError(f"{name_or_path}: {' and '.join(map(str, jobs[name_or_path]))} both name their job "
                        f"{name_or_path!r}; give the file's path, or rename one ([job] name)")
    if name_or_path in jobs:
        return jobs[name_or_path][0]
    listing = ", ".join(jobs) if jobs else f"none (no {JOBS_DIR}/*.toml here)"
    raise UserError(f"{name_or_path}: no such job file or job name; give a path to a job file, or one of the jobs "
                    f"under {JOBS_DIR}/: {listing}")
