"""What leaves kernelforge for other tools: exports of a job's winners, and the Optuna mirror.

- :mod:`.formats`: ``kernelforge export JOB --format ...``, the one entry that picks a format.
- :mod:`.entry`: the provenance record every exported (block, shape) carries.
- :mod:`.vllm_configs`: fused_moe configuration files for vLLM and SGLang.
- :mod:`.triton_folder`: a package-free folder of Triton files per block, with a dispatcher; its
  ``@triton.autotune`` configurations are read from the winners by :mod:`.autotune`.
- :mod:`.dashboard`: a one-way mirror of stored evaluations into Optuna studies, for
  optuna-dashboard.
"""

__all__ = ["formats", "entry", "vllm_configs", "triton_folder", "autotune", "dashboard"]
