"""mobius-gemma4: the Google Gemma 4 family plugin for mobius.

Where things are:
- ``plugin.py``: the hook implementations (import-light).
- ``config.py``: typed configs read from raw ``config.json``.
- ``contract.py`` / ``ports.py``: the pipeline contract and every component's ports.
- ``text/``: the text decoder — ``causal_lm.py`` (single ``model`` graph), ``embedding.py``
  and ``decoder.py`` (split package), ``stack.py``, ``decoder_layer.py``, ``attention.py``,
  ``mlp.py``, ``moe.py``, ``per_layer_embeddings.py``, ``rope.py``, ``masks.py``.
- ``weights/text.py``: HF checkpoint names → initializers.
- ``genai_config.py`` / ``processors.py``: runtime files and text preprocessing.
"""

__version__ = "0.1.1.dev0"
