"""Llama GGUF files: a random tiny Llama written the way llama.cpp's converter writes it
(``llama.*`` keys, gguf-py tensor names, q / k rows permuted for its rope layout) builds to
the package of the safetensors checkpoint (the permutation undone)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TESTDATA

MOBIUS = str(Path(sys.executable).parent / "mobius")
HEADS, KV, HIDDEN, FFN, LAYERS, VOCAB = 4, 2, 64, 96, 2, 512
NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The q / k row order llama.cpp's converter stores for Llama (its rope layout)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_llama(root: Path) -> dict[str, np.ndarray]:
    """A random tiny Llama checkpoint (safetensors, numpy) with tiny-qwen3's tokenizer."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(21)
    head = HIDDEN // HEADS
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (HIDDEN,),
            p + "post_attention_layernorm.weight": (HIDDEN,),
            p + "self_attn.q_proj.weight": (HEADS * head, HIDDEN),
            p + "self_attn.k_proj.weight": (KV * head, HIDDEN),
            p + "self_attn.v_proj.weight": (KV * head, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, HEADS * head),
            p + "mlp.gate_proj.weight": (FFN, HIDDEN),
            p + "mlp.up_proj.weight": (FFN, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, FFN),
        }
    weights = {
        n: (
            1 + 0.1 * rng.standard_normal(s) if len(s) == 1 else 0.2 * rng.standard_normal(s)
        ).astype(np.float32)
        for n, s in shapes.items()
    }
    root.mkdir()
    save_file(weights, str(root / "model.safetensors"))
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": VOCAB,
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
        "eos_token_id": 2, "bos_token_id": 0,
    }  # fmt: skip
    (root / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (root / name).write_bytes((TESTDATA / "tiny-qwen3" / name).read_bytes())
    return weights


def llama_gguf(path: Path, folder: Path, weights: dict[str, np.ndarray], kind: str) -> Path:
    from mobius_testing.gguf_files import gpt2_tokenizer_metadata, write_gguf

    a = "llama"
    meta = {
        f"{a}.block_count": LAYERS, f"{a}.context_length": 256, f"{a}.embedding_length": HIDDEN,
        f"{a}.feed_forward_length": FFN, f"{a}.attention.head_count": HEADS,
        f"{a}.attention.head_count_kv": KV, f"{a}.rope.freq_base": 10000.0,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-5, f"{a}.rope.dimension_count": 16,
        **gpt2_tokenizer_metadata(folder, pre="gpt-2"),
    }  # fmt: skip
    tensors = [
        ("token_embd.weight", weights["model.embed_tokens.weight"], kind),
        ("output_norm.weight", weights["model.norm.weight"], kind),
    ]
    for name, array in weights.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", name)
        if m:
            if m[2] in ("self_attn.q_proj", "self_attn.k_proj"):
                array = llama_cpp_permute(array, HEADS if m[2].endswith("q_proj") else KV)
            tensors.append((f"blk.{m[1]}.{NAMES[m[2]]}.weight", array, kind))
    return write_gguf(path, a, meta, tensors)


def _build(source: Path, out: Path) -> Path:
    done = subprocess.run(
        [MOBIUS, "build", str(source), str(out), "--dtype", "f32"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.l2
@pytest.mark.parametrize("kind", ["F32", "F16"])
def test_llama_gguf_equals_the_safetensors_build(tmp_path, kind):
    pytest.importorskip("onnxruntime")
    from mobius_testing.lm_parity import load_pipeline, step_logits

    folder = tmp_path / "tiny-llama"
    weights = tiny_llama(folder)
    if kind == "F16":  # the float16 values, so both builds read the same numbers
        weights = {n: w.astype(np.float16).astype(np.float32) for n, w in weights.items()}
        from safetensors.numpy import save_file

        save_file(weights, str(folder / "model.safetensors"))
    path = llama_gguf(tmp_path / "tiny-llama.gguf", folder, weights, kind)
    ids = np.random.default_rng(4).integers(6, VOCAB, size=(1, 20), dtype=np.int64)
    ref = step_logits(load_pipeline(_build(folder, tmp_path / "st")), ids, 12)
    got = step_logits(load_pipeline(_build(path, tmp_path / "gguf")), ids, 12)
    delta = float(np.abs(ref - got).max())
    print(f"\n[llama gguf {kind}] max|Δ logits| vs safetensors build: {delta:.3e}")
    assert delta <= 1e-4
