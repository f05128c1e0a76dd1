"""Weight map of the Qwen3 ``model`` graph.

Initializer names are HF's parameter names without the ``model.`` prefix. Linear
weights are transposed to ``[in, out]``; everything is cast to the build dtype and stays
a lazy expression until the package is written. The head keeps the checkpoint's
``[V, H]`` layout (the graph multiplies by its transpose in one Gemm): an untied
checkpoint's ``lm_head.weight`` as stored; a tied one has no ``lm_head`` initializer
(the graph reuses ``embed_tokens.weight``) and a ``lm_head.weight`` it carries anyway is
reported as ignored.

Qwen3-MoE experts come in two layouts, both accepted:

- per expert (every Hub checkpoint): ``mlp.experts.{e}.{gate,up,down}_proj.weight``
  (``[I, H]``, ``[I, H]``, ``[H, I]``), stacked here into ``gate_up_proj [E, H, 2I]`` and
  ``down_proj [E, I, H]``;
- fused (HF's in-memory layout): ``mlp.experts.gate_up_proj [E, 2I, H]`` and
  ``mlp.experts.down_proj [E, H, I]``, transposed on their last two axes.
"""

from __future__ import annotations

from mobius.checkpoint import Checkpoint
from mobius.errors import WeightPlanError
from mobius.weights import TensorExpr, WeightPlan, concat, ref
from mobius_qwen3.config import Qwen3Config

PREFIX = "model."


def _linear(name: str, dtype: str) -> TensorExpr:
    return ref(PREFIX + name).transpose().cast(dtype)


def _plain(name: str, dtype: str) -> TensorExpr:
    return ref(PREFIX + name).cast(dtype)


def _experts(cfg: Qwen3Config, i: int, checkpoint: Checkpoint, dtype: str):
    """``(gate_up_proj [E, H, 2I], down_proj [E, I, H])`` of layer ``i``."""
    base = f"{PREFIX}layers.{i}.mlp.experts."
    if base + "gate_up_proj" in checkpoint.tensors:
        return (
            ref(base + "gate_up_proj").transpose([0, 2, 1]).cast(dtype),
            ref(base + "down_proj").transpose([0, 2, 1]).cast(dtype),
        )
    if base + "0.gate_proj.weight" not in checkpoint.tensors:
        raise WeightPlanError(
            f"layer {i} is a sparse MoE layer but the checkpoint has neither "
            f"{base}0.gate_proj.weight nor {base}gate_up_proj",
            where=str(checkpoint.root),
            fix="check mlp_only_layers / decoder_sparse_step in config.json against the "
            "checkpoint, or use a complete Qwen3-MoE checkpoint",
        )
    H, inter = cfg.hidden_size, cfg.moe_intermediate_size
    gate_up, down = [], []
    for e in range(cfg.num_experts):
        p = f"{base}{e}."
        pair = concat(
            [ref(p + "gate_proj.weight").transpose(), ref(p + "up_proj.weight").transpose()],
            axis=1,
        )  # [H, 2I]
        gate_up.append(pair.reshape([1, H, 2 * inter]))
        down.append(ref(p + "down_proj.weight").transpose().reshape([1, inter, H]))
    return concat(gate_up, axis=0).cast(dtype), concat(down, axis=0).cast(dtype)


def weight_plan(cfg: Qwen3Config, checkpoint: Checkpoint, dtype: str) -> WeightPlan:
    """The plan of the ``model`` component; ``dtype`` is the port dtype (``float32`` …)."""
    plan = WeightPlan()
    plan.add("embed_tokens.weight", _plain("embed_tokens.weight", dtype))
    plan.add("norm.weight", _plain("norm.weight", dtype))
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            plan.add(p + f"{n}.weight", _plain(p + f"{n}.weight", dtype))
        a = p + "self_attn."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            plan.add(a + f"{n}.weight", _linear(a + f"{n}.weight", dtype))
            if cfg.attention_bias:
                plan.add(a + f"{n}.bias", _plain(a + f"{n}.bias", dtype))
        for n in ("q_norm", "k_norm"):
            plan.add(a + f"{n}.weight", _plain(a + f"{n}.weight", dtype))
        m = p + "mlp."
        if cfg.sparse_layers[i]:
            plan.add(m + "gate.weight", _linear(m + "gate.weight", dtype))
            gate_up, down = _experts(cfg, i, checkpoint, dtype)
            plan.add(m + "experts.gate_up_proj", gate_up)
            plan.add(m + "experts.down_proj", down)
        else:
            for n in ("gate_proj", "up_proj", "down_proj"):
                plan.add(m + f"{n}.weight", _linear(m + f"{n}.weight", dtype))
    if cfg.tie_word_embeddings:
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
    return plan
