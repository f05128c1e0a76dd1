"""Tensors two components plan identically are written once (``<first>/shared.data``) and
hard-linked into the other's folder; reshapes share, constants and other transforms do
not; a file system without hard links gets a copy (docs/internals.md, shared data)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from safetensors.numpy import save_file
from test_streaming_write import _model

from mobius.checkpoint import Checkpoint, open_local
from mobius.package import SHARED_NAME, write_package
from mobius.package.manifest import manifest_problems
from mobius.weights import WeightPlan, bind, constant, ref

TABLE = np.random.default_rng(3).normal(size=(64, 32)).astype(np.float32)


@pytest.fixture
def ckpt(tmp_path: Path) -> Checkpoint:
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    save_file({"table": TABLE, "other": TABLE[:8] * 2}, str(root / "model.safetensors"))
    return open_local(root, require_weights=True)


def _component(ckpt: Checkpoint, name: str, plan: dict[str, object]) -> ir.Model:
    weight_plan = WeightPlan()
    values = {}
    for init, expr in plan.items():
        shape, _ = expr.shape_dtype(ckpt)  # type: ignore[attr-defined]
        values[init] = (ir.DataType.FLOAT, shape)
        weight_plan.add(init, expr)  # type: ignore[arg-type]
    model = _model(values)
    bind(model, weight_plan, ckpt, component=name)
    return model


class _Messages:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def component_started(self, name: str, n_tensors: int) -> None: ...
    def tensor_written(self, component: str, name: str, nbytes: int) -> None: ...
    def component_finished(self, name: str) -> None: ...
    def message(self, text: str) -> None:
        self.lines.append(text)


def _write(
    tmp_path: Path, ckpt: Checkpoint, progress: object = None, *, force: bool = False
) -> Path:
    components = {
        "embedding": _component(
            ckpt, "embedding", {"embed": ref("table"), "own": ref("other"), "k": constant(TABLE)}
        ),
        "decoder": _component(
            ckpt,
            "decoder",
            {
                "head": ref("table").reshape([32, 64]),  # same bytes, another shape
                "scaled": ref("table").scale(2.0),  # another transform: its own copy
                "k2": constant(TABLE),  # a constant's repr does not show its values
            },
        ),
        "vision": _component(ckpt, "vision", {"w": ref("other")}),
    }
    return write_package(
        tmp_path / "pkg",
        components=components,
        manifest={},
        progress=progress,  # type: ignore[arg-type]
        force=force,
    )


def test_identical_plans_are_written_once_and_linked(tmp_path: Path, ckpt: Checkpoint) -> None:
    out = _write(tmp_path, ckpt)
    first, link = out / "embedding" / SHARED_NAME, out / "decoder" / SHARED_NAME
    assert os.path.samefile(first, link)
    # `other` is shared by embedding and vision, `table` by embedding and decoder
    assert (out / "vision" / SHARED_NAME).exists()
    assert first.stat().st_size == TABLE.nbytes + TABLE[:8].nbytes
    components = json.loads((out / "mobius.json").read_text())["components"]
    digest = hashlib.sha256(first.read_bytes()).hexdigest()
    assert components["embedding"]["shared"] == {
        "path": "embedding/shared.data",
        "sha256": digest,
        "size": first.stat().st_size,
    }
    assert components["decoder"]["shared"]["same_file_as"] == "embedding/shared.data"
    assert components["decoder"]["shared"]["sha256"] == digest
    assert manifest_problems({"components": components}) == []
    decoder = ir.load(out / "decoder" / "model.onnx")
    head = decoder.graph.initializers["head"].const_value
    assert str(head.location) == SHARED_NAME
    np.testing.assert_array_equal(_read(out, "decoder", head), TABLE)
    for own in ("scaled", "k2"):
        assert str(decoder.graph.initializers[own].const_value.location) == "model.onnx.data"
    # The links are package files: --force may replace the package (mobius.outdir).
    inode = first.stat().st_ino
    assert _write(tmp_path, ckpt, force=True) == out
    assert (out / "embedding" / SHARED_NAME).stat().st_ino != inode


def _read(out: Path, component: str, tensor: ir.ExternalTensor) -> np.ndarray:
    """The tensor's bytes read directly (onnx_ir refuses files with two hard links)."""
    with open(out / component / str(tensor.location), "rb") as f:
        f.seek(tensor.offset or 0)
        data = f.read(tensor.length)
    return np.frombuffer(data, np.float32).reshape(TABLE.shape)


def test_without_hard_links_the_file_is_copied(
    tmp_path: Path, ckpt: Checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", refuse)
    progress = _Messages()
    out = _write(tmp_path, ckpt, progress)
    first, copy = out / "embedding" / SHARED_NAME, out / "decoder" / SHARED_NAME
    assert not os.path.samefile(first, copy)
    assert first.read_bytes() == copy.read_bytes()
    assert any("refuses hard links" in line and "copied" in line for line in progress.lines)


def test_same_file_as_must_name_an_equal_first_file() -> None:
    pin = {"path": "a/shared.data", "sha256": "0" * 64, "size": 10}
    components = {
        "a": {"path": "a/model.onnx", "shared": pin},
        "b": {"path": "b/model.onnx", "shared": {**pin, "path": "b/shared.data", "size": 11,
                                                  "same_file_as": "a/shared.data"}},
        "c": {"path": "c/model.onnx", "shared": {**pin, "path": "c/shared.data",
                                                  "same_file_as": "x/shared.data"}},
    }  # fmt: skip
    problems = manifest_problems({"components": components})
    assert problems == [
        "components.b.shared: sha256 and size differ from those of a/shared.data, its own file",
        "components.c.shared.same_file_as names no other component's shared file",
    ]
