"""kernelforge: kernel autotuning and AI-assisted kernel search for the attention and MoE blocks of
large open models. See README.md; the flow is job -> candidates -> compile -> verify -> time ->
store -> report. The Python API is :mod:`kernelforge.api` (docs/python-api.md); its functions are
also reachable here, imported on first use so that ``import kernelforge.x`` stays light."""

import os

# One BLAS thread for numpy (OpenBLAS) unless the user chose otherwise, set before anything here
# imports numpy. The strategies' linear algebra is small (a Gaussian process over at most a few
# hundred told points) and runs beside compile workers: a second BLAS thread on a busy host made
# auto's ask at 400 told trials 10-40 times slower on this project's 2-core host (issue 34,
# reports/strategy-bench/README.md), and on an idle many-core host such small matrices gain
# nothing from threads. Torch's kernels do not use it. A process that imported numpy before
# kernelforge keeps numpy's own choice.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"

_API = ("open_job", "run", "results", "load_winner", "WinnerKernel")


def __getattr__(name: str):
    if name in _API:
        from kernelforge import api

        return getattr(api, name)
    raise AttributeError(f"module 'kernelforge' has no attribute {name!r}")
