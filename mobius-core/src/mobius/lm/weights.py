"""Weight plans of HF decoder checkpoints: linear / plain / tied-head tensors, whole layers.

Initializer names are HF's parameter names without the ``model.`` prefix (what
:class:`mobius.lm.DecoderLM` declares). Linear weights are transposed to ``[in, out]``;
everything is cast to the build dtype and stays a lazy expression until the package is
written. The head keeps the checkpoint's ``[V, H]`` layout (the graph multiplies by its
transpose in one Gemm): an untied checkpoint's ``lm_head.weight`` as stored; a tied one
has no ``lm_head`` initializer (the graph reuses ``embed_tokens.weight``) and a
``lm_head.weight`` it carries anyway is reported as ignored.
"""

from __future__ import annotations

from mobius.checkpoint import Checkpoint
from mobius.errors import WeightPlanError
from mobius.lm.config import DecoderConfig
from mobius.weights import TensorExpr, WeightPlan, ref

PREFIX = "model."


def hf_linear(name: str, dtype: str, prefix: str = PREFIX) -> TensorExpr:
    """An HF ``[out, in]`` linear weight, transposed to ``[in, out]`` and cast."""
    return ref(prefix + name).transpose().cast(dtype)


def hf_plain(name: str, dtype: str, prefix: str = PREFIX) -> TensorExpr:
    """An HF tensor as stored (norm weights, biases, embedding tables), cast."""
    return ref(prefix + name).cast(dtype)


def add_head(plan: WeightPlan, tied: bool, checkpoint: Checkpoint, dtype: str) -> None:
    """``lm_head.weight`` as stored (untied), or ignored when the head is tied."""
    if tied:
        if "lm_head.weight" in checkpoint.tensors:
            plan.ignore("lm_head.weight", "tied head: the graph uses embed_tokens.weight")
    elif "lm_head.weight" in checkpoint.tensors:
        plan.add("lm_head.weight", ref("lm_head.weight").cast(dtype))
    else:
        raise WeightPlanError(
            "tie_word_embeddings is false but the checkpoint has no lm_head.weight",
            where=str(checkpoint.root),
            fix="use a checkpoint with its lm_head, or set tie_word_embeddings to true "
            "if the head shares the embedding table",
        )


def decoder_plan(
    cfg: DecoderConfig,
    checkpoint: Checkpoint,
    dtype: str,
    *,
    qk_norm: bool = False,
    dense_mlp: tuple[bool, ...] | None = None,
) -> WeightPlan:
    """The plan of a :class:`mobius.lm.DecoderLM` (``dtype``: the port dtype, ``float32`` …).

    Layer ``i`` gets its gated-MLP tensors when ``dense_mlp`` is None or ``dense_mlp[i]``;
    a family whose other layers hold another block adds those tensors itself.
    """
    plan = WeightPlan()
    plan.add("embed_tokens.weight", hf_plain("embed_tokens.weight", dtype))
    plan.add("norm.weight", hf_plain("norm.weight", dtype))
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            plan.add(p + f"{n}.weight", hf_plain(p + f"{n}.weight", dtype))
        a = p + "self_attn."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            plan.add(a + f"{n}.weight", hf_linear(a + f"{n}.weight", dtype))
            if cfg.attention_bias:
                plan.add(a + f"{n}.bias", hf_plain(a + f"{n}.bias", dtype))
        for n in ("q_norm", "k_norm") if qk_norm else ():
            plan.add(a + f"{n}.weight", hf_plain(a + f"{n}.weight", dtype))
        if dense_mlp is None or dense_mlp[i]:
            m = p + "mlp."
            for n in ("gate_proj", "up_proj", "down_proj"):
                plan.add(m + f"{n}.weight", hf_linear(m + f"{n}.weight", dtype))
                if cfg.mlp_bias:
                    plan.add(m + f"{n}.bias", hf_plain(m + f"{n}.bias", dtype))
    add_head(plan, cfg.tie_word_embeddings, checkpoint, dtype)
    return plan
