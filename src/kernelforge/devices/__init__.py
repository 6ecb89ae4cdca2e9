"""Where kernels run and how they are timed: the device contract (:mod:`.base`), a real GPU
(:mod:`.cuda`), Triton's CPU interpreter with kernelforge's fixes (:mod:`.interpret`,
:mod:`.interpreter`), device names (:mod:`.registry`), hardware ceilings for rooflines
(:mod:`.hardware`) and their measurement on this device (:mod:`.measure`)."""

__all__ = ["base", "cuda", "interpret", "interpreter", "registry", "hardware", "measure"]
