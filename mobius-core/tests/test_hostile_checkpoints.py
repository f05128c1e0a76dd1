"""Hostile checkpoint folders: escapes, double claims, impossible casts, non-finite weights.

A checkpoint is downloaded input. These tests pin that mobius never reads outside
the folder (index traversal, symlinks), never lets two shards claim one tensor,
refuses casts that would silently destroy values (naming the tensor), and warns
(naming the tensors) when a weight it writes holds NaN or infinity.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from safetensors.numpy import save_file

from mobius import weights
from mobius.checkpoint import open_hub, open_local
from mobius.errors import CheckpointError, WeightPlanError
from mobius.weights import NonFiniteWeightWarning, WeightPlan, bind, count_non_finite, ref

INDEX = "model.safetensors.index.json"


def folder(root: Path, *, shards: dict[str, dict[str, np.ndarray]] | None = None) -> Path:
    """config.json plus the given safetensors files (default: one model.safetensors)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    shards = shards or {"model.safetensors": {"a": np.ones(2, np.float32)}}
    for name, arrays in shards.items():
        save_file(arrays, str(root / name))
    return root


def sharded(root: Path) -> Path:
    return folder(
        root,
        shards={
            "m-1.safetensors": {"a": np.ones(2, np.float32)},
            "m-2.safetensors": {"b": np.zeros(3, np.float32)},
        },
    )


def write_index(root: Path, weight_map: dict[str, str] | str) -> None:
    text = weight_map if isinstance(weight_map, str) else json.dumps({"weight_map": weight_map})
    (root / INDEX).write_text(text)


# ------------------------------------------------------------------ path traversal


@pytest.mark.parametrize(
    "shard",
    [
        "../outside.safetensors",
        "sub/../../outside.safetensors",
        "./../outside.safetensors",
        "..\\outside.safetensors",
        "/ABSOLUTE",
        "C:outside.safetensors",
        "sub/m-1.safetensors",
        "..",
        "",
    ],
)
def test_index_shard_names_that_leave_the_folder_are_refused(tmp_path: Path, shard: str) -> None:
    root = sharded(tmp_path / "ckpt")
    save_file({"a": np.ones(2, np.float32)}, str(tmp_path / "outside.safetensors"))
    shard = shard.replace("/ABSOLUTE", str(tmp_path / "outside.safetensors"))
    write_index(root, {"a": shard, "b": "m-2.safetensors"})
    with pytest.raises(CheckpointError, match="not a plain file name") as info:
        open_local(root)
    assert info.value.where == str(root / INDEX)


# -------------------------------------------------------------------------- symlinks


def _outside(tmp_path: Path) -> Path:
    target = tmp_path / "elsewhere"
    target.mkdir(exist_ok=True)
    save_file({"a": np.ones(2, np.float32)}, str(target / "weights.safetensors"))
    (target / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    (target / "tokenizer.json").write_text("{}")
    return target


@pytest.mark.parametrize("layout", ["single", "glob", "index"])
def test_shard_symlink_leaving_the_folder_is_refused(tmp_path: Path, layout: str) -> None:
    outside = _outside(tmp_path) / "weights.safetensors"
    root = tmp_path / "ckpt"
    if layout == "index":
        root = sharded(root)
        (root / "m-1.safetensors").unlink()
        (root / "m-1.safetensors").symlink_to(outside)
        write_index(root, {"a": "m-1.safetensors", "b": "m-2.safetensors"})
        name = "m-1.safetensors"
    else:
        root = folder(root, shards={"x.safetensors": {"b": np.zeros(1, np.float32)}})
        name = "model.safetensors" if layout == "single" else "y.safetensors"
        (root / name).symlink_to(outside)
    with pytest.raises(CheckpointError, match="leaves the checkpoint folder") as info:
        open_local(root)
    assert info.value.where == str(root / name)
    assert str(outside) in info.value.what and info.value.fix


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", INDEX])
def test_config_and_side_file_symlinks_leaving_the_folder_are_refused(
    tmp_path: Path, name: str
) -> None:
    outside = _outside(tmp_path)
    root = folder(tmp_path / "ckpt")
    if name == INDEX:
        (outside / INDEX).write_text(json.dumps({"weight_map": {"a": "model.safetensors"}}))
    (root / name).unlink(missing_ok=True)
    (root / name).symlink_to(outside / name)
    with pytest.raises(CheckpointError, match="leaves the checkpoint folder"):
        open_local(root)


def test_side_file_turned_into_an_escaping_symlink_after_opening(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    root = folder(tmp_path / "ckpt")
    ckpt = open_local(root)
    (root / "tokenizer.json").symlink_to(outside / "tokenizer.json")
    with pytest.raises(CheckpointError, match="leaves the checkpoint folder"):
        ckpt.file("tokenizer.json")
    assert ckpt.file("../elsewhere/tokenizer.json") is None


def test_symlinks_inside_the_folder_are_fine(tmp_path: Path) -> None:
    root = folder(tmp_path / "ckpt")
    (root / "real").mkdir()
    (root / "config.json").rename(root / "real" / "config.json")
    (root / "config.json").symlink_to(Path("real") / "config.json")
    (root / "model.safetensors").rename(root / "real" / "model.safetensors")
    (root / "model.safetensors").symlink_to(root / "real" / "model.safetensors")
    (root / "real" / "tokenizer.json").write_text("{}")
    (root / "tokenizer.json").symlink_to(root / "real" / "tokenizer.json")
    ckpt = open_local(root)
    assert list(ckpt.tensors) == ["a"]
    np.testing.assert_array_equal(ckpt.read("a"), np.ones(2, np.float32))
    assert ckpt.file("tokenizer.json") == root / "tokenizer.json"


def test_folder_reached_through_a_symlink_is_fine(tmp_path: Path) -> None:
    real = folder(tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    assert list(open_local(tmp_path / "link").tensors) == ["a"]


def test_glob_symlink_to_a_sibling_shard_is_read_once(tmp_path: Path) -> None:
    root = folder(tmp_path / "ckpt", shards={"x.safetensors": {"a": np.ones(2, np.float32)}})
    (root / "y.safetensors").symlink_to(root / "x.safetensors")
    ckpt = open_local(root)
    assert list(ckpt.tensors) == ["a"]


def test_looping_symlink_is_ignored_or_refused_cleanly(tmp_path: Path) -> None:
    root = folder(tmp_path / "ckpt")
    (root / "loop.safetensors").symlink_to(root / "loop.safetensors")
    assert list(open_local(root).tensors) == ["a"]  # model.safetensors wins, the loop is unread
    (root / "model.safetensors").unlink()
    assert list(open_local(root).tensors) == []  # a loop is not a file: ignored


def test_hub_snapshot_may_link_into_its_blobs_but_not_beyond(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    repo = tmp_path / "hub" / "models--o--n"
    snap = folder(repo / "snapshots" / ("a" * 40))
    blob = repo / "blobs" / ("b" * 64)
    blob.parent.mkdir()
    (snap / "model.safetensors").rename(blob)
    (snap / "model.safetensors").symlink_to(Path("../../blobs") / blob.name)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: str(snap))
    assert list(open_hub("o/n").tensors) == ["a"]
    (snap / "tokenizer.json").symlink_to(_outside(tmp_path) / "tokenizer.json")
    with pytest.raises(CheckpointError, match="leaves the checkpoint folder"):
        open_hub("o/n")


# --------------------------------------------------------------- double claims


def test_same_shard_under_two_names_is_fine(tmp_path: Path) -> None:
    root = sharded(tmp_path / "ckpt")
    (root / "alias.safetensors").symlink_to(root / "m-1.safetensors")
    write_index(root, {"a": "./m-1.safetensors", "b": "m-2.safetensors"})
    assert sorted(open_local(root).tensors) == ["a", "b"]
    write_index(root, {"a": "alias.safetensors", "b": "m-2.safetensors"})
    assert sorted(open_local(root).tensors) == ["a", "b"]


def test_shard_listed_for_several_tensors_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mobius.checkpoint import local

    root = folder(
        tmp_path / "ckpt",
        shards={"m-1.safetensors": {"a": np.ones(2, np.float32), "c": np.ones(1, np.float32)}},
    )
    write_index(root, {"a": "m-1.safetensors", "c": "m-1.safetensors"})
    reads: list[Path] = []
    real = local.read_safetensors_header
    monkeypatch.setattr(local, "read_safetensors_header", lambda p: reads.append(p) or real(p))
    assert sorted(open_local(root).tensors) == ["a", "c"]
    assert len(reads) == 1


def test_tensor_claimed_by_two_shards_in_the_index_is_refused(tmp_path: Path) -> None:
    root = sharded(tmp_path / "ckpt")
    write_index(
        root,
        '{"weight_map": {"a": "m-1.safetensors", "a": "m-2.safetensors", "b": "m-2.safetensors"}}',
    )
    with pytest.raises(CheckpointError, match="'a' twice") as info:
        open_local(root)
    assert "m-1.safetensors" in info.value.what and "m-2.safetensors" in info.value.what


def test_tensor_stored_in_two_shards_is_refused(tmp_path: Path) -> None:
    root = folder(
        tmp_path / "ckpt",
        shards={
            "m-1.safetensors": {"a": np.ones(2, np.float32)},
            "m-2.safetensors": {"a": np.zeros(2, np.float32), "b": np.zeros(3, np.float32)},
        },
    )
    write_index(root, {"a": "m-1.safetensors", "b": "m-2.safetensors"})
    with pytest.raises(CheckpointError, match="'a' is stored twice") as info:
        open_local(root)
    assert "m-1.safetensors" in info.value.what and "m-2.safetensors" in info.value.what


# ---------------------------------------------------------------- impossible casts


def _model(dtype: ir.DataType, shape: list[int]) -> ir.Model:
    x = ir.Value(name="x", type=ir.TensorType(dtype), shape=ir.Shape(shape))
    w = ir.Value(name="W", type=ir.TensorType(dtype), shape=ir.Shape(shape))
    node = ir.Node("", "Add", [x, w], num_outputs=1)
    y = node.outputs[0]
    y.name, y.type, y.shape = "y", ir.TensorType(dtype), ir.Shape(shape)
    graph = ir.Graph([x], [y], nodes=[node], opset_imports={"": 23}, name="m")
    graph.initializers["W"] = w
    return ir.Model(graph, ir_version=11)


@pytest.mark.parametrize(
    ("array", "target"),
    [
        (np.arange(3, dtype=np.int64), "bfloat16"),
        (np.array([True, False, True]), "bfloat16"),
        (np.arange(3, dtype=np.uint8), "bfloat16"),
        (np.arange(3, dtype=np.int32), "float16"),
        (np.ones(3, np.float32), "int64"),
        (np.ones(3, np.float32), "bool"),
        (np.arange(3, dtype=np.int64), "bool"),
    ],
    ids=["i64->bf16", "bool->bf16", "u8->bf16", "i32->f16", "f32->i64", "f32->bool", "i64->bool"],
)
def test_cast_the_plan_cannot_make_names_the_tensor(
    tmp_path: Path, array: np.ndarray, target: str
) -> None:
    root = folder(tmp_path / "ckpt", shards={"model.safetensors": {"odd.tensor": array}})
    plan = WeightPlan()
    plan.add("W", ref("odd.tensor").cast(target))
    with pytest.raises(WeightPlanError, match="cannot cast") as info:
        bind(_model(weights.IR_DTYPES[target], [3]), plan, open_local(root), component="m")
    assert "'odd.tensor'" in info.value.what and "'W'" in info.value.what


def test_cast_to_an_unknown_dtype_names_the_tensor() -> None:
    with pytest.raises(WeightPlanError, match="float8") as info:
        ref("odd.tensor").cast("float8")
    assert "odd.tensor" in (info.value.where or "")


def test_casts_between_floats_and_widening_ints_still_work(tmp_path: Path) -> None:
    ints = np.arange(3, dtype=np.int32)
    root = folder(tmp_path / "ckpt", shards={"model.safetensors": {"i": ints}})
    for target, graph_dtype in (("int64", ir.DataType.INT64), ("float32", ir.DataType.FLOAT)):
        plan = WeightPlan()
        plan.add("W", ref("i").cast(target))
        model = _model(graph_dtype, [3])
        bind(model, plan, open_local(root), component="m")
        value = model.graph.initializers["W"].const_value.numpy()
        np.testing.assert_array_equal(value, ints.astype(value.dtype))


# ---------------------------------------------------------------- NaN / Inf weights


def _bind_and_save(root: Path, plan: WeightPlan, dtype: ir.DataType, out: Path) -> None:
    model = _model(dtype, [4])
    bind(model, plan, open_local(root), component="decoder")
    ir.save(model, out / "m.onnx", external_data="m.onnx.data", size_threshold_bytes=0)


def test_non_finite_weights_warn_with_names_at_save_time(tmp_path: Path) -> None:
    bad = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    root = folder(
        tmp_path / "ckpt",
        shards={
            "model.safetensors": {"layers.0.bad": bad, "layers.0.good": np.ones(4, np.float32)}
        },
    )
    plan = WeightPlan()
    plan.add("W", ref("layers.0.bad").cast("bfloat16"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = _model(ir.DataType.BFLOAT16, [4])
        bind(model, plan, open_local(root), component="decoder")
        assert not caught  # binding reads nothing, so it cannot know yet
        ir.save(model, tmp_path / "m.onnx", external_data="m.onnx.data", size_threshold_bytes=0)
    found = [w for w in caught if issubclass(w.category, NonFiniteWeightWarning)]
    assert len(found) == 1, [str(w.message) for w in caught]
    text = str(found[0].message)
    assert "'W'" in text and "'layers.0.bad'" in text and "'decoder'" in text
    assert "1 NaN" in text and "2 infinite" in text

    plan = WeightPlan()
    plan.add("W", ref("layers.0.good"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteWeightWarning)
        _bind_and_save(root, plan, ir.DataType.FLOAT, tmp_path)  # finite: no warning


def test_overflow_in_a_cast_to_float16_warns(tmp_path: Path) -> None:
    big = np.array([1.0, 7e4, -1e5, 3.0], np.float32)  # beyond float16's 65504
    root = folder(tmp_path / "ckpt", shards={"model.safetensors": {"big": big}})
    plan = WeightPlan()
    plan.add("W", ref("big").cast("float16"))
    with pytest.warns(NonFiniteWeightWarning, match=r"2 infinite.*--dtype bf16"):
        _bind_and_save(root, plan, ir.DataType.FLOAT16, tmp_path)


def test_non_finite_count_is_chunked_and_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weights.finite, "FINITE_CHECK_CHUNK", 7)
    array = np.ones((10, 10), np.float32)
    array[0, 0] = array[5, 5] = array[9, 9] = np.nan
    array[3, 1] = np.inf
    array[9, 8] = -np.inf
    assert count_non_finite(array) == (3, 2)
    assert count_non_finite(np.arange(5)) == (0, 0)  # integers are never scanned
    assert count_non_finite(np.ones(0, np.float16)) == (0, 0)
    assert count_non_finite(np.full(3, np.inf).astype(weights.NUMPY_DTYPES["bfloat16"])) == (0, 3)
