"""Rotary position embeddings: ``inv_freq`` per HF rope type, cos/sin, and the ONNX op.

Three layers, each usable alone:

- :func:`rope_inv_freq` computes ``inv_freq`` and the cos/sin ``attention_scaling`` of an
  HF ``rope_parameters`` dict (types ``default``, ``linear``, ``proportional``, ``yarn``,
  ``llama3``; ``partial_rotary_factor`` included) in float32 numpy, op for op as
  transformers 5.24's ``modeling_rope_utils`` does in torch float32.
- :func:`rotary_cos_sin` forms ``cos/sin [B, S, len(inv_freq)]`` *in the graph* from
  ``position_ids`` (float32 ``pos · inv_freq``, as HF's rotary modules do), so no
  ``[max_positions, hd/2]`` table is stored; :func:`apply_rotary` runs the ONNX
  ``RotaryEmbedding`` op on q or k (``rotary_dim`` for a partial rotation).
- :class:`RotaryEmbedding` keeps build-time tables instead (what GroupQueryAttention's
  own rotary takes).

The table variant:

Tables are computed at build time in float64 from the model's ``inv_freq`` (so every
rope variant — default, linear, proportional/partial, yarn — is just a different
``inv_freq`` vector and ``scaling``) and stored in the compute dtype. The layout is
the HF split-half convention (``emb = cat(freqs, freqs)``, ``rotate_half``): a table
row holds ``hd/2`` values and the op runs with ``interleaved=0``. A partial rotary
table is expressed with zeros in ``inv_freq`` (cos 1, sin 0: those pairs pass through),
so the op always rotates the full head (``rotary_embedding_dim=0``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius.components.dtypes import ir_dtype, numpy_dtype
from mobius.components.graph import constant

ROPE_TYPES = ("default", "linear", "proportional", "yarn", "llama3")
"""Rope types :func:`rope_inv_freq` computes (HF ``rope_parameters["rope_type"]``)."""

_F32 = np.float32


def _exponents(count: int, dim: int) -> np.ndarray:
    """``arange(0, 2·count, 2) / dim`` in float32, as HF's int64 arange cast to float."""
    return np.arange(0, 2 * count, 2, dtype=np.int64).astype(_F32) / _F32(dim)


def _pow(base: float, exps: np.ndarray) -> np.ndarray:
    """``base ** exps`` rounded once to float32, as torch's float32 pow gives it (bit for
    bit on HF's tables; numpy's float32 pow is off by an ulp on some entries)."""
    return (np.float64(base) ** exps.astype(np.float64)).astype(_F32)


def rope_inv_freq(
    params: Mapping[str, Any], head_dim: int, max_position_embeddings: int | None = None
) -> tuple[np.ndarray, float]:
    """``(inv_freq, attention_scaling)`` of one HF ``rope_parameters`` dict.

    ``params`` holds ``rope_type`` (one of :data:`ROPE_TYPES`), ``rope_theta`` and the
    type's own keys (``factor``; yarn: ``original_max_position_embeddings``,
    ``beta_fast``/``beta_slow``, ``attention_factor``, ``mscale``/``mscale_all_dim``,
    ``truncate``; llama3: ``low_freq_factor``/``high_freq_factor``/
    ``original_max_position_embeddings``) and optionally ``partial_rotary_factor``.
    ``max_position_embeddings`` is the model's (yarn's ``factor`` default and HF's
    ``original_max_position_embeddings`` default).

    ``inv_freq`` is float32. Its length is ``int(head_dim · partial_rotary_factor) / 2``
    (rotate that many leading dims: pass ``rotary_dim`` to :func:`apply_rotary`), except
    for ``proportional``, whose table is zero-padded to ``head_dim / 2`` (exponent
    denominator the full head dim; zero frequencies leave their pairs unchanged).
    ``attention_scaling`` multiplies cos and sin (1.0 except yarn).
    Raises ``ValueError`` for another type; callers validate configs first.
    """
    kind = params.get("rope_type", params.get("type", "default"))
    base = float(params["rope_theta"])
    partial = float(params.get("partial_rotary_factor") or 1.0)
    if kind == "proportional":
        angles = int(partial * head_dim // 2)
        rotated = (_F32(1.0) / _pow(base, _exponents(angles, head_dim))).astype(_F32)
        out = np.zeros(head_dim // 2, dtype=_F32)
        out[:angles] = rotated
        return (out / _F32(params.get("factor", 1.0))).astype(_F32), 1.0
    dim = int(head_dim * partial)
    inv = (_F32(1.0) / _pow(base, _exponents(dim // 2, dim))).astype(_F32)
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return (inv / _F32(params["factor"])).astype(_F32), 1.0
    if kind == "yarn":
        return _yarn(params, inv, base, dim, max_position_embeddings)
    if kind == "llama3":
        return _llama3(params, inv, max_position_embeddings), 1.0
    raise ValueError(f"unknown rope_type {kind!r}; expected one of {ROPE_TYPES}")


def _yarn(params, inv_extra, base: float, dim: int, max_positions: int | None):
    original = params.get("original_max_position_embeddings") or max_positions
    factor = params.get("factor") or max_positions / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.get("attention_factor")
    if attention is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = (
            float(mscale(factor, m) / mscale(factor, m_all)) if m and m_all else mscale(factor)
        )
    fast = params.get("beta_fast") or 32
    slow = params.get("beta_slow") or 1

    def correction(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction(fast), correction(slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=_F32) - _F32(low)) / _F32(high - low), 0, 1)
    extrapolation = (1 - ramp).astype(_F32)
    pos_freqs = _pow(base, _exponents(dim // 2, dim))
    inv_inter = (1.0 / (_F32(factor) * pos_freqs)).astype(_F32)
    inv_extra = (1.0 / pos_freqs).astype(_F32)
    inv = inv_inter * (1 - extrapolation) + inv_extra * extrapolation
    return inv.astype(_F32), float(attention)


def _llama3(params, inv: np.ndarray, max_positions: int | None) -> np.ndarray:
    factor = _F32(params["factor"])
    low_f, high_f = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    old = float(params.get("original_max_position_embeddings") or max_positions)
    low_wavelen, high_wavelen = old / low_f, old / high_f
    wavelen = (_F32(2 * math.pi) / inv).astype(_F32)
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv).astype(_F32)
    smooth = ((_F32(old) / wavelen - _F32(low_f)) / _F32(high_f - low_f)).astype(_F32)
    smoothed = ((1 - smooth) * scaled / factor + smooth * scaled).astype(_F32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(_F32)


def rotary_cos_sin(
    op: OpBuilder,
    inv_freq: np.ndarray,
    position_ids: ir.Value,
    dtype: str | ir.DataType,
    *,
    scaling: float = 1.0,
    name: str = "rope",
) -> tuple[ir.Value, ir.Value]:
    """``(cos, sin)`` ``[B, S, len(inv_freq)]`` in ``dtype`` from int64 ``position_ids [B, S]``.

    ``angles = float32(position_ids) · inv_freq`` (inv_freq an inline constant
    ``<name>.inv_freq``), then ``cos/sin(angles) · scaling`` in float32, cast to ``dtype``:
    HF's ``emb.cos() * attention_scaling`` then ``.to(x.dtype)``. Build once per rope
    variant and reuse in every layer.
    """
    freq = op.initializer(ir.tensor(np.asarray(inv_freq, dtype=_F32), name=f"{name}.inv_freq"))
    pos = op.Unsqueeze(op.Cast(position_ids, to=ir.DataType.FLOAT), [-1])
    angles = op.Mul(pos, freq)
    cos, sin = op.Cos(angles), op.Sin(angles)
    if scaling != 1.0:
        cos, sin = op.Mul(cos, float(scaling)), op.Mul(sin, float(scaling))
    dt = ir_dtype(dtype)
    if dt != ir.DataType.FLOAT:
        cos, sin = op.Cast(cos, to=dt), op.Cast(sin, to=dt)
    return cos, sin


def apply_rotary(
    op: OpBuilder,
    x: ir.Value,
    cos: ir.Value,
    sin: ir.Value,
    *,
    num_heads: int | None = None,
    rotary_dim: int = 0,
) -> ir.Value:
    """HF ``apply_rotary_pos_emb`` (split-half ``rotate_half``) on one of q / k.

    ``x`` is ``[B, S, num_heads·head_dim]`` (give ``num_heads``) or ``[B, heads, S,
    head_dim]``; ``cos/sin`` ``[B, S, rotary_dim/2]`` from :func:`rotary_cos_sin`.
    ``rotary_dim`` > 0 rotates only the first ``rotary_dim`` dims of each head (HF
    partial rotary); 0 rotates the whole head.
    """
    attrs: dict[str, int] = {"interleaved": 0, "rotary_embedding_dim": int(rotary_dim)}
    if num_heads is not None:
        attrs["num_heads"] = int(num_heads)
    return op.RotaryEmbedding(x, cos, sin, **attrs)


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
