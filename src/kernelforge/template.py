"""Templates: Jinja2 sources of Triton implementations of a block, with their search space.

A template is one ``*.py.j2`` file in a block's folder. It opens with a Jinja comment holding a
TOML header that declares the template and its space::

    {#-
    [template]
    role = "baseline"            # "baseline" (the human expert's kernel) or "variant"
    origin = "human"             # human | llm
    description = "FlashAttention-2 forward with sinks and a band mask"
    constraints = ["BLOCK_N <= BLOCK_M"]

    [space]                      # parameter -> allowed values (Triton's spelling)
    BLOCK_M = [64, 128]
    BLOCK_N = [32, 64, 128]
    num_warps = [4, 8]
    num_stages = [2, 3, 4]

    [baseline]                   # the point a human expert ships
    BLOCK_M = 64
    BLOCK_N = 64
    num_warps = 4
    num_stages = 3
    -#}

A baseline template may also declare per-shape baseline points: ``[[baselines]]`` rules (the first
whose ``when`` holds for a shape gives its point, ``[baseline]`` is the fallback) and ``[template]
baseline_source`` naming where ``[baseline]`` comes from; see :mod:`kernelforge.baselines` and
:meth:`Template.baseline_for`.

A template may take its body from another template of its folder (``[template] body = "baseline"``:
the file is then a header alone) and tie body variables to its parameters (``[ties]``, body
variable = the parameter whose value it takes): a variant that searches part of a kernel's space
without a second copy of the kernel. The body is joined to the header when the file is loaded
(:meth:`Template.from_file`), so :attr:`Template.text` is always the whole template, which a store,
a report or an LLM prompt holds and :meth:`Template.from_text` parses on its own.

The variables the template body uses must be exactly the declared parameters and tied names,
besides the names of the kernel text kernelforge shares with templates
(:mod:`kernelforge.shared_kernels`: ``{{ moe_align }}``), which no parameter may take; rendering
with a missing or unknown parameter fails (StrictUndefined). The rendered text is a self-contained Python
module with a ``run(**inputs, out)`` entry point (see :mod:`kernelforge.block`).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import jinja2
from jinja2 import meta

from kernelforge.baselines import DEFAULT_SOURCE, BaselinePoint, BaselineRule, parse_rules, resolve
from kernelforge.errors import TemplateError, UserError
from kernelforge.limits import MAX_SOURCE_CHARS
from kernelforge.render import BodyRefused, parse_body, render_body, unreadable
from kernelforge.shared_kernels import SHARED, collisions, shared_values
from kernelforge.space import Space

if TYPE_CHECKING:
    from kernelforge.block import Shape

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

TEMPLATE_SUFFIX = ".py.j2"


def template_name(path: Path) -> str:
    """The NAME a template file gives its id BLOCK/NAME: its file name without ``.py.j2``."""
    return path.name[: -len(TEMPLATE_SUFFIX)] if path.name.endswith(TEMPLATE_SUFFIX) else path.stem
ROLES = ("baseline", "variant")
ORIGINS = ("human", "llm")
#: The keys ``[template]`` may set; any other key is refused with its name.
TEMPLATE_KEYS = ("role", "origin", "description", "constraints", "baseline_source", "body")
#: Keys that would set a rule of the judge (EVALUATION.md): refused with a message saying where
#: that rule comes from. Determinism is :attr:`kernelforge.block.Block.deterministic`; tolerances,
#: held-out shapes and seeds are the block's and the harness's.
JUDGE_KEYS = ("deterministic", "tolerance", "tolerances", "rtol", "atol", "rel_norm", "held_out", "check_shapes",
              "shapes", "seed", "verify", "trusted")

_HEADER = re.compile(r"\A\s*\{#-?(.*?)-?#\}", re.DOTALL)
#: A ``[template] body`` value: the name of a template file in the same folder, nothing else.
_BODY_NAME = re.compile(r"[A-Za-z0-9_]+")


@dataclass(frozen=True)
class Template:
    """A parsed, validated template. Build with :meth:`from_file` or :meth:`from_text`.

    ``baseline`` is the ``[baseline]`` point; ``baseline_rules`` the parsed ``[[baselines]]``
    (empty for most templates: then every shape's baseline is ``baseline``) and
    ``baseline_source`` where ``[baseline]`` comes from. ``ties`` maps a body variable to the
    parameter whose value it takes at every point (``[ties]``; empty for most templates), and
    ``body_of`` names the template whose body this one's is (``[template] body``; None for most).
    """

    id: str
    block_id: str
    text: str
    space: Space
    baseline: Mapping[str, Any]
    role: str = "variant"
    origin: str = "human"
    description: str = ""
    path: Path | None = field(default=None, compare=False)
    baseline_source: str = DEFAULT_SOURCE
    baseline_rules: tuple[BaselineRule, ...] = ()
    ties: Mapping[str, str] = field(default_factory=dict)
    body_of: str | None = None

    @classmethod
    def from_file(cls, path: Path, block_id: str) -> "Template":
        """Parse ``path`` (a ``*.py.j2`` in the folder of ``block_id``). A header that names
        another template's body (``[template] body``) gets that file's body joined to it."""
        name = template_name(path)
        text = _read(path)
        header = parse_header(text, str(path))
        info = header.get("template", {})
        body_of = info.get("body") if isinstance(info, dict) else None
        body_at = None
        if isinstance(body_of, str) and _BODY_NAME.fullmatch(body_of):
            text, body_at = _joined(text, path, body_of)  # the same header, so parsed once
            _check_size(text, str(path))
        return cls._parsed(text, header, template_id=f"{block_id}/{name}", block_id=block_id, where=str(path),
                           path=path, body_at=body_at)

    @classmethod
    def from_text(
        cls, text: str, *, template_id: str, block_id: str, where: str, path: Path | None = None
    ) -> "Template":
        """Parse template source ``text``; ``where`` names it in error messages. The body is
        parsed by :func:`kernelforge.render.parse_body` (the sandboxed template language); a text
        over :data:`~kernelforge.limits.MAX_SOURCE_CHARS` is refused before anything else."""
        return cls._parsed(text, parse_header(text, where), template_id=template_id, block_id=block_id, where=where,
                           path=path)

    @classmethod
    def _parsed(cls, text: str, header: dict[str, Any], *, template_id: str, block_id: str, where: str,
                path: Path | None, body_at: _BodyAt | None = None) -> "Template":
        """The template of ``text``, whose TOML header is ``header`` (parsed by :func:`parse_header`);
        ``body_at``: where the body of a joined text is (its errors name that file and line)."""
        info = header.get("template", {})
        _check_keys(info, where)
        unknown_tables = sorted(set(header) - {"template", "space", "baseline", "baselines", "ties"})
        if unknown_tables:
            raise TemplateError(f"{where}: unknown header table(s) {', '.join(unknown_tables)}; "
                                "use [template], [space], [baseline] (and [[baselines]] rules, [ties])")
        if "space" not in header or not header["space"]:
            raise TemplateError(f"{where}: header has no [space] table; declare each parameter's values")
        for table in ("template", "space", "baseline", "ties"):
            if not isinstance(header.get(table, {}), dict):
                raise TemplateError(f"{where}: [{table}] must be a table ([{table}]), not an array or a value")
        constraints = info.get("constraints", [])
        if not isinstance(constraints, list) or not all(isinstance(c, str) for c in constraints):
            raise TemplateError(f'{where} [template] constraints: must be a list of expressions, e.g. '
                                f'constraints = ["BLOCK_N <= BLOCK_M"]')
        space = _as_template_error(Space.build, header["space"], constraints, where=f"{where} [space]",
                                   constraints_where=f"{where} [template] constraints")
        baseline = dict(header.get("baseline", {}))
        problems = _as_template_error(space.problems, baseline)
        if problems:
            raise TemplateError(f"{where} [baseline]: {'; '.join(problems)}")
        if not isinstance(info.get("description", ""), str):
            raise TemplateError(f'{where} [template] description: must be a string, e.g. description = "Wider tiles"')
        role = info.get("role", "variant")
        origin = info.get("origin", "human")
        if role not in ROLES:
            raise TemplateError(f"{where} [template] role: {role!r} is not one of {', '.join(ROLES)}")
        if origin not in ORIGINS:
            raise TemplateError(f"{where} [template] origin: {origin!r} is not one of {', '.join(ORIGINS)}")
        baseline_source = info.get("baseline_source", DEFAULT_SOURCE)
        if not isinstance(baseline_source, str) or not baseline_source.strip():
            raise TemplateError(f'{where} [template] baseline_source: must be a non-empty string naming where '
                                f'[baseline] comes from, e.g. baseline_source = "vLLM get_default_config"')
        rules = _as_template_error(parse_rules, header["baselines"], space, baseline, where) \
            if "baselines" in header else ()
        if rules and role != "baseline":
            raise TemplateError(f'{where} [[baselines]]: only a role = "baseline" template has per-shape '
                                f"baselines; remove the rules or make this the block's baseline template")
        ties = _ties(header.get("ties", {}), space, where)
        _check_body_of(info.get("body"), text, where)
        try:
            parsed = parse_body(text)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"{_line(where, exc.lineno, body_at)}: Jinja syntax error: {exc.message}") from None
        except BodyRefused as exc:
            raise TemplateError(f"{_line(where, exc.lineno, body_at)}: {exc.message}") from None
        for table, names in (("[space]", space.names), ("[ties]", ties)):
            taken = collisions(names)
            if taken:
                raise TemplateError(f"{where} {table}: {', '.join(taken)} is the name of kernel text kernelforge "
                                    "shares with templates (kernelforge.shared_kernels); rename it")
            for name in names:
                if why := unreadable(name):
                    raise TemplateError(f"{where} {table}: {name} is {why}, so the body cannot read a variable of "
                                        "that name; rename it")
        used = meta.find_undeclared_variables(parsed) - set(SHARED)
        declared = set(space.names) | set(ties)
        if used != declared:
            parts = []
            if used - declared:
                owner = f"the body ({body_at.path}) uses" if body_at else "uses"
                parts.append(f"{owner} undeclared {', '.join(sorted(used - declared))}: add it to [space] or [ties]")
            if declared - used:
                parts.append(f"declares unused {', '.join(sorted(declared - used))}")
            raise TemplateError(f"{where}: template variables must equal its [space] and [ties]: {'; '.join(parts)}")
        return cls(
            id=template_id,
            block_id=block_id,
            text=text,
            space=space,
            baseline=baseline,
            role=role,
            origin=origin,
            description=info.get("description", ""),
            path=path,
            baseline_source=baseline_source,
            baseline_rules=rules,
            ties=ties,
            body_of=info.get("body"),
        )

    @property
    def name(self) -> str:
        """The template's NAME in its id BLOCK/NAME (its file's name without ``.py.j2``)."""
        return self.id.rpartition("/")[2]

    def as_proposed(self) -> "Template":
        """This template as a proposer's (the LLM's) template: a ``variant`` of origin ``llm``
        whatever its header says, with no per-shape baselines (``[[baselines]]``,
        ``baseline_source``): role, origin and baselines are facts of the project, never a
        proposer's claims, and a proposed template's ``[baseline]`` is only where its search
        starts. Speedups are always measured against the block's own baseline template."""
        return replace(self, role="variant", origin="llm", baseline_rules=(), baseline_source=DEFAULT_SOURCE)

    def render(self, point: Mapping[str, Any]) -> str:
        """The module source at ``point``; raises TemplateError naming what is wrong with it."""
        tied = sorted(set(point) & set(self.ties))
        if tied:
            raise TemplateError(f"template {self.id}: " + "; ".join(
                f"{name} is tied to {self.ties[name]} ([ties]): give {self.ties[name]}" for name in tied))
        problems = _as_template_error(self.space.problems, point)
        if problems:
            raise TemplateError(f"template {self.id}: {'; '.join(problems)}")
        try:
            tied = {name: point[parameter] for name, parameter in self.ties.items()}
            return render_body(self.text, {**shared_values(), **point, **tied})
        except jinja2.TemplateError as exc:
            raise TemplateError(f"template {self.id}: rendering failed: {exc}") from None
        except Exception as exc:  # the template's own expressions ({{ 1 // X }} at X = 0, ...)
            raise TemplateError(f"template {self.id}: rendering failed at {dict(point)}: "
                                f"{type(exc).__name__}: {exc}; fix the template or exclude the point "
                                "with a constraint") from None

    def render_baseline(self) -> str:
        return self.render(self.baseline)

    def baseline_for(self, shape: "Shape") -> BaselinePoint:
        """The baseline point of ``shape``: the first ``[[baselines]]`` rule whose ``when`` holds
        (its parameters over ``[baseline]``), else ``[baseline]`` with :attr:`baseline_source`.
        Raises TemplateError naming the rule and the shape when a rule cannot be resolved there."""
        return resolve(self.baseline_rules, shape, self.space, self.baseline, self.baseline_source,
                       str(self.path or self.id))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")  # an editor's byte-order mark is not the header's start
    except OSError as exc:
        raise TemplateError(f"{path}: cannot read template ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise TemplateError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                            "save the template as UTF-8") from None


@dataclass(frozen=True)
class _BodyAt:
    """Where the body of a joined template comes from: ``path``, and the number of lines to add to a
    line of the joined text from line ``first`` on to get that file's line."""

    path: str
    offset: int
    first: int


def _line(where: str, lineno: int | None, body_at: _BodyAt | None) -> str:
    """``file:line`` of a line of a template's text: the body's own file for a joined template."""
    if body_at is not None and lineno is not None and lineno >= body_at.first:
        return f"{body_at.path}:{lineno + body_at.offset}"
    return f"{where}:{lineno}"


def _check_size(text: str, where: str) -> None:
    if len(text) > MAX_SOURCE_CHARS:
        raise TemplateError(f"{where}: the template has {len(text)} characters, over the limit of "
                            f"{MAX_SOURCE_CHARS} (MAX_SOURCE_CHARS)")


def parse_header(text: str, where: str) -> dict[str, Any]:
    """The TOML header of a template text (its opening Jinja comment), parsed; a text over
    :data:`~kernelforge.limits.MAX_SOURCE_CHARS` is refused first."""
    _check_size(text, where)
    match = _HEADER.match(text)
    if not match and text.lstrip().startswith("{#"):
        raise TemplateError(f"{where}: the header's opening {{#- is never closed; end the header with -#}}")
    if not match:
        raise TemplateError(
            f"{where}: no header; a template starts with a Jinja comment {{#- ... -#}} holding "
            "TOML tables [template], [space] and [baseline]"
        )
    try:
        return tomllib.loads(match.group(1))
    except tomllib.TOMLDecodeError as exc:
        before = text[: match.start(1)].count("\n")  # the file's lines before the header's first
        message = re.sub(r"at line (\d+)", lambda m: f"at line {int(m.group(1)) + before} of the file", str(exc))
        raise TemplateError(f"{where}: header is not valid TOML ({message})") from None


def body_text(text: str) -> str:
    """What follows the header of a template text (the text itself when it has no header)."""
    match = _HEADER.match(text)
    return text[match.end():] if match else text


def _joined(text: str, path: Path, body_of: str) -> tuple[str, _BodyAt]:
    """The header-only template ``text`` of ``path`` with the body of the template ``body_of`` of
    its folder after it, and where that body is. That template must hold a body of its own (no
    chains)."""
    where, source = f"{path} [template] body", path.with_name(body_of + TEMPLATE_SUFFIX)
    if source == path or not source.is_file():
        raise TemplateError(f"{where}: {body_of!r} is not another template of {path.parent}; name the template "
                            f"whose body this one renders, without {TEMPLATE_SUFFIX}, e.g. body = \"baseline\"")
    source_text = _read(source)
    if "body" in parse_header(source_text, str(source)).get("template", {}):
        raise TemplateError(f"{where}: {source.name} takes its body from another template itself; name the "
                            "template that holds the body")
    if body_text(text).strip():
        raise TemplateError(f"{where}: the template has a body of its own; a template with [template] body is "
                            "a header alone, so remove its body or the key")
    header, source_header = (_HEADER.match(t).group(0) for t in (text, source_text))  # type: ignore[union-attr]
    at = _BodyAt(str(source), source_header.count("\n") - header.count("\n"), header.count("\n") + 1)
    return header + body_text(source_text), at


def _check_body_of(body_of: Any, text: str, where: str) -> None:
    """``[template] body``: a template file name of the folder, and a text that holds the body
    (joined when the file was loaded; a text on its own must carry it)."""
    if body_of is None:
        return
    if not isinstance(body_of, str) or not _BODY_NAME.fullmatch(body_of):
        raise TemplateError(f'{where} [template] body: must name a template of the same folder without '
                            f'{TEMPLATE_SUFFIX}, e.g. body = "baseline"')
    if not body_text(text).strip():
        raise TemplateError(f"{where} [template] body: the body of {body_of}{TEMPLATE_SUFFIX} is joined to this "
                            "header when the template is loaded from its folder; a template text on its own "
                            "must hold its body")


def _ties(ties: Any, space: Space, where: str) -> dict[str, str]:
    """``[ties]``: body variable -> the parameter whose value it takes; a tied name is not a parameter."""
    for name, parameter in ties.items():
        if name in space.names:
            raise TemplateError(f"{where} [ties] {name}: is a [space] parameter; a tie gives a body variable that "
                                "is not searched the value of one that is")
        if not isinstance(parameter, str) or parameter not in space.names:
            raise TemplateError(f"{where} [ties] {name}: must name the [space] parameter whose value it takes, "
                                f"e.g. {name} = \"{space.names[0]}\"; the space has {', '.join(space.names)}")
    return dict(ties)


def _check_keys(info: Any, where: str) -> None:
    """Refuse a ``[template]`` key that is not in :data:`TEMPLATE_KEYS`, naming it; a key of
    :data:`JUDGE_KEYS` says that rule is not a template's to set."""
    if not isinstance(info, dict):
        return  # reported as "[template] must be a table" by the caller
    for key in info:
        if key in JUDGE_KEYS:
            raise TemplateError(f"{where} [template] {key}: the judge's rules (determinism, tolerances, held-out "
                                "shapes, baselines) come from the block and the project, never from a template "
                                f"header; remove {key}")
        if key not in TEMPLATE_KEYS:
            raise TemplateError(f"{where} [template] {key}: unknown key; [template] takes {', '.join(TEMPLATE_KEYS)}")


def _as_template_error(function: Any, *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, a :class:`UserError` of the header (a constraint refused by
    the bounded evaluator, a bad space) raised as the :class:`TemplateError` every caller of the
    template handles (the LLM route turns it into its repair message; a resume skips the text)."""
    try:
        return function(*args, **kwargs)
    except TemplateError:
        raise
    except UserError as exc:
        raise TemplateError(str(exc)) from None
