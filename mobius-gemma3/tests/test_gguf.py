"""Gemma 3 GGUF files: written from testdata/tiny-gemma3 the way llama.cpp's
convert_hf_to_gguf.py writes them (``gemma3.*`` keys, its tensor names, every RMSNorm
weight stored as ``w + 1``), built with ``mobius build FILE.gguf``, equal to the
safetensors build.

Two departures from a real converted file, both because the tiny checkpoint is not a
released Gemma 3: it has an untied head, so the file carries ``output.weight`` (the
converter drops ``lm_head``; the tied case is tested on its own below), and every third
layer is global, not every sixth, so the file carries gguf-py's
``gemma3.attention.sliding_window_pattern`` (3).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TESTDATA

TINY = TESTDATA / "tiny-gemma3"
MOBIUS = str(Path(sys.executable).parent / "mobius")

NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
"""HF → llama.cpp layer tensor names (gguf-py's tensor_mapping for GEMMA3)."""


def _weights() -> dict[str, np.ndarray]:
    from mobius.checkpoint import open_local

    ckpt = open_local(TINY)
    return {name: ckpt.read(name).astype(np.float32) for name in ckpt.tensors}


def _gemma3_gguf(path, ggml_type: str, *, head: bool = True, embed_rows: int | None = None):
    """A Gemma 3 GGUF of the tiny checkpoint, 2-D tensors in ``ggml_type``; ``head``:
    keep ``output.weight``; ``embed_rows``: cut ``token_embd`` to that many rows."""
    from mobius_testing.gguf_files import gpt2_tokenizer_metadata, write_gguf

    cfg = json.loads((TINY / "config.json").read_text())
    weights = _weights()
    a = "gemma3"
    meta = {
        "general.name": "tiny-gemma3",
        f"{a}.block_count": cfg["num_hidden_layers"],
        f"{a}.context_length": cfg["max_position_embeddings"],
        f"{a}.embedding_length": cfg["hidden_size"],
        f"{a}.feed_forward_length": cfg["intermediate_size"],
        f"{a}.attention.head_count": cfg["num_attention_heads"],
        f"{a}.attention.head_count_kv": cfg["num_key_value_heads"],
        f"{a}.rope.freq_base": float(cfg["rope_parameters"]["full_attention"]["rope_theta"]),
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"]),
        f"{a}.attention.key_length": cfg["head_dim"],
        f"{a}.attention.value_length": cfg["head_dim"],
        f"{a}.attention.sliding_window": cfg["sliding_window"],
        f"{a}.attention.sliding_window_pattern": cfg["sliding_window_pattern"],
        **gpt2_tokenizer_metadata(TINY, pre="gpt-2"),
    }

    def stored(name: str, array: np.ndarray) -> np.ndarray:
        return array + 1.0 if name.endswith("norm.weight") else array  # llama.cpp's w + 1

    embed = weights["model.embed_tokens.weight"][:embed_rows]
    tensors = [
        ("token_embd.weight", embed, ggml_type),
        ("output_norm.weight", stored("norm.weight", weights["model.norm.weight"]), ggml_type),
    ]
    if head:
        tensors.append(("output.weight", weights["lm_head.weight"], ggml_type))
    for name, array in weights.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", name)
        if m:
            tensors.append((f"blk.{m[1]}.{NAMES[m[2]]}.weight", stored(name, array), ggml_type))
    return write_gguf(path, a, meta, tensors)


def _build(path: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MOBIUS, "build", str(path), str(out), *extra],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def gguf_builds(tmp_path_factory):
    """type -> (gguf file, package built with --dtype f32), built through the CLI."""
    root = tmp_path_factory.mktemp("gemma3-gguf")
    out = {}
    for kind in ("F32", "F16", "Q8_0"):
        path = _gemma3_gguf(root / f"tiny-gemma3-{kind}.gguf", kind)
        package = root / f"pkg-{kind}"
        done = _build(path, package, "--dtype", "f32")
        assert done.returncode == 0, done.stderr[-3000:]
        out[kind] = (path, package)
    return out


@pytest.mark.l2
@pytest.mark.parametrize("kind", ["F32", "F16", "Q8_0"])
def test_gguf_package_equals_safetensors_build(gguf_builds, mobius_build, kind):
    pytest.importorskip("onnxruntime")
    from mobius_testing.lm_parity import assert_gguf_matches, load_pipeline

    ref_pipe = load_pipeline(mobius_build(TINY, dtype="f32"))
    gguf_pipe = load_pipeline(gguf_builds[kind][1])
    # the bf16 checkpoint's values (norms + 1 included) are exact in f16 / f32
    assert_gguf_matches(ref_pipe, gguf_pipe, kind, "gemma3", seed=11)


@pytest.mark.l2
def test_gguf_config_is_the_checkpoints(gguf_builds):
    """The translated config has the checkpoint's shape, layer pattern, both ropes, the
    attention scale and the head; the tokenizer gives the checkpoint's ids."""
    tokenizers = pytest.importorskip("tokenizers")
    from mobius.package import MANIFEST_NAME

    package = gguf_builds["F32"][1]
    translated = json.loads((package / MANIFEST_NAME).read_text())["config"]
    truth = json.loads((TINY / "config.json").read_text())
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings",
                "max_position_embeddings", "rms_norm_eps", "sliding_window", "layer_types",
                "query_pre_attn_scalar", "rope_parameters", "bos_token_id"):  # fmt: skip
        assert translated[key] == truth[key], key
    mine = tokenizers.Tokenizer.from_file(str(package / "tokenizer.json"))
    theirs = tokenizers.Tokenizer.from_file(str(TINY / "tokenizer.json"))
    for text in ["We hold these truths", "  spaces\tand\nnew lines  ", "ünïcödé ✓ 123",
                 "<start_of_turn>user\nhi<end_of_turn>"]:  # fmt: skip
        assert mine.encode(text).ids == theirs.encode(text).ids, text


@pytest.mark.l2
def test_tied_file_with_a_cut_embedding(tmp_path):
    """As the converter writes a real Gemma 3: no ``output.weight`` (tied head) and, here,
    ``token_embd`` cut below the tokenizer's 512 ids: the embedding is padded back with
    zero rows, the norms come back as HF's ``w`` (the stored ``w + 1`` undone), and the
    layer pattern defaults to every 6th layer global when the file names none."""
    import gguf

    from mobius.plugins import PluginHost
    from mobius_gemma3.plugin import FAMILY

    path = _gemma3_gguf(tmp_path / "tied.gguf", "F32", head=False, embed_rows=500)
    host = PluginHost.from_plugins({"gemma3": FAMILY})
    ckpt = host.open_checkpoint(str(path), None)
    assert ckpt.raw_config["tie_word_embeddings"] is True and ckpt.raw_config["vocab_size"] == 512
    assert "lm_head.weight" not in ckpt.tensors
    weights = _weights()
    embed = ckpt.read("model.embed_tokens.weight")
    assert embed.shape == (512, 64)
    np.testing.assert_array_equal(embed[:500], weights["model.embed_tokens.weight"][:500])
    assert not embed[500:].any()
    for name in ("model.norm.weight", "model.layers.2.self_attn.k_norm.weight",
                 "model.layers.5.post_feedforward_layernorm.weight"):  # fmt: skip
        np.testing.assert_allclose(ckpt.read(name), weights[name], atol=1e-6)

    # the same file without the pattern key: llama.cpp's default, every 6th layer global
    reader = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    del meta["gemma3.attention.sliding_window_pattern"]
    from mobius_gemma3.gguf import translate

    shapes = {t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}
    config = translate("gemma3", meta, shapes).config
    assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    assert config["rope_parameters"]["sliding_attention"]["rope_theta"] == 10_000.0
    assert translate("qwen3", meta, shapes) is None


@pytest.mark.l2
def test_gguf_with_a_tensor_gemma3_does_not_know(tmp_path):
    """A tensor name outside Gemma 3's is refused in one line, nothing written; a file
    without a required key is refused naming it."""
    from mobius.errors import CheckpointError
    from mobius_gemma3.gguf import translate

    with pytest.raises(CheckpointError, match=r"gemma3\.block_count"):
        translate("gemma3", {"gemma3.embedding_length": 64}, {})
    from mobius_testing.gguf_files import write_gguf

    path = write_gguf(
        tmp_path / "odd.gguf",
        "gemma3",
        {"gemma3.block_count": 1, "gemma3.embedding_length": 8,
         "gemma3.feed_forward_length": 16, "gemma3.attention.head_count": 1},
        [("token_embd.weight", np.zeros((4, 8), np.float32), "F32"),
         ("blk.0.ffn_gate_inp.weight", np.zeros((4, 8), np.float32), "F32")],
    )  # fmt: skip
    out = tmp_path / "pkg"
    done = _build(path, out)
    assert done.returncode != 0
    assert "blk.0.ffn_gate_inp.weight" in done.stderr and "not ones the family knows" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()
