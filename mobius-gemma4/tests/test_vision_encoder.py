"""vision_encoder graph: ports, weight plan coverage, and f32 parity with HF 5.24 (L3)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from reference.paths import TINY_HUBSTYLE

from mobius.records import BuildOptions
from mobius.weights import bind
from mobius_gemma4.vision import (
    Gemma4ImageProcessor,
    build_vision_encoder,
    read_vision_config,
    vision_weight_plan,
)

TINY = TINY_HUBSTYLE


def _raw() -> dict:
    return json.loads(TINY.read_text())


@pytest.mark.l1
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_ports_and_plan_cover_every_initializer(dtype: str) -> None:
    raw = _raw()
    cfg = read_vision_config(raw["vision_config"])
    model = build_vision_encoder(cfg, 64, BuildOptions(dtype=dtype))
    port = {"f32": ir.DataType.FLOAT, "f16": ir.DataType.FLOAT16, "bf16": ir.DataType.BFLOAT16}[
        dtype
    ]
    ins = {v.name: v for v in model.graph.inputs}
    assert list(ins) == ["pixel_values", "pixel_position_ids"]
    assert ins["pixel_values"].dtype == port
    assert ins["pixel_position_ids"].dtype == ir.DataType.INT64
    (out,) = model.graph.outputs
    assert out.name == "image_features" and out.dtype == port
    assert list(out.shape) == ["num_image_tokens", 64]
    plan = vision_weight_plan(cfg, BuildOptions(dtype=dtype))
    empty = {n for n, v in model.graph.initializers.items() if v.const_value is None}
    assert empty == set(plan.entries)
    # clip bounds and standardize tensors are part of the plan for this config
    assert "vision_tower.encoder.layers.1.mlp.down_proj.output_max" in plan.entries
    assert "vision_tower.std_scale" in plan.entries


@pytest.mark.l1
def test_unclipped_plain_config_has_no_bounds() -> None:
    vc = {**_raw()["vision_config"], "use_clipped_linears": False, "standardize": False}
    cfg = read_vision_config(vc)
    model = build_vision_encoder(cfg, 64, BuildOptions())
    names = set(model.graph.initializers)
    assert not any(n.endswith(("input_min", "output_max")) for n in names)
    assert "vision_tower.std_bias" not in names
    plan = vision_weight_plan(cfg, BuildOptions())
    assert "model.vision_tower.encoder.layers.0.self_attn.q_proj.input_min" in plan.ignored


def _images() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    # With 70 soft tokens: 144x192 → 21x27 patches (63 tokens), 100x300 → 12x42 (56, padded).
    return [
        rng.integers(0, 256, (144, 192, 3), dtype=np.uint8),
        rng.integers(0, 256, (100, 300, 3), dtype=np.uint8),
    ]


@pytest.mark.reference
@pytest.mark.l3
@pytest.mark.parametrize("standardize", [True, False])
def test_image_features_match_hf_f32(tmp_path: Path, standardize: bool) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    ort = pytest.importorskip("onnxruntime")
    from mm_reference.towers import hf_vision, tiny_raw, write_checkpoint

    from mobius.checkpoint.local import open_local

    raw = tiny_raw(vision_config={"standardize": standardize})
    tower, embed = hf_vision(raw, seed=3)
    ckpt = open_local(
        write_checkpoint(tmp_path / "ckpt", raw, {"vision_tower": tower, "embed_vision": embed})
    )

    cfg = read_vision_config(raw["vision_config"])
    options = BuildOptions(dtype="f32")
    model = build_vision_encoder(cfg, raw["text_config"]["hidden_size"], options)
    plan = vision_weight_plan(cfg, options)
    report = bind(model, plan, ckpt, component="vision_encoder")
    assert report.bound == len(plan.entries)
    assert not report.unused  # every vision/embedder tensor of the checkpoint is used
    path = tmp_path / "vision.onnx"
    ir.save(model, path)

    batch = Gemma4ImageProcessor(max_soft_tokens=70)(_images())
    assert batch.num_soft_tokens[0] != batch.num_soft_tokens[1]  # two sizes, one padded
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = sess.run(
        None,
        {"pixel_values": batch.pixel_values, "pixel_position_ids": batch.pixel_position_ids},
    )
    with torch.no_grad():
        hs = tower(
            pixel_values=torch.from_numpy(batch.pixel_values),
            pixel_position_ids=torch.from_numpy(batch.pixel_position_ids),
        ).last_hidden_state
        want = embed(hs).numpy()
    assert got.shape == want.shape == (sum(batch.num_soft_tokens), 64)
    diff = float(np.abs(got - want).max())
    print(f"image_features max|Δ| = {diff:.3g} (standardize={standardize})")
    assert diff <= 1e-5
