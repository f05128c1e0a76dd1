"""Lazy tensor expressions, weight plans and binding them to ONNX initializers."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest
from safetensors.numpy import save_file

from mobius.checkpoint import Checkpoint, open_local
from mobius.errors import CheckpointError, WeightPlanError
from mobius.weights import (
    BindReport,
    WeightPlan,
    bind,
    concat,
    constant,
    ref,
    unused_tensors,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
RNG = np.random.default_rng(1)
ARRAYS = {
    "w": RNG.normal(size=(4, 6)).astype(np.float32),
    "v": RNG.normal(size=(2, 6)).astype(np.float32),
    "h": RNG.normal(size=(3, 4)).astype(np.float16),
    "b": RNG.normal(size=(3, 4)).astype(BF16),
    "cube": RNG.normal(size=(2, 3, 4)).astype(np.float32),
    "ids": np.arange(5, dtype=np.int64),
    "unused": np.zeros(2, dtype=np.float32),
}


@pytest.fixture
def ckpt(tmp_path: Path) -> Checkpoint:
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    save_file(ARRAYS, str(root / "model.safetensors"))
    return open_local(root, require_weights=True)


TRANSFORMS = {
    "ref": (lambda: ref("w"), lambda a: a["w"]),
    "cast f32->bf16": (lambda: ref("w").cast("bfloat16"), lambda a: a["w"].astype(BF16)),
    "cast bf16->f16": (
        lambda: ref("b").cast("float16"),
        lambda a: a["b"].astype(np.float32).astype(np.float16),
    ),
    "cast i64->f32": (lambda: ref("ids").cast("float32"), lambda a: a["ids"].astype(np.float32)),
    "transpose default": (lambda: ref("w").transpose(), lambda a: a["w"].T),
    "transpose perm": (
        lambda: ref("cube").transpose([1, 2, 0]),
        lambda a: a["cube"].transpose(1, 2, 0),
    ),
    "reshape": (lambda: ref("cube").reshape([6, 4]), lambda a: a["cube"].reshape(6, 4)),
    "reshape -1": (lambda: ref("cube").reshape([-1, 2]), lambda a: a["cube"].reshape(-1, 2)),
    "scale f32": (lambda: ref("w").scale(0.5), lambda a: a["w"] * np.float32(0.5)),
    "scale f16": (
        lambda: ref("h").scale(3.0),
        lambda a: (a["h"].astype(np.float32) * 3.0).astype(np.float16),
    ),
    "scale bf16": (
        lambda: ref("b").scale(1.7),
        lambda a: (a["b"].astype(np.float32) * np.float32(1.7)).astype(BF16),
    ),
    "slice": (lambda: ref("w").slice(1, 2, 5), lambda a: a["w"][:, 2:5]),
    "slice negative axis": (lambda: ref("cube").slice(-1, 0, 1), lambda a: a["cube"][..., 0:1]),
    "concat": (
        lambda: concat([ref("w"), ref("v")], axis=0),
        lambda a: np.concatenate([a["w"], a["v"]], 0),
    ),
    "constant": (lambda: constant(np.eye(2, dtype=np.float32)), lambda a: np.eye(2)),
    "chain": (
        lambda: (
            concat([ref("w"), ref("v").scale(2.0)], axis=0)
            .transpose()
            .slice(0, 1, 4)
            .cast("float16")
        ),
        lambda a: np.concatenate([a["w"], a["v"] * 2], 0).T[1:4].astype(np.float16),
    ),
}


@pytest.mark.parametrize("case", sorted(TRANSFORMS))
def test_transforms_match_numpy(ckpt: Checkpoint, case: str) -> None:
    make, expected_of = TRANSFORMS[case]
    expr = make()
    expected = np.asarray(expected_of(ARRAYS))
    got = expr.evaluate(ckpt)
    np.testing.assert_array_equal(np.asarray(got, dtype=np.float64), expected.astype(np.float64))
    shape, dtype = expr.shape_dtype(ckpt)
    assert shape == got.shape
    assert np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype) == got.dtype


def test_shape_dtype_reads_no_data(ckpt: Checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_read(name: str) -> np.ndarray:
        raise AssertionError("shape_dtype must not read tensor data")

    monkeypatch.setattr(ckpt, "read", no_read)
    expr = concat([ref("w"), ref("v")], 0).transpose().reshape([3, 2, 6]).cast("bfloat16")
    assert expr.shape_dtype(ckpt) == ((3, 2, 6), "bfloat16")


BAD = {
    "reshape size": (lambda: ref("w").reshape([5, 5]), "cannot reshape"),
    "reshape two -1": (lambda: ref("w").reshape([-1, -1]), "at most one -1"),
    "bad perm": (lambda: ref("w").transpose([0, 0]), "not a permutation"),
    "perm rank": (lambda: ref("w").transpose([0, 1, 2]), "not a permutation"),
    "slice past end": (lambda: ref("w").slice(1, 2, 7), "out of range"),
    "slice reversed": (lambda: ref("w").slice(1, 3, 2), "out of range"),
    "slice axis": (lambda: ref("w").slice(2, 0, 1), "axis 2 is out of range"),
    "concat dims": (lambda: concat([ref("w"), ref("h")], 0), "differ|mixes"),
    "concat dtypes": (lambda: concat([ref("h"), ref("b")], 0), "mixes dtypes"),
    "concat rank": (lambda: concat([ref("w"), ref("cube")], 0), "differ"),
    "concat empty": (lambda: concat([], 0), "no tensors"),
    "scale int": (lambda: ref("ids").scale(2.0), "cannot scale"),
    "missing": (lambda: ref("nope").transpose(), "'nope' is missing"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_transforms_raise_weight_plan_error(ckpt: Checkpoint, case: str) -> None:
    make, message = BAD[case]
    with pytest.raises(WeightPlanError, match=message):
        make().shape_dtype(ckpt)


def test_cast_to_unknown_dtype_is_refused() -> None:
    with pytest.raises(WeightPlanError, match="cannot cast"):
        ref("w").cast("float8")


# --------------------------------------------------------------------------- models


def _value(name: str, dtype: ir.DataType, shape: list[int]) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(shape))


def tiny_model() -> ir.Model:
    """y = (x @ W) + bias, where W is a parameter and bias already carries data."""
    f = ir.DataType.FLOAT
    x, w = _value("x", f, [1, 4]), _value("W", f, [4, 6])
    bias = _value("bias", f, [6])
    bias.const_value = ir.tensor(np.arange(6, dtype=np.float32), name="bias")
    matmul = ir.Node("", "MatMul", [x, w], num_outputs=1)
    add = ir.Node("", "Add", [matmul.outputs[0], bias], num_outputs=1)
    y = add.outputs[0]
    y.name, y.type, y.shape = "y", ir.TensorType(f), ir.Shape([1, 6])
    graph = ir.Graph([x], [y], nodes=[matmul, add], opset_imports={"": 23}, name="tiny")
    graph.initializers["W"] = w
    graph.initializers["bias"] = bias
    return ir.Model(graph, ir_version=11)


def test_bind_sets_lazy_tensors_and_reports(ckpt: Checkpoint) -> None:
    model = tiny_model()
    plan = WeightPlan()
    plan.add("W", ref("w"))
    plan.ignore("v", "not used by this tiny model")
    report = bind(model, plan, ckpt, component="model")
    assert report == BindReport(
        bound=1,
        referenced=frozenset({"w"}),
        ignored={"v": plan.ignored["v"]},
        unused=("b", "cube", "h", "ids", "unused"),
    )
    w = model.graph.initializers["W"].const_value
    assert isinstance(w, ir.LazyTensor)
    assert w.dtype == ir.DataType.FLOAT and list(w.shape) == [4, 6]
    np.testing.assert_array_equal(w.numpy(), ARRAYS["w"])
    np.testing.assert_array_equal(
        model.graph.initializers["bias"].const_value.numpy(), np.arange(6)
    )
    assert unused_tensors(ckpt, [report]) == ("b", "cube", "h", "ids", "unused")


def test_bind_lists_every_problem_at_once(ckpt: Checkpoint) -> None:
    model = tiny_model()
    f = ir.DataType.FLOAT
    for name, dtype, shape in [
        ("A", f, [4, 6]),
        ("B", ir.DataType.FLOAT16, [3, 4]),
        ("C", f, [2, 2]),
        ("D", f, [4, 6]),
    ]:
        model.graph.initializers[name] = _value(name, dtype, shape)
    plan = WeightPlan()
    plan.add("W", ref("w").transpose())  # shape mismatch: planned [6, 4] vs graph [4, 6]
    plan.add("A", ref("missing_one"))
    plan.add("B", ref("b"))  # dtype mismatch: bfloat16 vs float16
    plan.add("C", ref("w").reshape([7]))  # bad transform
    plan.add("ghost", ref("missing_two"))  # no such initializer
    plan.add("bias", constant(np.zeros(6, np.float32)))  # bias already has data
    # D has no plan entry
    with pytest.raises(WeightPlanError) as info:
        bind(model, plan, ckpt, component="decoder")
    text = str(info.value)
    assert "component 'decoder'" in text
    assert "missing_one" in text and "missing_two" in text
    assert "planned [6, 4] vs graph [4, 6]" in text
    assert "planned bfloat16 vs graph float16" in text
    assert "cannot reshape" in text
    assert "'D' has no weight plan entry" in text
    assert "'ghost' names no initializer" in text
    assert "'bias' already carries data" in text
    # nothing was bound
    assert model.graph.initializers["W"].const_value is None


def test_bind_on_checkpoint_without_weights_explains(tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    (root / "config.json").write_text("{}")
    (root / "model.pt").write_bytes(b"x")
    plan = WeightPlan()
    plan.add("W", ref("w"))
    with pytest.raises(CheckpointError, match="arbitrary code"):
        bind(tiny_model(), plan, open_local(root), component="model")


def test_plan_refuses_duplicates() -> None:
    plan = WeightPlan()
    plan.add("W", ref("w"))
    with pytest.raises(WeightPlanError, match="planned twice"):
        plan.add("W", ref("v"))


def test_lazy_model_saves_and_runs_in_onnxruntime(ckpt: Checkpoint, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    model = tiny_model()
    plan = WeightPlan()
    plan.add("W", ref("w").scale(2.0))
    bind(model, plan, ckpt, component="model")
    path = tmp_path / "model.onnx"
    ir.save(model, path, external_data="model.onnx.data", size_threshold_bytes=0)
    assert (tmp_path / "model.onnx.data").stat().st_size >= ARRAYS["w"].nbytes
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = RNG.normal(size=(1, 4)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, x @ (ARRAYS["w"] * 2) + np.arange(6), rtol=1e-5, atol=1e-5)


def test_materialization_happens_at_save_one_tensor_at_a_time(
    ckpt: Checkpoint, tmp_path: Path
) -> None:
    f = ir.DataType.FLOAT
    model = tiny_model()
    names = ["P0", "P1", "P2", "P3"]
    for name in names:
        model.graph.initializers[name] = _value(name, f, [6, 4])
    plan = WeightPlan()
    plan.add("W", ref("w"))
    for name in names:
        plan.add(name, ref("w").transpose().scale(1.5))

    reads: list[str] = []
    alive: list[weakref.ref] = []
    original_read = ckpt.read

    def tracking_read(name: str) -> np.ndarray:
        gc.collect()
        assert all(r() is None for r in alive), "a previous tensor is still alive"
        array = original_read(name)
        reads.append(name)
        alive.append(weakref.ref(array))
        return array

    ckpt.read = tracking_read  # type: ignore[method-assign]
    bind(model, plan, ckpt, component="model")
    assert reads == []  # binding reads nothing
    ir.save(model, tmp_path / "m.onnx", external_data="m.onnx.data", size_threshold_bytes=0)
    assert len(reads) == 5  # each lazy tensor evaluated once, while saving
