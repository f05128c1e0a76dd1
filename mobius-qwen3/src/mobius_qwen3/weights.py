"""Weight map of the Qwen3 ``model`` graph: core's decoder plan, plus Qwen3-MoE experts.

Names, transposes and the tied head: :mod:`mobius.lm.weights`. Qwen3-MoE experts come
in three layouts, all accepted:

- per expert (every Hub checkpoint): ``mlp.experts.{e}.{gate,up,down}_proj.weight``
  (``[I, H]``, ``[I, H]``, ``[H, I]``), stacked here into ``gate_up_proj [E, H, 2I]`` and
  ``down_proj [E, I, H]``;
- fused (HF's in-memory layout): ``mlp.experts.gate_up_proj [E, 2I, H]`` and
  ``mlp.experts.down_proj [E, H, I]``, transposed on their last two axes;
- stacked per projection (a ``qwen3moe`` GGUF file, :mod:`mobius_qwen3.gguf`):
  ``mlp.experts.{gate,up}_proj.weight [E, I, H]`` (concatenated on axis 1 into HF's
  ``gate_up_proj``) and ``mlp.experts.down_proj.weight [E, H, I]``.
"""

from __future__ import annotations

from mobius.checkpoint import Checkpoint
from mobius.errors import WeightPlanError
from mobius.lm.weights import PREFIX, decoder_plan, hf_linear
from mobius.weights import WeightPlan, concat, ref
from mobius_qwen3.config import Qwen3Config


def _experts(cfg: Qwen3Config, i: int, checkpoint: Checkpoint, dtype: str):
    """``(gate_up_proj [E, H, 2I], down_proj [E, I, H])`` of layer ``i``."""
    base = f"{PREFIX}layers.{i}.mlp.experts."
    if base + "gate_up_proj" in checkpoint.tensors:
        return (
            ref(base + "gate_up_proj").transpose([0, 2, 1]).cast(dtype),
            ref(base + "down_proj").transpose([0, 2, 1]).cast(dtype),
        )
    if base + "gate_proj.weight" in checkpoint.tensors:
        gate_up = concat([ref(base + "gate_proj.weight"), ref(base + "up_proj.weight")], axis=1)
        return (
            gate_up.transpose([0, 2, 1]).cast(dtype),
            ref(base + "down_proj.weight").transpose([0, 2, 1]).cast(dtype),
        )
    if base + "0.gate_proj.weight" not in checkpoint.tensors:
        raise WeightPlanError(
            f"layer {i} is a sparse MoE layer but the checkpoint has none of "
            f"{base}0.gate_proj.weight, {base}gate_up_proj, {base}gate_proj.weight",
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
    dense = tuple(not s for s in cfg.sparse_layers)
    plan = decoder_plan(cfg, checkpoint, dtype, qk_norm=True, dense_mlp=dense)
    for i in (i for i, sparse in enumerate(cfg.sparse_layers) if sparse):
        m = f"layers.{i}.mlp."
        plan.add(m + "gate.weight", hf_linear(m + "gate.weight", dtype))
        gate_up, down = _experts(cfg, i, checkpoint, dtype)
        plan.add(m + "experts.gate_up_proj", gate_up)
        plan.add(m + "experts.down_proj", down)
    return plan
