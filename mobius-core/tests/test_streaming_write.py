"""Chunked (streamed) weights: TensorExpr.iter_chunks, plain-read checkpoints, the writer.

A full-size checkpoint has tensors of several GiB (Gemma 4's per-layer embedding
table is 4.4 GiB); the package writer must stream them in bounded chunks with plain
file reads instead of materializing them, with identical bytes, the same NaN / inf
warning and the same sha256.
"""

from __future__ import annotations

import hashlib
import json
import math
import tracemalloc
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest
from safetensors.numpy import save_file

from mobius.checkpoint import Checkpoint, open_local
from mobius.checkpoint.local import BackgroundHashes
from mobius.errors import SafetensorsError
from mobius.package import write_package
from mobius.weights import (
    NonFiniteWeightWarning,
    PlannedTensor,
    WeightPlan,
    bind,
    concat,
    constant,
    ref,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
RNG = np.random.default_rng(7)
ARRAYS = {
    "b": RNG.normal(size=(37, 13)).astype(BF16),  # rows of 26 bytes: chunks cut rows
    "c": RNG.normal(size=(5, 13)).astype(BF16),
    "f": RNG.normal(size=(11, 7)).astype(np.float32),
    "row": RNG.normal(size=(1, 9, 4)).astype(np.float32),
    "ids": np.arange(30, dtype=np.int64),
}


@pytest.fixture
def ckpt(tmp_path: Path) -> Checkpoint:
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    save_file(ARRAYS, str(root / "model.safetensors"))
    return open_local(root, require_weights=True)


STREAMABLE = {
    "ref bf16": lambda: ref("b"),
    "cast bf16->f16": lambda: ref("b").cast("float16"),
    "cast bf16->f32": lambda: ref("b").cast("float32"),
    "cast f32->bf16": lambda: ref("f").cast("bfloat16"),
    "cast i64->f32": lambda: ref("ids").cast("float32"),
    "scale bf16": lambda: ref("b").scale(0.37),
    "scale then cast": lambda: ref("b").scale(3.0).cast("float16"),
    "reshape": lambda: ref("b").reshape([13, -1]).cast("float32"),
    "slice axis 0": lambda: ref("b").slice(0, 3, 29),
    "slice after size-1 axis": lambda: ref("row").slice(1, 2, 7),
    "concat axis 0": lambda: concat([ref("b").slice(0, 30, 37), ref("c")], axis=0).scale(2.0),
    "constant": lambda: constant(np.arange(50, dtype=np.float32).reshape(5, 10)),
    "nested": lambda: (
        concat([ref("c"), ref("b").slice(0, 1, 20).reshape([19, 13])], 0)
        .slice(0, 2, 22)
        .cast("float16")
        .scale(-1.5)
    ),
}


@pytest.mark.parametrize("case", sorted(STREAMABLE))
@pytest.mark.parametrize("max_bytes", [1, 50, 130, 10_000])
def test_chunks_equal_whole_evaluation(ckpt: Checkpoint, case: str, max_bytes: int) -> None:
    expr = STREAMABLE[case]()
    whole = expr.evaluate(ckpt)
    chunks = expr.iter_chunks(ckpt, max_bytes)
    assert chunks is not None
    pieces = [np.array(c) for c in chunks]  # copy: a chunk may reuse the read buffer
    shape, _dtype = expr.shape_dtype(ckpt)
    itemsize = whole.dtype.itemsize
    assert all(p.ndim == 1 and p.dtype == whole.dtype for p in pieces)
    assert all(p.nbytes <= max(max_bytes, itemsize) for p in pieces)
    assert sum(p.size for p in pieces) == math.prod(shape) == whole.size
    assert np.concatenate(pieces).tobytes() == np.ascontiguousarray(whole).tobytes()


def test_bf16_casts_match_numpy(ckpt: Checkpoint) -> None:
    b = ARRAYS["b"]
    for dtype, expected in (
        ("float16", b.astype(np.float32).astype(np.float16)),
        ("float32", b.astype(np.float32)),
    ):
        chunks = ref("b").cast(dtype).iter_chunks(ckpt, 64)
        assert chunks is not None
        got = np.concatenate([np.array(c) for c in chunks]).reshape(b.shape)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    "make",
    [
        lambda: ref("b").transpose(),
        lambda: ref("b").slice(1, 0, 5),  # columns: not one contiguous range
        lambda: concat([ref("b"), ref("b")], axis=1),
        lambda: concat([ref("b").transpose(), ref("b").transpose()], axis=0),
        lambda: ref("b").transpose().cast("float32"),
    ],
)
def test_non_contiguous_expressions_do_not_stream(ckpt: Checkpoint, make) -> None:  # type: ignore[no-untyped-def]
    expr = make()
    assert expr.iter_chunks(ckpt, 64) is None
    assert expr.evaluate(ckpt).shape == expr.shape_dtype(ckpt)[0]


def test_iter_chunks_refuses_a_non_positive_bound(ckpt: Checkpoint) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        ref("b").iter_chunks(ckpt, 0)


def test_reads_use_no_memory_map_and_one_reused_buffer(ckpt: Checkpoint) -> None:
    whole = ckpt.read("b")
    assert not isinstance(whole, np.memmap) and not isinstance(whole.base, np.memmap)
    assert whole.flags.owndata or (whole.base is not None and whole.base.flags.owndata)
    np.testing.assert_array_equal(whole, ARRAYS["b"])
    bases = []
    for chunk in ckpt.read_chunks("b", 5, 400, 100):
        assert not isinstance(chunk.base, np.memmap)
        bases.append(chunk.__array_interface__["data"][0])
    assert len(bases) == 4 and len(set(bases)) == 1  # the same buffer every time


def test_a_file_that_shrank_is_a_safetensors_error(ckpt: Checkpoint) -> None:
    info = ckpt.info("b")
    with info.file.open("r+b") as f:
        f.truncate(info.start + 100)
    with pytest.raises(SafetensorsError, match="file ended"):
        list(ckpt.read_chunks("b", 0, 37 * 13, 16))
    with pytest.raises(SafetensorsError, match="file ended"):
        ckpt.read("b")


def test_non_finite_values_are_counted_across_chunks(tmp_path: Path) -> None:
    data = np.ones((64, 8), dtype=np.float32)
    data[3, 1] = np.nan  # first chunk
    data[40, 2] = np.inf  # a later chunk
    data[63, 7] = -np.inf  # the last one
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text("{}")
    save_file({"x": data}, str(root / "model.safetensors"))
    ckpt = open_local(root)
    tensor = PlannedTensor(
        ref("x").cast("float16"), ckpt, "float16", (64, 8), name="X", component="model"
    )
    chunks = tensor.iter_chunks(100)
    assert chunks is not None
    with pytest.warns(NonFiniteWeightWarning, match=r"1 NaN and 2 infinite value\(s\) out of 512"):
        pieces = [np.array(c) for c in chunks]
    assert len(pieces) > 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per tensor, not again on a second pass
        again = tensor.iter_chunks(100)
        assert again is not None
        list(again)
        tensor.numpy()


# --------------------------------------------------------------------------- the writer


def _model(values: dict[str, tuple[ir.DataType, tuple[int, ...]]]) -> ir.Model:
    """A graph returning each initializer through an Identity (enough for the writer)."""
    nodes, outputs, inits = [], [], {}
    for name, (dtype, shape) in values.items():
        init = ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(shape))
        node = ir.Node("", "Identity", [init], num_outputs=1)
        out = node.outputs[0]
        out.name, out.type, out.shape = f"{name}_out", ir.TensorType(dtype), ir.Shape(shape)
        nodes.append(node)
        outputs.append(out)
        inits[name] = init
    graph = ir.Graph([], outputs, nodes=nodes, opset_imports={"": 23}, name="g")
    for name, init in inits.items():
        graph.initializers[name] = init
    return ir.Model(graph, ir_version=11)


def _bind(ckpt: Checkpoint, plan: dict[str, object]) -> ir.Model:
    values = {}
    weight_plan = WeightPlan()
    for name, expr in plan.items():
        shape, dtype = expr.shape_dtype(ckpt)  # type: ignore[attr-defined]
        values[name] = ({"bfloat16": ir.DataType.BFLOAT16, "float16": ir.DataType.FLOAT16,
                         "float32": ir.DataType.FLOAT}[dtype], shape)  # fmt: skip
        weight_plan.add(name, expr)  # type: ignore[arg-type]
    model = _model(values)
    bind(model, weight_plan, ckpt, component="model")
    return model


def test_writer_streams_large_tensors_with_identical_bytes(
    ckpt: Checkpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = {
        "B": ref("b").scale(0.5),
        "B16": ref("b").cast("float16"),
        "B32": ref("b").cast("float32"),
        "S": concat([ref("c"), ref("b").slice(0, 2, 9)], axis=0),
        "T": ref("b").transpose(),  # not streamable: evaluated whole
    }
    expected = {name: np.ascontiguousarray(e.evaluate(ckpt)) for name, e in plan.items()}
    model = _bind(ckpt, plan)

    whole_reads: list[str] = []
    original = ckpt.read

    def tracking_read(name: str) -> np.ndarray:
        whole_reads.append(name)
        return original(name)

    monkeypatch.setattr(ckpt, "read", tracking_read)
    out = write_package(
        tmp_path / "pkg", components={"model": model}, manifest={}, inline_limit=0, chunk_bytes=48
    )
    assert whole_reads == ["b"]  # only the transpose read a whole tensor
    loaded = ir.load(out / "model" / "model.onnx")
    for name, array in expected.items():
        got = loaded.graph.initializers[name].const_value.numpy()
        assert got.tobytes() == array.tobytes(), name
    manifest = json.loads((out / "mobius.json").read_text())
    data = (out / "model" / "model.onnx.data").read_bytes()
    assert manifest["components"]["model"]["data_sha256"] == hashlib.sha256(data).hexdigest()


def test_writer_output_does_not_depend_on_the_chunk_size(ckpt: Checkpoint, tmp_path: Path) -> None:
    plan = {"B": ref("b").cast("float32"), "C": ref("c").scale(2.0), "F": ref("f")}
    digests = set()
    for i, chunk in enumerate((7, 64, 1 << 20)):
        out = write_package(
            tmp_path / f"pkg{i}",
            components={"model": _bind(ckpt, plan)},
            manifest={},
            inline_limit=0,
            chunk_bytes=chunk,
        )
        digests.add(
            json.loads((out / "mobius.json").read_text())["components"]["model"]["data_sha256"]
        )
    assert len(digests) == 1


def test_streamed_write_holds_about_one_chunk_at_a_time(tmp_path: Path) -> None:
    """Peak traced memory of writing a 16 MiB tensor (cast to 8 MiB) in 256 KiB chunks."""
    rows, cols = 4096, 1024
    table = (np.arange(rows * cols, dtype=np.float32) % 251).reshape(rows, cols)
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text("{}")
    save_file({"table": table}, str(root / "model.safetensors"))
    del table
    ckpt = open_local(root)
    model = _bind(ckpt, {"T": ref("table").cast("bfloat16").scale(0.5)})
    dict(ckpt.source.files)  # let the background hashing (16 MiB buffer) finish first

    tracemalloc.start()
    try:
        out = write_package(
            tmp_path / "pkg",
            components={"model": model},
            manifest={},
            inline_limit=0,
            chunk_bytes=256 * 1024,
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * 1024 * 1024, f"peak {peak / 2**20:.1f} MiB"  # whole tensor: 8 + 16 MiB
    size = (out / "model" / "model.onnx.data").stat().st_size
    assert size == rows * cols * 2


def test_whole_tensor_write_is_measured_by_the_same_check(tmp_path: Path) -> None:
    """The bound above can fail: a non-streamable tensor of the same size exceeds it."""
    rows, cols = 1024, 1024
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text("{}")
    save_file({"t": np.ones((rows, cols), np.float32)}, str(root / "model.safetensors"))
    ckpt = open_local(root)
    model = _bind(ckpt, {"T": ref("t").transpose()})
    tracemalloc.start()
    try:
        write_package(
            tmp_path / "pkg",
            components={"model": model},
            manifest={},
            inline_limit=0,
            chunk_bytes=256 * 1024,
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak >= rows * cols * 4


# --------------------------------------------------------------------------- source hashes


def test_source_files_are_hashed_in_the_background(ckpt: Checkpoint) -> None:
    files = ckpt.source.files
    assert isinstance(files, BackgroundHashes)
    weights = ckpt.root / "model.safetensors"
    assert files["model.safetensors"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert list(files) == sorted(files) == ["config.json", "model.safetensors"]
    assert dict(ckpt.source.to_dict()["files"]) == dict(files)


def test_a_hashing_failure_surfaces_when_the_hashes_are_read(tmp_path: Path) -> None:
    hashes = BackgroundHashes({"gone.safetensors": tmp_path / "gone.safetensors"})
    with pytest.raises(FileNotFoundError):
        dict(hashes)


# --------------------------------------------------------------------------- fast paths


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)])
def test_half_float_non_finite_count_matches_isfinite(dtype: np.dtype) -> None:
    from mobius.weights import count_non_finite

    bits = np.random.default_rng(3).integers(0, 2**16, size=50_000, dtype=np.uint16)
    values = bits.view(dtype)
    wide = values.astype(np.float32)
    expected = (int(np.isnan(wide).sum()), int(np.isinf(wide).sum()))
    assert expected[0] > 0 and expected[1] >= 0
    specials = np.array([np.inf, -np.inf, np.nan, -np.nan, 1.0], dtype=np.float32).astype(dtype)
    assert count_non_finite(specials) == (2, 2)
    assert count_non_finite(values) == expected
    assert count_non_finite(np.ones(10, dtype=dtype)) == (0, 0)


@pytest.mark.parametrize(
    ("shape", "perm"),
    [
        ((600, 7), None),
        ((3, 517, 5), [0, 2, 1]),
        ((300, 1100), None),
        ((1, 1), None),
        ((4, 3, 2), [2, 1, 0]),
    ],
)
def test_transpose_in_row_blocks_matches_numpy(
    tmp_path: Path, shape: tuple[int, ...], perm: list[int] | None
) -> None:
    data = np.arange(math.prod(shape), dtype=np.float32).reshape(shape).astype(BF16)
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text("{}")
    save_file({"x": data}, str(root / "model.safetensors"))
    ckpt = open_local(root)
    got = ref("x").transpose(perm).evaluate(ckpt)
    expected = np.transpose(data, perm)
    assert got.dtype == BF16 and got.shape == expected.shape
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(expected).tobytes()


def test_hashing_stops_when_the_mapping_is_dropped_unread(tmp_path: Path) -> None:
    import gc

    from mobius.checkpoint import local

    big = tmp_path / "big.safetensors"
    big.write_bytes(b"\0" * (4 * local._CHUNK))
    hashes = BackgroundHashes({f"f{i}": big for i in range(4000)})  # 256 GiB to hash
    thread = hashes._thread
    del hashes
    gc.collect()
    thread.join(timeout=30)
    assert not thread.is_alive()
