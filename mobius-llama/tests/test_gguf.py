"""Llama GGUF files: written from a tiny random checkpoint the way llama.cpp's
convert_hf_to_gguf.py writes them (``llama.*`` keys, its tensor names, q and k rows
permuted for its rope layout), built with ``mobius build FILE.gguf``, equal to the
safetensors build of the same checkpoint."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_package import _checkpoint

from mobius_testing import lm_parity as lp

MOBIUS = str(Path(sys.executable).parent / "mobius")
LAYER_NAMES = {
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


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (q with the attention heads, k with the KV heads)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama_gguf(
    folder: Path, path: Path, ggml_type: str, *, permute: bool = True, extra=()
) -> Path:
    """The GGUF llama.cpp writes for ``folder`` (``permute=False``: q/k rows left in HF
    order, which llama.cpp never does; ``extra``: more (name, array, type) tensors)."""
    from mobius.checkpoint import open_local
    from mobius_testing.gguf_files import gpt2_tokenizer_metadata, write_gguf

    cfg = json.loads((folder / "config.json").read_text())
    ckpt = open_local(folder)
    weights = {name: ckpt.read(name).astype(np.float32) for name in ckpt.tensors}
    a = "llama"
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    meta = {
        "general.name": "tiny-llama",
        f"{a}.vocab_size": cfg["vocab_size"],
        f"{a}.block_count": cfg["num_hidden_layers"],
        f"{a}.context_length": cfg["max_position_embeddings"],
        f"{a}.embedding_length": cfg["hidden_size"],
        f"{a}.feed_forward_length": cfg["intermediate_size"],
        f"{a}.attention.head_count": heads,
        f"{a}.attention.head_count_kv": kv,
        f"{a}.rope.freq_base": float(cfg.get("rope_theta", 10000.0)),
        f"{a}.rope.dimension_count": cfg["hidden_size"] // heads,
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"]),
        **gpt2_tokenizer_metadata(folder, pre="gpt-2"),
    }
    scaling = cfg.get("rope_scaling")
    if scaling:
        meta[f"{a}.rope.scaling.type"] = scaling["rope_type"]
        meta[f"{a}.rope.scaling.factor"] = float(scaling["factor"])
    tensors = [
        ("token_embd.weight", weights["model.embed_tokens.weight"], ggml_type),
        ("output_norm.weight", weights["model.norm.weight"], ggml_type),
    ]
    if "lm_head.weight" in weights:
        tensors.append(("output.weight", weights["lm_head.weight"], ggml_type))
    for name, array in weights.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", name)
        if m:
            if permute and m[2] == "self_attn.q_proj":
                array = _permute(array, heads)
            elif permute and m[2] == "self_attn.k_proj":
                array = _permute(array, kv)
            # llama.cpp falls back to F16 where a row is not whole blocks (ffn_down: 48)
            kind = "F16" if ggml_type == "Q8_0" and array.shape[-1] % 32 else ggml_type
            tensors.append((f"blk.{m[1]}.{LAYER_NAMES[m[2]]}.weight", array, kind))
    return write_gguf(path, a, meta, [*tensors, *extra])


def _build(source: Path, out: Path) -> Path:
    done = subprocess.run(
        [MOBIUS, "build", str(source), str(out), "--dtype", "f32"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out


CASES = {
    "untied": {},
    "tied-linear-rope": {
        "tie_word_embeddings": True,
        "rope_theta": 50_000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    },
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama-gguf")
    out = {}
    for case, extra in CASES.items():
        folder = _checkpoint(root / case, "llama", **extra)
        _f16_exact(folder, tied=bool(extra.get("tie_word_embeddings")))
        out[case] = (folder, _build(folder, root / f"{case}-safetensors"))
    return out


def _f16_exact(folder: Path, tied: bool) -> None:
    """Weights that float16 holds exactly (so an F16 file is the same model), and no
    ``lm_head.weight`` when the head is tied."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    if tied:
        del tensors["lm_head.weight"]
    exact = {k: v.astype(np.float16).astype(np.float32) for k, v in tensors.items()}
    save_file(exact, str(folder / "model.safetensors"))


@pytest.mark.l2
@pytest.mark.parametrize("kind", ["F32", "F16", "Q8_0"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_gguf_package_equals_safetensors_build(checkpoints, tmp_path, case, kind):
    pytest.importorskip("onnxruntime")
    folder, reference = checkpoints[case]
    path = _llama_gguf(folder, tmp_path / f"{case}-{kind}.gguf", kind)
    package = _build(path, tmp_path / "pkg")
    from mobius.package import MANIFEST_NAME

    config = json.loads((package / MANIFEST_NAME).read_text())["config"]
    assert config["tie_word_embeddings"] is (case != "untied")
    assert config["num_key_value_heads"] == 2 and config["vocab_size"] == 512
    ref_pipe, gguf_pipe = lp.load_pipeline(reference), lp.load_pipeline(package)
    lp.assert_gguf_matches(ref_pipe, gguf_pipe, kind, f"llama {case}", seed=17)


@pytest.mark.l2
def test_unpermuted_q_k_would_differ(checkpoints, tmp_path):
    """The permutation is real: a file whose q/k rows are left in HF order (not what
    llama.cpp writes) builds a different model, so the equality above tests the undo."""
    folder, reference = checkpoints["untied"]
    path = _llama_gguf(folder, tmp_path / "plain.gguf", "F32", permute=False)
    ids = np.random.default_rng(17).integers(6, 512, size=(1, 24), dtype=np.int64)
    ref = lp.step_logits(lp.load_pipeline(reference), ids, 16)
    got = lp.step_logits(lp.load_pipeline(_build(path, tmp_path / "pkg")), ids, 16)
    assert float(np.abs(ref - got).max()) > 1e-2


@pytest.mark.l2
def test_llama31_rope_factors_are_refused(checkpoints, tmp_path):
    """``rope_freqs.weight`` (Llama 3.1's precomputed rope factors) is refused in one
    line, nothing written."""
    folder, _ = checkpoints["untied"]
    rope = ("rope_freqs.weight", np.ones(4, np.float32), "F32")
    path = _llama_gguf(folder, tmp_path / "rope.gguf", "F32", extra=[rope])
    out = tmp_path / "pkg"
    done = subprocess.run(
        [MOBIUS, "build", str(path), str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "rope_freqs.weight" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()
