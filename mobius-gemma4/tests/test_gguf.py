"""Gemma 4 text GGUF files (llama.cpp architecture ``gemma4``) in F32, F16, Q8_0, Q4_0 and
Q4_K (hand-built blocks: gguf has no Q4_K quantizer).

A seeded random ``gemma4_text`` checkpoint of testdata/tiny-gemma4's shape (sliding and
full layers with their own head dims, per-layer embeddings, KV-sharing layers with a
double-wide MLP, softcapped logits; hidden 256 so that Q4_K applies to most matrices,
values exact in float16) is written the way llama.cpp's convert_hf_to_gguf.py writes it
(``Gemma4Model``: ``gemma4.*`` keys, per-layer ``feed_forward_length`` and
``sliding_window_pattern``, tensor names, ``rope_freqs``, no norm shift, 1-D tensors
F32, rows no block divides in llama.cpp's fallback type). The package built from the file
equals the safetensors build of the checkpoint holding gguf's own dequantization of the
file's tensors (logits within 1e-4, greedy ids equal), with the file's quantization kept
(the default) and with ``--dtype f32``; for F32 / F16 that checkpoint is the original.

HF transformers 5.24's GGUF loader (``AutoModelForCausalLM.from_pretrained(folder,
gguf_file=...)``) does not load these files on their own metadata: the per-layer
``gemma4.feed_forward_length`` of a double-wide file fails with
"StrictDataclassFieldValidationError: Validation error for field 'intermediate_size':
TypeError: Field 'intermediate_size' expected int, got list (value: [256, 256, 256, 256,
512, 512])"; and a MoE file (test_gguf_moe.py) with "RuntimeError: You set
`ignore_mismatched_sizes` to `False`, thus raising an error" (it reads neither
``attention.key_length_swa`` nor ``per_layer_config``: q/k/v/o and q/k norms sized for
head dim 256, the per-layer-input tensors expected though the file has none). Given the
checkpoint's config.json it loads, but maps no ``blk.{i}.layer_output_scale`` (HF
``layer_scalar`` left at its initial value, "MISSING" in its load report), and for MoE
files none of ``ffn_gate_inp.scale``, ``ffn_down_exps.scale``, ``ffn_gate_up_exps``,
``ffn_down_exps`` (router scales and every expert table MISSING: max|Δ logits| 7.0 against
the package). So the reference test here (:func:`test_gguf_matches_hf_gguf_loader`) is
the dense file through HF's loader with the checkpoint's config, its ``layer_scalar``
values set from the file (the one tensor HF does not map); HF's loader is no reference
for the MoE tensors.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

TINY = Path(__file__).resolve().parents[2] / "testdata" / "tiny-gemma4"
KINDS = ["F32", "F16", "Q8_0", "Q4_0", "Q4_K"]
FLOAT_KINDS = ("F32", "F16")
HIDDEN, INTER = 256, 256


def _config() -> dict:
    cfg = json.loads((TINY / "config.json").read_text())
    cfg.update(hidden_size=HIDDEN, intermediate_size=INTER)
    return cfg


def _geometry(cfg: dict):
    layers = cfg["num_hidden_layers"]
    full = [t == "full_attention" for t in cfg["layer_types"]]
    head_dim = [cfg["per_layer_config"].get(str(i), {}).get("head_dim", cfg["head_dim"])
                for i in range(layers)]  # fmt: skip
    producers = layers - cfg["num_kv_shared_layers"]
    ff = [INTER * (2 if cfg["use_double_wide_mlp"] and i >= producers else 1)
          for i in range(layers)]  # fmt: skip
    return layers, full, head_dim, producers, ff


def _weights(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    """HF ``gemma4_text`` tensors of ``cfg``, random and exact in float16."""
    rng = np.random.default_rng(seed)
    layers, _, head_dim, producers, ff = _geometry(cfg)
    V, H, P = cfg["vocab_size"], HIDDEN, cfg["hidden_size_per_layer_input"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    shapes = {
        "model.embed_tokens.weight": (V, H),
        "model.embed_tokens_per_layer.weight": (V, layers * P),
        "model.per_layer_model_projection.weight": (layers * P, H),
        "model.per_layer_projection_norm.weight": (P,),
        "model.norm.weight": (H,),
    }
    for i in range(layers):
        p, d = f"model.layers.{i}.", head_dim[i]
        shapes[p + "layer_scalar"] = (1,)
        for n in ("input", "post_attention", "pre_feedforward", "post_feedforward"):
            shapes[p + f"{n}_layernorm.weight"] = (H,)
        shapes.update({
            p + "self_attn.q_proj.weight": (heads * d, H), p + "self_attn.q_norm.weight": (d,),
            p + "self_attn.o_proj.weight": (H, heads * d),
            p + "mlp.gate_proj.weight": (ff[i], H), p + "mlp.up_proj.weight": (ff[i], H),
            p + "mlp.down_proj.weight": (H, ff[i]),
            p + "per_layer_input_gate.weight": (P, H), p + "per_layer_projection.weight": (H, P),
            p + "post_per_layer_input_norm.weight": (H,),
        })  # fmt: skip
        if i < producers:
            shapes.update({p + "self_attn.k_proj.weight": (kv * d, H),
                           p + "self_attn.v_proj.weight": (kv * d, H),
                           p + "self_attn.k_norm.weight": (d,)})  # fmt: skip
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[-1]) * (2.0 if "embed" in name else 1.0)
        out[name] = w.astype(np.float16).astype(np.float32)
    return out


def gemma4_gguf(root, kind: str, seed: int = 3, extra=(), tokenizer: str = "gpt2", like=TINY):
    """(GGUF file, checkpoint folder of gguf's dequantization of its tensors).

    ``tokenizer``: ``gpt2`` writes the tiny checkpoint's byte-level BPE as llama.cpp
    writes a gpt2 vocab; ``gemma4`` rewrites it into Gemma 4's shape
    (:func:`~mobius_testing.gguf_files.gemma_style_tokenizer`, then also the
    checkpoint's tokenizer) and writes it as ``Gemma4Model.set_vocab`` does."""
    from mobius_testing.gguf_files import (
        gemma4_tokenizer_metadata,
        gemma_style_tokenizer,
        gpt2_tokenizer_metadata,
        llamacpp_name,
        write_checkpoint,
        write_gguf_dequantized,
    )

    if tokenizer == "gemma4":
        like = gemma_style_tokenizer(like, root / f"{like.name}-gemma-tokenizer")
        vocab = gemma4_tokenizer_metadata(like)
    else:
        vocab = gpt2_tokenizer_metadata(like, pre="gpt-2")

    cfg = _config()
    weights = _weights(cfg, seed)
    layers, full, head_dim, _, ff = _geometry(cfg)
    rope = cfg["rope_parameters"]
    a = "gemma4"
    full_dim = max(head_dim)
    swa_dim = min(head_dim)
    meta = {
        "general.name": "tiny-gemma4-256",
        f"{a}.context_length": cfg["max_position_embeddings"],
        f"{a}.embedding_length": HIDDEN,
        f"{a}.block_count": layers,
        f"{a}.feed_forward_length": ff,
        f"{a}.attention.head_count": cfg["num_attention_heads"],
        f"{a}.attention.head_count_kv": cfg["num_key_value_heads"],
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"]),
        f"{a}.rope.freq_base": float(rope["full_attention"]["rope_theta"]),
        f"{a}.final_logit_softcapping": float(cfg["final_logit_softcapping"]),
        f"{a}.attention.sliding_window": cfg["sliding_window"],
        f"{a}.attention.shared_kv_layers": cfg["num_kv_shared_layers"],
        f"{a}.embedding_length_per_layer_input": cfg["hidden_size_per_layer_input"],
        f"{a}.attention.sliding_window_pattern": [not f for f in full],
        f"{a}.attention.key_length": full_dim,
        f"{a}.attention.value_length": full_dim,
        f"{a}.attention.key_length_swa": swa_dim,
        f"{a}.attention.value_length_swa": swa_dim,
        f"{a}.rope.dimension_count": full_dim,
        f"{a}.rope.dimension_count_swa": swa_dim,
        **vocab,
    }
    rotated = int(full_dim * rope["full_attention"]["partial_rotary_factor"] / 2)
    freqs = np.array([1.0] * rotated + [1e30] * (full_dim // 2 - rotated), np.float32)
    tensors = [("rope_freqs.weight", freqs, "F32")]
    names = {hf: llamacpp_name(a, hf, layers) for hf in weights}  # gguf-py's names
    tensors += [(names[hf], w, kind) for hf, w in weights.items()]
    path = root / f"{a}-{kind}.gguf"
    back = write_gguf_dequantized(path, a, meta, [*tensors, *extra], np.random.default_rng(seed))
    dequantized = {hf: back[names[hf]].reshape(w.shape) for hf, w in weights.items()}
    if kind in FLOAT_KINDS:
        for hf, w in weights.items():
            np.testing.assert_array_equal(dequantized[hf], w)
    return path, write_checkpoint(root / f"{a}-{kind}-dequantized", cfg, dequantized, like)


def _build(path, out, dtype=None):
    """``mobius build FILE OUT`` (dtype None: the file's quantization kept, the CLI's
    default; ``mobius.build``'s own default is f32)."""
    import mobius

    mobius.build(str(path), out, dtype=dtype)
    return out


@pytest.mark.l2
@pytest.mark.parametrize("kind", KINDS)
def test_gguf_kinds_equal_the_dequantized_checkpoint(mobius_build, tmp_path, kind):
    pytest.importorskip("onnxruntime")
    from mobius.package import MANIFEST_NAME
    from mobius_testing.lm_parity import assert_gguf_matches, load_pipeline

    path, dequantized = gemma4_gguf(tmp_path, kind)
    ref = load_pipeline(mobius_build(dequantized, dtype="f32"))
    kept = _build(path, tmp_path / "kept")
    versus = f"{kind} (vs gguf's dequantization)"
    assert_gguf_matches(ref, load_pipeline(kept), versus, "gemma4 kept", seed=9)
    manifest = json.loads((kept / MANIFEST_NAME).read_text())
    config, truth = manifest["config"], _config()
    assert config["model_type"] == "gemma4_text"
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "sliding_window", "layer_types",
                "num_kv_shared_layers", "hidden_size_per_layer_input", "use_double_wide_mlp",
                "final_logit_softcapping", "vocab_size", "tie_word_embeddings",
                "rope_parameters", "attention_k_eq_v"):  # fmt: skip
        assert config[key] == truth[key], key
    assert config["global_head_dim"] == truth["per_layer_config"]["2"]["head_dim"]
    if kind in FLOAT_KINDS:
        return
    quant = manifest["quantization"]["components"]["model"]
    sources = {entry["source_type"] for entry in quant["tensors"].values()}
    assert kind in sources, sources  # the file's blocks are kept
    f32 = _build(path, tmp_path / "f32", dtype="f32")
    assert_gguf_matches(ref, load_pipeline(f32), versus, "gemma4 --dtype f32", seed=9)


TOKENIZER_TEXTS = [
    "Hello world, the nation was conceived in Liberty.",
    "  leading, trailing   and\n\n\trunning   whitespace  ",
    "héllo wörld — 日本語 🙂 ½ ÿ",
    "def f(x):\n    return {'a': x**2 + 1}  # côde\n",
    "<|turn>user\nHi there<turn|>\n<|turn>model\n",
    "<bos><eos><pad><mask><unk> not special: <|turnx> <turn|",
]


@pytest.mark.l2
@pytest.mark.parametrize("like", ["tiny-gemma4", "tiny-gemma4-mm"])
def test_gemma4_tokenizer_from_gguf_metadata(mobius_build, tmp_path, like):
    """A Gemma 4 GGUF's own tokenizer (``tokenizer.ggml.model`` ``gemma4``, as llama.cpp's
    ``Gemma4Model.set_vocab`` writes it) becomes a ``tokenizer.json`` giving the source
    tokenizer's ids (and text back) on unicode, whitespace runs, code and the special
    markers; the package generates the safetensors build's greedy ids from text."""
    pytest.importorskip("onnxruntime")
    tokenizers = pytest.importorskip("tokenizers")
    from mobius.checkpoint import gguf_tokenizer
    from mobius_testing.lm_parity import assert_gguf_matches, load_pipeline

    if "gemma4" not in getattr(gguf_tokenizer, "MODELS", ()):  # compat-*-corefloor rows
        pytest.skip("the installed mobius-core (before 0.1.6) reads no gemma4 tokenizer")
    root = TINY.parent / like
    path, checkpoint = gemma4_gguf(tmp_path, "F32", tokenizer="gemma4", like=root)
    package = _build(path, tmp_path / "pkg")
    mine = tokenizers.Tokenizer.from_file(str(package / "tokenizer.json"))
    theirs = tokenizers.Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    assert json.loads(theirs.to_str())["model"]["byte_fallback"]  # Gemma's shape
    for text in TOKENIZER_TEXTS:
        want = theirs.encode(text).ids
        assert mine.encode(text).ids == want, text
        assert want[0] == 2  # <bos> added, as Gemma's tokenizer does
        assert mine.decode(want) == theirs.decode(want), text
    assert 5 in theirs.encode(TOKENIZER_TEXTS[4]).ids  # <|turn> is one control token
    tcfg = json.loads((package / "tokenizer_config.json").read_text())
    assert (tcfg["bos_token"], tcfg["eos_token"], tcfg["add_bos_token"]) == ("<bos>", "<eos>", True)
    ref = load_pipeline(mobius_build(checkpoint, dtype="f32"))
    got = load_pipeline(package)
    assert_gguf_matches(ref, got, "F32", "gemma4 gemma4-tokenizer", seed=9)
    prompt = TOKENIZER_TEXTS[3]
    want = ref.generate(prompt=prompt, max_new_tokens=12)
    result = got.generate(prompt=prompt, max_new_tokens=12)
    assert result.ids == want.ids and result.text == want.text


@pytest.mark.l2
def test_gemma4_gguf_with_a_tensor_the_family_does_not_know(tmp_path):
    """A shared-expert tensor (qwen2moe's; Gemma 4 has none) is refused in one line naming
    the tensor and the file; nothing is written."""
    from mobius.errors import CheckpointError

    extra = [("blk.0.ffn_gate_shexp.weight", np.zeros((4, HIDDEN), np.float32), "F32")]
    path, _ = gemma4_gguf(tmp_path, "F32", extra=extra)
    out = tmp_path / "pkg"
    with pytest.raises(CheckpointError) as info:
        _build(path, out)
    error = info.value
    assert "blk.0.ffn_gate_shexp.weight" in error.what and "\n" not in error.what
    assert str(path) in error.where and error.fix
    assert not out.exists()


@pytest.mark.l2
@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("gemma4.attention.sliding_window_pattern", None, r"has no gemma4\.attention\.sliding"),
        ("gemma4.feed_forward_length", [256, 256, 256], r"not one int or one per layer"),
    ],
)
def test_gemma4_gguf_bad_metadata(tmp_path, key, value, match):
    """A missing or malformed Gemma 4 key is refused naming it."""
    from mobius.checkpoint.gguf import read_gguf
    from mobius.errors import CheckpointError
    from mobius_gemma4.gguf import translate

    path, _ = gemma4_gguf(tmp_path, "F32")
    metadata, tensors = read_gguf(path)
    metadata = dict(metadata)
    if value is None:
        del metadata[key]
    else:
        metadata[key] = value
    with pytest.raises(CheckpointError, match=match):
        translate("gemma4", metadata, {t.name: t.shape for t in tensors})


@pytest.mark.l3
@pytest.mark.reference
@pytest.mark.parametrize("kind", ["F32", "Q4_0"])
def test_gguf_matches_hf_gguf_loader(tmp_path, kind):
    """The package built from a Gemma 4 file (its blocks kept) gives the logits of HF's
    GGUF loader on the same file (HF's tensor mapping and gguf's dequantization, float32;
    the checkpoint's config, and ``layer_scalar`` from the file's ``layer_output_scale``,
    which HF 5.24 does not map), within 1e-4, top-1 equal everywhere."""
    from mobius_testing.reference import hf_gguf_model, missing_reference

    if (reason := missing_reference()) is not None:
        pytest.skip(reason)
    import torch

    from mobius_testing.lm_parity import load_pipeline, step_logits

    path, dequantized = gemma4_gguf(tmp_path, kind)
    hf = hf_gguf_model(path, config=dequantized)
    import gguf

    reader = gguf.GGUFReader(path)
    scales = {t.name: np.array(t.data, np.float32) for t in reader.tensors
              if t.name.endswith(".layer_output_scale.weight")}  # fmt: skip
    assert len(scales) == len(hf.model.layers)
    with torch.no_grad():
        for i, layer in enumerate(hf.model.layers):
            layer.layer_scalar.copy_(torch.from_numpy(scales[f"blk.{i}.layer_output_scale.weight"]))
    ids = np.random.default_rng(3).integers(6, 512, size=(1, 24), dtype=np.int64)
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids)).logits.numpy()
    got = step_logits(load_pipeline(_build(path, tmp_path / "kept")), ids, 16)
    delta = float(np.abs(ref - got).max())
    print(f"\n[L3] gemma4 GGUF {kind} vs HF's GGUF loader: max|Δ| {delta:.3e}")
    assert delta <= 1e-4
    assert (ref.argmax(-1) == got.argmax(-1)).all()
