"""Small-model LLM workers: model, KV cache, prefix cache, engine, and the PDD roles (workers/roles)."""
