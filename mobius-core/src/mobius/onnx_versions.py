"""The ONNX versions every graph mobius writes declares.

onnxruntime-gpu 1.31 (the newest on PyPI) loads IR versions up to 13 and
default-domain opsets up to 25, while onnx ≥ 1.23 writes IR 14 by default; so the
IR version is pinned here rather than left to the library. Opset 23 is the first
with ``Attention``, ``RotaryEmbedding`` and ``RMSNormalization``.
"""

from __future__ import annotations

OPSET = 23
"""ai.onnx opset of every mobius graph."""

MS_OPSET = 1
"""com.microsoft opset (GroupQueryAttention, …) where a target uses contrib ops."""

IR_VERSION = 11
"""ONNX IR version matching :data:`OPSET` (onnx 1.18 pairs IR 11 with opset 23)."""
