"""LLM serving: KV-cache sizing and pool capacity."""
