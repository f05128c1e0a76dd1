"""The package writer (atomic, streamed), reader and verifier."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from safetensors.numpy import save_file

from mobius.checkpoint import open_local
from mobius.contract import Component, Contract, ExternalInput, Port
from mobius.errors import PackageError
from mobius.package import (
    ALIGNMENT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    read_package,
    verify_package,
    write_package,
)
from mobius.package.stamp import STAMP_NAME
from mobius.records import RuntimeFile
from mobius.weights import WeightPlan, bind, ref

W = np.arange(24, dtype=np.float32).reshape(4, 6) / 10
V = np.arange(5, dtype=np.float32)  # 20 bytes: forces padding before the next tensor


def _value(name: str, shape: list[int]) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(shape))


def tiny_model() -> ir.Model:
    """y = x @ W + bias; z = v + v (v is a second parameter, of an odd byte size)."""
    x, w, v = _value("x", [1, 4]), _value("W", [4, 6]), _value("v", [5])
    bias = _value("bias", [6])
    bias.const_value = ir.tensor(np.ones(6, dtype=np.float32), name="bias")
    matmul = ir.Node("", "MatMul", [x, w], num_outputs=1)
    add = ir.Node("", "Add", [matmul.outputs[0], bias], num_outputs=1)
    double = ir.Node("", "Add", [v, v], num_outputs=1)
    y, z = add.outputs[0], double.outputs[0]
    y.name, y.type, y.shape = "y", ir.TensorType(ir.DataType.FLOAT), ir.Shape([1, 6])
    z.name, z.type, z.shape = "z", ir.TensorType(ir.DataType.FLOAT), ir.Shape([5])
    graph = ir.Graph([x], [y, z], nodes=[matmul, add, double], opset_imports={"": 23})
    for value in (v, w, bias):
        graph.initializers[value.name] = value
    return ir.Model(graph, ir_version=11)


CONTRACT = Contract(
    components=(
        Component(
            "model",
            inputs=(Port("x", "float32", (1, 4)),),
            outputs=(Port("y", "float32", (1, 6)), Port("z", "float32", (5,))),
        ),
    ),
    externals=(ExternalInput("model.x", "x"),),
    outputs=("model.y",),
)


@pytest.fixture
def bound_model(tmp_path: Path) -> ir.Model:
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    save_file({"w": W, "v": V}, str(root / "model.safetensors"))
    ckpt = open_local(root, require_weights=True)
    model = tiny_model()
    plan = WeightPlan()
    plan.add("W", ref("w"))
    plan.add("v", ref("v"))
    bind(model, plan, ckpt, component="model")
    return model


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def component_started(self, name: str, n_tensors: int) -> None:
        self.events.append(("start", name, n_tensors))

    def tensor_written(self, component: str, name: str, nbytes: int) -> None:
        self.events.append(("tensor", component, name, nbytes))

    def component_finished(self, name: str) -> None:
        self.events.append(("finish", name))

    def message(self, text: str) -> None:
        self.events.append(("message", text))


def write(out: Path, model: ir.Model, **kwargs) -> Path:
    """Write with every initializer external (the test tensors are all tiny)."""
    kwargs.setdefault("inline_limit", 0)
    return write_package(
        out,
        components={"model": model},
        manifest={"model_type": "tiny", "contract": CONTRACT.to_dict(), "dtype": "f32"},
        runtime_files=[
            RuntimeFile("genai_config.json", content=b'{"model": {}}'),
            RuntimeFile("tok/tokenizer.json", content=b"{}"),
        ],
        **kwargs,
    )


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if "mobius-tmp" in p.name or "mobius-old" in p.name]


def test_write_read_verify_round_trip_and_run(bound_model: ir.Model, tmp_path: Path) -> None:
    progress = Recorder()
    out = write(tmp_path / "pkg", bound_model, progress=progress)
    assert out == (tmp_path / "pkg").absolute()
    assert sorted(p.name for p in out.iterdir()) == [
        STAMP_NAME,  # the writer checked the package and stamped it (see stamp.py)
        "genai_config.json",
        MANIFEST_NAME,
        "model",
        "tok",
    ]
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["format_version"] == FORMAT_VERSION and manifest["model_type"] == "tiny"
    entry = manifest["components"]["model"]
    assert entry["path"] == "model/model.onnx" and entry["data"] == "model/model.onnx.data"
    assert entry["size"] == entry["model_size"] + entry["data_size"]
    assert set(manifest["files"]) == {"genai_config.json", "tok/tokenizer.json"}

    # progress: one event per tensor, in order, between start and finish
    assert progress.events[0] == ("start", "model", 3)
    tensors = [e for e in progress.events if e[0] == "tensor"]
    assert [(e[2], e[3]) for e in tensors] == [("v", 20), ("W", 96), ("bias", 24)]
    assert progress.events[4] == ("finish", "model")

    # every initializer is external and 64-byte aligned
    proto = onnx.load(str(out / "model" / "model.onnx"), load_external_data=False)
    for init in proto.graph.initializer:
        assert init.data_location == onnx.TensorProto.EXTERNAL, init.name
        info = {e.key: e.value for e in init.external_data}
        assert info["location"] == "model.onnx.data"
        assert int(info.get("offset", 0)) % ALIGNMENT == 0
    # the caller's model keeps its lazy tensors
    assert isinstance(bound_model.graph.initializers["W"].const_value, ir.LazyTensor)

    package = read_package(out)
    assert package.contract == CONTRACT
    assert package.components == {"model": out / "model" / "model.onnx"}
    assert verify_package(out) == []

    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(
        str(package.components["model"]), providers=["CPUExecutionProvider"]
    )
    x = np.array([[1.0, -2.0, 0.5, 3.0]], dtype=np.float32)
    y, z = session.run(None, {"x": x})
    np.testing.assert_allclose(y, x @ W + 1, rtol=1e-6)
    np.testing.assert_allclose(z, V + V)


def test_non_empty_out_is_refused_and_force_replaces_only_a_package(
    bound_model: ir.Model, tmp_path: Path
) -> None:
    out = tmp_path / "pkg"
    out.mkdir()
    (out / "old.txt").write_text("old")
    for force in (False, True):  # a folder that is not a package is never replaced
        with pytest.raises(PackageError, match="not empty and is not a mobius package"):
            write(out, bound_model, force=force)
    assert (out / "old.txt").read_text() == "old"
    (out / "old.txt").unlink()
    write(out, bound_model)
    with pytest.raises(PackageError, match="already holds a mobius package") as info:
        write(out, bound_model)
    assert "--force" in str(info.value) and "another folder" in str(info.value)
    write(out, bound_model, force=True)
    assert verify_package(out) == []
    assert _leftovers(tmp_path) == []


def test_write_package_refuses_the_current_folder(
    bound_model: ir.Model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for out in (work, tmp_path, Path(".")):
        with pytest.raises(PackageError, match="the current folder"):
            write(out, bound_model, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "work"]
    assert list(work.iterdir()) == []


def test_empty_existing_out_is_used(bound_model: ir.Model, tmp_path: Path) -> None:
    out = tmp_path / "pkg"
    out.mkdir()
    write(out, bound_model)
    assert verify_package(out) == []


def test_out_that_is_a_file_is_refused(bound_model: ir.Model, tmp_path: Path) -> None:
    (tmp_path / "pkg").write_text("x")
    with pytest.raises(PackageError, match="is a file, not a folder"):
        write(tmp_path / "pkg", bound_model, force=True)
    assert (tmp_path / "pkg").read_text() == "x"


class Boom(RuntimeError):
    pass


def test_failure_mid_write_leaves_nothing(bound_model: ir.Model, tmp_path: Path) -> None:
    class Failing(Recorder):
        def tensor_written(self, component: str, name: str, nbytes: int) -> None:
            super().tensor_written(component, name, nbytes)
            if name == "W":
                raise Boom("disk on fire")

    with pytest.raises(Boom):
        write(tmp_path / "pkg", bound_model, progress=Failing())
    assert not (tmp_path / "pkg").exists()
    assert _leftovers(tmp_path) == []
    # the model was restored and can still be written
    assert isinstance(bound_model.graph.initializers["v"].const_value, ir.LazyTensor)
    write(tmp_path / "pkg", bound_model)
    assert verify_package(tmp_path / "pkg") == []


def test_failure_with_force_keeps_the_old_package(bound_model: ir.Model, tmp_path: Path) -> None:
    out = write(tmp_path / "pkg", bound_model)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def bad_lazy() -> ir.Tensor:
        raise Boom("lazy tensor failed")

    bound_model.graph.initializers["v"].const_value = ir.LazyTensor(
        bad_lazy, dtype=ir.DataType.FLOAT, shape=ir.Shape([5])
    )
    with pytest.raises(Boom):
        write(out, bound_model, force=True)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert _leftovers(tmp_path) == []


def test_tampered_and_missing_files_are_named(bound_model: ir.Model, tmp_path: Path) -> None:
    out = write(tmp_path / "pkg", bound_model)
    data = out / "model" / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF
    data.write_bytes(bytes(raw))
    (out / "tok" / "tokenizer.json").write_text('{"changed": 1}')
    (out / "genai_config.json").unlink()
    problems = verify_package(out)
    text = "\n".join(problems)
    assert "model/model.onnx.data: sha256" in text
    assert "tok/tokenizer.json" in text
    assert "genai_config.json: missing" in text
    # data sha, tokenizer size (a file of the wrong size is not hashed), missing genai config
    assert len(problems) == 3


def test_verify_reports_contract_violations(bound_model: ir.Model, tmp_path: Path) -> None:
    out = write(tmp_path / "pkg", bound_model)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    manifest["contract"]["components"][0]["outputs"][0]["dtype"] = "float16"
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    problems = verify_package(out)
    assert len(problems) == 1 and problems[0].startswith("contract:")
    assert "model.y" in problems[0]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda root: (root / MANIFEST_NAME).unlink(), "no mobius.json"),
        (lambda root: (root / MANIFEST_NAME).write_text("{nope"), "not valid JSON"),
        (lambda root: (root / MANIFEST_NAME).write_text("[1]"), "not a JSON object"),
        (
            lambda root: (root / MANIFEST_NAME).write_text(json.dumps({"format_version": 99})),
            "unknown package format_version 99",
        ),
        (
            lambda root: (root / MANIFEST_NAME).write_text(
                json.dumps({"format_version": 1, "components": {"m": {"path": "../x"}}})
            ),
            "leaves the package",
        ),
    ],
)
def test_read_package_errors(tmp_path: Path, bound_model: ir.Model, mutate, message: str) -> None:
    out = write(tmp_path / "pkg", bound_model)
    mutate(out)
    with pytest.raises(PackageError, match=message):
        read_package(out)
    assert any(message in p for p in verify_package(out))


def test_read_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(PackageError, match="does not exist"):
        read_package(tmp_path / "nope")


def test_runtime_file_copied_from_source(bound_model: ir.Model, tmp_path: Path) -> None:
    src = tmp_path / "tokenizer_config.json"
    src.write_text('{"a": 1}')
    out = write_package(
        tmp_path / "pkg",
        components={"model": bound_model},
        manifest={"contract": CONTRACT},
        runtime_files=[RuntimeFile("tokenizer_config.json", source=src)],
    )
    assert (out / "tokenizer_config.json").read_text() == '{"a": 1}'
    assert verify_package(out) == []


def test_runtime_file_colliding_with_component_is_refused(
    bound_model: ir.Model, tmp_path: Path
) -> None:
    with pytest.raises(PackageError, match="collides"):
        write_package(
            tmp_path / "pkg",
            components={"model": bound_model},
            manifest={"contract": CONTRACT},
            runtime_files=[RuntimeFile("model/extra.json", content=b"{}")],
        )
    assert not (tmp_path / "pkg").exists()


def test_manifest_without_contract_is_refused(bound_model: ir.Model, tmp_path: Path) -> None:
    out = write_package(tmp_path / "pkg", components={"model": bound_model}, manifest={})
    with pytest.raises(PackageError, match=r"contract in mobius\.json cannot be read"):
        read_package(out)


def test_writer_materializes_one_tensor_at_a_time(tmp_path: Path) -> None:
    import gc
    import weakref

    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text("{}")
    save_file({"w": W, "v": V}, str(root / "model.safetensors"))
    ckpt = open_local(root)
    model = tiny_model()
    plan = WeightPlan()
    plan.add("W", ref("w").transpose().transpose())
    plan.add("v", ref("v").scale(3.0))
    bind(model, plan, ckpt, component="model")

    alive: list[weakref.ref] = []
    original = ckpt.read

    def tracking_read(name: str) -> np.ndarray:
        gc.collect()
        assert all(r() is None for r in alive), "a previous tensor is still alive"
        array = original(name)
        alive.append(weakref.ref(array))
        return array

    ckpt.read = tracking_read  # type: ignore[method-assign]
    out = write_package(tmp_path / "pkg", components={"model": model}, manifest={}, inline_limit=0)
    assert len(alive) == 2
    loaded = ir.load(out / "model" / "model.onnx")
    np.testing.assert_array_equal(loaded.graph.initializers["v"].const_value.numpy(), V * 3)
    np.testing.assert_array_equal(loaded.graph.initializers["W"].const_value.numpy(), W)


def test_small_tensors_stay_inside_the_graph(bound_model: ir.Model, tmp_path: Path) -> None:
    """onnxruntime needs small constants (axes, shapes) in the graph while it infers shapes."""
    out = write_package(
        tmp_path / "pkg", components={"model": bound_model}, manifest={"contract": CONTRACT}
    )
    loaded = ir.load(out / "model" / "model.onnx")
    for value in loaded.graph.initializers.values():
        tensor = value.const_value
        is_small = tensor.size * tensor.dtype.itemsize < 1024
        assert isinstance(tensor, ir.ExternalTensor) != is_small, value.name
    assert verify_package(out) == []
