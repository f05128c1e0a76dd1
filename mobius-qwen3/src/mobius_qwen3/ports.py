"""Ports of the single ``model`` graph: the one source for the graph and the contract.

Each entry is ``(name, dtype, shape)`` with symbolic dims as strings. Every layer owns
a KV cache ``[batch, num_key_value_heads, past, head_dim]`` (BNSH, on both attention
paths), so the ports do not depend on the build target.
"""

from __future__ import annotations

from mobius_qwen3.config import Qwen3Config

PortSpec = tuple[str, str, tuple[int | str, ...]]

BATCH, SEQ, PAST, TOTAL = "batch", "sequence_len", "past_sequence_len", "total_sequence_len"


def kv_shape(cfg: Qwen3Config, length: str | int) -> tuple[int | str, ...]:
    return (BATCH, cfg.num_key_value_heads, length, cfg.head_dim)


def model_ports(cfg: Qwen3Config, dtype: str) -> tuple[list[PortSpec], list[PortSpec]]:
    """``(inputs, outputs)``: ids, mask, positions and past K/V in; logits and presents out."""
    inputs: list[PortSpec] = [
        ("input_ids", "int64", (BATCH, SEQ)),
        ("attention_mask", "int64", (BATCH, TOTAL)),
        ("position_ids", "int64", (BATCH, SEQ)),
    ]
    outputs: list[PortSpec] = [("logits", dtype, (BATCH, SEQ, cfg.vocab_size))]
    for i in range(cfg.num_hidden_layers):
        for kind in ("key", "value"):
            inputs.append((f"past_key_values.{i}.{kind}", dtype, kv_shape(cfg, PAST)))
            outputs.append((f"present.{i}.{kind}", dtype, kv_shape(cfg, TOTAL)))
    return inputs, outputs
