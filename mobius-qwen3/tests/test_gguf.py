"""Qwen3 GGUF files: written from testdata/tiny-qwen3 the way llama.cpp's
convert_hf_to_gguf.py writes them, built with ``mobius build FILE.gguf``, equal to the
safetensors build."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TESTDATA

TINY = TESTDATA / "tiny-qwen3"
MOBIUS = str(Path(sys.executable).parent / "mobius")


def _qwen3_gguf(path, ggml_type: str):
    """A Qwen3 GGUF of the tiny checkpoint: llama.cpp's ``qwen3.*`` keys, tensor names,
    no permutation (Qwen is not permuted), 2-D tensors in ``ggml_type``."""
    from mobius.checkpoint import open_local
    from mobius_testing.gguf_files import gpt2_tokenizer_metadata, write_gguf

    cfg = json.loads((TINY / "config.json").read_text())
    ckpt = open_local(TINY)
    weights = {name: ckpt.read(name).astype(np.float32) for name in ckpt.tensors}
    a = "qwen3"
    meta = {
        "general.name": "tiny-qwen3",
        f"{a}.block_count": cfg["num_hidden_layers"],
        f"{a}.context_length": cfg["max_position_embeddings"],
        f"{a}.embedding_length": cfg["hidden_size"],
        f"{a}.feed_forward_length": cfg["intermediate_size"],
        f"{a}.attention.head_count": cfg["num_attention_heads"],
        f"{a}.attention.head_count_kv": cfg["num_key_value_heads"],
        f"{a}.rope.freq_base": float(cfg["rope_parameters"]["rope_theta"]),
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"]),
        f"{a}.attention.key_length": cfg["head_dim"],
        f"{a}.attention.value_length": cfg["head_dim"],
        **gpt2_tokenizer_metadata(TINY, pre="gpt-2"),
    }
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    tensors = [
        ("token_embd.weight", weights["model.embed_tokens.weight"], ggml_type),
        ("output_norm.weight", weights["model.norm.weight"], ggml_type),
    ]
    for name, array in weights.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", name)
        if m:
            tensors.append((f"blk.{m[1]}.{names[m[2]]}.weight", array, ggml_type))
    return write_gguf(path, a, meta, tensors)


@pytest.fixture(scope="module")
def gguf_builds(tmp_path_factory):
    """type -> (gguf file, package built with --dtype f32), built through the CLI."""
    root = tmp_path_factory.mktemp("qwen3-gguf")
    out = {}
    for kind in ("F32", "F16", "Q8_0"):
        path = _qwen3_gguf(root / f"tiny-qwen3-{kind}.gguf", kind)
        package = root / f"pkg-{kind}"
        done = subprocess.run(
            [MOBIUS, "build", str(path), str(package),
             "--dtype", "f32"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
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
    assert_gguf_matches(ref_pipe, gguf_pipe, kind, "qwen3", seed=11)


@pytest.mark.l2
def test_gguf_package_tokenizer_and_template(gguf_builds):
    """tokenizer.json made from the metadata gives the checkpoint's ids; the chat template
    and the eos id come across."""
    tokenizers = pytest.importorskip("tokenizers")
    package = gguf_builds["F32"][1]
    mine = tokenizers.Tokenizer.from_file(str(package / "tokenizer.json"))
    theirs = tokenizers.Tokenizer.from_file(str(TINY / "tokenizer.json"))
    for text in ["We hold these truths", "  spaces\tand\nnew lines  ", "ünïcödé ✓ 123",
                 "<|im_start|>user\nhi<|im_end|>", "def f(x):\n    return x**2"]:  # fmt: skip
        assert mine.encode(text).ids == theirs.encode(text).ids, text
        assert mine.decode(mine.encode(text).ids) == theirs.decode(theirs.encode(text).ids)
    template = (package / "chat_template.jinja").read_text()
    assert template == (TINY / "chat_template.jinja").read_text()
    generation = json.loads((package / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2]
    tcfg = json.loads((package / "tokenizer_config.json").read_text())
    assert tcfg["eos_token"] == "<|im_end|>" and tcfg["add_bos_token"] is False
    from mobius.package import MANIFEST_NAME

    manifest = json.loads((package / MANIFEST_NAME).read_text())
    assert manifest["source"]["kind"] == "gguf"
    assert list(manifest["source"]["files"]) == ["tiny-qwen3-F32.gguf"]
    assert manifest["config"]["tie_word_embeddings"] is True


@pytest.mark.l2
def test_gguf_with_a_tensor_qwen3_does_not_know(tmp_path):
    """A tensor name outside Qwen3's is refused in one line, nothing written."""
    import gguf

    path = _qwen3_gguf(tmp_path / "q.gguf", "F32")
    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(str(tmp_path / "extra.gguf"), "qwen3")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, value, kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, kind)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.add_tensor("blk.0.ffn_gate_inp.weight", np.zeros((4, 64), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    out = tmp_path / "pkg"
    done = subprocess.run(
        [MOBIUS, "build", str(tmp_path / "extra.gguf"), str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "blk.0.ffn_gate_inp.weight" in done.stderr and "not ones the family knows" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()


@pytest.mark.l3
@pytest.mark.reference
def test_gguf_package_matches_hf_gguf_loader(gguf_builds):
    """The config the translation builds is the checkpoint's; HF transformers' own GGUF
    loader is the reference for the weights (its tensor mapping and dequantization) and the
    tokenizer. HF 5.24 reads no ``qwen3.attention.key_length`` (head_dim falls back to
    Qwen3's 128, wrong for this tiny model), so it gets the checkpoint's config.json."""
    from mobius_testing.reference import hf_gguf_model, missing_reference

    if (reason := missing_reference()) is not None:
        pytest.skip(reason)
    import torch
    from transformers import AutoTokenizer

    from mobius_testing.lm_parity import load_pipeline, step_logits

    path, package = gguf_builds["F32"]
    from mobius.package import MANIFEST_NAME

    translated = json.loads((package / MANIFEST_NAME).read_text())["config"]
    truth = json.loads((TINY / "config.json").read_text())
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings",
                "max_position_embeddings", "rms_norm_eps", "eos_token_id"):  # fmt: skip
        assert translated[key] == truth[key], key
    assert translated["rope_parameters"] == truth["rope_parameters"]
    hf = hf_gguf_model(path, config=TINY)
    ids = np.random.default_rng(3).integers(6, 512, size=(1, 24), dtype=np.int64)
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids)).logits.numpy()
    got = step_logits(load_pipeline(package), ids, 16)
    delta = float(np.abs(ref - got).max())
    print(f"\n[L3] qwen3 GGUF F32 vs HF's GGUF loader: max|Δ| {delta:.3e}")
    assert delta <= 1e-4
    hf_tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizers = pytest.importorskip("tokenizers")
    mine = tokenizers.Tokenizer.from_file(str(package / "tokenizer.json"))
    for text in ["We hold these truths", "  a\tb\n\nc ", "ünï ✓", "<|im_start|>user\nhi"]:
        assert mine.encode(text).ids == hf_tok(text)["input_ids"], text


@pytest.mark.l2
@pytest.mark.parametrize(("kind", "quant"), [("Q8_0", "int8"), ("Q4_0", "int4")])
def test_quant_keeps_the_gguf_blocks(tmp_path, kind, quant):
    """``--quant int8`` on Q8_0 tensors / ``--quant int4`` on Q4_0 ones (block 32,
    symmetric) writes the file's own blocks into MatMulNBits / GatherBlockQuantized: the
    package computes what the dequantized (--dtype f32) build of the same file does."""
    pytest.importorskip("onnxruntime")
    import onnx

    from mobius_testing.lm_parity import load_pipeline, step_logits

    path = _qwen3_gguf(tmp_path / f"m-{kind}.gguf", kind)
    packages = {}
    for label, extra in (("float", []), ("kept", ["--quant", quant])):
        packages[label] = tmp_path / label
        done = subprocess.run(
            [MOBIUS, "build", str(path), str(packages[label]), "--dtype", "f32", *extra],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    graph = onnx.load(str(packages["kept"] / "model" / "model.onnx"), load_external_data=False)
    ops = [node.op_type for node in graph.graph.node]
    assert ops.count("MatMulNBits") >= 7 * 3 and "GatherBlockQuantized" in ops
    ids = np.random.default_rng(13).integers(6, 512, size=(1, 20), dtype=np.int64)
    ref = step_logits(load_pipeline(packages["float"]), ids, 12)
    got = step_logits(load_pipeline(packages["kept"]), ids, 12)
    delta = float(np.abs(ref - got).max())
    print(f"\n[gguf {kind} kept as {quant}] max|Δ| vs the dequantized build: {delta:.3e}")
    assert delta <= 1e-4
