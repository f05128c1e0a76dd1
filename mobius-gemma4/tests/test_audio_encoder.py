"""audio_encoder graph: ports, plan coverage, f32 parity with HF 5.24, f16/bf16 Compress path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from reference.paths import TINY_HUBSTYLE

from mobius.records import BuildOptions
from mobius.weights import bind
from mobius_gemma4.audio import audio_weight_plan, build_audio_encoder, read_audio_config

TINY = TINY_HUBSTYLE


def _raw() -> dict:
    return json.loads(TINY.read_text())


@pytest.mark.l1
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_ports_and_plan_cover_every_initializer(dtype: str) -> None:
    cfg = read_audio_config(_raw()["audio_config"])
    model = build_audio_encoder(cfg, 64, BuildOptions(dtype=dtype))
    port = {"f32": ir.DataType.FLOAT, "f16": ir.DataType.FLOAT16, "bf16": ir.DataType.BFLOAT16}[
        dtype
    ]
    ins = {v.name: v for v in model.graph.inputs}
    assert ins["input_features"].dtype == port
    assert ins["input_features_mask"].dtype == ir.DataType.BOOL
    outs = {v.name: v for v in model.graph.outputs}
    assert outs["audio_features"].dtype == port
    assert len(outs["audio_features"].shape) == 2
    assert outs["audio_features_mask"].dtype == ir.DataType.BOOL
    plan = audio_weight_plan(cfg, BuildOptions(dtype=dtype))
    empty = {n for n, v in model.graph.initializers.items() if v.const_value is None}
    assert empty == set(plan.entries)
    assert model.graph.initializers["audio_tower.layers.0.self_attn.per_dim_scale"].shape.dims == (
        cfg.head_dim,
    )


def _cuda_works(ort) -> bool:
    """True when the CUDA EP actually loads (the gpu wheel lists it even without CUDA libs)."""
    import onnx

    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "p", [x], [y])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 23)])
    model.ir_version = 11
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    except Exception:
        return False
    return "CUDAExecutionProvider" in sess.get_providers()


def _features(lengths: list[int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = max(lengths)
    feats = rng.standard_normal((len(lengths), t, 128)).astype(np.float32)
    mask = np.zeros((len(lengths), t), dtype=bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    return feats * mask[..., None], mask


def _build_bound(tmp_path: Path, raw: dict, dtype: str, seed: int):
    from mm_reference.towers import hf_audio, write_checkpoint

    from mobius.checkpoint.local import open_local

    tower, embed = hf_audio(raw, seed=seed)
    folder = tmp_path / "ckpt"
    if not folder.exists():
        write_checkpoint(folder, raw, {"audio_tower": tower, "embed_audio": embed})
    cfg = read_audio_config(raw["audio_config"])
    options = BuildOptions(dtype=dtype)
    model = build_audio_encoder(cfg, raw["text_config"]["hidden_size"], options)
    plan = audio_weight_plan(cfg, options)
    report = bind(model, plan, open_local(folder), component="audio_encoder")
    assert report.bound == len(plan.entries) and not report.unused
    path = tmp_path / f"audio_{dtype}.onnx"
    ir.save(model, path)
    return tower, embed, path


@pytest.mark.reference
@pytest.mark.l3
@pytest.mark.parametrize("heads", [2, 8])
def test_audio_features_match_hf_f32(tmp_path: Path, heads: int) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    ort = pytest.importorskip("onnxruntime")
    from mm_reference.towers import tiny_raw

    raw = tiny_raw(audio_config={"num_attention_heads": heads})
    tower, embed, path = _build_bound(tmp_path, raw, "f32", seed=5)
    # 1.2 s → 119 frames and 0.75 s → 74 frames: a right-padded batch of two.
    feats, mask = _features([119, 74], seed=11)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got, got_mask = sess.run(None, {"input_features": feats, "input_features_mask": mask})
    with torch.no_grad():
        out = tower(torch.from_numpy(feats), torch.from_numpy(mask))
        want = embed(out.last_hidden_state)[out.attention_mask].numpy()
    np.testing.assert_array_equal(got_mask, out.attention_mask.numpy())
    assert got.shape == want.shape == (30 + 19, 64)
    diff = float(np.abs(got - want).max())
    print(f"audio_features max|Δ| = {diff:.3g} (heads={heads})")
    assert diff <= 1e-5


@pytest.mark.reference
@pytest.mark.l3
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_low_precision_compress_path_runs(tmp_path: Path, dtype: str) -> None:
    """f16/bf16 builds run the Compress path and keep the row count; error vs HF f32 reported."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    ort = pytest.importorskip("onnxruntime")
    import ml_dtypes
    from mm_reference.towers import tiny_raw

    raw = tiny_raw()
    tower, embed, path = _build_bound(tmp_path, raw, dtype, seed=5)
    feats, mask = _features([119, 74], seed=11)
    np_dt = np.float16 if dtype == "f16" else ml_dtypes.bfloat16
    providers = ["CPUExecutionProvider"]
    if dtype == "bf16":  # ORT's CPU EP has no bf16 Mul/MatMul kernels
        if not _cuda_works(ort):
            pytest.skip("bf16 needs a working onnxruntime CUDA EP")
        providers = ["CUDAExecutionProvider"]
    sess = ort.InferenceSession(str(path), providers=providers)
    got, _ = sess.run(None, {"input_features": feats.astype(np_dt), "input_features_mask": mask})
    with torch.no_grad():
        out = tower(torch.from_numpy(feats), torch.from_numpy(mask))
        want = embed(out.last_hidden_state)[out.attention_mask].numpy()
    got = got.astype(np.float32)
    assert got.shape == want.shape
    assert np.isfinite(got).all()
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"audio_features {dtype} vs HF f32: max|Δ|/max|ref| = {rel:.3g}")
    assert rel < 0.1
