"""Rotary position embeddings: numpy-built cos/sin tables and the ONNX ``RotaryEmbedding`` op.

Tables are computed at build time in float64 from the model's ``inv_freq`` (so every
rope variant — default, linear, proportional/partial, yarn — is just a different
``inv_freq`` vector and ``scaling``) and stored in the compute dtype. The layout is
the HF split-half convention (``emb = cat(freqs, freqs)``, ``rotate_half``): a table
row holds ``hd/2`` values and the op runs with ``interleaved=0``. A partial rotary
table is expressed with zeros in ``inv_freq`` (cos 1, sin 0: those pairs pass through),
so the op always rotates the full head (``rotary_embedding_dim=0``).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius.components.dtypes import ir_dtype, numpy_dtype
from mobius.components.graph import constant


def rotary_tables(
    inv_freq: np.ndarray, max_positions: int, *, scaling: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(cos, sin)`` float32 tables ``[max_positions, len(inv_freq)]``.

    ``cos[p, i] = cos(p · inv_freq[i]) · scaling`` (same for sin), computed in float64.
    """
    inv = np.asarray(inv_freq, dtype=np.float64).reshape(-1)
    freqs = np.outer(np.arange(max_positions, dtype=np.float64), inv)
    cos = (np.cos(freqs) * scaling).astype(np.float32)
    sin = (np.sin(freqs) * scaling).astype(np.float32)
    return cos, sin


class RotaryEmbedding(nn.Module):
    """Split-half rotary embedding backed by build-time cos/sin tables.

    Constructor: ``RotaryEmbedding(inv_freq, max_positions, *, scaling=1.0, dtype="float32",
    name=None)``; ``inv_freq`` has ``head_dim/2`` entries (zeros for non-rotated pairs).
    No parameters: the tables are initializers ``<scope>.cos_cache`` / ``<scope>.sin_cache``
    ``[max_positions, head_dim/2]`` in ``dtype``, created once per graph.

    - ``tables(op) -> (cos, sin)``: the full 2-D tables (what GroupQueryAttention takes).
    - ``gather(op, position_ids) -> (cos, sin)``: rows for int64 ``position_ids`` ``[B, S]``,
      shape ``[B, S, head_dim/2]``; gather once, reuse in every layer.
    - ``forward(op, x, cos, sin, position_ids=None, *, num_heads=None) -> x_rot``: ONNX
      ``RotaryEmbedding`` on ``x`` ``[B, S, num_heads·head_dim]`` (``num_heads`` required) or
      ``[B, num_heads, S, head_dim]``. ``cos/sin`` are either gathered 3-D rows or, with
      ``position_ids``, the 2-D tables.
    """

    def __init__(
        self,
        inv_freq: np.ndarray,
        max_positions: int,
        *,
        scaling: float = 1.0,
        dtype: str | ir.DataType = "float32",
        name: str | None = None,
    ) -> None:
        super().__init__(name)
        self.inv_freq = np.asarray(inv_freq, dtype=np.float64).reshape(-1)
        self.max_positions = int(max_positions)
        self.scaling = float(scaling)
        self.dtype = ir_dtype(dtype)
        self.head_dim = 2 * self.inv_freq.size
        self._tables: dict[int, tuple[ir.Value, ir.Value]] = {}

    def tables(self, op: OpBuilder) -> tuple[ir.Value, ir.Value]:
        root = op.builder.root
        cached = self._tables.get(id(root))
        if cached is not None and cached[0].graph is root.graph:
            return cached
        cos, sin = rotary_tables(self.inv_freq, self.max_positions, scaling=self.scaling)
        np_dtype = numpy_dtype(self.dtype)
        gb = op.builder
        gb.push_module(self.name or "", type(self).__qualname__)
        try:
            values = (
                constant(gb, cos.astype(np_dtype), "cos_cache"),
                constant(gb, sin.astype(np_dtype), "sin_cache"),
            )
        finally:
            gb.pop_module()
        self._tables[id(root)] = values
        return values

    def gather(self, op: OpBuilder, position_ids: ir.Value) -> tuple[ir.Value, ir.Value]:
        cos, sin = self.tables(op)
        return op.Gather(cos, position_ids, axis=0), op.Gather(sin, position_ids, axis=0)

    def forward(
        self,
        op: OpBuilder,
        x: ir.Value,
        cos: ir.Value,
        sin: ir.Value,
        position_ids: ir.Value | None = None,
        *,
        num_heads: int | None = None,
    ) -> ir.Value:
        attrs = {"interleaved": 0, "rotary_embedding_dim": 0}
        if num_heads is not None:
            attrs["num_heads"] = int(num_heads)
        inputs = [x, cos, sin] if position_ids is None else [x, cos, sin, position_ids]
        return op.RotaryEmbedding(*inputs, **attrs)
