"""The workload profiles every preset and the projection are built from: one table.

Agents call models many times in sequence, so what counts is the time to the first token (the
prefill of the prompt, compute-bound) and between tokens (a decode step, memory-bound) at serving
concurrency. The profiles (BLOCKS.md's agent-latency profiles, and InferenceX's 8k/1k serving
benchmark) give the prompt and output lengths; blocks name their presets after them and the
projection (:mod:`kernelforge.report.projection.model`) reads those presets back by name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    """A workload profile: input (prefill) and output (decode) tokens."""

    name: str
    input_tokens: int
    output_tokens: int

    @property
    def context(self) -> int:
        """The cache length at the last decode step (input + output tokens): the slowest step."""
        return self.input_tokens + self.output_tokens


PROFILES: dict[str, Profile] = {
    "interactive": Profile("interactive", 8000, 800),
    "rag": Profile("rag", 32000, 1200),
    "coding": Profile("coding", 64000, 4000),
    "long_context": Profile("long_context", 128000, 2000),
    "8k1k": Profile("8k1k", 8192, 1024),
}

#: Serving concurrency of the decode presets (sequences per decode step).
BATCHES: tuple[int, ...] = (1, 8, 32, 64)

#: Prompt lengths of the profiles, in increasing order: a prefill runs a block once over the prompt.
PROMPT_TOKENS: tuple[int, ...] = tuple(sorted({p.input_tokens for p in PROFILES.values()}))

#: The token counts vLLM's MoE tuner times (benchmarks/kernels/benchmark_moe.py, its default batch
#: sizes; the keys of its shipped fused_moe config files): the ``<model>-vllm`` MoE shape sets.
VLLM_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)

__all__ = ["BATCHES", "PROFILES", "PROMPT_TOKENS", "VLLM_BATCH_SIZES", "Profile"]
