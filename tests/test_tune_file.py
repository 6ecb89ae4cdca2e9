"""``kernelforge.tune``: what a user's FILE.py becomes (the candidate body, the generated header), what
is refused in one line, and the database kept apart when the judge's part of the file changed."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from kernelforge.catalog import Catalog
from kernelforge.errors import UserError
from kernelforge.template import Template
from kernelforge.tune import JUDGE_FILE, parse, prepare, template_text

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "tune" / "scale_add.py"
TEXT = FIXTURE.read_text()
CONFIGS = """        triton.Config({"BLOCK": 256}, num_warps=4, num_stages=2),
        triton.Config({"BLOCK": 64}, num_warps=2, num_stages=2),
        triton.Config({"BLOCK": 1024}, num_warps=8, num_stages=3),
"""
assert CONFIGS in TEXT


def write(tmp_path: Path, text: str, name: str = "k.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def generated(tmp_path: Path, text: str) -> Template:
    """The template `kernelforge tune` would generate from ``text``, parsed as every template is."""
    src = parse(write(tmp_path, text), "scale_add")
    out = tmp_path / "baseline.py.j2"
    out.write_text(template_text(src))
    return Template.from_file(out, "tune/scale_add")


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("def run(x, y, alpha, out):", "def run(x, y, alpha, out)"), r"k.py:\d+: expected ':'"),
    (lambda t: t + "\nrun2 = run\n", None),  # another name for run is fine
    (lambda t: t.replace("def run(", "def run_(") + "\nrun = run_\n", "run must be a function of the module"),
    (lambda t: t.replace("@triton.jit\ndef scale_add", "def scale_add"), "scale_add is not a @triton.jit function"),
    (lambda t: t.replace("num_warps=4, num_stages=2)", "num_warps=4, num_stages=2, pre_hook=None)"),
     "triton.Config's pre_hook is not carried by kernelforge tune"),
    (lambda t: t.replace("num_warps=4, num_stages=2)", "num_warps=4, num_stages=2, maxnreg=128)"),
     "the configs must all set the same keys; maxnreg is set in some only"),
    (lambda t: t.replace('{"BLOCK": 256}', '{"BLOCK": None}'), "'BLOCK': None is not a value kernelforge tune can"),
])
def test_a_file_kernelforge_cannot_tune_is_one_line_naming_it(tmp_path, edit, message):
    path = write(tmp_path, edit(TEXT))
    if message is None:
        assert parse(path, "scale_add").kernel == "scale_add"
        with pytest.raises(UserError, match="k.py: SHAPES must be a function of the module"):
            parse(path, "SHAPES")  # a name that is not a kernel
        return
    with pytest.raises(UserError, match=message):
        parse(path, "scale_add")


def test_the_candidate_keeps_decorators_helpers_and_constants_the_kernel_and_run_read(tmp_path):
    text = TEXT.replace("@triton.jit\ndef scale_add", "@triton.heuristics({'EVEN': lambda a: a['n'] % a['BLOCK'] == 0})"
                        "\n@triton.jit(do_not_specialize=['n'])\ndef scale_add")
    text = text.replace("scale_add[lambda META: (triton.cdiv(n, META[\"BLOCK\"]),)]", "scale_add[_grid(n)]")
    text = text.replace("def run(", "SCALE = 1\n\n\ndef _grid(n):\n    return lambda META: (triton.cdiv(n * SCALE, "
                        "META['BLOCK']),)\n\n\ndef _unused_by_run():\n    return torch.ones(3).sum()\n\n\ndef run(")
    body = parse(write(tmp_path, text), "scale_add").body
    assert "@triton.heuristics({'EVEN'" in body and "@triton.jit(do_not_specialize=['n'])" in body
    assert "@triton.autotune" not in body
    assert "def _grid(n):" in body and "SCALE = 1" in body and "_unused_by_run" not in body
    assert "def reference" not in body and "SHAPES" not in body  # the judge's part is never a candidate's


def test_boolean_string_and_cta_values_make_a_valid_header(tmp_path):
    text = TEXT.replace(CONFIGS, """        triton.Config({"BLOCK": 256, "FAST": True, "ORDER": "row"}, num_warps=4, num_ctas=2),
        triton.Config({"BLOCK": 64, "FAST": False, "ORDER": 'col "b"'}, num_warps=2),
        triton.Config({"BLOCK": 64, "FAST": True, "ORDER": "row"}, num_warps=2),
""").replace("(x, y, out, alpha, n)", "(x, y, out, alpha, n)  # FAST ORDER")
    template = generated(tmp_path, text)
    assert template.space.values("FAST") == (False, True) and template.space.values("num_ctas") == (1, 2)
    assert template.space.values("ORDER") == ('col "b"', "row")
    assert template.baseline == {"BLOCK": 256, "FAST": True, "ORDER": "row", "num_warps": 4, "num_stages": 3,
                                 "num_ctas": 2}
    valid = list(template.space.points())
    assert len(valid) == 3 and {"BLOCK": 64, "FAST": True, "ORDER": "row", "num_warps": 2, "num_stages": 3,
                                "num_ctas": 1} in valid
    assert "FAST=True, ORDER='row', num_warps=4, num_stages=3, num_ctas=2)" in template.render_baseline()
    with pytest.raises(UserError, match="ORDER: a string config value with a quote"):
        parse(write(tmp_path, text.replace('\'col "b"\'', '"it\'s"')), "scale_add")


def test_a_changed_reference_keeps_the_stored_results_apart_and_a_new_config_does_not(tmp_path):
    out = tmp_path / "reports" / "tune-scale_add"
    first = prepare(f"{write(tmp_path, TEXT)}::scale_add", out, "interpret", "float16")
    assert first.kept_apart is None and (out / JUDGE_FILE).is_file()
    assert tomllib.loads(first.job.read_text())["job"]["storage"].endswith("kernelforge.db")
    (out / "kernelforge.db").write_bytes(b"results")
    (out / "kernelforge.db-wal").write_bytes(b"log")
    more = TEXT.replace(CONFIGS, CONFIGS + '        triton.Config({"BLOCK": 128}, num_warps=4, num_stages=2),\n')
    assert prepare(f"{write(tmp_path, more)}::scale_add", out, "interpret", "float16").kept_apart is None
    assert (out / "kernelforge.db").read_bytes() == b"results"
    fixed = more.replace("return alpha * x.float() + y.float()", "return alpha * x.double() + y.float()")
    moved = prepare(f"{write(tmp_path, fixed)}::scale_add", out, "interpret", "float16").kept_apart
    assert moved is not None and moved.read_bytes() == b"results" and Path(f"{moved}-wal").read_bytes() == b"log"
    assert not (out / "kernelforge.db").exists() and not (out / "kernelforge.db-wal").exists()
    (out / "kernelforge.db").write_bytes(b"new results")
    # Another file of the same kernel name judges differently too; nothing is ever overwritten.
    other = write(tmp_path, TEXT.replace('SHAPES = {"n1000": {"N": 1000}, ', "SHAPES = {"), "other.py")
    again = prepare(f"{other}::scale_add", out, "interpret", "float16").kept_apart
    assert again is not None and again != moved and again.read_bytes() == b"new results"
    assert moved.read_bytes() == b"results"


@pytest.mark.parametrize("shapes, message", [
    ("SHAPES = {}", r"SHAPES must map at least one shape's name to its dimensions"),
    ('SHAPES = {"n1000": 1000}', r"SHAPES\['n1000'\] must map dimension names to integers"),
    ('SHAPES = {"n1000": {"N": 1000}}\nraise RuntimeError("no GPU here")', r"k.py \(copied to .*user_kernel.py\): "
     "importing it raised RuntimeError: no GPU here"),
])
def test_the_users_shapes_and_import_errors_are_one_line_naming_the_file(tmp_path, shapes, message):
    text = TEXT.replace('SHAPES = {"n1000": {"N": 1000}, "n4096": {"N": 4096}}', shapes)
    prepared = prepare(f"{write(tmp_path, text)}::scale_add", tmp_path / "out", "interpret", "float16")
    with pytest.raises(UserError, match=message):
        Catalog.discover(prepared.kernels).block("tune/scale_add").shape_sets()


def test_the_tuned_blocks_judge_follows_the_judges_part_of_the_file_only(tmp_path):
    out = tmp_path / "out"

    def judge(text: str) -> str:
        kernels = prepare(f"{write(tmp_path, text)}::scale_add", out, "interpret", "float16").kernels
        return Catalog.discover(kernels).judge("tune/scale_add")

    first = judge(TEXT)
    assert judge(TEXT.replace("mask = offs < n", "mask = offs < n  # the kernel edited")
                 .replace("num_warps=8, num_stages=3", "num_warps=8, num_stages=4")) == first
    assert judge(TEXT.replace("return alpha * x.float() + y.float()", "return alpha * x.float() - y.float()")) != first
