"""Example mobius plugin: a two-layer MLP classifier (model_type ``tinymlp``)."""

__version__ = "0.1.0"
