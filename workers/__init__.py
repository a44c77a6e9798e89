"""Small-model LLM workers: model, KV cache, prefix cache, engine (and later the PDD roles)."""
