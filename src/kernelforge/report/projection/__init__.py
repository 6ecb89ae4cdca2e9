"""Model-level projection: what measured per-call block times mean for time-to-first-token and
time-between-tokens of a whole model.

- :mod:`.model`: the projection itself (calls per token, rooflines, TTFT/TBT under a latency target).
- :mod:`.of_report`: the projection of one collected report, read from its stored measurements.
- :mod:`.gpt_oss` and :mod:`.mla`: the costs of the models the projection knows (GPT-OSS;
  DeepSeek-R1 and Kimi K2.5 MLA).
"""

__all__ = ["model", "of_report", "gpt_oss", "mla"]
