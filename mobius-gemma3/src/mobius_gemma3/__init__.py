"""mobius-gemma3: the Gemma 3 text family plugin (gemma3_text) on core's decoder-LM kit."""

__version__ = "0.1.0.dev0"
