"""The Llama family plugin object (``llama``, ``mistral``): a :class:`mobius.lm.family.DecoderFamily`.

The layer is core's :class:`mobius.lm.decoder.DecoderLM` as it stands (HF 5.24
``LlamaDecoderLayer`` / ``MistralDecoderLayer``: no q/k norms, gated SiLU MLP), the
weights core's :func:`mobius.lm.weights.decoder_plan`; onnxruntime-genai runs the
package as its model type ``llama`` / ``mistral``. Prompts come from the checkpoint's
chat template (core copies it; Llama 2 and 3 lay chats out differently), else the text
as given. Import-light: ``mobius plugins`` imports this module.
"""

from __future__ import annotations

from mobius.lm.family import DecoderFamily
from mobius.records import ModelTypeInfo
from mobius_llama.config import read_config


def _gguf(architecture: str, metadata, tensors):
    from mobius_llama.gguf import translate

    return translate(architecture, metadata, tensors)


FAMILY = DecoderFamily(
    "Llama",
    [
        ModelTypeInfo(
            "llama",
            tasks=("text-generation",),
            modalities=("text",),
            description="Llama 2 / 3 / 3.1 / 3.2 causal LM (SmolLM, TinyLlama, …): one model graph",
        ),
        ModelTypeInfo(
            "mistral",
            tasks=("text-generation",),
            modalities=("text",),
            description="Mistral causal LM (7B v0.1 … v0.3): sliding window when set",
        ),
    ],
    read_config,
    gguf=_gguf,
)
