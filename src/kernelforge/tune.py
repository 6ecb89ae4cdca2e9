"""Bring your own kernel: ``kernelforge tune FILE.py::KERNEL`` tunes an existing ``@triton.jit``
kernel over its ``@triton.autotune`` configs with kernelforge's verification, search, store and
report, with no Jinja2 template and no ``Block`` subclass to write.

What FILE.py must hold (the contract; a missing piece is one clear error):

- ``KERNEL``: a ``@triton.jit`` function under ``@triton.autotune(configs=[triton.Config({...},
  num_warps=..., num_stages=...), ...], key=[...])``; the configs are literals.
- ``run(**inputs, out)``: the host wrapper that launches ``KERNEL[grid](...)`` (a grid lambda may
  read the config's ``META``); host code allocates and takes views with torch, never computes.
- ``reference(**inputs)``: the exact result, in fp32.
- ``make_inputs(shape, dtype, device, seed, distribution="normal")``: fresh seeded inputs, the
  keyword arguments of ``run`` (``shape["N"]`` reads a dimension).
- ``make_output(shape, dtype, device)``: the uninitialised output ``run`` fills.
- ``SHAPES``: shape name -> dimensions (``{"n4096": {"N": 4096}}``); all are searched.

:func:`prepare` writes, under the output folder, a kernels folder with one block ``tune/<KERNEL>``:
a copy of FILE.py, a generated ``block.py`` whose :class:`UserFileBlock` reads it, and a template
``baseline.py.j2``: the kernel with the autotune decorator removed and ``run`` launching it at
one config, whose space is the configs' values and whose one constraint keeps exactly the
declared configs (the baseline: the first). Then a job file that searches it; ``kernelforge tune``
runs that job as ``kernelforge search`` runs any other. Nothing of the original file is changed.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelforge.block import Block, Counts, Shape
from kernelforge.errors import UserError

#: triton.Config's launch keywords and their Triton defaults.
LAUNCH_DEFAULTS = {"num_warps": 4, "num_stages": 3}
REQUIRED = ("run", "reference", "make_inputs", "make_output", "SHAPES")
USER_FILE = "user_kernel.py"


@dataclass(frozen=True)
class TuneSource:
    """What :func:`parse` reads from FILE.py: the kernel's name, its declared configs (each the
    config's keyword values plus ``num_warps``/``num_stages``) and the candidate body (imports,
    ``@triton.jit`` functions, ``run``) with ``{{ NAME }}`` placeholders at the launch."""

    path: Path
    kernel: str
    configs: tuple[dict[str, Any], ...]
    body: str


def split_target(target: str) -> tuple[Path, str]:
    """``FILE.py::KERNEL`` -> (path, kernel name); one clear error for anything else."""
    file, sep, name = target.rpartition("::")
    if not sep or not file or not name.isidentifier():
        raise UserError(f"tune {target}: write FILE.py::KERNEL (the @triton.autotune kernel's name after ::)")
    path = Path(file)
    if not path.is_file():
        raise UserError(f"tune {target}: {path} is not a file")
    return path, name


def _config(node: ast.AST, where: str) -> dict[str, Any]:
    """One ``triton.Config({...}, num_warps=..., num_stages=...)`` literal."""
    if not (isinstance(node, ast.Call) and ast.unparse(node.func) in ("triton.Config", "Config")
            and len(node.args) == 1):
        raise UserError(f"{where}: each config must be triton.Config({{...}}, num_warps=..., num_stages=...)")
    try:
        values = dict(ast.literal_eval(node.args[0]))
        keywords = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg in LAUNCH_DEFAULTS}
    except ValueError:
        raise UserError(f"{where}: the configs must be literals (numbers, strings)") from None
    return {**values, **LAUNCH_DEFAULTS, **keywords}


def parse(path: Path, kernel: str) -> TuneSource:
    """Read FILE.py (see the module docstring for what it must hold)."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(path))
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    names = set(defs) | {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    missing = [n for n in (kernel, *REQUIRED) if n not in names]
    if missing:
        raise UserError(f"{path}: defines no {', '.join(missing)} (kernelforge tune needs the kernel and "
                        f"{', '.join(REQUIRED)}; see docs/tune.md)")
    node = defs[kernel]
    autotune = next((d for d in node.decorator_list if isinstance(d, ast.Call)
                     and ast.unparse(d.func) in ("triton.autotune", "autotune")), None)
    configs_node = next((k.value for k in autotune.keywords if k.arg == "configs"), None) if autotune else None
    if not isinstance(configs_node, ast.List) or not configs_node.elts:
        raise UserError(f"{path}: {kernel} has no @triton.autotune(configs=[triton.Config(...), ...]) with literal configs")
    configs = tuple(_config(c, f"{path}: {kernel}'s configs") for c in configs_node.elts)
    if len({tuple(sorted(c)) for c in configs}) != 1:
        raise UserError(f"{path}: {kernel}'s configs must all set the same keys")
    lines = text.splitlines()
    parts = ["\n".join(ast.get_source_segment(text, n) or "" for n in tree.body
                        if isinstance(n, (ast.Import, ast.ImportFrom)))]
    for n in tree.body:
        if not isinstance(n, ast.FunctionDef) or n.name == "run":
            continue
        decorators = [ast.unparse(d) for d in n.decorator_list]
        if "triton.jit" not in decorators:
            continue
        start = n.lineno if n is node else min(d.lineno for d in n.decorator_list)
        code = "\n".join(lines[start - 1:n.end_lineno])
        parts.append(("@triton.jit\n" + code) if n is node else code)
    parts.append(_launch_at_config(defs["run"], kernel, configs[0]))
    return TuneSource(path=path, kernel=kernel, configs=configs, body="\n\n\n".join(parts) + "\n")


class _PinLaunch(ast.NodeTransformer):
    """Adds the config's keywords, as Jinja placeholders, to every ``KERNEL[grid](...)`` call."""

    def __init__(self, kernel: str, keys: list[str]):
        self.kernel, self.keys = kernel, keys

    def visit_Call(self, node: ast.Call) -> ast.Call:
        self.generic_visit(node)
        if isinstance(node.func, ast.Subscript) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == self.kernel:
            node.keywords.extend(ast.keyword(arg=k, value=ast.Name(id=f"__KF_{k}__")) for k in self.keys)
        return node


def _launch_at_config(run: ast.FunctionDef, kernel: str, config: dict[str, Any]) -> str:
    code = ast.unparse(_PinLaunch(kernel, list(config)).visit(run))
    if "__KF_" not in code:
        raise UserError(f"run never launches {kernel}[grid](...); kernelforge tune pins the config at that launch")
    for key in config:
        code = code.replace(f"__KF_{key}__", "{{ " + key + " }}")
    return code


def template_text(src: TuneSource) -> str:
    """The generated ``baseline.py.j2``: the configs' values as the space, the declared configs as
    its one constraint, the first config as the baseline."""
    keys = list(src.configs[0])
    values = {k: sorted({c[k] for c in src.configs}, key=lambda v: (str(type(v)), v)) for k in keys}
    declared = ", ".join("(" + ", ".join(repr(c[k]) for k in keys) + ",)" for c in src.configs)
    constraint = f"({', '.join(keys)},) in ({declared},)"
    header = ["{#-", "[template]", 'role = "baseline"', 'origin = "human"',
              f'description = "{src.kernel} from {src.path.name} at one of its @triton.autotune configs"',
              f"constraints = [{constraint!r}]".replace("'", '"'), "", "[space]"]
    header += [f"{k} = {[*values[k]]!r}".replace("'", '"') for k in keys]
    header += ["", "[baseline]"] + [f"{k} = {src.configs[0][k]!r}".replace("'", '"') for k in keys] + ["-#}"]
    return "\n".join(header) + "\n" + src.body


BLOCK_PY = '''"""Generated by `kernelforge tune` from {file}: the block of kernel {kernel} (inputs, output,
reference and shapes are the copy of that file beside this one, {user})."""

from kernelforge.tune import UserFileBlock


class Tuned(UserFileBlock):
    description = "{kernel} from {file}"
'''


class UserFileBlock(Block):
    """A block whose data comes from the user's file copied beside its ``block.py`` (see the module
    docstring): every shape of ``SHAPES`` is in both the ``smoke`` and ``check`` sets."""

    family = "tune"
    dtypes = ("float32", "float16", "bfloat16")

    @property
    def user(self) -> Any:
        module = getattr(self, "_user", None)
        if module is None:
            path = Path(inspect.getfile(type(self))).parent / USER_FILE
            spec = importlib.util.spec_from_file_location(f"kf_tune_{self.id.replace('/', '_')}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)  # type: ignore[union-attr]
            self._user = module
        return module

    def shape_sets(self):
        shapes = [Shape.of(name, **dims) for name, dims in self.user.SHAPES.items()]
        return {"smoke": shapes, "check": shapes}

    def make_inputs(self, shape, dtype, device, seed, distribution="normal"):
        return self.user.make_inputs(shape, dtype, device, seed, distribution)

    def make_output(self, shape, dtype, device):
        return self.user.make_output(shape, dtype, device)

    def reference(self, **inputs):
        return self.user.reference(**inputs)

    def counts(self, shape, dtype) -> Counts:
        counts = getattr(self.user, "counts", None)
        return counts(shape, dtype) if counts else Counts(flops=0.0, bytes=0.0)


JOB = '''# Generated by `kernelforge tune {target}`.
[job]
name = "{name}"
device = "{device}"
dtype = "{dtype}"
tune = "all-shapes"
storage = "sqlite:///{db}"

[strategy]
name = "grid"
evaluations = {evaluations}

[[blocks]]
id = "tune/{kernel}"
shapes = "smoke"
'''


def prepare(target: str, out: Path, device: str, dtype: str, evaluations: int | None = None) -> tuple[Path, Path]:
    """Write the kernels folder and the job of ``target`` (``FILE.py::KERNEL``) under ``out``;
    returns (job file, kernels folder). ``evaluations`` defaults to the number of configs (every
    declared config is measured: the grid strategy walks them)."""
    path, kernel = split_target(target)
    src = parse(path, kernel)
    folder = out / "kernels" / "tune" / kernel
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, folder / USER_FILE)
    (folder / "block.py").write_text(BLOCK_PY.format(file=path.name, kernel=kernel, user=USER_FILE), encoding="utf-8")
    (folder / "baseline.py.j2").write_text(template_text(src), encoding="utf-8")
    job = out / "tune.toml"
    job.write_text(JOB.format(target=target, name=f"tune-{kernel}", device=device, dtype=dtype,
                              db=(out / "kernelforge.db").resolve(), evaluations=evaluations or len(src.configs),
                              kernel=kernel), encoding="utf-8")
    return job, out / "kernels"
