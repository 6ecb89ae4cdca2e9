"""Discovery of blocks and templates by folder: a block is a folder with a ``block.py``, a template is
a ``*.py.j2`` file in it. Nothing is registered by hand.

The kernels folder is, in order: the ``root`` argument, ``$KERNELFORGE_KERNELS``, or the
``kernels/`` folder of the checkout this package was installed from.
"""

from __future__ import annotations

import ast
import difflib
import functools
import hashlib
import importlib.util
import inspect
import math
import os
import sys
import traceback
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Collection, Mapping

from kernelforge.block import DTYPES, Block, Counts, HarnessError, Shape
from kernelforge.errors import UserError
from kernelforge.template import TEMPLATE_SUFFIX, Template, template_name


def default_kernels_root() -> Path:
    env = os.environ.get("KERNELFORGE_KERNELS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "kernels"


def _load_block(folder: Path, block_id: str) -> Block:
    path = folder / "block.py"
    module_name = "kernelforge_block_" + block_id.replace("/", "__")
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the block's own code: whatever it raises is its author's to fix
        del sys.modules[module_name]
        raise UserError(f"{path}: importing it raised {type(exc).__name__}: {exc}") from None
    ours = [obj for obj in vars(module).values()
            if inspect.isclass(obj) and issubclass(obj, Block) and obj is not Block and obj.__module__ == module_name]
    classes = [obj for obj in ours if not inspect.isabstract(obj)]
    if not classes and len(ours) == 1:
        missing = ", ".join(sorted(ours[0].__abstractmethods__))
        raise UserError(f"{path}: {ours[0].__name__} does not define {missing}, which every block defines "
                        "(docs/block-contract.md)")
    if len(classes) != 1:
        raise UserError(f"{path}: must define exactly one concrete Block subclass, found {len(classes)}")
    cls = classes[0]
    for name in _BLOCK_METHODS:  # on the class made by this load of block.py alone
        setattr(cls, name, _named_failures(getattr(cls, name), name, path))
    block = cls(block_id)
    _check_declarations(block, path)
    return block


#: The methods of a block the harness calls: an exception raised in one is the block's mistake,
#: said as such (:func:`_named_failures`).
_BLOCK_METHODS = ("shape_sets", "make_inputs", "make_output", "reference", "counts", "tolerance",
                  "output_tolerance", "compile_shape")


def _named_failures(method, name: str, path: Path):
    """``method`` of a loaded block, raising a :class:`~kernelforge.block.HarnessError` that names
    the file, the method and the line for anything it raises (a shape without a dimension
    ``make_inputs`` reads, a ``reference`` that fails on a shape): one line of the block's author's
    to fix, never a traceback from deep inside the harness, nor a candidate's failure."""

    @functools.wraps(method)
    def call(*args, **kwargs):
        try:
            result = method(*args, **kwargs)
        except (HarnessError, UserError):
            raise
        except Exception as exc:  # noqa: BLE001 - the block's own code
            lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__)
                     if Path(frame.filename).resolve() == path.resolve()]
            at = f" (line {lines[-1]})" if lines else ""
            raise HarnessError(f"{path}: {name}() raised {type(exc).__name__}: {exc}{at}") from None
        if name == "counts" and not (isinstance(result, Counts) and all(
                isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in (result.flops, result.bytes))):
            raise HarnessError(f"{path}: counts() returned {result!r}; it must return Counts(flops, bytes) of finite "
                               "numbers >= 0")
        return result

    return call


def _check_declarations(block: Block, path: Path) -> None:
    """The block's declarations against docs/block-contract.md, checked when it is loaded (a
    mistake there would otherwise surface as a traceback mid-search, or not at all): its
    attributes' types, and shape sets that are a dict of lists of :class:`Shape` with a
    non-empty ``smoke`` set and no name given to two different shapes."""
    for name, kind, example in (("family", str, '"moe"'), ("description", str, '"..."'),
                                ("inplace_reset", bool, "True"), ("deterministic", bool, "True")):
        if not isinstance(getattr(block, name), kind):
            raise UserError(f"{path}: {name} is {getattr(block, name)!r}; it must be a {kind.__name__}, e.g. "
                            f"{name} = {example}")
    for name, example in (("dtypes", '("bfloat16", "float16")'), ("inplace", '("residual",)')):
        value = getattr(block, name)
        if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
            raise UserError(f"{path}: {name} is {value!r}; it must be a tuple of names, e.g. {name} = {example}")
    unknown = [d for d in block.dtypes if d not in DTYPES]
    if unknown or not block.dtypes:
        raise UserError(f"{path}: dtypes {tuple(block.dtypes)!r} must name at least one of {', '.join(DTYPES)}")
    try:
        sets = block.shape_sets()
    except HarnessError as exc:  # it raised (named by _named_failures): the block cannot load
        raise UserError(str(exc)) from None
    if not isinstance(sets, Mapping) or not all(isinstance(v, (list, tuple)) for v in sets.values()):
        raise UserError(f"{path}: shape_sets() must return a dict of set name -> list of Shape, got "
                        f"{type(sets).__name__}")
    if not sets.get("smoke"):
        raise UserError(f"{path}: shape_sets() has no non-empty 'smoke' set (tiny shapes the interpreter runs); "
                        f"it has {', '.join(map(str, sets)) or 'none'}")
    seen: dict[str, Shape] = {}
    for set_name, shapes in sets.items():
        names = [getattr(shape, "name", None) for shape in shapes]
        twice = sorted({n for n in names if n is not None and names.count(n) > 1})
        if twice:
            raise UserError(f"{path}: shape set {set_name!r} lists {', '.join(map(repr, twice))} twice; list each "
                            "shape once")
        for index, shape in enumerate(shapes):
            if not isinstance(shape, Shape):
                raise UserError(f"{path}: shape_sets()[{set_name!r}][{index}] is a {type(shape).__name__}, not a "
                                "Shape (make one with Shape.of(name, **dims))")
            if seen.setdefault(shape.name, shape) != shape:
                raise UserError(f"{path}: shape name {shape.name!r} is given to two different shapes "
                                f"({dict(seen[shape.name].dims)} and {dict(shape.dims)}); a name is one shape")


def _code(path: Path) -> str:
    """A Python file's code without comments, docstrings and layout (its syntax tree, dumped)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def _suggest(name: str, options: list[str]) -> str:
    close = difflib.get_close_matches(name, options, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


@dataclass(frozen=True)
class Catalog:
    """The blocks and templates found under one kernels folder."""

    root: Path

    @classmethod
    def discover(cls, root: Path | str | None = None) -> "Catalog":
        root = Path(root) if root is not None else default_kernels_root()
        if not root.is_dir():
            raise UserError(f"kernels folder {root} does not exist; give your kernels/ folder (--kernels DIR or "
                            "KERNELFORGE_KERNELS)")
        return cls(root)

    def command(self, words: str) -> str:
        """The ``kernelforge`` command line of ``words`` on this kernels folder, for a message to
        suggest: with ``--kernels ROOT`` when the folder is not the one a plain command finds."""
        if self.root.resolve() == default_kernels_root().resolve():
            return f"kernelforge {words}"
        return f"kernelforge --kernels {self.root} {words}"

    @cached_property
    def _found(self) -> tuple[dict[str, Block], dict[str, UserError]]:
        found: dict[str, Block] = {}
        broken: dict[str, UserError] = {}
        for path in sorted(self.root.glob("*/*/block.py")):
            block_id = path.parent.relative_to(self.root).as_posix()
            try:
                found[block_id] = _load_block(path.parent, block_id)
            except UserError as exc:
                broken[block_id] = exc
        return found, broken

    @property
    def blocks(self) -> dict[str, Block]:
        """Block id -> block, for every ``<family>/<name>/block.py`` under the root that loads (a
        broken one stops only what uses it: :meth:`block` raises its error)."""
        return self._found[0]

    @property
    def broken_blocks(self) -> Mapping[str, UserError]:
        """Block id -> the error of each ``block.py`` that does not load."""
        return self._found[1]

    def block(self, block_id: str) -> Block:
        if block_id in self.broken_blocks:
            raise self.broken_blocks[block_id]
        try:
            return self.blocks[block_id]
        except KeyError:
            raise UserError(
                f"unknown block {block_id!r}{_suggest(block_id, list(self.blocks))}; "
                f"`{self.command('blocks')}` lists them"
            ) from None

    def judge(self, block_id: str) -> str:
        """A hash of what judges the block's candidates: the code of its ``block.py`` (the
        reference, inputs, shapes, tolerances), comments, docstrings and layout left out, so such an
        edit changes it and a reworded docstring does not. Templates are not in it (a candidate's id
        is its source's), nor is a library line's ``library.py`` (its results are its own); a
        generated block that reads another file (``kernelforge tune``'s) names that file's judge in
        its ``block.py``."""
        self.block(block_id)
        return hashlib.sha256(_code(self.root / block_id / "block.py").encode()).hexdigest()[:16]

    def listing(self, block_id: str) -> "BlockTemplates":
        """Every template file of a block's folder (but hidden ones, such as an editor's lock file):
        those that load, baseline first (then by id), and each that does not with its error (a
        name that is not a Python identifier, as ``kernelforge new`` asks, or any error of the
        file). Raises nothing for a broken file: :meth:`templates` decides what one stops."""
        self.block(block_id)
        loaded, broken = [], {}
        for path in sorted((self.root / block_id).glob(f"*{TEMPLATE_SUFFIX}")):
            if path.name.startswith("."):
                continue  # an editor's lock or swap file (.#v1.py.j2), never a template
            try:
                if not template_name(path).isidentifier():
                    raise UserError(f"{path}: a template's name must be a Python identifier (letters, digits, _), "
                                    f"as its id {block_id}/NAME is; rename the file")
                loaded.append(Template.from_file(path, block_id))
            except UserError as exc:
                broken[path] = exc
        ordered = tuple(sorted(loaded, key=lambda t: (t.role != "baseline", t.id)))
        return BlockTemplates(block_id, self.root / block_id, ordered, broken)

    def templates(self, block_id: str, names: Collection[str] | None = None) -> list[Template]:
        """The templates of a block, baseline first (then by id); with ``names`` (NAME of
        BLOCK/NAME), only those. Each one asked for must load (a broken file raises its own error)
        and the folder must have exactly one baseline that loads (role = "baseline"; else a
        UserError naming the files); a broken file not asked for stops nothing, so a variant being
        edited does not stop a command on the others."""
        listing = self.listing(block_id)
        for path, error in listing.broken.items():
            if names is None or template_name(path) in names:
                raise error
        problem = listing.baseline_problem()
        if problem:
            raise UserError(problem)
        return [t for t in listing.loaded if names is None or t.role == "baseline" or t.name in names]

    def all_templates(self) -> list[Template]:
        """Every block's :meth:`templates` (each must load)."""
        return [t for block_id in self.blocks for t in self.templates(block_id)]

    def template(self, template_id: str) -> Template:
        block_id, _, _ = template_id.rpartition("/")
        if block_id not in self.blocks:
            raise UserError(
                f"unknown template {template_id!r}: templates are named BLOCK/NAME, "
                f"e.g. {next(iter(self.blocks), 'attention/x')}/baseline; `{self.command('templates')}` lists them"
            )
        name = template_id.rpartition("/")[2]
        templates = {t.id: t for t in self.templates(block_id, [name])}
        if template_id not in templates:
            known = [f"{block_id}/{n}" for n in self.listing(block_id).names]
            raise UserError(
                f"unknown template {template_id!r}{_suggest(template_id, known)}; "
                f"{block_id} has {', '.join(known) or 'no templates'}"
            )
        return templates[template_id]

    def baseline(self, block_id: str) -> Template:
        """The block's human-baseline template (role = "baseline")."""
        return self.templates(block_id, ())[0]  # exactly one, first (templates() checks)

    def resolve(self, name: str) -> Template:
        """A block id (meaning its baseline template) or a template id."""
        if name in self.blocks:
            return self.baseline(name)
        if name.rpartition("/")[0] not in self.blocks:
            known = list(self.blocks) + [f"{b}/{n}" for b in self.blocks for n in self.listing(b).names]
            raise UserError(
                f"unknown block or template {name!r}{_suggest(name, known)}; "
                f"`{self.command('blocks')}` and `{self.command('templates')}` list them"
            )
        return self.template(name)


@dataclass(frozen=True)
class BlockTemplates:
    """The template files of one block folder (:meth:`Catalog.listing`): ``loaded``, baseline
    first, and ``broken``, each file that does not load with its error."""

    block_id: str
    folder: Path
    loaded: tuple[Template, ...]
    broken: Mapping[Path, UserError]

    @property
    def names(self) -> list[str]:
        """Every template's NAME (of BLOCK/NAME), loaded or not, sorted."""
        return sorted([t.name for t in self.loaded] + [template_name(p) for p in self.broken])

    def baseline_problem(self) -> str | None:
        """Why the folder has no one baseline (role = "baseline") among the templates that load,
        naming the files and the fix; None when it has."""
        baselines = [t.path.name for t in self.loaded if t.role == "baseline" and t.path is not None]
        if len(baselines) == 1:
            return None
        if not baselines and self.broken:
            return (f"block {self.block_id} has no baseline template that loads, and the baseline may be a broken "
                    "one: " + "; ".join(str(error) for error in self.broken.values()))
        fix = ('set role = "variant" in all but the one experts ship' if baselines else
               'set role = "baseline" in the template experts ship')
        found = f"{len(baselines)} ({', '.join(baselines)})" if baselines else "0"
        return (f"block {self.block_id} must have exactly one template with role = \"baseline\", found {found} in "
                f"{self.folder}; {fix}")
