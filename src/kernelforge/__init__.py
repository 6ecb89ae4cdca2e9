"""kernelforge: kernel autotuning and AI-assisted kernel search for the attention and MoE blocks of
large open models. See README.md; the flow is job -> candidates -> compile -> verify -> time ->
store -> report. The Python API is :mod:`kernelforge.api` (docs/python-api.md); its functions are
also reachable here, imported on first use so that ``import kernelforge.x`` stays light."""

__version__ = "0.1.0"

_API = ("open_job", "run", "results", "load_winner", "WinnerKernel")


def __getattr__(name: str):
    if name in _API:
        from kernelforge import api

        return getattr(api, name)
    raise AttributeError(f"module 'kernelforge' has no attribute {name!r}")
