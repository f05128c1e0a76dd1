"""The multimodal package around the graphs (L1, no torch): contract wiring, processors,
prompt expansion and the onnxruntime-genai side files of a ``gemma4`` package."""

from __future__ import annotations

import json

import numpy as np
import pytest
from reference.paths import TINY_HUBSTYLE

from mobius.errors import MobiusError
from mobius.records import BuildOptions
from mobius_gemma4.config import read_config
from mobius_gemma4.contract import pipeline_contract
from mobius_gemma4.genai_config import runtime_files
from mobius_gemma4.processors import expand_prompt, format_chat_prompt, text_processors

pytestmark = pytest.mark.l1

TINY = TINY_HUBSTYLE


def _config(**text_overrides):
    raw = json.loads(TINY.read_text())
    raw["text_config"] = {**raw["text_config"], **text_overrides}
    return read_config("gemma4", raw)


def test_contract_wires_encoders_with_presence_and_fallbacks():
    contract = pipeline_contract(_config(), BuildOptions())
    comps = {c.name: c for c in contract.components}
    assert comps["vision_encoder"].presence == "image"
    assert comps["audio_encoder"].presence == "audio"
    edges = {(e.producer, e.consumer) for e in contract.edges}
    assert ("vision_encoder.image_features", "embedding.image_features") in edges
    assert ("audio_encoder.audio_features", "embedding.audio_features") in edges
    optionals = {o.consumer: (o.presence, o.absent_shape) for o in contract.optionals}
    assert optionals == {
        "embedding.image_features": ("image", (0, 64)),
        "embedding.audio_features": ("audio", (0, 64)),
    }
    assert comps["audio_encoder"].input("input_features_mask").dtype == "bool"
    assert comps["decoder"].input("input_ids") is None  # no "vision" overlay here
    assert contract.problems() == []


def test_vision_overlay_feeds_input_ids_to_decoder_too():
    from mobius_runtime.plan import compile_plan

    config = _config(use_bidirectional_attention="vision")
    contract = pipeline_contract(config, BuildOptions())
    assert contract.component("decoder").input("input_ids") is not None
    plan = compile_plan(contract)
    assert set(plan.caller_names["input_ids"]) == {"embedding.input_ids", "decoder.input_ids"}
    assert plan.order.index("vision_encoder") < plan.order.index("embedding")


def test_expand_prompt_counts_and_order():
    text = format_chat_prompt("hi", images=2, audio=1)
    assert text == "<bos><|turn>user\n<|image|><|image|><|audio|>hi<turn|>\n<|turn>model\n"
    out = expand_prompt(text, [2, 1], [3])
    assert "<|image><|image|><|image|><image|><|image><|image|><image|>" in out
    assert "<|audio><|audio|><|audio|><|audio|><audio|>hi" in out
    with pytest.raises(MobiusError, match="placeholder"):
        expand_prompt(text, [2], [3])


def test_processors_return_port_arrays_and_counts():
    procs = text_processors(_config())
    image = np.random.default_rng(0).integers(0, 256, size=(144, 192, 3), dtype=np.uint8)
    # 144x144, not 96x192: resized to the 280-token budget that one is 69 patches wide, past
    # the tiny vision position table (64 rows), and the processor refuses it
    out = procs.preprocess_image([image, image[:, :144]])
    assert set(out) == {"pixel_values", "pixel_position_ids", "num_soft_tokens"}
    assert out["pixel_values"].dtype == np.float32
    assert out["pixel_values"].shape[0] == 2 and out["pixel_values"].shape[2] == 768
    for i, n in enumerate(out["num_soft_tokens"]):
        valid = (out["pixel_position_ids"][i] != -1).all(-1).sum()
        assert valid == 9 * n
    clip = np.zeros(19_200, dtype=np.float32)
    audio = procs.preprocess_audio([clip])
    assert audio["input_features"].shape == (1, 119, 128)
    assert audio["input_features_mask"].dtype == np.bool_
    assert audio["num_soft_tokens"] == [30]


def test_genai_config_and_processor_files():
    config = _config()
    files = {f.path: f for f in runtime_files(config, None, None, BuildOptions())}
    genai = json.loads(files["genai_config.json"].content)["model"]
    assert genai["vision"] == {
        "filename": "vision_encoder/model.onnx",
        "config_filename": "image_processor.json",
    }
    assert genai["speech"]["inputs"] == {
        "audio_embeds": "input_features",
        "attention_mask": "input_features_mask",
    }
    image = json.loads(files["image_processor.json"].content)
    attrs = image["processor"]["transforms"][1]["operation"]["attrs"]
    assert attrs == {"patch_size": 16, "max_soft_tokens": 280, "pooling_kernel_size": 3}
    audio = json.loads(files["audio_processor.json"].content)
    mel = audio["feature_extraction"]["sequence"][1]["operation"]
    assert mel["type"] == "Gemma4LogMel" and mel["attrs"]["feature_size"] == 128


def test_no_audio_tower_gives_empty_speech_section():
    raw = json.loads(TINY.read_text())
    raw["audio_config"] = None
    config = read_config("gemma4", raw)
    files = {f.path: f for f in runtime_files(config, None, None, BuildOptions())}
    assert json.loads(files["genai_config.json"].content)["model"]["speech"] == {
        "config_filename": ""
    }
    assert "audio_processor.json" not in files
    names = [c.name for c in pipeline_contract(config, BuildOptions()).components]
    assert names == ["vision_encoder", "embedding", "decoder"]
