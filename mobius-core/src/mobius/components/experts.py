"""Routed mixture-of-experts: top-k routing and an experts block that reads only hit experts.

Two pieces, shared by every MoE family (Gemma 4 26B-A4B, Qwen3-MoE, …):

``route(op, logits, top_k, *, softmax_first=True, normalize=True) -> (weights, indices)``
    ``logits`` ``[T, E]`` (any float dtype) → ``weights`` ``[T, k]`` float32 and
    ``indices`` ``[T, k]`` int64 (TopK order: largest first). ``softmax_first`` true is
    HF's ``softmax(logits, dtype=float32)`` then ``topk`` (Gemma 4, Qwen3-MoE), optionally
    renormalised so each row sums to 1 (``normalize``; Qwen3-MoE's ``norm_topk_prob``).
    ``softmax_first`` false is ``topk`` of the logits then a softmax over the k picks
    (``normalize`` is then moot: the rows already sum to 1). Family specifics (Gemma 4's
    ``per_expert_scale``, a cast of the weights to the model dtype) are applied by the
    family to the returned weights.

``RoutedExperts(num_experts, hidden_size, intermediate_size, activation="silu", *,
dtype="float32", name=None)``
    Parameters ``gate_up_proj`` ``[E, H, 2I]`` (columns ``0..I-1`` gate, ``I..2I-1`` up) and
    ``down_proj`` ``[E, I, H]`` — HF's ``[E, 2I, H]`` / ``[E, H, I]`` transposed by the
    family's weight plan, so the graph is a plain batched MatMul. ``activation`` gates the
    expert (``"gelu_tanh"`` for Gemma 4, ``"silu"`` for Qwen3-MoE; see
    :data:`mobius.components.mlp.ACTIVATIONS`).
    ``forward(op, x, weights, indices) -> y``: ``x`` ``[T, H]`` (model dtype), ``weights``
    ``[T, k]`` float32, ``indices`` ``[T, k]`` int64 → ``y`` ``[T, H]`` (model dtype),
    ``y[t] = Σ_j weights[t, j] · down(act(gate(x[t])) · up(x[t]))`` over experts
    ``indices[t, j]``.

How the experts are computed (decided from the graph, measured with benchmarks/moe.py):
the graph finds the set ``U`` of experts hit by any token of the step (a ``[T, E]`` hit mask
→ ``ReduceMax`` over tokens → ``NonZero``, ascending expert order), ``Gather``\\ s only those
experts' ``gate_up_proj`` / ``down_proj`` slabs and runs every token of the step through
them as one batched MatMul ``[U, T, ·]``; tokens weight each expert's output by their
routing weight (zero for experts they did not pick) and the sum runs over ``U`` in
ascending expert order, the order in which HF's loop accumulates. A single decode token
therefore reads exactly ``k`` experts' weights (a batch of B rows at most ``B·k``), so the
bytes read per step grow with ``top_k``, not with ``num_experts``. A long prompt hits
nearly every expert, where this is the dense formulation over the hit experts. For
float32 each token's products equal HF's per-expert loop (the k weighted outputs are
summed in TopK order, HF sums in expert order: a last-bit difference for k > 2); in
float16/bfloat16 a weighted output is computed in float32 and cast back before the sum,
like HF.

``dense_formulation()``: a context manager; ``RoutedExperts`` constructed inside it compute
every expert for every token and weight the outputs with a dense ``[T, E]`` matrix that is
zero outside the top-k — the formulation mobius used before routing, kept as the reference
that benchmarks/moe.py and the tests measure the routed graph against. Builds never use it.

``expert_tables(graph)`` and ``decode_weight_bytes(graph, num_experts, top_k)`` read a built
graph: which initializers are gathered by hit expert only, and the weight bytes a decode
token reads routed vs dense (printed by the L2 test for the full-size configs).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius.components.dtypes import ir_dtype
from mobius.components.mlp import ACTIVATIONS, activation

_F32 = ir.DataType.FLOAT
_I64 = ir.DataType.INT64
_DENSE = contextvars.ContextVar("mobius_dense_experts", default=False)


@contextlib.contextmanager
def dense_formulation() -> Iterator[None]:
    """Build ``RoutedExperts`` the dense way (every expert, every token) inside this block."""
    token = _DENSE.set(True)
    try:
        yield
    finally:
        _DENSE.reset(token)


def route(
    op: OpBuilder,
    logits: ir.Value,
    top_k: int,
    *,
    softmax_first: bool = True,
    normalize: bool = True,
) -> tuple[ir.Value, ir.Value]:
    """Top-k routing of router ``logits`` ``[T, E]``; see the module docstring."""
    x32 = logits if logits.dtype == _F32 else op.Cast(logits, to=_F32)
    k = op.Constant(value_ints=[top_k])
    if softmax_first:
        probs = op.Softmax(x32, axis=-1)
        weights, indices = op.TopK(probs, k, axis=-1, _outputs=2)
        if normalize:
            weights = op.Div(weights, op.ReduceSum(weights, [-1], keepdims=1))
    else:
        top, indices = op.TopK(x32, k, axis=-1, _outputs=2)
        weights = op.Softmax(top, axis=-1)
    return weights, indices


class RoutedExperts(nn.Module):
    """Experts of a routed MoE block; see the module docstring for the signature."""

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        activation: str = "silu",
        *,
        dtype: str | ir.DataType = "float32",
        name: str | None = None,
    ) -> None:
        super().__init__(name)
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; expected one of {ACTIVATIONS}")
        self.num_experts, self.hidden = num_experts, hidden_size
        self.inter, self.activation, self.dtype = intermediate_size, activation, ir_dtype(dtype)
        self.dense = _DENSE.get()
        E, H, inter = num_experts, hidden_size, intermediate_size
        self.gate_up_proj = nn.Parameter([E, H, 2 * inter], dtype=self.dtype)
        self.down_proj = nn.Parameter([E, inter, H], dtype=self.dtype)

    def forward(self, op: OpBuilder, x: ir.Value, weights: ir.Value, indices: ir.Value) -> ir.Value:
        if self.dense:
            return self._dense(op, x, weights, indices)
        top_k = op.Shape(indices, start=1, end=2)  # [1]
        flat = op.Reshape(indices, [-1])  # [A]: assignment a = (token a // k, pick a % k)
        # one-hot of every assignment's expert, and per expert its assignment count
        onehot = op.Cast(
            op.Equal(
                op.Unsqueeze(flat, [1]), op.Constant(value_ints=list(range(self.num_experts)))
            ),
            to=_I64,
        )  # [A, E]
        counts = op.ReduceSum(onehot, [0], keepdims=0)  # [E]
        is_hit = op.Greater(counts, op.Constant(value_int=0))
        hit = op.Reshape(op.NonZero(is_hit), [-1])  # [U] hit experts, ascending
        # the hit-set slot of each assignment's expert, and its rank among that expert's
        # assignments (tokens in order)
        slot_of = op.Sub(op.CumSum(op.Cast(is_hit, to=_I64), op.Constant(value_int=0)), 1)
        slot = op.Gather(slot_of, flat, axis=0)  # [A]
        rank = op.ReduceSum(
            op.Mul(op.CumSum(onehot, op.Constant(value_int=0), exclusive=1), onehot),
            [1],
            keepdims=0,
        )  # [A]
        where = op.Concat(op.Unsqueeze(slot, [1]), op.Unsqueeze(rank, [1]), axis=1)  # [A, 2]
        # token table [U, C]: the tokens routed to each hit expert, padded with token 0
        # (padding rows are computed but never read back)
        capacity = op.ReduceMax(counts, [0], keepdims=1)  # [1]
        n_hit = op.Shape(hit)  # [1]
        table = op.ScatterND(
            op.ConstantOfShape(
                op.Concat(n_hit, capacity, axis=0), value=ir.tensor([0], dtype=_I64)
            ),
            where,
            op.Div(op.Range(0, op.Size(flat), 1), op.Squeeze(top_k, [0])),
        )
        xg = op.Gather(x, table, axis=0)  # [U, C, H]
        gate_up = op.Gather(self.gate_up_proj, hit, axis=0)  # [U, H, 2I]: hit experts only
        down = op.Gather(self.down_proj, hit, axis=0)  # [U, I, H]
        gu = op.MatMul(xg, gate_up)  # [U, C, 2I]
        gate, up = op.Split(
            gu, op.Constant(value_ints=[self.inter, self.inter]), axis=-1, _outputs=2
        )
        y = op.MatMul(op.Mul(activation(op, gate, self.activation), up), down)  # [U, C, H]
        picked = op.Reshape(
            op.GatherND(y, where),
            op.Concat(op.Shape(indices), op.Constant(value_ints=[self.hidden]), axis=0),
        )  # [T, k, H]
        return self._weighted_sum(op, picked, op.Unsqueeze(weights, [2]), 1)  # over k

    def _dense(self, op: OpBuilder, x: ir.Value, weights: ir.Value, indices: ir.Value):
        """Every expert for every token, weighted by a dense ``[T, E]`` matrix (reference)."""
        zeros = op.ConstantOfShape(
            op.Concat(
                op.Shape(x, start=0, end=1), op.Constant(value_ints=[self.num_experts]), axis=0
            ),
            value=ir.tensor([0.0], dtype=_F32),
        )
        dense = op.ScatterElements(zeros, indices, weights, axis=1)  # [T, E]
        gu = op.MatMul(op.Unsqueeze(x, [0]), self.gate_up_proj)  # [E, T, 2I]
        gate, up = op.Split(
            gu, op.Constant(value_ints=[self.inter, self.inter]), axis=-1, _outputs=2
        )
        y = op.MatMul(op.Mul(activation(op, gate, self.activation), up), self.down_proj)
        w = op.Unsqueeze(op.Transpose(dense, perm=[1, 0]), [2])  # [E, T, 1]
        return self._weighted_sum(op, y, w, 0)  # over E

    def _weighted_sum(self, op: OpBuilder, y: ir.Value, w: ir.Value, axis: int) -> ir.Value:
        if self.dtype == _F32:
            return op.ReduceSum(op.Mul(y, w), [axis], keepdims=0)
        # HF: (expert output in M) × float32 weight, cast to M, accumulated in M
        return op.ReduceSum(
            op.Cast(op.Mul(op.Cast(y, to=_F32), w), to=self.dtype), [axis], keepdims=0
        )


def expert_tables(graph: ir.Graph) -> list[ir.Value]:
    """Initializers of ``graph`` read only at the hit experts (:func:`gathers_hit_experts`):
    the expert tables :class:`RoutedExperts` emits, float or quantized."""
    tables = []
    for value in graph.initializers.values():
        uses = [use.node for use in value.uses()]
        if uses and all(gathers_hit_experts(node, value) for node in uses):
            tables.append(value)
    return tables


def gathers_hit_experts(node: ir.Node, table: ir.Value) -> bool:
    """Whether ``node`` reads ``table`` only at the hit experts: a ``Gather`` (axis 0) of the
    table, or the com.microsoft ``GatherBlockQuantized`` that ``--quant`` makes of it (the
    table is then its packed data, scales or zero points), indexed by a value derived from
    ``NonZero`` of the hit mask."""
    if node.op_type == "Gather" and node.domain in ("", "ai.onnx"):
        if node.inputs[0] is not table:
            return False
        axis = node.attributes.get("axis")
    elif node.op_type == "GatherBlockQuantized" and node.domain == "com.microsoft":
        if node.inputs[1] is table or table not in node.inputs:
            return False
        axis = node.attributes.get("gather_axis")
    else:
        return False
    if axis is not None and axis.as_int() != 0:
        return False
    value = node.inputs[1]
    for _ in range(_HIT_DEPTH):  # Reshape(NonZero) directly, or hit·N + n for quantized rows
        producer = value.producer() if value is not None else None
        if producer is None:
            return False
        if producer.op_type == "NonZero":
            return True
        value = producer.inputs[0]
    return False


_HIT_DEPTH = 5


def decode_weight_bytes(graph: ir.Graph, num_experts: int, top_k: int) -> tuple[int, int]:
    """Weight bytes one decode token (batch 1) reads: ``(routed, dense)``.

    Every initializer counts in full (the head reads its whole table), except the expert
    tables of :func:`expert_tables`, of which a routed step reads ``top_k`` of
    ``num_experts`` slabs; ``dense`` is what reading every expert costs. Works on graphs
    without weight data (sizes come from shapes and dtypes).
    """
    routed = dense = 0
    experts = {id(v) for v in expert_tables(graph)}
    for value in graph.initializers.values():
        size = math.prod(int(d) for d in value.shape) * int(value.dtype.itemsize)
        dense += size
        routed += size * top_k // num_experts if id(value) in experts else size
    return routed, dense
