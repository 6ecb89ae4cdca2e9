"""A block author's mistakes in block.py get one message naming the file and the fix, when the
block is loaded or first judged, never a traceback mid-search or a silent pass (the declarations
of docs/block-contract.md, the reference and the tolerances)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from kernelforge.block import HarnessError
from kernelforge.catalog import Catalog
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.errors import UserError
from kernelforge.execute.inprocess import InProcessExecutor

pytestmark = pytest.mark.interpreter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
AXPY = (FIXTURES / "toy" / "axpy" / "block.py").read_text(encoding="utf-8")
SMOKE = '"smoke": [Shape.of("n1000", N=1000)],'


def _catalog(tmp_path: Path, old: str, new: str) -> Catalog:
    shutil.copytree(FIXTURES / "toy", tmp_path / "toy")
    assert old in AXPY
    (tmp_path / "toy" / "axpy" / "block.py").write_text(AXPY.replace(old, new, 1), encoding="utf-8")
    return Catalog.discover(tmp_path)


def _judging_refused(tmp_path: Path, old: str, new: str) -> str:
    """The HarnessError of judging the baseline of toy/axpy with ``old`` replaced by ``new`` in its block.py."""
    from kernelforge.candidate import Candidate

    catalog = _catalog(tmp_path, old, new)
    block = catalog.block("toy/axpy")
    source = Candidate.from_template(catalog.baseline("toy/axpy")).source
    executor = InProcessExecutor(InterpretDevice(warmup=0, repeats=1))
    executor.prepare()
    with pytest.raises(HarnessError) as refused:
        executor.evaluate(block, source, block.shapes("smoke"), torch.float16)
    return str(refused.value)


@pytest.mark.parametrize("old, new, message", [
    (SMOKE, '"smoke": [Shape.of("n1000", N=1000), Shape.of("n1000", N=1000)],', "lists 'n1000' twice"),
    (SMOKE, SMOKE + ' "more": [Shape.of("n1000", N=64)],', "'n1000' is given to two different shapes"),
    (SMOKE, '"smoke": [],', "no non-empty 'smoke' set"),
    (SMOKE, '"smoke": [{"N": 1000}],', "shape_sets()['smoke'][0] is a dict, not a Shape"),
    ('dtypes = ("float32", "float16", "bfloat16")', 'dtypes = "float16"', "dtypes is 'float16'; it must be a tuple"),
    ('dtypes = ("float32", "float16", "bfloat16")', 'dtypes = ("fp16",)', "dtypes ('fp16',) must name"),
    ('family = "toy"', "family = 7", "family is 7; it must be a str"),
    ('        return {\n            "smoke"', '        raise ValueError("oops")\n        return {\n            "smoke"',
     "shape_sets() raised ValueError: oops"),
])
def test_a_mistake_in_the_declarations_is_named_when_the_block_loads(tmp_path, old, new, message):
    catalog = _catalog(tmp_path, old, new)
    with pytest.raises(UserError) as refused:
        catalog.block("toy/axpy")
    assert "axpy/block.py" in str(refused.value) and message in str(refused.value)
    assert catalog.block("toy/router").id == "toy/router", "the other blocks still load"


@pytest.mark.parametrize("old, new, message", [
    ("return alpha * x.float() + y.float()", "return (alpha * x.float() + y.float()).half()",
     "reference 'out' is torch.float16"),
    ("return alpha * x.float() + y.float()",
     "out = alpha * x.float() + y.float()\n        out[0] = float('nan')\n        return out",
     "reference 'out' has 1 NaN or Inf value(s) (the first at (0,))"),
    ("    def counts(", "    def tolerance(self, dtype, device_type='cpu'):\n        return None\n\n    def counts(",
     "tolerance of 'out' at torch.float16 is None"),
    ("    def counts(", "    def tolerance(self, dtype, device_type='cpu'):\n"
                      "        from kernelforge.block import Tolerance\n"
                      "        return Tolerance(float('nan'), float('nan'), float('nan'))\n\n    def counts(",
     "must be a Tolerance(rel_norm, atol, rtol) of finite numbers >= 0"),
])
def test_a_reference_or_tolerance_that_would_pass_anything_is_the_blocks_mistake(tmp_path, old, new, message):
    """A NaN in the reference or a NaN tolerance made every comparison pass (a wrong kernel was
    judged ok), a reference in the output's dtype hid its rounding error in the tolerance, and a
    tolerance of None was a traceback."""
    assert message in _judging_refused(tmp_path, old, new)


def test_a_job_in_a_dtype_the_block_is_not_searched_in_is_refused(tmp_path):
    from kernelforge.job import load_job

    job = tmp_path / "j.toml"
    job.write_text('[job]\nname = "j"\ndtype = "float32"\ndevice = "interpret"\n\n'
                   '[[blocks]]\nid = "demo/matmul"\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"demo/matmul is searched in float16, bfloat16 \(its block.py dtypes\), not "
                                        r"the job's dtype float32"):
        load_job(job, Catalog.discover(FIXTURES))


@pytest.mark.parametrize("old, new, method", [
    ('        n = shape["N"]\n        return {\n            "x"', '        n = shape["M"]\n        return {\n            "x"',
     "make_inputs() raised KeyError: \"shape 'n"),
    ("    def reference(self, x, y, alpha):\n", "    def reference(self, x, y, alpha):\n        raise RuntimeError('boom')\n",
     "reference() raised RuntimeError: boom (line"),
    ("    def counts(self, shape: Shape, dtype) -> Counts:\n",
     "    def counts(self, shape: Shape, dtype) -> Counts:\n        raise RuntimeError('no counts')\n",
     "counts() raised RuntimeError: no counts (line"),
    ("        return Counts(flops=2.0 * n,", "        return Counts(flops=-2.0 * n,",
     "counts() returned Counts(flops=-2000.0"),
])
def test_a_block_method_that_raises_is_one_line_naming_the_file_method_and_line(tmp_path, old, new, method):
    refused = _judging_refused(tmp_path, old, new)
    assert "axpy/block.py: " in refused and method in refused
