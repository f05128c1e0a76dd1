"""Gemma 4 MoE GGUF files (26B-A4B's layout, llama.cpp architecture ``gemma4``) in F32,
F16, Q8_0, Q4_0 and Q4_K.

A seeded random ``gemma4_text`` checkpoint shaped like testdata/configs/gemma-4-26B-A4B-it
(``enable_moe_block``: routed experts beside the dense MLP on every layer, no per-layer
embeddings, no KV sharing, the full layers' k shared as v) but tiny (6 layers, hidden 256,
4 experts top-2, expert width 256, so that Q4_K applies to every matrix) is written the
way llama.cpp's converter writes it (``Gemma4Model``: ``gemma4.expert_*`` keys; the router
as ``ffn_gate_inp.weight`` (kept F32, as llama.cpp keeps routers) with its input scale in
``ffn_gate_inp.scale``; ``per_expert_scale`` as ``ffn_down_exps.scale``; HF's fused
``experts.gate_up_proj`` / ``down_proj`` as ``ffn_gate_up_exps`` / ``ffn_down_exps``; the
three branch norms ``pre_ffw_norm_2`` / ``post_ffw_norm_1`` / ``post_ffw_norm_2``). The
package built from the file equals the safetensors build of the checkpoint holding gguf's
own dequantization of the file's tensors (logits within 1e-4, greedy ids equal; Q8_0 by
top-1, as for every family), with the file's quantization kept and with ``--dtype f32``;
for F32 / F16 that checkpoint is the original, value for value.

HF transformers 5.24's GGUF loader is no reference for these files (test_gguf.py's
docstring has its exact errors): on the file's metadata it refuses the tiny MoE file
(size mismatches: it reads no ``key_length_swa``), and given the checkpoint's config it
maps none of the router scales or expert tables (left at their initial values).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_gguf import FLOAT_KINDS, HIDDEN, INTER, KINDS, TINY, _build, _geometry, _weights

EXPERTS, TOP_K, EXPERT_INTER = 4, 2, 256
MOE_NAMES = {
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
}
"""HF names the converter renames itself (``Gemma4Model.modify_tensors``); the rest go
through gguf-py's tensor map."""


def moe_config() -> dict:
    cfg = json.loads((TINY / "config.json").read_text())
    cfg.update(
        hidden_size=HIDDEN, intermediate_size=INTER, enable_moe_block=True,
        num_experts=EXPERTS, top_k_experts=TOP_K, moe_intermediate_size=EXPERT_INTER,
        hidden_size_per_layer_input=0, num_kv_shared_layers=0, use_double_wide_mlp=False,
        attention_k_eq_v=True,
    )  # fmt: skip
    cfg.pop("vocab_size_per_layer_input", None)
    return cfg


def moe_weights(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    """The dense tensors of :func:`test_gguf._weights` (no per-layer inputs, no v on the
    full layers) and each layer's router and experts, exact in float16."""
    rng = np.random.default_rng(seed + 100)
    layers, full, *_ = _geometry(cfg)
    out = {n: w for n, w in _weights(cfg, seed).items() if w.size and "per_layer" not in n}
    H, E, W = HIDDEN, EXPERTS, EXPERT_INTER
    for i in range(layers):
        p = f"model.layers.{i}."
        if full[i]:
            out.pop(p + "self_attn.v_proj.weight")
        moe = {
            "router.proj.weight": rng.standard_normal((E, H)) / np.sqrt(H),
            "router.scale": 1.0 + 0.1 * rng.standard_normal(H),
            "router.per_expert_scale": 1.0 + 0.1 * rng.standard_normal(E),
            "experts.gate_up_proj": rng.standard_normal((E, 2 * W, H)) / np.sqrt(H),
            "experts.down_proj": rng.standard_normal((E, H, W)) / np.sqrt(W),
        }
        for n in ("pre_feedforward_layernorm_2", "post_feedforward_layernorm_1",
                  "post_feedforward_layernorm_2"):  # fmt: skip
            moe[f"{n}.weight"] = 1.0 + 0.1 * rng.standard_normal(H)
        for n, w in moe.items():
            out[p + n] = w.astype(np.float16).astype(np.float32)
    return out


def gguf_name(hf: str, layers: int) -> str:
    from mobius_testing.gguf_files import llamacpp_name

    _, _, rest = hf.partition(".layers.")
    index, _, tail = rest.partition(".")
    if tail in MOE_NAMES:
        return f"blk.{int(index)}.{MOE_NAMES[tail]}"
    return llamacpp_name("gemma4", hf, layers)


def gemma4_moe_gguf(root, kind: str, seed: int = 4, extra=()):
    """(GGUF file, checkpoint folder of gguf's dequantization of its tensors)."""
    from mobius_testing.gguf_files import (
        gpt2_tokenizer_metadata,
        write_checkpoint,
        write_gguf_dequantized,
    )

    cfg = moe_config()
    weights = moe_weights(cfg, seed)
    layers, full, head_dim, _, _ = _geometry(cfg)
    a, rope = "gemma4", cfg["rope_parameters"]
    full_dim, swa_dim = max(head_dim), min(head_dim)
    meta = {
        "general.name": "tiny-gemma4-moe",
        f"{a}.context_length": cfg["max_position_embeddings"],
        f"{a}.embedding_length": HIDDEN,
        f"{a}.block_count": layers,
        f"{a}.feed_forward_length": INTER,
        f"{a}.attention.head_count": cfg["num_attention_heads"],
        f"{a}.attention.head_count_kv": cfg["num_key_value_heads"],
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"]),
        f"{a}.rope.freq_base": float(rope["full_attention"]["rope_theta"]),
        f"{a}.final_logit_softcapping": float(cfg["final_logit_softcapping"]),
        f"{a}.attention.sliding_window": cfg["sliding_window"],
        f"{a}.attention.shared_kv_layers": 0,
        f"{a}.embedding_length_per_layer_input": 0,
        f"{a}.attention.sliding_window_pattern": [not f for f in full],
        f"{a}.attention.key_length": full_dim,
        f"{a}.attention.value_length": full_dim,
        f"{a}.attention.key_length_swa": swa_dim,
        f"{a}.attention.value_length_swa": swa_dim,
        f"{a}.rope.dimension_count": full_dim,
        f"{a}.rope.dimension_count_swa": swa_dim,
        f"{a}.expert_count": EXPERTS,
        f"{a}.expert_used_count": TOP_K,
        f"{a}.expert_feed_forward_length": EXPERT_INTER,
        **gpt2_tokenizer_metadata(TINY, pre="gpt-2"),
    }
    rotated = int(full_dim * rope["full_attention"]["partial_rotary_factor"] / 2)
    freqs = np.array([1.0] * rotated + [1e30] * (full_dim // 2 - rotated), np.float32)
    names = {hf: gguf_name(hf, layers) for hf in weights}
    tensors = [("rope_freqs.weight", freqs, "F32")]
    tensors += [(names[hf], w, "F32" if "router.proj" in hf else kind) for hf, w in weights.items()]
    path = root / f"{a}-moe-{kind}.gguf"
    back = write_gguf_dequantized(path, a, meta, [*tensors, *extra], np.random.default_rng(seed))
    dequantized = {hf: back[names[hf]].reshape(w.shape) for hf, w in weights.items()}
    if kind in FLOAT_KINDS:
        for hf, w in weights.items():
            np.testing.assert_array_equal(dequantized[hf], w)
    return path, write_checkpoint(root / f"{a}-moe-{kind}-dequantized", cfg, dequantized, TINY)


@pytest.mark.l2
@pytest.mark.parametrize("kind", KINDS)
def test_gguf_moe_kinds_equal_the_dequantized_checkpoint(mobius_build, tmp_path, kind):
    pytest.importorskip("onnxruntime")
    from mobius.package import MANIFEST_NAME
    from mobius_testing.lm_parity import assert_gguf_matches, load_pipeline

    path, dequantized = gemma4_moe_gguf(tmp_path, kind)
    ref = load_pipeline(mobius_build(dequantized, dtype="f32"))
    kept = _build(path, tmp_path / "kept")
    versus = f"{kind} (vs gguf's dequantization)"
    assert_gguf_matches(ref, load_pipeline(kept), versus, "gemma4 moe kept", seed=9)
    manifest = json.loads((kept / MANIFEST_NAME).read_text())
    config, truth = manifest["config"], moe_config()
    for key in ("enable_moe_block", "num_experts", "top_k_experts", "moe_intermediate_size",
                "attention_k_eq_v", "num_kv_shared_layers", "hidden_size_per_layer_input",
                "use_double_wide_mlp", "intermediate_size", "layer_types"):  # fmt: skip
        assert config[key] == truth[key], key
    if kind in FLOAT_KINDS:
        return
    quant = manifest["quantization"]["components"]["model"]
    sources = {entry["source_type"] for entry in quant["tensors"].values()}
    assert kind in sources, sources  # the file's blocks are kept
    tables = ("layers.1.experts.gate_up_proj", "layers.1.experts.down_proj")
    if kind == "Q4_K":  # float zero points: GatherBlockQuantized takes none
        assert all("GatherBlockQuantized" in quant["kept_float"][t] for t in tables)
    else:  # the file's blocks, gathered per hit expert
        for table in tables:
            entry = quant["tensors"][table]
            assert entry["ops"] == ["GatherBlockQuantized"] and entry["source_type"] == kind
    f32 = _build(path, tmp_path / "f32", dtype="f32")
    assert_gguf_matches(ref, load_pipeline(f32), versus, "gemma4 moe --dtype f32", seed=9)


@pytest.mark.l2
def test_gguf_moe_without_expert_counts(tmp_path):
    """A Gemma 4 file with experts and no ``gemma4.expert_count`` is refused naming it."""
    from mobius.checkpoint.gguf import read_gguf
    from mobius.errors import CheckpointError
    from mobius_gemma4.gguf import translate

    path, _ = gemma4_moe_gguf(tmp_path, "F32")
    metadata, tensors = read_gguf(path)
    shapes = {t.name: t.shape for t in tensors}
    metadata = {k: v for k, v in metadata.items() if k != "gemma4.expert_count"}
    with pytest.raises(CheckpointError, match=r"has no gemma4\.expert_count"):
        translate("gemma4", metadata, shapes)
    partial = {n: s for n, s in shapes.items() if not n.startswith("blk.3.ffn_gate_up_exps")}
    with pytest.raises(CheckpointError, match=r"experts on some layers only \(none on \[3\]\)"):
        translate("gemma4", dict(read_gguf(path)[0]), partial)
