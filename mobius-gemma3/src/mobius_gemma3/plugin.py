"""The Gemma 3 text family plugin object (``gemma3_text``): a :class:`mobius.lm.family.DecoderFamily`.

The graph is core's Gemma-shaped decoder (:mod:`mobius.lm.gemma`: HF 5.24
``Gemma3DecoderLayer``'s sandwich norms, q/k norms, ``1 + w`` RMSNorms, scaled embedding,
one rope per layer type, GELU-tanh MLP, optional final softcap), its weights
:func:`mobius.lm.gemma.gemma_plan`; onnxruntime-genai runs the package as its model type
``gemma3_text``. Prompts come from the checkpoint's chat template (core copies it), else
the text as given. Import-light: ``mobius plugins`` imports this module.
"""

from __future__ import annotations

from mobius.lm.family import DecoderFamily
from mobius.records import ModelTypeInfo
from mobius_gemma3.config import FAMILY_NAME, MODEL_TYPE, read_config
from mobius_gemma3.gguf import translate


def _build(config, options):
    from mobius.lm.gemma import build_gemma

    # BuildOptions.logits is new in core 0.1.4: only a "last" build passes it on
    last = {"logits": "last"} if getattr(options, "logits", "all") == "last" else {}
    return build_gemma(config, options.dtype, options.target, family=FAMILY_NAME, **last)


def _plan(config, checkpoint, options):
    from mobius.lm.gemma import gemma_plan

    return gemma_plan(config, checkpoint, options.port_dtype)


FAMILY = DecoderFamily(
    "Gemma3",
    [
        ModelTypeInfo(
            MODEL_TYPE,
            tasks=("text-generation",),
            modalities=("text",),
            description="Gemma 3 text causal LM (Gemma3ForCausalLM: 270M, 1B, text-only "
            "checkpoints): one model graph, local/global layers",
        )
    ],
    read_config,
    build=_build,
    weight_plan=_plan,
    gguf=translate,
)
