"""The LLM candidate generator: new templates from any OpenAI-compatible chat-completions model,
verified, timed and tuned by the search like any other template.

- :mod:`.client`: the endpoint (timeouts, retries with backoff, Retry-After, redaction of the key);
- :mod:`.workers`: the threads requests run on while the device evaluates;
- :mod:`.prompts`: the Jinja2 prompts shipped in ``llm/templates/``;
- :mod:`.context`: what the generator reads of the search, and the prompt built from it;
- :mod:`.parse`: what an answer holds (a template, points, or why neither);
- :mod:`.base`: taking answers in, the LLM log, settling verdicts (repairs), the summary;
- :mod:`.generator`: the live generator (parents, repairs, background requests);
- :mod:`.replay`: the offline generator that hands stored answers back;
- :mod:`.proposer`: both behind the search's proposer seam (:func:`.proposer.for_job`).
- :mod:`.advisor`: the point adviser (``[llm] guide_points``): points of a study's space asked first.

Enabled by a job's ``[llm]`` table or ``kernelforge search JOB --llm URL --llm-model NAME``;
``--llm replay`` reruns a search offline from the transcripts stored in the job database.
"""

__all__ = ["proposer", "advisor", "lineage"]
