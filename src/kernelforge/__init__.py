"""kernelforge: kernel autotuning and AI-assisted kernel search for the attention and MoE blocks of
large open models. See README.md; the flow is job -> candidates -> compile -> verify -> time ->
store -> report."""

__version__ = "0.1.0"
