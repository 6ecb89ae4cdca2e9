"""The CUDA worker's sandbox lets Triton build its kernel launchers (issue 28).

Triton 3.6, the GPU image's version, builds a small C module with the C compiler at the first
launch of every compiled kernel signature (``make_launcher`` in ``triton/backends/nvidia/
driver.py``, through ``triton.runtime.build.compile_module_from_src``), inside the worker, in a
cache of its own. Here a launcher-like module (``Python.h`` and Triton's bundled ``cuda.h``) is
built with that same helper in a fresh process confined by exactly the CUDA role's rules
(:func:`kernelforge.sandbox.roles.apply_sandbox`, only the GPU driver's start skipped: there is
no GPU). The compile pool's role, whose rules are the CUDA role's before this fix (ptxas only),
must refuse the compiler: that is what the test would see with the rules reverted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from kernelforge.sandbox.roles import c_compiler, sandbox_environment, sandbox_plan

PLAN = sandbox_plan()
pytestmark = [
    pytest.mark.skipif(not PLAN.landlock_abi or not PLAN.seccomp, reason=f"this machine's sandbox is {PLAN.label}"),
    pytest.mark.skipif(c_compiler() is None, reason="no C compiler: Triton could not build a launcher either"),
]

LAUNCHER = r"""
#include "cuda.h"
#include <Python.h>
static PyObject* launch(PyObject* self, PyObject* args) { return PyLong_FromLong((long)sizeof(CUdeviceptr)); }
static PyMethodDef methods[] = {{"launch", launch, METH_VARARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "__triton_launcher", NULL, -1, methods};
PyMODINIT_FUNC PyInit___triton_launcher(void) { return PyModule_Create(&module); }
"""

BUILD = textwrap.dedent("""
    import json, os, sys
    from kernelforge.sandbox.roles import Role, apply_sandbox
    role = Role(sys.argv[1])
    apply_sandbox(role, os.environ["KERNELFORGE_SANDBOX_DIR"], start_toolchain=False)
    import triton
    from triton.runtime.build import compile_module_from_src
    include = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "include")
    try:
        module = compile_module_from_src(sys.stdin.read(), "__triton_launcher", include_dirs=[include])
    except PermissionError as exc:
        print(json.dumps({"denied": str(exc)}))
    else:
        print(json.dumps({"built": module.launch(), "cache": module.__file__}))
""")


def build_under(role: str) -> dict:
    """Build :data:`LAUNCHER` in a new process confined as ``role``; what happened, as JSON."""
    with tempfile.TemporaryDirectory(prefix="kf-launcher-") as temp_dir:
        env = sandbox_environment(temp_dir)
        done = subprocess.run([sys.executable, "-c", BUILD, role], input=LAUNCHER, capture_output=True, text=True,
                              env=env, cwd=temp_dir, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        answer["temp_dir"] = str(Path(temp_dir).resolve())
        return answer


def test_the_cuda_role_builds_a_triton_launcher_in_its_sandbox():
    answer = build_under("cuda")
    assert answer.get("built") == 8, answer  # sizeof(CUdeviceptr): the module was compiled and imported
    assert answer["cache"].startswith(answer["temp_dir"])  # in the sandbox's own Triton cache


def test_without_the_compiler_in_the_rules_the_build_is_refused():
    """The compile pool's rules run ptxas only: the launcher build fails there, as it did in the
    CUDA worker before its rules let the C compiler run."""
    answer = build_under("compiler")
    assert "denied" in answer, answer
