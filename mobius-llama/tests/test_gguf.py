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
    folder: Path, path: Path, ggml_type: str, *, permute: bool = True, extra=(), retype=None
) -> Path:
    """The GGUF llama.cpp writes for ``folder`` (``permute=False``: q/k rows left in HF
    order, which llama.cpp never does; ``extra``: more (name, array, type) tensors;
    ``retype(name, array, type)``: the (array or encoded blocks, type) each tensor is
    written as instead)."""
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
    if retype is not None:
        tensors = [(name, *retype(name, array, kind)) for name, array, kind in tensors]
    return write_gguf(path, a, meta, [*tensors, *extra])


def _build(source: Path, out: Path, *options: str) -> Path:
    done = subprocess.run(
        [MOBIUS, "build", str(source), str(out), *(options or ("--dtype", "f32"))],
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


def _wide_checkpoint(folder: Path) -> Path:
    """The tiny llama checkpoint made 256 wide (MLP 512, head_dim 64): every matrix row
    is whole Q4_K super-blocks."""
    from safetensors.numpy import save_file

    _checkpoint(folder, "llama")
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(hidden_size=256, intermediate_size=512, head_dim=64)
    (folder / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(23)
    H, inter, hd, V = 256, 512, 64, cfg["vocab_size"]

    def w(*shape):
        return (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)

    t = {"model.embed_tokens.weight": w(V, H), "model.norm.weight": 1 + 0.1 * w(H)}
    t["lm_head.weight"] = w(V, H)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for n, rows in {"q": 4 * hd, "k": 2 * hd, "v": 2 * hd}.items():
            t[p + f"self_attn.{n}_proj.weight"] = w(rows, H)
        t[p + "self_attn.o_proj.weight"] = w(H, 4 * hd)
        t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"] = w(inter, H), w(inter, H)
        t[p + "mlp.down_proj.weight"] = w(H, inter)
        t[p + "input_layernorm.weight"] = 1 + 0.1 * w(H)
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * w(H)
    save_file(t, str(folder / "model.safetensors"))
    return folder


def _levels(package: Path, level: int, out: Path) -> Path:
    """A copy of ``package`` whose MatMulNBits run at ``accuracy_level`` ``level`` (the
    graph edited, its manifest pin updated; the weights file unchanged)."""
    import hashlib
    import shutil

    import onnx

    from mobius.package import MANIFEST_NAME

    shutil.copytree(package, out)
    path = out / "model" / "model.onnx"
    model = onnx.load(str(path), load_external_data=False)
    for node in model.graph.node:
        for a in node.attribute:
            if node.op_type == "MatMulNBits" and a.name == "accuracy_level":
                a.i = level
    onnx.save(model, str(path))
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    entry = manifest["components"]["model"]
    entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    entry["model_size"] = path.stat().st_size
    entry["size"] = entry["model_size"] + entry["data_size"]
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    return out


@pytest.mark.l2
def test_q4_1_q4_k_cpu_form_is_exact(tmp_path):
    """``--target cpu`` keeps Q4_1 / Q4_K MatMul weights exactly (int4 levels with the
    default zero point 8, no zero-point input, plus ReduceSum(x by 32) @ C, the block sums
    made once per input), not as int8 blocks: its logits equal the dequantized ``--dtype
    f32`` build of the same file up to float rounding at accuracy level 0 (greedy ids
    equal), and up to the int8 activations at level 4 (the cpu default; greedy picks the
    reference's best up to a near-tie)."""
    pytest.importorskip("onnxruntime")
    import onnx

    from mobius.package import MANIFEST_NAME
    from mobius_testing.gguf_files import q4_k_blocks

    rng = np.random.default_rng(29)
    folder = _wide_checkpoint(tmp_path / "wide")

    def retype(name, array, kind):
        if name == "token_embd.weight":
            return array, "F32"  # a Gather's table: the int8 approximation, not tested here
        if ".ffn_" in name:  # Q4_K: blocks made by hand (gguf has no Q4_K quantizer)
            return q4_k_blocks(array.shape, rng, float(np.abs(array).max())), "Q4_K"
        return array, kind

    path = _llama_gguf(folder, tmp_path / "m.gguf", "Q4_1", retype=retype)
    dense = _build(path, tmp_path / "f32")
    cpu = _build(path, tmp_path / "cpu", "--target", "cpu")
    manifest = json.loads((cpu / MANIFEST_NAME).read_text())
    tensors = manifest["quantization"]["components"]["model"]["tensors"]
    kinds = {t["source_type"] for t in tensors.values()}
    assert kinds == {"Q4_1", "Q4_K"} and len(tensors) == 2 * 7 + 1
    for entry in tensors.values():
        assert (entry["bits"], entry["zero_points"], entry["correction"]) == (
            4,
            "none",
            "block-sums",
        )
    graph = onnx.load(str(cpu / "model" / "model.onnx"), load_external_data=False).graph
    # per layer: x (q/k/v, fused into one), attention output, post-norm x (gate/up, one),
    # down's input; + head: one MatMulNBits and one correction MatMul (+ Add) each
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 2 * 4 + 1 and all(len(n.input) == 3 for n in nbits)
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in nbits]
    assert all((a["bits"], a["block_size"], a["accuracy_level"]) == (4, 32, 4) for a in attrs)
    sums = [n for n in graph.node if n.op_type == "ReduceSum" and "block_sums" in n.name]
    assert len(sums) == 2 * 4 + 1
    fixes = [n for n in graph.node if n.op_type == "MatMul" and n.input[0] in
             {s.output[0] for s in sums}]  # fmt: skip
    assert len(fixes) == 2 * 4 + 1
    fused = {t: e.get("fused") for t, e in tensors.items() if e.get("fused")}
    assert len(fused) == 2 * 5 and len(set(fused.values())) == 2 * 2
    ids = np.random.default_rng(31).integers(6, 512, size=(1, 24), dtype=np.int64)
    ref_pipe = lp.load_pipeline(dense)
    ref = lp.step_logits(ref_pipe, ids, 16)
    scale = float(np.abs(ref).max())
    prompt = [5, 17, 42, 99]
    want = ref_pipe.generate(input_ids=prompt, max_new_tokens=12).ids
    # level 0: float rounding only (measured 4e-6 of logits up to 3.4); level 4 adds the
    # int8 activations (per block of 32, a step of max|x|/127), as every int4 / int8
    # MatMulNBits of the cpu target has them (measured 5e-2): top-1 may then flip where
    # two logits lie within that error, never elsewhere
    for level, bound in ((0, 1e-5), (4, 3e-2)):
        pipe = lp.load_pipeline(_levels(cpu, level, tmp_path / f"cpu-level{level}"))
        got = lp.step_logits(pipe, ids, 16)
        delta = float(np.abs(ref - got).max())
        strict, tied = lp.top1(ref, got, tie=2 * bound * scale)
        print(f"\n[llama Q4_1/Q4_K --target cpu, level {level}] max|Δ logits| {delta:.3e} "
              f"(of {scale:.2f}), top-1 {strict:.1%}")  # fmt: skip
        assert delta <= bound * scale
        assert tied == 1.0 and strict >= (1.0 if level == 0 else 0.9)
        greedy = pipe.generate(input_ids=prompt, max_new_tokens=12).ids
        if level == 0:
            assert greedy == want
            continue
        # level 4: each greedy pick is the reference's best up to a tie (the reference
        # scoring the package's own ids: one near-tie flip must not fail the rest)
        seq = np.array([prompt + greedy[:-1]], np.int64)
        scored = lp.step_logits(ref_pipe, seq, len(prompt))[0, len(prompt) - 1 :]
        picked = scored[np.arange(len(greedy)), greedy]
        assert np.all(picked >= scored.max(-1) - 2 * bound * scale), (greedy, want)


@pytest.mark.l2
def test_python_build_keeps_the_files_blocks_as_the_cli_does(checkpoints, tmp_path):
    """``mobius.build(FILE.gguf, OUT)`` without ``dtype`` keeps the file's Q8_0 blocks,
    as ``mobius build`` without ``--dtype`` does (it used to default to f32 and dequantize);
    ``dtype="f32"`` dequantizes."""
    import mobius
    from mobius.package import MANIFEST_NAME

    folder, _ = checkpoints["untied"]
    path = _llama_gguf(folder, tmp_path / "q8.gguf", "Q8_0")
    kept, dense = tmp_path / "kept", tmp_path / "dense"
    mobius.build(str(path), str(kept))
    mobius.build(str(path), str(dense), dtype="f32")
    manifest = json.loads((kept / MANIFEST_NAME).read_text())
    assert manifest["quantization"]["method"] == "kept-from-source"
    assert {e["source_type"] for e in manifest["quantization"]["components"]["model"]
            ["tensors"].values()} == {"Q8_0"}  # fmt: skip
    assert "quantization" not in json.loads((dense / MANIFEST_NAME).read_text())
