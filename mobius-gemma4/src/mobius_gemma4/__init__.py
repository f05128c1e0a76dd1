"""mobius-gemma4: the Google Gemma 4 family plugin for mobius.

Where things are:
- ``plugin.py``: the hook implementations (import-light).
- ``config.py``: typed configs read from raw ``config.json``.
- ``contract.py`` / ``ports.py``: the pipeline contract and every component's ports.
- ``text/``: the text decoder — ``model.py`` (the single ``model`` graph, the split
  package's ``embedding`` and ``decoder``, the layer stack) and ``layers.py`` (one layer).
- ``weights/text.py``: HF checkpoint names → initializers.
- ``genai_config.py`` / ``processors.py``: runtime files and text preprocessing.
"""

__version__ = "0.1.1.dev0"
