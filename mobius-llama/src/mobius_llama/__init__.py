"""mobius-llama: the Llama family plugin (llama, mistral) on core's decoder-LM kit."""

__version__ = "0.1.0.dev0"
