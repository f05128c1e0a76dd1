"""bf16 emulation on onnxruntime CPU reproduces bf16 rounding bit for bit on small graphs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from mobius_testing.bf16_emulation import emulate_bf16, emulation_session_options, has_bf16

ort = pytest.importorskip("onnxruntime")

BF = ml_dtypes.bfloat16


def _model(nodes, inputs, outputs, initializers=(), opset=23) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 11
    return model


def _bf16_initializer(name: str, array: np.ndarray) -> TensorProto:
    bits = np.asarray(array, dtype=BF).view(np.uint16)
    return helper.make_tensor(name, TensorProto.BFLOAT16, array.shape, bits.tobytes(), raw=True)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(
        model.SerializeToString(), emulation_session_options(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def _r(x: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (ties to even), back in float32."""
    return np.asarray(x, np.float32).astype(BF).astype(np.float32)


def _chain_model(w: np.ndarray) -> onnx.ModelProto:
    """z = ((x * y) + w) * x - y, all in bfloat16, with a bf16 initializer w."""
    bf16 = TensorProto.BFLOAT16
    nodes = [
        helper.make_node("Mul", ["x", "y"], ["m"]),
        helper.make_node("Add", ["m", "w"], ["a"]),
        helper.make_node("Mul", ["a", "x"], ["b"]),
        helper.make_node("Sub", ["b", "y"], ["z"]),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info(n, bf16, ["n"]) for n in ("x", "y")],
        [helper.make_tensor_value_info("z", bf16, ["n"])],
        [_bf16_initializer("w", w)],
    )


def test_bf16_graph_does_not_run_on_cpu_without_emulation():
    """The premise: ORT CPU has no bf16 Mul, so the emulation is needed at all."""
    model = _chain_model(np.ones(4, np.float32))
    with pytest.raises(Exception, match="Could not find an implementation"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_mul_add_chain_matches_stepwise_bf16_rounding_exactly():
    rng = np.random.default_rng(1)
    n = 50_000
    x = rng.standard_normal(n).astype(np.float32) * 3
    y = rng.standard_normal(n).astype(np.float32)
    w = _r(rng.standard_normal(n).astype(np.float32))
    model = _chain_model(w)
    assert has_bf16(model)
    emulated = emulate_bf16(model)
    assert isinstance(emulated, onnx.ModelProto)
    assert not has_bf16_compute(emulated)
    (got,) = _run(emulated, {"x": x, "y": y})
    xb, yb, wb = x.astype(BF), y.astype(BF), w.astype(BF)
    expect = ((xb * yb + wb) * xb - yb).astype(np.float32)  # ml_dtypes rounds after each op
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expect)
    # and it really is not a float32 computation
    exact = (x * y + w) * x - y
    assert np.abs(exact - got).max() > 1e-3


def has_bf16_compute(model: onnx.ModelProto) -> bool:
    """Any bf16 left outside the rounding casts the emulation adds."""
    ir_model = ir.serde.deserialize_model(model)
    for node in ir_model.graph:
        if node.op_type == "Cast":
            continue
        if any(v.dtype == ir.DataType.BFLOAT16 for v in (*node.inputs, *node.outputs) if v):
            return True
    return any(v.dtype == ir.DataType.BFLOAT16 for v in ir_model.graph.inputs) or any(
        v.dtype == ir.DataType.BFLOAT16 for v in ir_model.graph.outputs
    )


def test_inputs_are_rounded_on_entry_and_outputs_are_float32():
    """A caller feeding un-rounded float32 gets what a bf16 input would have given."""
    bf16 = TensorProto.BFLOAT16
    model = _model(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Add", ["x", "x"], ["z"])],
        [helper.make_tensor_value_info("x", bf16, [3])],
        [helper.make_tensor_value_info(n, bf16, [3]) for n in ("y", "z")],
    )
    emulated = emulate_bf16(model)
    assert [i.type.tensor_type.elem_type for i in emulated.graph.input] == [TensorProto.FLOAT]
    assert [o.name for o in emulated.graph.output] == ["y", "z"]
    assert {o.type.tensor_type.elem_type for o in emulated.graph.output} == {TensorProto.FLOAT}
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, np.pi], np.float32)  # ties go to even
    y, z = _run(emulated, {"x": x})
    np.testing.assert_array_equal(y, _r(x))
    np.testing.assert_array_equal(z, _r(_r(x) * 2))
    assert y[0] == 1.0 and y[1] == 1 + 4 * 2**-8


def test_casts_constants_and_matmul_in_a_mixed_graph():
    """f32 norm region, CastLike back to bf16, bf16 Constant/ConstantOfShape, MatMul, Cast int."""
    bf16 = TensorProto.BFLOAT16
    rng = np.random.default_rng(2)
    wm = _r(rng.standard_normal((8, 5)).astype(np.float32))
    half = helper.make_tensor("half", bf16, [1], np.array([0.3], BF).view(np.uint16).tobytes(), 1)
    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xf", "xf"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], keepdims=1),
        helper.make_node("Sqrt", ["ms"], ["rms"]),
        helper.make_node("Div", ["xf", "rms"], ["nf"]),
        helper.make_node("CastLike", ["nf", "x"], ["n"]),
        helper.make_node("MatMul", ["n", "wm"], ["h"]),
        helper.make_node("Constant", [], ["c"], value=half),
        helper.make_node("Mul", ["h", "c"], ["hc"]),
        helper.make_node("Shape", ["hc"], ["shape"]),
        helper.make_node(
            "ConstantOfShape",
            ["shape"],
            ["ones"],
            value=helper.make_tensor(
                "v", bf16, [1], np.array([1], BF).view(np.uint16).tobytes(), 1
            ),
        ),
        helper.make_node("Cast", ["k"], ["kb"], to=bf16),
        helper.make_node("Add", ["hc", "ones"], ["h1"]),
        helper.make_node("Add", ["h1", "kb"], ["y"]),
        helper.make_node("Cast", ["y"], ["yf"], to=TensorProto.FLOAT),
    ]
    model = _model(
        nodes,
        [
            helper.make_tensor_value_info("x", bf16, [2, 8]),
            helper.make_tensor_value_info("k", TensorProto.INT64, [2, 5]),
        ],
        [
            helper.make_tensor_value_info("y", bf16, [2, 5]),
            helper.make_tensor_value_info("yf", TensorProto.FLOAT, [2, 5]),
        ],
        [_bf16_initializer("wm", wm)],
    )
    x = rng.standard_normal((2, 8)).astype(np.float32)
    k = np.array([[1, 2, 3, 257, 259], [-1, 0, 1000, 65535, 3]], np.int64)
    y, yf = _run(emulate_bf16(model), {"x": x, "k": k})
    xr = _r(x)
    nf = xr / np.sqrt(np.mean(xr * xr, keepdims=True))  # opset 18+: no axes = all axes
    h = _r(_r(nf).astype(np.float64) @ wm.astype(np.float64))  # f32 accumulation ~ exact here
    hc = _r(h * _r(np.float32(0.3)))
    expect = _r(_r(hc + 1) + k.astype(BF).astype(np.float32))  # int64 -> bf16 in one rounding
    np.testing.assert_array_equal(y, expect)
    np.testing.assert_array_equal(yf, expect)
    assert y[0, 3] != 0 and k.astype(BF).astype(np.float32)[0, 3] == 256.0


def test_ir_model_is_rewritten_in_place_and_subgraphs_too():
    bf16 = TensorProto.BFLOAT16
    then_graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", bf16, [4])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", bf16, [4])],
    )
    model = _model(
        [
            helper.make_node("If", ["cond"], ["o"], then_branch=then_graph, else_branch=else_graph),
            helper.make_node("Mul", ["o", "x"], ["y"]),
        ],
        [
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", bf16, [4]),
        ],
        [helper.make_tensor_value_info("y", bf16, [4])],
    )
    ir_model = ir.serde.deserialize_model(model)
    assert emulate_bf16(ir_model) is ir_model
    emulated = ir.serde.serialize_model(ir_model)
    assert not has_bf16_compute(emulated)
    x = np.array([1.01, 2.02, -3.3, 7.77], np.float32)
    xr = _r(x)
    (y_then,) = _run(emulated, {"cond": np.array(True), "x": x})
    (y_else,) = _run(emulated, {"cond": np.array(False), "x": x})
    np.testing.assert_array_equal(y_then, _r(_r(xr * xr) * xr))
    np.testing.assert_array_equal(y_else, _r(_r(xr + xr) * xr))


def test_graph_without_bf16_is_unchanged_in_meaning():
    model = _model(
        [helper.make_node("Mul", ["x", "x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    assert not has_bf16(model)
    emulated = emulate_bf16(model)
    assert [n.op_type for n in emulated.graph.node] == ["Mul"]
    x = np.array([1.001, 2.0, 3.0], np.float32)
    np.testing.assert_array_equal(_run(emulated, {"x": x})[0], x * x)


def test_rejects_other_types():
    with pytest.raises(TypeError, match=r"ModelProto or onnx_ir\.Model"):
        emulate_bf16("model.onnx")
