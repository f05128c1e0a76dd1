"""A GGUF file's quantization kept (a build without ``--quant`` / ``--dtype``): per block
format, a tensor quantized by gguf's own quantizer (hand-built blocks for the K-quants,
which gguf cannot quantize) becomes MatMulNBits / GatherBlockQuantized, and onnxruntime
computes with exactly gguf's dequantization (the exact forms), or within the weight
error the build reports (``--target cpu``'s int8 form of the float-minimum formats a
Gather reads, and of Q5_1 / Q5_K; Q4_1 / Q4_K MatMul weights take an exact int4 form);
formats without a form stay float, saying why."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import onnx_ir as ir
import pytest
from test_gguf import open_toy, reference, toy_file

from mobius.checkpoint.gguf import GGUFCheckpoint
from mobius.quantization import SourceQuant, quantize_component
from mobius.weights import WeightPlan, bind, ref
from mobius.weights.quantize import dequantize_rows, quantize_rows

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(21)
N, K, V = 24, 512, 16
SCALE_BYTES = {  # fp16 d (and dmin) of hand-built blocks: gguf cannot quantize these
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208, None),
    "Q2_K": (80, 82),
}
EXACT = ["Q8_0", "Q4_0", "Q5_0", "Q6_K"]
FLOAT_MIN = ["Q4_1", "Q4_K"]
NO_EXACT_FORM = ["Q5_1", "Q5_K"]
NO_FORM = ["Q2_K"]


def stored(kind: str, rows: int) -> np.ndarray:
    """A ``[rows, K]`` tensor as ``kind`` stores it: float values gguf quantizes, or
    random blocks with sane fp16 scales."""
    if kind not in SCALE_BYTES:
        return RNG.standard_normal((rows, K)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kind]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = RNG.integers(0, 256, size=(rows * K // block, size), dtype=np.uint8)
    at, dmin = SCALE_BYTES[kind]
    raw[:, at : at + 2] = np.full((len(raw), 1), 0.01, np.float16).view(np.uint8)
    if dmin is not None:
        raw[:, dmin : dmin + 2] = np.full((len(raw), 1), 0.02, np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def model_of(ckpt: GGUFCheckpoint, target: str) -> tuple[ir.Model, dict]:
    """``y = x @ w.T`` and ``e[ids]`` over the file's tensors ``w`` and ``e``, kept as
    the build keeps them (the report of :func:`quantize_component`)."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([3, K]))
    ids = ir.Value(name="ids", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([4]))
    w = ir.Value(name="W", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([K, N]))
    e = ir.Value(name="E", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([V, K]))
    y = ir.Value(name="y", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([3, N]))
    rows = ir.Value(name="rows", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([4, K]))
    nodes = [
        ir.Node("", "MatMul", inputs=[x, w], outputs=[y]),
        ir.Node(
            "", "Gather", inputs=[e, ids], outputs=[rows], attributes=[ir.AttrInt64("axis", 0)]
        ),
    ]
    graph = ir.Graph([x, ids], [y, rows], nodes=nodes, initializers=[w, e], opset_imports={"": 21})
    model = ir.Model(graph, ir_version=10)
    plan = WeightPlan()
    plan.add("W", ref("w").transpose())
    plan.add("E", ref("e"))
    keep = SourceQuant(ckpt, target)
    plan, report = quantize_component(model, plan, None, target=target, keep=keep)
    bind(model, plan, ckpt, component="m")
    return model, {"report": report, "keep": keep}


def run(model: ir.Model, tmp_path: Path, x: np.ndarray, ids: np.ndarray) -> list[np.ndarray]:
    # accuracy level 4 (--target cpu) quantizes the activations to int8 by design: the
    # weights are what is checked here, so the ops run at level 0
    for node in model.graph:
        if node.op_type == "MatMulNBits":
            node.attributes["accuracy_level"] = ir.AttrInt64("accuracy_level", 0)
    path = tmp_path / "m.onnx"
    ir.save(model, str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x, "ids": ids})


def ops(model: ir.Model) -> dict[str, dict]:
    return {n.op_type: {k: a.value for k, a in n.attributes.items()} for n in model.graph}


@pytest.mark.parametrize("target", ["default", "cpu"])
@pytest.mark.parametrize("kind", EXACT + FLOAT_MIN + NO_EXACT_FORM + NO_FORM)
def test_each_format_keeps_gguf_values(tmp_path, kind, target):
    path = toy_file(
        tmp_path / "m.gguf", [("w", stored(kind, N), kind), ("e", stored(kind, V), kind)]
    )
    ckpt = open_toy(path)
    want_w, want_e = reference(path, "w"), reference(path, "e")
    model, got = model_of(ckpt, target)
    report, keep = got["report"], got["keep"]
    x = RNG.standard_normal((3, K)).astype(np.float32)
    ids = np.array([3, 0, 15, 3], np.int64)
    y, rows = run(model, tmp_path, x, ids)
    exact_y = x.astype(np.float64) @ want_w.T.astype(np.float64)
    bound = 2e-5 * np.abs(x).astype(np.float64) @ np.abs(want_w).T  # float rounding only
    found = ops(model)
    if kind in NO_FORM or (kind in NO_EXACT_FORM and target == "default"):
        assert set(report.kept_float) == {"W", "E"}
        assert "dequantized" in report.kept_float["W"], report.kept_float
        assert "MatMulNBits" not in found
        np.testing.assert_array_equal(rows, want_e[ids])
        (line,) = keep.dequantized({"m": report})  # what the build prints
        assert line.startswith("kept float: W, E: ") or line.startswith("kept float: E, W: ")
        assert kind in line
        return
    if kind in EXACT:  # both targets: the file's own blocks, both ops
        bits, block = {"Q4_0": (4, 32), "Q6_K": (8, 16)}.get(kind, (8, 32))
        assert found["MatMulNBits"]["bits"] == bits and found["MatMulNBits"]["block_size"] == block
        assert found["GatherBlockQuantized"]["bits"] == bits
        assert report.tensors["W"]["zero_points"] == "none"
        assert np.all(np.abs(y - exact_y) <= bound)
        np.testing.assert_array_equal(rows, want_e[ids])
        assert not keep.approximations()
        return
    if target == "default":  # Q4_1 / Q4_K: float zero points, exact up to one rounding
        assert report.tensors["W"]["zero_points"] == "float"
        assert found["MatMulNBits"]["bits"] == 4
        assert np.all(np.abs(y - exact_y) <= bound)
        assert "GatherBlockQuantized" in report.kept_float["E"]  # no float zero points there
        np.testing.assert_array_equal(rows, want_e[ids])
        return
    # --target cpu: Q4_1 / Q4_K read by MatMul only: exact, int4 levels (default zero
    # point 8) plus ReduceSum(x by blocks of 32) @ C; a Gather's table (and Q5_1 / Q5_K):
    # int8 blocks of 32 with integer zero points from gguf's values, the reported error
    # the largest over those tensors, and bounding the outputs
    assert found["GatherBlockQuantized"]["bits"] == 8
    approximated = {"e": want_e} if kind in FLOAT_MIN else {"w": want_w, "e": want_e}
    errors = {}
    for name, want in approximated.items():
        q = quantize_rows(want, bits=8, block_size=32, symmetric=False)
        errors[name] = float(np.abs(dequantize_rows(q, K, bits=8, block_size=32) - want).max())
    ((largest, count),) = keep.approximations().values()
    assert keep.approximations().keys() == {kind} and count == len(approximated)
    assert largest == max(errors.values()) > 0
    assert np.abs(rows - want_e[ids]).max() <= errors["e"]
    if kind in FLOAT_MIN:
        entry = report.tensors["W"]
        assert entry["zero_points"] == "none" and entry["correction"] == "block-sums"
        (mm,) = [n for n in model.graph if n.op_type == "MatMulNBits"]
        assert found["MatMulNBits"]["bits"] == 4 and len(mm.inputs) == 3  # no zero points
        assert found["ReduceSum"]["keepdims"] == 0 and "MatMul" in found and "Add" in found
        assert np.all(np.abs(y - exact_y) <= bound)  # float rounding, as the exact forms
    else:
        assert report.tensors["W"]["zero_points"] == "uint8"
        assert found["MatMulNBits"]["bits"] == 8
        assert np.all(np.abs(y - exact_y) <= np.abs(x) @ np.full((K, N), errors["w"]) + bound)


def test_row_moves_keep_the_blocks(tmp_path):
    """llama.cpp's q/k row permutation (and rows padded) move whole quantized rows: the
    blocks are kept, read in any row range; a transform changing values is not."""
    from test_gguf import ToyFamily

    from mobius.checkpoint.gguf import add_constant, pad_rows, unpermute_rows
    from mobius.records import GGUFTensor
    from mobius.weights.quantize import QuantScheme

    w = RNG.standard_normal((16, 64)).astype(np.float32)
    family = ToyFamily({
        "q": GGUFTensor("q", (unpermute_rows(2),)),
        "p": GGUFTensor("p", (pad_rows(20),)),
        "c": GGUFTensor("c", (add_constant(1.0),)),
    })  # fmt: skip
    path = toy_file(tmp_path / "m.gguf", [("q", w, "Q4_1"), ("p", w, "Q5_0"), ("c", w, "Q8_0")])
    ckpt = open_toy(path, family)
    for name, bits, fzp in (("q", 4, True), ("p", 8, False)):
        scheme = ckpt.kept_scheme(name, target="default", gather=False)
        assert scheme == QuantScheme(bits=bits, block_size=32, symmetric=not fzp,
                                     float_zero_points=fzp)  # fmt: skip
        read = ckpt.stored_quantized(name, scheme, np.float32)
        want = ckpt.read(name)
        for lo, hi in ((0, len(want)), (3, 11), (15, len(want))):
            back = dequantize_rows(read(lo, hi), 64, bits=bits, block_size=32)
            # one float rounding of the zero point: about 2**-24 of the block range
            np.testing.assert_allclose(back, want[lo:hi], rtol=1e-6, atol=1e-6)
    # --target cpu's exact form of Q4_1: symmetric levels plus block corrections, moved
    # with the rows (a Gather's table keeps the int8 approximation)
    scheme = ckpt.kept_scheme("q", target="cpu", gather=False)
    assert scheme == QuantScheme(bits=4, block_size=32, symmetric=True, block_correction=True)
    assert ckpt.kept_scheme("q", target="cpu", gather=True).bits == 8
    read = ckpt.stored_quantized("q", scheme, np.float32)
    want = ckpt.read("q")
    for lo, hi in ((0, len(want)), (3, 11)):
        got = read(lo, hi)
        assert got.zero_points is None and got.correction.shape == (hi - lo, 2)
        back = dequantize_rows(got, 64, bits=4, block_size=32)
        np.testing.assert_allclose(back, want[lo:hi], rtol=1e-6, atol=1e-6)
    assert "transform" in ckpt.kept_scheme("c", target="default", gather=False)
    assert ckpt.stored_quantized("c", QuantScheme(bits=8), np.float32) is None


def test_expert_table_from_two_tensors_keeps_their_blocks(tmp_path):
    """A routed-experts table ``[E, H, 2I]`` planned from two GGUF tables ``[E, I, H]``
    (llama.cpp's gate and up, concatenated on axis 1 and transposed) keeps their blocks:
    its rows are found in both files' rows (row_segments), read in any range; tables of
    two different types, or whose rows a plan computes, stay float."""
    from mobius.weights import concat
    from mobius.weights.quantize import QuantScheme, _stored_blocks, row_segments

    E, inter, H = 3, 8, 64
    gate, up = (RNG.standard_normal((E, inter, H)).astype(np.float32) for _ in range(2))
    path = toy_file(tmp_path / "m.gguf", [("g", gate, "Q8_0"), ("u", up, "Q8_0"),
                                          ("o", up, "Q4_0")])  # fmt: skip
    ckpt = open_toy(path)
    table = concat([ref("g"), ref("u")], axis=1).transpose([0, 2, 1]).cast("float32")
    from mobius.weights.quantize import rows_of_matmul_weight

    rows = rows_of_matmul_weight(table, experts=True).reshape([E * 2 * inter, H])
    segments = row_segments(rows, ckpt)
    assert segments == [(n, e * inter, (e + 1) * inter) for e in range(E) for n in "gu"]
    keep = SourceQuant(ckpt, "default")
    scheme = keep(rows, True)
    assert scheme == QuantScheme(bits=8, block_size=32, symmetric=True)
    read = _stored_blocks(rows, ckpt, scheme, np.dtype(np.float32))
    want = np.concatenate([reference(path, "g").reshape(E, inter, H),
                           reference(path, "u").reshape(E, inter, H)], axis=1)  # fmt: skip
    want = want.reshape(-1, H)
    for lo, hi in ((0, len(want)), (5, 29), (11, 12)):
        back = dequantize_rows(read(lo, hi), H, bits=8, block_size=32)
        np.testing.assert_array_equal(back, want[lo:hi])
    mixed = concat([ref("g"), ref("o")], axis=1).reshape([E * 2 * inter, H])
    assert "different types" in keep(mixed, True)
    assert "computed" in keep(concat([ref("g"), ref("u")], axis=2).reshape([-1, H]), True)
    assert "computed" in keep(ref("g").scale(2.0).reshape([-1, H]), True)
