"""Gemma 4 GGUF files (llama.cpp architecture ``gemma4``) read as the ``gemma4_text``
checkpoint they came from.

llama.cpp's converter (``Gemma4Model``, on ``Gemma3Model``) writes the text decoder only
(the encoders go to an ``mmproj`` file, not read here). What it stores and how it is read:

- ``gemma4.*`` keys: the Gemma 3 ones (``block_count``, ``embedding_length``,
  ``attention.head_count``, ``attention.layer_norm_rms_epsilon``, ``context_length``,
  ``attention.sliding_window``, ``final_logit_softcapping``, ``rope.freq_base`` of the
  full layers) and Gemma 4's: ``attention.sliding_window_pattern`` (one bool per layer,
  true = sliding), ``attention.key_length`` (the full layers' head dim, HF
  ``global_head_dim``) and ``attention.key_length_swa`` (the sliding layers', HF
  ``head_dim``), ``attention.shared_kv_layers`` (``num_kv_shared_layers``),
  ``embedding_length_per_layer_input`` (``hidden_size_per_layer_input``, 0: no per-layer
  embeddings), ``feed_forward_length`` (one value, or one per layer when the KV-sharing
  layers are double wide: ``use_double_wide_mlp``) and ``attention.head_count_kv`` (one
  value, or one per layer: the full layers' is ``num_global_key_value_heads``);
- no norm shift (Gemma 3n / 4 norms multiply by the weight itself), no q/k permutation;
  ``token_embd`` may be cut to the tokenizer's vocabulary, as for Gemma 3 (padded back);
- ``rope_freqs`` (llama.cpp's frequency factors for the full layers' proportional rope)
  is not needed: the full layers take Gemma 4's proportional rope with
  ``partial_rotary_factor`` 0.25, as HF's GGUF loader does (the factor is in that
  tensor's values, which a translation does not read); the sliding layers' base is
  ``rope.freq_base_swa`` when the file has it, else Gemma 4's 10,000;
- a full layer with ``attn_k`` and no ``attn_v`` shares k as v (``attention_k_eq_v``).

Gemma 4 MoE (26B-A4B: ``enable_moe_block``) runs routed experts beside the dense MLP.
The converter writes ``gemma4.expert_count`` / ``expert_used_count`` /
``expert_feed_forward_length`` (HF ``num_experts`` / ``top_k_experts`` /
``moe_intermediate_size``) and, per layer (gguf-py ``MODEL_ARCH.GEMMA4``; tensor shapes
in numpy order):

- ``ffn_gate_inp.weight`` ``[E, H]``: the router projection (``router.proj.weight``);
- ``ffn_gate_inp.scale`` ``[H]``: the router's input scale (``router.scale``);
- ``ffn_down_exps.scale`` ``[E]``: ``router.per_expert_scale`` (llama.cpp applies it to
  each expert's down output, which is where HF multiplies the routing weight by it);
- ``ffn_gate_up_exps.weight`` ``[E, 2I, H]`` and ``ffn_down_exps.weight`` ``[E, H, I]``:
  HF's fused ``experts.gate_up_proj`` / ``experts.down_proj``, stored as they are (the
  converter only appends ``.weight``; gate rows first, as HF chunks them);
- ``pre_ffw_norm_2`` / ``post_ffw_norm_1`` / ``post_ffw_norm_2``: the expert branch's
  input norm and the two branches' output norms (``pre_feedforward_layernorm_2``,
  ``post_feedforward_layernorm_1`` / ``_2``).

No transform applies to any of them; a file with experts on some layers only is refused
(Gemma 4 puts them on every layer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from mobius.errors import CheckpointError
from mobius.lm import gguf as lm_gguf
from mobius.records import GGUFTensor, GGUFTranslation

ARCHITECTURE = "gemma4"

CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.key_length": "global_head_dim",
    "attention.key_length_swa": "head_dim",
    "attention.sliding_window": "sliding_window",
    "attention.shared_kv_layers": "num_kv_shared_layers",
    "embedding_length_per_layer_input": "hidden_size_per_layer_input",
    "context_length": "max_position_embeddings",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "final_logit_softcapping": "final_logit_softcapping",
}
"""``gemma4.<key>`` → HF ``Gemma4TextConfig`` key (copied as they are)."""

MOE_CONFIG_KEYS = {
    "expert_count": "num_experts",
    "expert_used_count": "top_k_experts",
    "expert_feed_forward_length": "moe_intermediate_size",
}
"""``gemma4.<key>`` → HF key of a MoE file (all required when it has experts)."""

REQUIRED = (
    "block_count",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.key_length_swa",
    "attention.sliding_window_pattern",
)

FULL_ROPE = {"rope_type": "proportional", "partial_rotary_factor": 0.25}
SLIDING_THETA = 10_000.0

GLOBAL_TENSORS = {
    "per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",
    "per_layer_model_proj.weight": "model.per_layer_model_projection.weight",
    "per_layer_proj_norm.weight": "model.per_layer_projection_norm.weight",
}
LAYER_TENSORS = {
    **lm_gguf.LAYER_TENSORS,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "inp_gate": "per_layer_input_gate",
    "proj": "per_layer_projection",
    "post_norm": "post_per_layer_input_norm",
}
"""Core's Llama-shaped layer names, Gemma's sandwich norms and the per-layer-input
(PLE) gate, projection and norm."""
MOE_LAYER_TENSORS = {
    "ffn_gate_inp.weight": "router.proj.weight",
    "ffn_gate_inp.scale": "router.scale",
    "ffn_down_exps.scale": "router.per_expert_scale",
    "ffn_gate_up_exps.weight": "experts.gate_up_proj",
    "ffn_down_exps.weight": "experts.down_proj",
    "pre_ffw_norm_2.weight": "pre_feedforward_layernorm_2.weight",
    "post_ffw_norm_1.weight": "post_feedforward_layernorm_1.weight",
    "post_ffw_norm_2.weight": "post_feedforward_layernorm_2.weight",
}
"""MoE layer tensors (``blk.{i}.<key>``) → HF names under ``model.layers.{i}.``."""
LAYER_SCALE = "layer_output_scale"
"""``blk.{i}.layer_output_scale.weight``: HF ``model.layers.{i}.layer_scalar``."""


def translate(
    architecture: str, metadata: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]]
) -> GGUFTranslation | None:
    """The HF config and tensor names of a ``gemma4`` GGUF file (None for other
    architectures)."""
    if architecture != ARCHITECTURE:
        return None
    from mobius.checkpoint.gguf import pad_rows

    missing = [_key(k) for k in REQUIRED if _key(k) not in metadata]
    if missing:
        _fail(f"the Gemma 4 GGUF file has no {', '.join(missing)}")
    config: dict[str, Any] = {"model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"]}
    for key, hf in CONFIG_KEYS.items():
        if _key(key) in metadata:
            config[hf] = metadata[_key(key)]
    layers = int(config["num_hidden_layers"])
    sliding = _per_layer(metadata, "attention.sliding_window_pattern", layers, bool)
    config["layer_types"] = ["sliding_attention" if s else "full_attention" for s in sliding]
    full = [i for i, s in enumerate(sliding) if not s]
    shared = int(config.get("num_kv_shared_layers", 0))
    producers = range(layers - shared)
    ff = _per_layer(metadata, "feed_forward_length", layers, int)
    config["intermediate_size"] = ff[0]
    config["use_double_wide_mlp"] = any(ff[i] != ff[0] for i in range(layers - shared, layers))
    if any(v not in (ff[0], 2 * ff[0]) for v in ff):
        _fail(f"{_key('feed_forward_length')} {ff} is neither one width nor double-wide")
    kv = _per_layer(metadata, "attention.head_count_kv", layers, int)
    swa_kv = [kv[i] for i in range(layers) if sliding[i]] or kv
    config["num_key_value_heads"] = swa_kv[0]
    if any(kv[i] != swa_kv[0] for i in full):
        config["num_global_key_value_heads"] = kv[full[0]]
    config["attention_k_eq_v"] = any(
        f"blk.{i}.attn_k.weight" in tensors and f"blk.{i}.attn_v.weight" not in tensors
        for i in full
        if i in producers
    )
    config["rope_parameters"] = {
        "full_attention": {
            **FULL_ROPE,
            "rope_theta": float(metadata.get(_key("rope.freq_base"), 1_000_000.0)),
        },
        "sliding_attention": {
            "rope_type": "default",
            "rope_theta": float(metadata.get(_key("rope.freq_base_swa"), SLIDING_THETA)),
        },
    }
    rows = tensors.get("token_embd.weight", (0,))[0]
    vocab = metadata.get(_key("vocab_size"))
    if vocab is None and isinstance(metadata.get("tokenizer.ggml.tokens"), list):
        vocab = len(metadata["tokenizer.ggml.tokens"])
    vocab = max(int(vocab or 0), rows)
    config["vocab_size"] = vocab
    if "per_layer_token_embd.weight" in tensors:
        config["vocab_size_per_layer_input"] = tensors["per_layer_token_embd.weight"][0]
    config["tie_word_embeddings"] = "output.weight" not in tensors
    config.update(_moe_config(metadata, tensors, layers))
    names: dict[str, str | GGUFTensor | None] = {"rope_freqs.weight": None}
    for name in tensors:
        hf = hf_name(name)
        if hf is None:
            continue  # refused by the opener, which names it
        if name == "token_embd.weight" and rows < vocab:
            names[name] = GGUFTensor(hf, (pad_rows(vocab),))
        else:
            names[name] = hf
    return GGUFTranslation(config=config, tensors=names)


def hf_name(name: str) -> str | None:
    """The HF weight name of GGUF tensor ``name``; None when it is not a Gemma 4 text
    tensor (left out of the translation, so the opener refuses the file, naming it)."""
    if name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] == LAYER_SCALE:
        return f"model.layers.{int(parts[1])}.layer_scalar" if parts[3] == "weight" else None
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit():
        moe = MOE_LAYER_TENSORS.get(f"{parts[2]}.{parts[3]}")
        if moe is not None:
            return f"model.layers.{int(parts[1])}.{moe}"
    return lm_gguf.hf_tensor_name(name, LAYER_TENSORS)


def _moe_config(
    metadata: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]], layers: int
) -> dict[str, Any]:
    """``enable_moe_block`` and, for a file with routed experts, their sizes."""
    routed = [i for i in range(layers) if f"blk.{i}.ffn_gate_up_exps.weight" in tensors]
    if not routed:
        return {"enable_moe_block": False}
    if len(routed) != layers:
        missing = sorted(set(range(layers)) - set(routed))
        _fail(f"the Gemma 4 GGUF file has experts on some layers only (none on {missing[:8]})")
    missing = [_key(k) for k in MOE_CONFIG_KEYS if _key(k) not in metadata]
    if missing:
        _fail(f"the Gemma 4 MoE GGUF file has no {', '.join(missing)}")
    out: dict[str, Any] = {"enable_moe_block": True}
    for key, hf in MOE_CONFIG_KEYS.items():
        value = metadata[_key(key)]
        if type(value) is not int or value <= 0:
            _fail(f"{_key(key)} is {str(value)[:40]}, not a positive int")
        out[hf] = value
    return out


def _key(name: str) -> str:
    return f"{ARCHITECTURE}.{name}"


def _per_layer(metadata: Mapping[str, Any], key: str, layers: int, kind: type) -> list[Any]:
    """A key holding one value for every layer, or one per layer."""
    value = metadata[_key(key)]
    values = value if isinstance(value, list) else [value] * layers
    if len(values) != layers or not all(type(v) is kind for v in values):
        _fail(
            f"{_key(key)} is {str(value)[:60]}, not one {kind.__name__} or one per layer ({layers})"
        )
    return list(values)


def _fail(what: str) -> NoReturn:
    raise CheckpointError(
        what,
        where="GGUF metadata",
        fix="convert the model again with llama.cpp's convert_hf_to_gguf.py",
    )
