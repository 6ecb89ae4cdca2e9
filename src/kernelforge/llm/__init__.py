"""The LLM candidate generator: new templates from any OpenAI-compatible chat-completions model,
verified, timed and tuned by the search like any other template.

- :mod:`.client`: the endpoint (timeouts, retries with backoff, Retry-After, redaction of the key);
- :mod:`.prompts`: the Jinja2 prompts shipped in ``kernelforge/prompts/``;
- :mod:`.parse`: what an answer holds (a template, points, or why neither);
- :mod:`.generator`: the strategy itself (parents, repairs, background requests) and its replay.

Enabled by a job's ``[llm]`` table or ``kernelforge search JOB --llm URL --llm-model NAME``;
``--llm replay`` reruns a search offline from the transcripts stored in the job database.
"""
