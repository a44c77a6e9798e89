"""Small-model LLM workers: model, KV cache, prefix cache, engine, KV data plane (kvwire), PDD roles (roles)."""
