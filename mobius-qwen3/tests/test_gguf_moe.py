"""Qwen3 and Qwen3-MoE GGUF files in every tensor type a test can write: F32, F16, Q8_0,
Q4_0 (gguf's quantizers) and Q4_K (hand-built blocks: gguf has no Q4_K quantizer).

A seeded random checkpoint (numpy, rows of 256 values so that Q4_K applies everywhere,
values exact in float16) is written the way llama.cpp's convert_hf_to_gguf.py writes it
(``qwen3`` / ``qwen3moe`` keys, tensor names, experts stacked per projection into
``ffn_{gate,up,down}_exps``, the router ``ffn_gate_inp`` and the 1-D tensors kept F32),
and the package built from the file equals the safetensors build of the checkpoint
holding gguf's own dequantization of the file's tensors (logits within 1e-4, greedy ids
equal), both with the file's quantization kept (the default) and with ``--dtype f32``.
For F32 / F16 that checkpoint is the original one, value for value.

HF transformers 5.24's own GGUF loader is the reference for the qwen3moe tensor mapping
and dequantization (:func:`test_qwen3moe_gguf_matches_hf_gguf_loader`), given the
checkpoint's config: on the file's own metadata it reads no
``qwen3moe.expert_feed_forward_length`` (``moe_intermediate_size`` stays Qwen3-MoE's 768)
and refuses the tiny file ("You set `ignore_mismatched_sizes` to `False`, thus raising an
error", ``mlp.experts.gate_up_proj`` ckpt ``[4, 512, 256]`` vs model ``[4, 1536, 256]``).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import TESTDATA

TINY = TESTDATA / "tiny-qwen3"
KINDS = ["F32", "F16", "Q8_0", "Q4_0", "Q4_K"]
FLOAT_KINDS = ("F32", "F16")
LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 2, 256, 4, 2, 64, 256
EXPERTS, TOP_K = 4, 2


def _config(moe: bool) -> dict:
    cfg = json.loads((TINY / "config.json").read_text())
    cfg.update(
        hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
        layer_types=["full_attention"] * LAYERS, dtype="float32",
    )  # fmt: skip
    if moe:
        cfg.update(
            model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"],
            tie_word_embeddings=False, num_experts=EXPERTS, num_experts_per_tok=TOP_K,
            moe_intermediate_size=INTER, norm_topk_prob=True, decoder_sparse_step=1,
            mlp_only_layers=[],  # llama.cpp's qwen3moe has experts on every layer
        )  # fmt: skip
    return cfg


def _weights(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    """HF tensors of ``cfg`` (per-expert layout, as Hub checkpoints hold them), random and
    exact in float16; routers sharpened (a random router at init is nearly uniform)."""
    rng = np.random.default_rng(seed)
    moe = cfg["model_type"] == "qwen3_moe"
    V, H, q, kv = cfg["vocab_size"], HIDDEN, HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (V, H)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (q, H), p + "self_attn.k_proj.weight": (kv, H),
            p + "self_attn.v_proj.weight": (kv, H), p + "self_attn.o_proj.weight": (H, q),
            p + "self_attn.q_norm.weight": (HEAD_DIM,), p + "self_attn.k_norm.weight": (HEAD_DIM,),
        })  # fmt: skip
        if moe and i not in cfg["mlp_only_layers"]:
            shapes[p + "mlp.gate.weight"] = (EXPERTS, H)
            for e in range(EXPERTS):
                x = f"{p}mlp.experts.{e}."
                shapes.update({x + "gate_proj.weight": (INTER, H), x + "up_proj.weight": (INTER, H),
                               x + "down_proj.weight": (H, INTER)})  # fmt: skip
        else:
            shapes.update({p + "mlp.gate_proj.weight": (INTER, H), p + "mlp.up_proj.weight": (INTER, H),
                           p + "mlp.down_proj.weight": (H, INTER)})  # fmt: skip
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("mlp.gate.weight"):
            w = 0.3 * rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[-1]) * (4.0 if "embed" in name else 1.0)
        out[name] = w.astype(np.float16).astype(np.float32)
    return out


def _gguf_tensors(weights: dict[str, np.ndarray], architecture: str):
    """(llama.cpp name, the HF tensors it holds, array): gguf-py's names, experts stacked
    per projection ``[E, I, H]`` / ``[E, H, I]`` (numpy order) as the converter stacks
    ``mlp.experts.{e}.*_proj`` into ``mlp.experts.*_proj``."""
    from mobius_testing.gguf_files import llamacpp_name

    out, stacks = [], {}
    for name in weights:
        m = re.fullmatch(r"(model\.layers\.\d+\.mlp\.experts)\.\d+\.(\w+_proj\.weight)", name)
        if m:
            stacks.setdefault(f"{m[1]}.{m[2]}", []).append(name)
        else:
            out.append((llamacpp_name(architecture, name, LAYERS), [name], weights[name]))
    for merged, names in stacks.items():
        stacked = np.stack([weights[n] for n in names])
        out.append((llamacpp_name(architecture, merged, LAYERS), names, stacked))
    return out


def qwen3_gguf(root, moe: bool, kind: str, seed: int = 5, extra=()):
    """(GGUF file, checkpoint folder of gguf's dequantization of its tensors)."""
    from mobius_testing.gguf_files import (
        gpt2_tokenizer_metadata,
        write_checkpoint,
        write_gguf_dequantized,
    )

    cfg = _config(moe)
    weights = _weights(cfg, seed)
    a = "qwen3moe" if moe else "qwen3"
    meta = {
        "general.name": "tiny-qwen3-moe" if moe else "tiny-qwen3-256",
        f"{a}.block_count": LAYERS,
        f"{a}.context_length": cfg["max_position_embeddings"],
        f"{a}.embedding_length": HIDDEN,
        f"{a}.feed_forward_length": INTER,
        f"{a}.attention.head_count": HEADS,
        f"{a}.attention.head_count_kv": KV_HEADS,
        f"{a}.rope.freq_base": float(cfg["rope_parameters"]["rope_theta"]),
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"]),
        f"{a}.attention.key_length": HEAD_DIM,
        f"{a}.attention.value_length": HEAD_DIM,
        **gpt2_tokenizer_metadata(TINY, pre="qwen2"),
    }
    if moe:
        meta.update({f"{a}.expert_count": EXPERTS, f"{a}.expert_used_count": TOP_K,
                     f"{a}.expert_feed_forward_length": INTER})  # fmt: skip
    layout = _gguf_tensors(weights, a)
    # llama.cpp keeps 1-D tensors (encode does) and the MoE router in F32
    tensors = [(n, w, "F32" if "ffn_gate_inp" in n else kind) for n, _, w in layout]
    back = write_gguf_dequantized(
        root / f"{a}-{kind}.gguf", a, meta, [*tensors, *extra], np.random.default_rng(seed + 1)
    )
    dequantized = {}
    for name, hf_names, _ in layout:
        parts = np.split(back[name], len(hf_names)) if len(hf_names) > 1 else [back[name]]
        for hf, part in zip(hf_names, parts):
            dequantized[hf] = part.reshape(weights[hf].shape)
    if kind in FLOAT_KINDS:  # F32 / F16 hold the checkpoint exactly (f16-exact values)
        for hf, w in weights.items():
            np.testing.assert_array_equal(dequantized[hf], w)
    folder = write_checkpoint(root / f"{a}-{kind}-dequantized", cfg, dequantized, TINY)
    return root / f"{a}-{kind}.gguf", folder


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3-gguf-kinds")
    cache = {}

    def get(moe: bool, kind: str):
        if (moe, kind) not in cache:
            folder = root / f"{'moe' if moe else 'dense'}-{kind}"
            folder.mkdir()
            cache[moe, kind] = qwen3_gguf(folder, moe, kind)
        return cache[moe, kind]

    return get


def _build(path, out, dtype=None):
    """``mobius build FILE OUT`` (dtype None: the file's quantization kept, the CLI's
    default; ``mobius.build``'s own default is f32)."""
    import mobius

    mobius.build(str(path), out, dtype=dtype)
    return out


@pytest.mark.l2
@pytest.mark.parametrize("moe", [False, True], ids=["qwen3", "qwen3moe"])
@pytest.mark.parametrize("kind", KINDS)
def test_gguf_kinds_equal_the_dequantized_checkpoint(files, mobius_build, tmp_path, moe, kind):
    pytest.importorskip("onnxruntime")
    from mobius.package import MANIFEST_NAME
    from mobius_testing.lm_parity import assert_gguf_matches, load_pipeline

    path, dequantized = files(moe, kind)
    ref = load_pipeline(mobius_build(dequantized, dtype="f32"))
    label = "qwen3moe" if moe else "qwen3"
    kept = _build(path, tmp_path / "kept")
    versus = f"{kind} (vs gguf's dequantization)"
    assert_gguf_matches(ref, load_pipeline(kept), versus, f"{label} kept", seed=7)
    manifest = json.loads((kept / MANIFEST_NAME).read_text())
    config = manifest["config"]
    assert config["model_type"] == ("qwen3_moe" if moe else "qwen3")
    if moe:
        assert (config["num_experts"], config["num_experts_per_tok"]) == (EXPERTS, TOP_K)
        assert config["moe_intermediate_size"] == INTER and config["norm_topk_prob"] is True
        assert config["mlp_only_layers"] == [] and config["tie_word_embeddings"] is False
    if kind in FLOAT_KINDS:
        assert "quantization" not in manifest or not manifest["quantization"]["components"][
            "model"]["tensors"]  # fmt: skip
        return
    quant = manifest["quantization"]["components"]["model"]
    sources = {entry["source_type"] for entry in quant["tensors"].values()}
    assert sources == {kind}, sources  # attention / MLP projections keep the file's blocks
    if moe:
        tables = ("layers.1.mlp.experts.gate_up_proj", "layers.1.mlp.experts.down_proj")
        assert "layers.0.mlp.experts.down_proj" in {**quant["tensors"], **quant["kept_float"]}
        if kind == "Q4_K":  # float zero points: GatherBlockQuantized takes none
            assert all("GatherBlockQuantized" in quant["kept_float"][t] for t in tables)
        else:  # the file's blocks, gathered per hit expert
            gate_up = quant["tensors"][tables[0]]
            assert gate_up["ops"] == ["GatherBlockQuantized"] and gate_up["source_type"] == kind
            assert gate_up["source"] == ("model.layers.1.mlp.experts.gate_proj.weight, "
                                         "model.layers.1.mlp.experts.up_proj.weight")  # fmt: skip
            down = quant["tensors"][tables[1]]["source"]
            assert down == "model.layers.1.mlp.experts.down_proj.weight"
    f32 = _build(path, tmp_path / "f32", dtype="f32")
    assert_gguf_matches(ref, load_pipeline(f32), versus, f"{label} --dtype f32", seed=7)


@pytest.mark.l2
def test_qwen3moe_gguf_with_a_tensor_the_family_does_not_know(tmp_path):
    """A shared-expert tensor (qwen2moe's, not Qwen3-MoE's) is refused in one line naming
    the tensor and the file; nothing is written."""
    from mobius.errors import CheckpointError

    extra = [("blk.1.ffn_gate_shexp.weight", np.zeros((INTER, HIDDEN), np.float32), "F32")]
    path, _ = qwen3_gguf(tmp_path, True, "F32", extra=extra)
    out = tmp_path / "pkg"
    with pytest.raises(CheckpointError) as info:
        _build(path, out)
    error = info.value  # what (one line), where, fix
    assert "blk.1.ffn_gate_shexp.weight" in error.what and "\n" not in error.what
    assert str(path) in error.where and error.fix
    assert not out.exists()


@pytest.mark.l2
def test_qwen3moe_gguf_without_expert_counts(tmp_path):
    """A qwen3moe file missing its expert keys is refused naming them."""
    import gguf

    from mobius.errors import CheckpointError

    path, _ = qwen3_gguf(tmp_path, True, "F32")
    reader = gguf.GGUFReader(path)
    stripped = tmp_path / "stripped.gguf"
    writer = gguf.GGUFWriter(str(stripped), "qwen3moe")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "qwen3moe.expert_count"):
            continue
        kind = field.types[0]
        sub = {"sub_type": field.types[-1]} if kind == gguf.GGUFValueType.ARRAY else {}
        writer.add_key_value(key, field.contents(), kind, **sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CheckpointError, match=r"qwen3moe\.expert_count"):
        _build(stripped, tmp_path / "pkg")
    assert not (tmp_path / "pkg").exists()


@pytest.mark.l1
def test_qwen3moe_layer_without_experts_is_dense():
    """A layer of a qwen3moe file without a router is read as an MLP-only layer (its
    ``ffn_gate`` / ``ffn_up`` / ``ffn_down`` as ``mlp.*_proj``)."""
    from mobius_qwen3.gguf import translate

    meta = {"qwen3moe.block_count": 2, "qwen3moe.embedding_length": 8,
            "qwen3moe.feed_forward_length": 16, "qwen3moe.attention.head_count": 2,
            "qwen3moe.expert_count": 4, "qwen3moe.expert_used_count": 2,
            "qwen3moe.expert_feed_forward_length": 8}  # fmt: skip
    shapes = {"token_embd.weight": (32, 8), "blk.0.ffn_gate.weight": (16, 8),
              "blk.1.ffn_gate_inp.weight": (4, 8), "blk.1.ffn_gate_exps.weight": (4, 8, 8),
              "blk.1.ffn_down_exps.weight": (4, 8, 8)}  # fmt: skip
    t = translate("qwen3moe", meta, shapes)
    assert t.config["mlp_only_layers"] == [0] and t.config["num_experts"] == 4
    assert t.tensors["blk.0.ffn_gate.weight"] == "model.layers.0.mlp.gate_proj.weight"
    assert t.tensors["blk.1.ffn_gate_inp.weight"] == "model.layers.1.mlp.gate.weight"
    assert t.tensors["blk.1.ffn_down_exps.weight"] == "model.layers.1.mlp.experts.down_proj.weight"
    assert translate("llama", meta, shapes) is None


@pytest.mark.l3
@pytest.mark.reference
@pytest.mark.parametrize("kind", ["F32", "Q4_0"])
def test_qwen3moe_gguf_matches_hf_gguf_loader(files, tmp_path, kind):
    """The package built from a qwen3moe file (its blocks kept) gives the logits of HF's
    GGUF loader on the same file (HF's tensor mapping, expert stacking and gguf's
    dequantization; float32), within 1e-4, top-1 equal everywhere."""
    from mobius_testing.reference import hf_gguf_model, missing_reference

    if (reason := missing_reference()) is not None:
        pytest.skip(reason)
    import torch

    from mobius_testing.lm_parity import load_pipeline, step_logits

    path, dequantized = files(True, kind)
    hf = hf_gguf_model(path, config=dequantized)
    ids = np.random.default_rng(3).integers(6, 512, size=(1, 24), dtype=np.int64)
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids)).logits.numpy()
    got = step_logits(load_pipeline(_build(path, tmp_path / "kept")), ids, 16)
    delta = float(np.abs(ref - got).max())
    print(f"\n[L3] qwen3moe GGUF {kind} vs HF's GGUF loader: max|Δ| {delta:.3e}")
    assert delta <= 1e-4
    assert (ref.argmax(-1) == got.argmax(-1)).all()
