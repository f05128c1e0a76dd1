"""int4 packages of the tiny Gemma 4 fixtures: logits error against the f32 package is
at most that of the f32 package quantized by onnxruntime's own quantizer (RTN, same
bits / block / symmetry), on the same tensors; the figures are printed (``-s``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import mobius
from mobius.records import QuantOptions

pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
from mobius_testing.quant_accuracy import compare, ort_quantizer

pytestmark = pytest.mark.l1
TESTDATA = Path(__file__).resolve().parents[2] / "testdata"
TABLES = ("embed_tokens.weight", "embed_tokens_per_layer.weight")
"""Gemma 4's Gather tables; in the one-graph text package the tied lm_head is a Gemm
on embed_tokens.weight, which onnxruntime's quantizer does not handle."""


@pytest.fixture(scope="module", params=["tiny-gemma4", "tiny-gemma4-mm"])
def packages(request, tmp_path_factory) -> tuple[str, dict[str, Path]]:
    src = TESTDATA / request.param
    root = tmp_path_factory.mktemp(request.param)
    out = {
        "f32": root / "f32",
        "matmul": root / "q_matmul",
        "all": root / "q_all",
    }
    mobius.build(str(src), out["f32"])
    mobius.build(str(src), out["matmul"], quant=QuantOptions(exclude=TABLES))
    mobius.build(str(src), out["all"], quant="int4")
    return request.param, out


def _ids() -> list[int]:
    return [int(i) for i in np.random.default_rng(7).integers(3, 500, size=48)]


def test_matmul_weights_int4_beat_onnxruntime(packages) -> None:
    name, pkg = packages
    acc = compare(pkg["f32"], pkg["matmul"], _ids(), ort_quantizer(op_types=("MatMul",)))
    print(f"\n{name} MatMul weights int4: {acc.line()}")
    assert 0 < acc.rmse_ours <= acc.rmse_ort, acc.line()


def test_everything_int4_beats_onnxruntime_matmul_and_gather(packages) -> None:
    """Ours also quantizes the tied lm_head (a Gemm), which onnxruntime leaves float."""
    name, pkg = packages
    transform = ort_quantizer(op_types=("MatMul", "Gather"))
    acc = compare(pkg["f32"], pkg["all"], _ids(), transform)
    print(f"\n{name} all int4: {acc.line()}")
    assert 0 < acc.rmse_ours <= acc.rmse_ort, acc.line()


def test_gemma4_keeps_embedders_float_and_int8_lm_head(tmp_path) -> None:
    import json

    from mobius_runtime import Pipeline

    out = tmp_path / "mm-q4"
    mobius.build(
        str(TESTDATA / "tiny-gemma4-mm"), out, quant=QuantOptions(lm_head="int8"), target="cpu"
    )
    q = json.loads((out / "mobius.json").read_text())["quantization"]
    comps = q["components"]
    assert comps["vision_encoder"]["kept_float"]["vision_tower.patch_embedder.input_proj.weight"]
    assert "embed_audio.embedding_projection.weight" in comps["audio_encoder"]["kept_float"]
    assert comps["embedding"]["tensors"]["embed_tokens.weight"]["bits"] == 8
    assert comps["embedding"]["tensors"]["embed_tokens_per_layer.weight"] == {
        "ops": ["GatherBlockQuantized"],
        "bits": 4,
        "shape": [512, 96],
    }
    assert comps["decoder"]["tensors"]["lm_head.weight"]["bits"] == 8
    assert sum(len(c["tensors"]) for c in comps.values()) > 80
    result = Pipeline.load(out, device="cpu").generate(
        prompt="Describe this. <|image|>",
        images=[str(TESTDATA / "media" / "tiny.png")],
        max_new_tokens=4,
    )
    assert len(result.ids) == 4


@pytest.mark.parametrize("method", ["int4", "int8"])
def test_asymmetric_package_beats_onnxruntime(tmp_path, method: str) -> None:
    """Asymmetric blocks (packed zero points) on the MatMul weights, both sides; the tied
    table asymmetric too (one zero point per byte for GatherBlockQuantized) must run."""
    src = TESTDATA / "tiny-gemma4"
    f32, q, q_all = tmp_path / "f32", tmp_path / "q", tmp_path / "q_all"
    mobius.build(str(src), f32)
    mobius.build(str(src), q, quant=QuantOptions(method=method, symmetric=False, exclude=TABLES))
    mobius.build(str(src), q_all, quant=QuantOptions(method=method, symmetric=False))
    bits = 4 if method == "int4" else 8
    transform = ort_quantizer(bits=bits, symmetric=False, op_types=("MatMul",))
    acc = compare(f32, q, _ids(), transform)
    print(f"\ntiny-gemma4 {method} asymmetric MatMul weights: {acc.line()}")
    # int8: per-block errors are within rounding of onnxruntime's (test_quantize.py), and
    # which of two near-equal blocks wins moves logits by a few % either way (measured
    # 1.026x); the int4 promise is the strict one.
    bound = 1.0 if method == "int4" else 1.1
    assert 0 < acc.rmse_ours <= bound * acc.rmse_ort, acc.line()
    every = compare(f32, q_all, _ids(), transform)
    print(f"tiny-gemma4 {method} asymmetric, tables too: RMSE {every.rmse_ours:.5f}")
    assert 0 < every.rmse_ours < 1.0 and every.top1_ours > 0
