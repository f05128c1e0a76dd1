"""A Gemma 4 GGUF model with its ``mmproj`` companion (vision and audio encoders) builds
the multimodal ``gemma4`` package.

testdata/tiny-gemma4-mm is written the way llama.cpp's convert_hf_to_gguf.py writes it:
the text model (``Gemma4Model``: ``gemma4.*`` keys, tensors under gguf-py's names, 1-D
tensors F32) and, with ``--mmproj``, the encoders (``Gemma4VisionAudioModel``:
``general.architecture`` ``clip``, ``clip.*`` keys, ``v.*`` / ``a.*`` / ``mm.*`` names
from gguf-py's own tensor map after the converter's renames; the patch embedding
reshaped and permuted to a ``[hidden, 3, p, p]`` conv kernel, ``per_dim_scale`` stored
as its softplus, the depthwise conv kernel squeezed to ``[h, k]``, scalar clip bounds as
``[1]``; in an F16 or Q8_0 file the converter's F32 exceptions: norms, 1-D tensors,
biases and bounds, the position table, the audio conv stack and its input projection, the
patch embedding outside F16 files; Q8_0 falls back to F16 where 32 does not divide a row).
The package built from the pair (the file's quantization kept: Q8_0 encoder weights
become MatMulNBits) equals the safetensors build of a checkpoint holding the same values
(gguf's dequantization of the file's tensors; the soft-token budget, which no GGUF key
stores, at HF's default): encoder outputs and logits of an image prompt and an audio
prompt within 1e-4, greedy ids equal.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

TESTDATA = Path(__file__).resolve().parents[2] / "testdata"
TINY = TESTDATA / "tiny-gemma4-mm"
MEDIA = TESTDATA / "media"
KINDS = ["F32", "F16", "Q8_0"]
NOT_IN_GGUF = ("vision_soft_tokens_per_image",)
"""Config keys no GGUF key stores (the reference checkpoint drops them too)."""
VISION_NOT_IN_GGUF = ("default_output_length",)


def _tiny() -> tuple[dict, dict[str, np.ndarray]]:
    from safetensors.numpy import load_file

    return json.loads((TINY / "config.json").read_text()), load_file(TINY / "model.safetensors")


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x.astype(np.float64)).astype(np.float32)


def _mmproj_tensors(weights: dict[str, np.ndarray], kind: str):
    """(GGUF name, stored array, type, HF name) of every encoder tensor, as the converter
    writes them (its renames, then gguf-py's MMPROJ tensor map)."""
    import gguf

    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, 128)
    suffixes = (".weight", ".bias", ".input_max", ".input_min", ".output_max", ".output_min")
    out = []
    for hf, w in weights.items():
        if "language_model" in hf:
            continue
        audio = "audio_tower" in hf or "embed_audio" in hf
        data = w.reshape(1) if w.ndim == 0 else w
        if audio:
            name = hf.replace("model.audio_tower.", "conformer.").replace(".linear.", ".")
            if name.endswith("per_dim_scale"):
                name += ".weight"
                data = _softplus(data)
            if "lconv1d.depthwise_conv1d" in name and name.endswith(".weight"):
                data = data.reshape(data.shape[0], data.shape[2])
        else:
            name = hf.replace("model.vision_tower.encoder.", "vision_model.model.")
            name = name.replace(".linear.weight", ".weight")
            if name.endswith(("layer_scalar", "position_embedding_table")):
                name += ".weight"
            if name.endswith("patch_embedder.input_proj.weight"):
                n, k = data.shape
                p = round((k // 3) ** 0.5)
                data = data.reshape(n, p, p, 3).transpose(0, 3, 1, 2).copy()
        new = tmap.get_name(key=name, try_suffixes=suffixes)
        assert new is not None, hf
        ggml = "F32"
        if kind != "F32":
            forced_f32 = (audio and (".conv" in hf or ("_conv" in hf and ".weight" in hf))) or (
                "position_embedding_table" in hf
            )
            if not forced_f32 and data.ndim > 1 and new.endswith(".weight"):
                ggml = kind
            if new.endswith(".patch_embd.weight"):  # MmprojModel: F16 only in an F16 file
                ggml = "F16" if kind == "F16" else "F32"
            if ggml == "Q8_0" and data.shape[-1] % 32:
                ggml = "F16"  # the converter's fallback when the blocks do not divide a row
            if data.ndim <= 1 or new.endswith("_norm.weight"):
                ggml = "F32"
        out.append((new, np.ascontiguousarray(data, np.float32), ggml, hf))
    return out


def _mmproj_metadata(cfg: dict) -> dict:
    v, a, text = cfg["vision_config"], cfg["audio_config"], cfg["text_config"]
    return {
        "general.name": "tiny-gemma4-mm",
        "clip.has_vision_encoder": True,
        "clip.vision.projection_dim": text["hidden_size"],
        "clip.vision.image_size": 224,
        "clip.vision.patch_size": v["patch_size"],
        "clip.vision.embedding_length": v["hidden_size"],
        "clip.vision.feed_forward_length": v["intermediate_size"],
        "clip.vision.block_count": v["num_hidden_layers"],
        "clip.vision.attention.head_count": v["num_attention_heads"],
        "clip.vision.image_mean": [0.0, 0.0, 0.0],
        "clip.vision.image_std": [1.0, 1.0, 1.0],
        "clip.has_audio_encoder": True,
        "clip.audio.projection_dim": text["hidden_size"],
        "clip.audio.embedding_length": a["hidden_size"],
        "clip.audio.feed_forward_length": 4 * a["hidden_size"],
        "clip.audio.block_count": a["num_hidden_layers"],
        "clip.audio.attention.head_count": a["num_attention_heads"],
        "clip.vision.projector_type": "gemma4v",
        "clip.vision.attention.layer_norm_epsilon": 1e-6,
        "clip.audio.projector_type": "gemma4a",
        "clip.audio.num_mel_bins": 128,
        "clip.audio.attention.layer_norm_epsilon": 1e-5,
    }


def _text_gguf(path: Path, cfg: dict, weights: dict[str, np.ndarray], kind: str, vocab: dict):
    """The text file (``Gemma4Model``; ``vocab``: its ``tokenizer.*`` keys); returns
    {HF name: (stored array, type)}."""
    from mobius_testing.gguf_files import fitting_type, llamacpp_name, write_gguf

    t = cfg["text_config"]
    layers = t["num_hidden_layers"]
    full = [x == "full_attention" for x in t["layer_types"]]
    dims = [t["per_layer_config"].get(str(i), {}).get("head_dim", t["head_dim"])
            for i in range(layers)]  # fmt: skip
    producers = layers - t["num_kv_shared_layers"]
    ff = [t["intermediate_size"] * (2 if t["use_double_wide_mlp"] and i >= producers else 1)
          for i in range(layers)]  # fmt: skip
    g = "gemma4"
    meta = {
        "general.name": "tiny-gemma4-mm",
        f"{g}.context_length": t["max_position_embeddings"],
        f"{g}.embedding_length": t["hidden_size"],
        f"{g}.block_count": layers,
        f"{g}.feed_forward_length": ff,
        f"{g}.attention.head_count": t["num_attention_heads"],
        f"{g}.attention.head_count_kv": t["num_key_value_heads"],
        f"{g}.attention.layer_norm_rms_epsilon": float(t["rms_norm_eps"]),
        f"{g}.rope.freq_base": float(t["rope_parameters"]["full_attention"]["rope_theta"]),
        f"{g}.final_logit_softcapping": float(t["final_logit_softcapping"]),
        f"{g}.attention.sliding_window": t["sliding_window"],
        f"{g}.attention.shared_kv_layers": t["num_kv_shared_layers"],
        f"{g}.embedding_length_per_layer_input": t["hidden_size_per_layer_input"],
        f"{g}.attention.sliding_window_pattern": [not f for f in full],
        f"{g}.attention.key_length": max(dims),
        f"{g}.attention.value_length": max(dims),
        f"{g}.attention.key_length_swa": min(dims),
        f"{g}.attention.value_length_swa": min(dims),
        **vocab,
    }
    rotated = int(max(dims) * 0.25 / 2)
    freqs = np.array([1.0] * rotated + [1e30] * (max(dims) // 2 - rotated), np.float32)
    tensors = [("rope_freqs.weight", freqs, "F32")]
    types = {}
    for hf, w in weights.items():
        if not hf.startswith("model.language_model."):
            continue
        text_name = "model." + hf[len("model.language_model.") :]
        ggml = fitting_type(kind, w.shape[-1]) if w.ndim > 1 else "F32"
        tensors.append((llamacpp_name(g, text_name, layers), w, ggml))
        types[hf] = (w, ggml)
    write_gguf(path, g, meta, tensors)
    return types


def _held(hf: str, stored: np.ndarray, ggml: str, like: np.ndarray) -> np.ndarray:
    """The values a tensor stored as ``ggml`` holds, in HF's layout (gguf's own
    dequantization; the patch embedding's conv-kernel layout permuted back)."""
    import gguf

    if ggml == "F32":
        return like
    qtype = gguf.GGMLQuantizationType[ggml]
    back = gguf.quants.dequantize(gguf.quants.quantize(stored, qtype), qtype)
    back = back.astype(np.float32).reshape(stored.shape)
    if hf.endswith("patch_embedder.input_proj.weight"):
        back = back.transpose(0, 2, 3, 1)
    return back.reshape(like.shape)


def _write_pair(
    root: Path, kind: str, *, mmproj_meta=None, extra=(), edit=None, tokenizer: str = "gpt2"
):
    """(folder with the text GGUF and its mmproj file, reference checkpoint folder);
    ``edit`` may change the encoder tensors written (a list of (name, data, type, HF name));
    ``tokenizer``: ``gpt2`` writes the tiny byte-level BPE as llama.cpp writes a gpt2
    vocab, ``gemma4`` rewrites it into Gemma 4's shape and writes it as
    ``Gemma4Model.set_vocab`` does (the reference checkpoint gets the rewritten one)."""
    from mobius_testing.gguf_files import (
        gemma4_tokenizer_metadata,
        gemma_style_tokenizer,
        gpt2_tokenizer_metadata,
        write_checkpoint,
        write_gguf,
    )

    like = TINY
    if tokenizer == "gemma4":
        like = gemma_style_tokenizer(TINY, root / "tiny-gemma4-mm-gemma-tokenizer")
        vocab = gemma4_tokenizer_metadata(like)
    else:
        vocab = gpt2_tokenizer_metadata(TINY, pre="gpt-2")
    cfg, weights = _tiny()
    folder = root / f"gguf-{kind}"
    folder.mkdir()
    types = _text_gguf(folder / f"tiny-gemma4-mm-{kind}.gguf", cfg, weights, kind, vocab)
    enc = _mmproj_tensors(weights, kind)
    if edit is not None:
        enc = edit(enc)
    meta = {**_mmproj_metadata(cfg), **(mmproj_meta or {})}
    meta = {k: v for k, v in meta.items() if v is not None}  # None: the key left out
    stored = [(n, d, t) for n, d, t, _ in enc]
    write_gguf(folder / f"mmproj-tiny-gemma4-mm-{kind.lower()}.gguf", "clip", meta,
               [*stored, *extra])  # fmt: skip
    types.update({hf: (d, t) for _, d, t, hf in enc})
    # the values the files hold, in HF form (F16 rounding, Q8_0 blocks)
    held = {hf: _held(hf, *types[hf], w) if hf in types else w for hf, w in weights.items()}
    ref_cfg = {k: v for k, v in cfg.items() if k not in NOT_IN_GGUF}
    ref_cfg["vision_config"] = {
        k: v for k, v in cfg["vision_config"].items() if k not in VISION_NOT_IN_GGUF
    }
    return folder, write_checkpoint(root / f"ref-{kind}", ref_cfg, held, like)


def _encoded(pipe, prompt: str, **media):
    ids, caller = pipe.prompts.request(prompt, None, media.get("images", ()),
                                       media.get("audio", ()), None, False)  # fmt: skip
    return ids, pipe.forward(**{"input_ids": ids, **caller})


@pytest.mark.l2
@pytest.mark.parametrize(
    ("kind", "tokenizer"), [(k, "gpt2") for k in KINDS] + [(k, "gemma4") for k in KINDS]
)
def test_gguf_with_mmproj_equals_the_safetensors_build(mobius_build, tmp_path, kind, tokenizer):
    pytest.importorskip("onnxruntime")
    import mobius
    from mobius.checkpoint import gguf_tokenizer
    from mobius.package import MANIFEST_NAME
    from mobius_testing.lm_parity import load_pipeline

    if tokenizer not in getattr(gguf_tokenizer, "MODELS", ("gpt2",)):  # corefloor rows
        pytest.skip(f"the installed mobius-core reads no {tokenizer} tokenizer")
    folder, reference = _write_pair(tmp_path, kind, tokenizer=tokenizer)
    ref = load_pipeline(mobius_build(reference, dtype="f32"))
    out = tmp_path / "pkg"
    # the folder: the mmproj file beside the model is found; dtype None keeps the file's
    # quantization (the CLI's default)
    mobius.build(str(folder), out, dtype=None)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["model_type"] == "gemma4"
    names = {c["name"] for c in manifest["contract"]["components"]}
    assert {"vision_encoder", "audio_encoder", "embedding", "decoder"} <= names
    assert any(n.startswith("mmproj-") for n in manifest["source"]["files"])
    config, truth = manifest["config"], json.loads((TINY / "config.json").read_text())
    for section in ("vision_config", "audio_config"):
        for key, value in config[section].items():
            assert value == truth[section][key], (section, key)
    for key in ("image_token_id", "boi_token_id", "eoi_token_id", "audio_token_id",
                "boa_token_id", "eoa_token_index", "video_token_id"):  # fmt: skip
        assert config[key] == truth[key], key
    if kind == "Q8_0":  # the encoders' Q8_0 blocks are kept as MatMulNBits
        quant = manifest["quantization"]["components"]
        for component in ("vision_encoder", "audio_encoder"):
            kinds = {e["source_type"] for e in quant[component]["tensors"].values()}
            assert kinds == {"Q8_0"}, (component, kinds)
    got = load_pipeline(out)
    cases = {
        "image": ("Describe this. <|image|>", {"images": [str(MEDIA / "tiny.png")]},
                  "vision_encoder.image_features"),
        "audio": ("Transcribe <|audio|>", {"audio": [str(MEDIA / "tiny.wav")]},
                  "audio_encoder.audio_features"),
    }  # fmt: skip
    for label, (prompt, media, port) in cases.items():
        ids_ref, want = _encoded(ref, prompt, **media)
        ids_got, have = _encoded(got, prompt, **media)
        np.testing.assert_array_equal(ids_got, ids_ref)
        feat = float(np.abs(have[port].astype(np.float32) - want[port]).max())
        delta = float(np.abs(have["logits"].astype(np.float32) - want["logits"]).max())
        print(
            f"\n[gguf+mmproj {kind} {tokenizer} {label}] max|Δ {port}| {feat:.2e}, max|Δ logits| {delta:.2e}"
        )
        assert feat <= 1e-4 and delta <= 1e-4, (label, feat, delta)
        greedy = ref.generate(prompt, max_new_tokens=8, **media).ids
        assert got.generate(prompt, max_new_tokens=8, **media).ids == greedy
    if kind == "F32" and tokenizer == "gpt2":  # F32 holds the checkpoint itself: so does
        # the original build
        import mobius as m

        orig = load_pipeline(m.build(str(TINY), tmp_path / "orig").out)
        _, want = _encoded(orig, "Transcribe <|audio|>", audio=[str(MEDIA / "tiny.wav")])
        _, have = _encoded(got, "Transcribe <|audio|>", audio=[str(MEDIA / "tiny.wav")])
        assert float(np.abs(have["logits"] - want["logits"]).max()) <= 1e-4


@pytest.mark.l2
def test_explicit_mmproj_none_and_text_only(tmp_path):
    """``--mmproj none`` builds the text file alone; ``--mmproj FILE`` names the file."""
    pytest.importorskip("onnxruntime")
    import mobius

    folder, _ = _write_pair(tmp_path, "F32")
    model = next(folder.glob("tiny-*.gguf"))
    text = mobius.build(str(model), tmp_path / "text", mmproj="none")
    assert text.model_type == "gemma4_text"
    moved = tmp_path / "elsewhere.gguf"
    next(folder.glob("mmproj-*.gguf")).rename(moved)
    assert mobius.build(str(model), tmp_path / "bare").model_type == "gemma4_text"
    assert mobius.build(str(model), tmp_path / "mm", mmproj=str(moved)).model_type == "gemma4"


@pytest.mark.l2
@pytest.mark.parametrize(
    ("meta", "extra", "match"),
    [
        ({"clip.vision.projector_type": "gemma3"}, (), r"projector is 'gemma3', not Gemma 4"),
        ({"clip.vision.projection_dim": 2560}, (), r"projects to width 2560.*hidden size is 64"),
        ({"clip.audio.projector_type": "ultravox"}, (), r"audio projector is 'ultravox'"),
        ({"clip.audio.num_mel_bins": 80}, (), r"num_mel_bins is 80"),
        ({"clip.vision.block_count": "two"}, (), r"block_count is 'two', not a positive"),
        ({}, [("v.blk.9.attn_q.weight", np.zeros((32, 32), np.float32), "F32")],
         r"not ones the family knows: 'v\.blk\.9\.attn_q\.weight'"),
        ({}, [("token_embd.weight", np.zeros((512, 64), np.float32), "F32")],
         r"in both the model file and its mmproj file"),
    ],
)  # fmt: skip
def test_mismatched_mmproj_is_refused(tmp_path, meta, extra, match):
    """A companion of another model, a malformed key or a tensor the family does not
    know: one line saying what and where, with a fix; nothing written."""
    import mobius
    from mobius.errors import CheckpointError

    folder, _ = _write_pair(tmp_path, "F32", mmproj_meta=meta, extra=extra)
    out = tmp_path / "pkg"
    with pytest.raises(CheckpointError, match=match) as info:
        mobius.build(str(folder), out)
    error = info.value
    assert "\n" not in error.what and error.fix and error.where
    assert not out.exists()


@pytest.mark.l2
def test_mmproj_that_is_no_mmproj_file(tmp_path):
    """``--mmproj`` naming a model file, a missing file, or given with a safetensors SRC
    is refused naming it; nothing written."""
    import mobius
    from mobius.errors import BuildError, CheckpointError
    from mobius_testing.gguf_files import write_gguf

    folder, ref = _write_pair(tmp_path, "F32")
    model = next(folder.glob("tiny-*.gguf"))
    copy = tmp_path / "other.gguf"
    copy.write_bytes(model.read_bytes())
    with pytest.raises(CheckpointError, match=r"'rope_freqs\.weight' is in both the model"):
        mobius.build(str(model), tmp_path / "pkg", mmproj=str(copy))
    other = write_gguf(tmp_path / "llama.gguf", "llama", {}, [("x.weight", np.ones(4), "F32")])
    with pytest.raises(CheckpointError, match=r"general\.architecture is 'llama', not 'clip'"):
        mobius.build(str(model), tmp_path / "pkg", mmproj=str(other))
    with pytest.raises(CheckpointError, match="mmproj file not found"):
        mobius.build(str(model), tmp_path / "pkg", mmproj=str(tmp_path / "missing.gguf"))
    with pytest.raises(BuildError, match="SRC is no GGUF file"):
        mobius.build(str(ref), tmp_path / "pkg", mmproj=str(copy))
    assert not (tmp_path / "pkg").exists()


@pytest.mark.l2
def test_vision_only_mmproj_builds_without_audio(tmp_path):
    """A vision-only mmproj (26B-A4B / 31B have no audio tower): no audio_encoder, and
    the image features are those of the full pair's package."""
    pytest.importorskip("onnxruntime")
    import mobius
    from mobius_testing.lm_parity import load_pipeline

    (tmp_path / "full").mkdir()
    full, _ = _write_pair(tmp_path / "full", "F32")
    drop = {k: None for k in _mmproj_metadata(_tiny()[0]) if k.startswith("clip.audio.")}
    vision_only = tmp_path / "vision"
    vision_only.mkdir()
    folder, _ = _write_pair(
        vision_only,
        "F32",
        mmproj_meta={**drop, "clip.has_audio_encoder": False},
        edit=lambda enc: [e for e in enc if not e[0].startswith(("a.", "mm.a."))],
    )
    a = mobius.build(str(full), tmp_path / "a", dtype=None)
    b = mobius.build(str(folder), tmp_path / "b", dtype=None)
    assert "audio_encoder" in a.components and "audio_encoder" not in b.components
    media = {"images": [str(MEDIA / "tiny.png")]}
    port = "vision_encoder.image_features"
    _, want = _encoded(load_pipeline(a.out), "Describe this. <|image|>", **media)
    _, have = _encoded(load_pipeline(b.out), "Describe this. <|image|>", **media)
    np.testing.assert_array_equal(have[port], want[port])


@pytest.mark.l2
def test_a_per_dim_scale_that_is_no_softplus_is_refused(tmp_path):
    """``per_dim_scale`` is stored as a softplus (> 0); a value ≤ 0 cannot be undone and is
    refused naming the tensor, nothing written."""
    import mobius
    from mobius.errors import CheckpointError

    def negative(enc):
        return [(n, -d if n == "a.blk.1.per_dim_scale.weight" else d, t, hf)
                for n, d, t, hf in enc]  # fmt: skip

    folder, _ = _write_pair(tmp_path, "F32", edit=negative)
    out = tmp_path / "pkg"
    with pytest.raises(CheckpointError, match="not positive") as info:
        mobius.build(str(folder), out, dtype=None)
    assert "a.blk.1.per_dim_scale.weight" in info.value.where and "\n" not in info.value.what
    assert not out.exists()


@pytest.mark.l2
def test_cli_mmproj_option(tmp_path):
    """``mobius build MODEL.gguf OUT --mmproj FILE`` says which file it read; a second
    mmproj file beside the model leaves both alone, saying so; an unknown one exits 1."""
    from typer.testing import CliRunner

    from mobius.cli import make_app

    folder, _ = _write_pair(tmp_path, "F16")
    model = next(folder.glob("tiny-*.gguf"))
    mmproj = next(folder.glob("mmproj-*.gguf"))

    def run(*args: str):
        return CliRunner().invoke(make_app(), ["build", *args], env={"COLUMNS": "300"})

    named = run(str(model), str(tmp_path / "a"), "--mmproj", str(mmproj))
    assert named.exit_code == 0, named.output
    assert f"mmproj companion {mmproj}: read with the model" in named.output
    assert "built gemma4 package" in named.output
    (folder / "mmproj-copy.gguf").write_bytes(mmproj.read_bytes())
    two = run(str(folder), str(tmp_path / "b"))
    assert two.exit_code == 0, two.output
    assert "2 mmproj files beside the model" in two.output
    assert "built gemma4_text package" in two.output
    missing = run(str(model), str(tmp_path / "c"), "--mmproj", str(tmp_path / "no.gguf"))
    assert missing.exit_code == 1 and "mmproj file not found" in missing.output
    assert not (tmp_path / "c").exists()
