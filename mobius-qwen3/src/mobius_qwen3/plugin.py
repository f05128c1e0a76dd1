"""The Qwen3 family plugin object (``qwen3``, ``qwen3_moe``): a :class:`mobius.lm.family.DecoderFamily`.

Core's Llama-shaped decoder with q/k norms and, on the sparse layers of qwen3_moe, routed
experts (:mod:`mobius_qwen3.model`, :mod:`mobius_qwen3.weights`); the ChatML prompt
(:mod:`mobius_qwen3.processors`); onnxruntime-genai runs both types as ``qwen3``.
Import-light on purpose: ``mobius plugins`` and ``mobius --help`` import this module, so
the graph builders (onnx_ir, onnxscript) are imported inside the functions below.
"""

from __future__ import annotations

from mobius.lm.family import DecoderFamily
from mobius.records import BuildOptions, ModelTypeInfo
from mobius_qwen3.config import read_config
from mobius_qwen3.gguf import translate
from mobius_qwen3.processors import format_chat_prompt


def _build(config, options: BuildOptions):
    from mobius_qwen3.model import build_model

    # BuildOptions.logits is new in core 0.1.4: only a "last" build passes it on
    last = {"logits": "last"} if getattr(options, "logits", "all") == "last" else {}
    return build_model(config, options.dtype, options.target, **last)


def _weights(config, checkpoint, options: BuildOptions):
    from mobius_qwen3.weights import weight_plan

    return weight_plan(config, checkpoint, options.port_dtype)


FAMILY = DecoderFamily(
    "Qwen3",
    [
        ModelTypeInfo(
            "qwen3",
            tasks=("text-generation",),
            modalities=("text",),
            description="Qwen3 dense causal LM (0.6B … 32B): one model graph",
        ),
        ModelTypeInfo(
            "qwen3_moe",
            tasks=("text-generation",),
            modalities=("text",),
            description="Qwen3-MoE causal LM (30B-A3B, 235B-A22B): routed SiLU experts",
        ),
    ],
    read_config,
    build=_build,
    weight_plan=_weights,
    format_prompt=format_chat_prompt,
    genai_types={"qwen3_moe": "qwen3"},
    gguf=translate,
)
