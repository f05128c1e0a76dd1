"""``--target cpu`` fuses the MatMulNBits nodes that read one input (mobius.fusion)."""

from __future__ import annotations

import numpy as np
import pytest

from mobius.checkpoint import open_local
from mobius.weights import WeightPlan, bind, ref

ort = pytest.importorskip("onnxruntime")

K = 64
WIDTHS = {"wa": 32, "wb": 16, "wc": 16, "wd": 24, "we": 8, "ws": 8}
"""Each weight's N. wa, wb, wc: int4 on x (one group); wd: int8 on x (its own form);
we: int4 on relu(x) (another input); ws: read by two MatMuls (x and relu(x))."""


def _graph(widths: dict[str, int], reads: list[tuple[str, str]], k: int = K):
    """``y{i} = a @ W`` for each ``(weight, a)`` of ``reads`` (``a``: ``"x"`` or
    ``"rx"`` = relu(x)), every W ``[k, N]`` planned as its checkpoint tensor transposed."""
    import onnx_ir as ir

    f32 = ir.TensorType(ir.DataType.FLOAT)
    x = ir.Value(name="x", type=f32, shape=ir.Shape(["b", "s", k]))
    relu = ir.node("Relu", [x], name="relu")
    relu.outputs[0].name, relu.outputs[0].type = "rx", f32
    inputs = {"x": x, "rx": relu.outputs[0]}
    weights = {n: ir.Value(name=n, type=f32, shape=ir.Shape([k, w])) for n, w in widths.items()}
    nodes, outs = [relu], []
    for i, (name, a) in enumerate(reads):
        mm = ir.node("MatMul", [inputs[a], weights[name]], name=f"mm{i}")
        out = mm.outputs[0]
        out.name, out.type, out.shape = f"y{i}", f32, ir.Shape(["b", "s", widths[name]])
        nodes.append(mm)
        outs.append(out)
    graph = ir.Graph([x], outs, nodes=nodes, initializers=list(weights.values()),
                     opset_imports={"": 21})  # fmt: skip
    plan = WeightPlan()
    for name in widths:
        plan.add(name, ref(name).transpose())
    return ir.Model(graph, ir_version=10), plan


def _quantized(tmp_path, ckpt, widths, reads, fuse, monkeypatch, k=K, **quant):
    """The graph of :func:`_graph` quantized for ``--target cpu`` (``quant``: the
    arguments of ``quantize_component`` after the plan), bound and saved."""
    import onnx_ir as ir

    from mobius import quantization

    model, plan = _graph(widths, reads, k)
    monkeypatch.setattr(quantization, "FUSING_TARGETS", ("cpu",) if fuse else ())
    plan, report = quantization.quantize_component(model, plan, target="cpu", **quant)
    bind(model, plan, ckpt, component="m")
    path = tmp_path / f"m-{fuse}.onnx"
    ir.save(model, str(path))
    return path, report


def _model(tmp_path, symmetric: bool, fuse: bool, monkeypatch):
    from safetensors.numpy import save_file

    from mobius.records import QuantOptions

    rng = np.random.default_rng(5)
    hf = {n: rng.normal(size=(w, K)).astype(np.float32) for n, w in WIDTHS.items()}
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(exist_ok=True)
    save_file(hf, str(ckpt / "model.safetensors"))
    (ckpt / "config.json").write_text('{"model_type": "x"}')
    reads = [("wa", "x"), ("wb", "x"), ("wc", "x"), ("wd", "x"), ("we", "rx"), ("ws", "x"),
             ("ws", "rx")]  # fmt: skip
    return _quantized(tmp_path, open_local(ckpt), WIDTHS, reads, fuse, monkeypatch,
                      quant=QuantOptions(symmetric=symmetric), overrides={"wd": "int8"})  # fmt: skip


def _outputs(paths, shapes, k=K):
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in paths]
    for shape in shapes:
        xs = np.random.default_rng(sum(shape)).normal(size=(*shape, k)).astype(np.float32)
        yield xs, [s.run(None, {"x": xs}) for s in sessions]


@pytest.mark.parametrize("symmetric", [True, False])
def test_one_input_int4_matmuls_fuse_and_give_the_same_outputs(tmp_path, monkeypatch, symmetric):
    """wa, wb, wc become one MatMulNBits (N = 64) + Split; wd (int8), we (another input)
    and ws (blocks read twice) stay alone; every output is bit-equal to the unfused
    graph's at accuracy level 4, prefill and decode shapes; the report names the group."""
    import onnx

    fused, report = _model(tmp_path, symmetric, True, monkeypatch)
    plain, plain_report = _model(tmp_path, symmetric, False, monkeypatch)
    graph = onnx.load(str(fused)).graph
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    ns = sorted(next(a.i for a in n.attribute if a.name == "N") for n in nbits)
    assert ns == sorted([32 + 16 + 16, 24, 8, 8, 8])
    assert len(onnx.load(str(plain)).graph.node) == 1 + 7
    assert [n.op_type for n in graph.node].count("Split") == 1
    group = "{wa,wb,wc}"
    assert {t: e.get("fused") for t, e in report.tensors.items()} == {
        "wa": group, "wb": group, "wc": group, "wd": None, "we": None, "ws": None
    }  # fmt: skip
    inits = {i.name for i in graph.initializer}
    assert f"{group}.quant" in inits and "wa.quant" not in inits and "wd.quant" in inits
    assert report.initializers <= inits and f"{group}.scales" in report.initializers
    assert not report.initializers & {"wa.quant", "wb.scales"}
    assert (f"{group}.zero_points" in inits) == (not symmetric)
    for xs, (got, want) in _outputs((fused, plain), ((1, 1), (2, 7))):
        for i, (g, w) in enumerate(zip(got, want)):
            assert g.shape == w.shape
            np.testing.assert_array_equal(g, w, err_msg=f"output y{i}, x {xs.shape}")
    assert plain_report.tensors["wa"].get("fused") is None


def test_gguf_block_corrections_fuse_with_their_group(tmp_path, monkeypatch):
    """A GGUF file's Q4_1 and Q4_K weights on one input (``--target cpu``: int4 levels
    + ``ReduceSum(x by 32) @ C``) fuse into one MatMulNBits, one correction MatMul and one
    Add; the Q8_0 weight beside them (int8, no correction) stays alone. Bit-equal to the
    unfused graph, and gguf's values up to float rounding (level 0 would be exact; level 4
    adds the int8 activations)."""
    import onnx
    from test_gguf import open_toy, reference, toy_file
    from test_gguf_kept import stored

    from mobius.quantization import SourceQuant

    k = 512
    kinds = {"wa": "Q4_1", "wb": "Q4_K", "wc": "Q4_1", "wd": "Q8_0"}
    widths = {"wa": 32, "wb": 16, "wc": 16, "wd": 24}
    rng = np.random.default_rng(8)
    tensors = []
    for name, kind in kinds.items():
        if kind == "Q4_K":
            tensors.append((name, stored(kind, widths[name]), kind))
        else:
            tensors.append((name, rng.standard_normal((widths[name], k)).astype(np.float32), kind))
    path = toy_file(tmp_path / "m.gguf", tensors)
    ckpt = open_toy(path)
    reads = [(n, "x") for n in kinds]
    fused, report = _quantized(tmp_path, ckpt, widths, reads, True, monkeypatch, k, quant=None,
                               keep=SourceQuant(ckpt, "cpu"))  # fmt: skip
    plain, _ = _quantized(tmp_path, ckpt, widths, reads, False, monkeypatch, k, quant=None,
                          keep=SourceQuant(ckpt, "cpu"))  # fmt: skip
    graph = onnx.load(str(fused)).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("MatMulNBits") == 2 and ops.count("Split") == 1
    assert ops.count("MatMul") == 1 and ops.count("ReduceSum") == 1
    group = "{wa,wb,wc}"
    assert {t: e.get("fused") for t, e in report.tensors.items()} == {
        "wa": group, "wb": group, "wc": group, "wd": None
    }  # fmt: skip
    assert all(report.tensors[t]["correction"] == "block-sums" for t in ("wa", "wb", "wc"))
    want = {n: reference(path, n) for n in kinds}
    for xs, (got, plain_got) in _outputs((fused, plain), ((1, 1), (1, 5)), k):
        for i, name in enumerate(kinds):
            np.testing.assert_array_equal(got[i], plain_got[i], err_msg=f"{name}, {xs.shape}")
            exact = xs.astype(np.float64) @ want[name].T.astype(np.float64)
            # int8 activations: per block of 32 a step of max|x|/127 on each value
            bound = 0.02 * np.abs(xs).astype(np.float64) @ np.abs(want[name]).T + 1e-4
            assert np.all(np.abs(got[i] - exact) <= bound), name
