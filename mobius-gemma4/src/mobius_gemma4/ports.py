"""Port lists of every text component: the single source for graphs and contract alike.

Each entry is ``(name, dtype, shape)`` with symbolic dims as strings. KV ports exist only
for cache-owning layers ``i < L − N_sh`` with that layer's static ``kvh_i`` and ``hd_i``.
"""

from __future__ import annotations

from mobius_gemma4.config import Gemma4TextConfig

PortSpec = tuple[str, str, tuple[int | str, ...]]

BATCH, SEQ, PAST, TOTAL = "batch", "sequence_len", "past_sequence_len", "total_sequence_len"


def kv_inputs(cfg: Gemma4TextConfig, dtype: str) -> list[PortSpec]:
    out: list[PortSpec] = []
    for i in range(cfg.num_cache_layers):
        shape = (BATCH, cfg.kv_heads[i], PAST, cfg.head_dims[i])
        out += [
            (f"past_key_values.{i}.key", dtype, shape),
            (f"past_key_values.{i}.value", dtype, shape),
        ]
    return out


def kv_outputs(cfg: Gemma4TextConfig, dtype: str) -> list[PortSpec]:
    out: list[PortSpec] = []
    for i in range(cfg.num_cache_layers):
        shape = (BATCH, cfg.kv_heads[i], TOTAL, cfg.head_dims[i])
        out += [(f"present.{i}.key", dtype, shape), (f"present.{i}.value", dtype, shape)]
    return out


def _common_inputs() -> list[PortSpec]:
    return [("attention_mask", "int64", (BATCH, TOTAL)), ("position_ids", "int64", (BATCH, SEQ))]


def logits_port(cfg: Gemma4TextConfig, dtype: str) -> PortSpec:
    return ("logits", dtype, (BATCH, SEQ, cfg.vocab_size))


def model_ports(cfg: Gemma4TextConfig, dtype: str) -> tuple[list[PortSpec], list[PortSpec]]:
    """Single ``model`` graph: ids in, logits + presents out."""
    inputs = [("input_ids", "int64", (BATCH, SEQ)), *_common_inputs(), *kv_inputs(cfg, dtype)]
    return inputs, [logits_port(cfg, dtype), *kv_outputs(cfg, dtype)]


def embedding_ports(cfg: Gemma4TextConfig, dtype: str) -> tuple[list[PortSpec], list[PortSpec]]:
    """``embedding`` graph of the split package (media features come with a later issue)."""
    outputs: list[PortSpec] = [("inputs_embeds", dtype, (BATCH, SEQ, cfg.hidden_size))]
    if cfg.has_ple:
        outputs.append(("per_layer_inputs", dtype, (BATCH, SEQ, cfg.ple_width)))
    return [("input_ids", "int64", (BATCH, SEQ))], outputs


def decoder_ports(cfg: Gemma4TextConfig, dtype: str) -> tuple[list[PortSpec], list[PortSpec]]:
    inputs: list[PortSpec] = [("inputs_embeds", dtype, (BATCH, SEQ, cfg.hidden_size))]
    if cfg.has_ple:
        inputs.append(("per_layer_inputs", dtype, (BATCH, SEQ, cfg.ple_width)))
    inputs += [*_common_inputs(), *kv_inputs(cfg, dtype)]
    return inputs, [logits_port(cfg, dtype), *kv_outputs(cfg, dtype)]
