"""Gemma 4 text decoder graphs: the single ``model`` graph and the ``embedding`` / ``decoder`` split."""
