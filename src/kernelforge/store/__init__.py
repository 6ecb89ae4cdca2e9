"""The results database: schema, typed records, queries, the LLM log and the job lock."""
