"""mobius-qwen3: the Qwen3 family plugin (qwen3, qwen3_moe)."""

__version__ = "0.1.0.dev0"
