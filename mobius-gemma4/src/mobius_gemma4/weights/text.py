"""Weight map of the Gemma 4 text graphs (docs/gemma4.md §11).

Initializer names are the HF parameter names with the wrapper prefix removed
(``model.language_model.`` for ``gemma4``, ``model.`` for ``gemma4_text``). Linear
weights are transposed to ``[in, out]``; expert tensors to ``[E, in, out]``; every
tensor is cast to the build dtype. Everything stays a lazy expression until the package
is written.

Components:
- ``model`` (single graph): everything; a tied head shares ``embed_tokens.weight``, an
  untied one reads ``lm_head.weight``.
- ``embedding``: ``embed_tokens`` and the PLE tables/projection/norm.
- ``decoder``: layers, final norm and ``lm_head.weight`` in the checkpoint's ``[V, H]``
  layout (the graph uses ``Gemm(transB=1)``) — a plain ref of ``embed_tokens`` when tied,
  so the package writer streams it instead of materializing a transposed copy.

Known-unused tensors are ignored with a reason: k/v projections and k_norm of
KV-consumer layers (E2B/E4B ship them), and tower tensors that no encoder of this
package reads (a ``gemma4_text`` build of a checkpoint that carries towers, or a tower
whose config is null). Built encoders read their own tensors (:mod:`.media`).
"""

from __future__ import annotations

from collections.abc import Iterator

from mobius.checkpoint import Checkpoint
from mobius.errors import WeightPlanError
from mobius.records import PORT_DTYPE_OF_BUILD_DTYPE
from mobius.weights import WeightPlan, ref
from mobius_gemma4.config import Gemma4Config, Gemma4TextConfig

LINEAR = "linear"  # [out, in] -> [in, out]
EXPERTS = "experts"  # [E, out, in] -> [E, in, out]
PLAIN = "plain"

VISION_PREFIXES = ("model.vision_tower.", "model.embed_vision.")
AUDIO_PREFIXES = ("model.audio_tower.", "model.embed_audio.")
MEDIA_PREFIXES = VISION_PREFIXES + AUDIO_PREFIXES


def layer_parameters(cfg: Gemma4TextConfig, i: int) -> Iterator[tuple[str, str]]:
    """``(name, kind)`` of every parameter of decoder layer ``i`` (graph-side name)."""
    p = f"layers.{i}."
    yield p + "layer_scalar", PLAIN
    for n in ("input", "post_attention", "pre_feedforward", "post_feedforward"):
        yield p + f"{n}_layernorm.weight", PLAIN
    a = p + "self_attn."
    yield a + "q_proj.weight", LINEAR
    yield a + "q_norm.weight", PLAIN
    if not cfg.is_kv_consumer(i):
        yield a + "k_proj.weight", LINEAR
        if not cfg.uses_k_eq_v(i):
            yield a + "v_proj.weight", LINEAR
        yield a + "k_norm.weight", PLAIN
    yield a + "o_proj.weight", LINEAR
    for n in ("gate_proj", "up_proj", "down_proj"):
        yield p + f"mlp.{n}.weight", LINEAR
    if cfg.enable_moe_block:
        yield p + "router.proj.weight", LINEAR
        yield p + "router.scale", PLAIN
        yield p + "router.per_expert_scale", PLAIN
        yield p + "experts.gate_up_proj", EXPERTS
        yield p + "experts.down_proj", EXPERTS
        for n in (
            "post_feedforward_layernorm_1",
            "post_feedforward_layernorm_2",
            "pre_feedforward_layernorm_2",
        ):
            yield p + f"{n}.weight", PLAIN
    if cfg.has_ple:
        yield p + "per_layer_input_gate.weight", LINEAR
        yield p + "per_layer_projection.weight", LINEAR
        yield p + "post_per_layer_input_norm.weight", PLAIN


def embedding_parameters(cfg: Gemma4TextConfig) -> Iterator[tuple[str, str]]:
    yield "embed_tokens.weight", PLAIN
    if cfg.has_ple:
        yield "embed_tokens_per_layer.weight", PLAIN
        yield "per_layer_model_projection.weight", LINEAR
        yield "per_layer_projection_norm.weight", PLAIN


def decoder_parameters(cfg: Gemma4TextConfig) -> Iterator[tuple[str, str]]:
    for i in range(cfg.num_hidden_layers):
        yield from layer_parameters(cfg, i)
    yield "norm.weight", PLAIN


def checkpoint_prefix(config: Gemma4Config, checkpoint: Checkpoint | None = None) -> str:
    """``model.language_model.`` for gemma4, ``model.`` for gemma4_text.

    A ``gemma4_text`` config over a multimodal layout (text-only export of a gemma4
    checkpoint) is accepted too.
    """
    if config.model_type in ("gemma4", "gemma4_unified"):
        return "model.language_model."
    tensors = checkpoint.tensors if checkpoint is not None else {}
    if (
        "model.embed_tokens.weight" not in tensors
        and "model.language_model.embed_tokens.weight" in tensors
    ):
        return "model.language_model."
    return "model."


def _expr(kind: str, source: str, dtype: str):
    e = ref(source)
    if kind == LINEAR:
        e = e.transpose()
    elif kind == EXPERTS:
        e = e.transpose([0, 2, 1])
    return e.cast(dtype)


def _head_source(config: Gemma4Config, checkpoint: Checkpoint, prefix: str) -> str:
    text = config.text
    if not text.tie_word_embeddings:
        if "lm_head.weight" in checkpoint.tensors:
            return "lm_head.weight"
        raise WeightPlanError(
            "tie_word_embeddings is false but the checkpoint has no lm_head.weight",
            where=str(checkpoint.root),
            fix="use a checkpoint with its lm_head, or set tie_word_embeddings true",
        )
    return prefix + "embed_tokens.weight"


def _ignore_known_unused(
    plan: WeightPlan, config: Gemma4Config, checkpoint: Checkpoint, prefix: str
) -> None:
    text = config.text
    for i in range(text.first_kv_shared_layer, text.num_hidden_layers):
        for n in ("k_proj.weight", "v_proj.weight", "k_norm.weight", "v_norm.weight"):
            name = f"{prefix}layers.{i}.self_attn.{n}"
            if name in checkpoint.tensors:
                plan.ignore(
                    name, f"layer {i} reads the KV of layer {text.kv_producer(i)} (KV sharing)"
                )
    from mobius_gemma4.ports import has_audio, has_vision

    unread: tuple[str, ...] = ()
    if not has_vision(config):
        unread += VISION_PREFIXES
    if not has_audio(config):
        unread += AUDIO_PREFIXES
    reason = (
        "text-only model type: no encoders are built"
        if config.model_type == "gemma4_text"
        else "config.json has no config for this tower, so no encoder reads it"
    )
    for name in checkpoint.tensors:
        if unread and name.startswith(unread):
            plan.ignore(name, reason)
    if text.tie_word_embeddings and "lm_head.weight" in checkpoint.tensors:
        plan.ignore("lm_head.weight", "tied head: the graph uses embed_tokens.weight")


def text_weight_plan(
    config: Gemma4Config, component: str, checkpoint: Checkpoint, build_dtype: str
) -> WeightPlan:
    """The plan of one text component (``model``, ``embedding`` or ``decoder``)."""
    dtype = PORT_DTYPE_OF_BUILD_DTYPE[build_dtype]
    text = config.text
    prefix = checkpoint_prefix(config, checkpoint)
    plan = WeightPlan()
    if component in ("model", "embedding"):
        for name, kind in embedding_parameters(text):
            plan.add(name, _expr(kind, prefix + name, dtype))
    if component in ("model", "decoder"):
        for name, kind in decoder_parameters(text):
            plan.add(name, _expr(kind, prefix + name, dtype))
        if component == "decoder":  # [V, H] as stored: Gemm(transB=1) in the graph
            plan.add(
                "lm_head.weight", _expr(PLAIN, _head_source(config, checkpoint, prefix), dtype)
            )
        elif not text.tie_word_embeddings:
            plan.add(
                "lm_head.weight", _expr(LINEAR, _head_source(config, checkpoint, prefix), dtype)
            )
    if component not in ("model", "embedding", "decoder"):
        raise WeightPlanError(
            f"no text weight plan for component {component!r}",
            where="mobius_gemma4.weights.text",
            fix="components are model, embedding, decoder",
        )
    _ignore_known_unused(plan, config, checkpoint, prefix)
    return plan
