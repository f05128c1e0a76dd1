"""One object per decoder-LM family, registered through the existing hooks.

A family's entry point names a :class:`DecoderFamily` instead of a module of hook
functions (``[project.entry-points.mobius] llama = "mobius_llama.plugin:FAMILY"``); its
methods are the hook implementations, each answering for the family's model types
(core sends owner-only hooks to the owner). What a family gives:

- ``model_types`` (its :class:`~mobius.records.ModelTypeInfo` records) and
  ``read_config(model_type, raw) -> DecoderConfig``;
- optionally ``build(config, options) -> ir.Model`` and ``weight_plan(config, checkpoint,
  options) -> WeightPlan`` (default: :func:`mobius.lm.decoder.build_decoder` and
  :func:`mobius.lm.weights.decoder_plan` as they stand), ``format_prompt`` (default
  none: the package's chat template, else the text as given), ``genai_types`` (model type
  → onnxruntime-genai type; default the model type itself), ``gguf(architecture,
  metadata, tensors) -> GGUFTranslation | None`` (the family's reading of GGUF files:
  ``mobius_gguf_translation``; default none).

Import-light: ``mobius plugins`` imports every entry point, so the graph builders are
imported inside the methods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mobius.hookspecs import hookimpl
from mobius.lm.runtime import check_component, runtime_files, text_processors
from mobius.records import BuildOptions, ModelTypeInfo


def _default_build(config, options: BuildOptions):
    from mobius.lm.decoder import build_decoder

    return build_decoder(
        config, options.dtype, options.target, family=config.model_type, logits=options.logits
    )


def _default_plan(config, checkpoint, options: BuildOptions):
    from mobius.lm.weights import decoder_plan

    return decoder_plan(config, checkpoint, options.port_dtype)


class DecoderFamily:
    """``DecoderFamily(name, model_types, read_config, *, build=None, weight_plan=None,
    format_prompt=None, genai_types=None, gguf=None)``: the plugin object of a one-``model`` decoder
    LM family (see the module docstring)."""

    def __init__(
        self,
        name: str,
        model_types: Sequence[ModelTypeInfo],
        read_config: Callable[[str, Mapping[str, Any]], Any],
        *,
        build: Callable[[Any, BuildOptions], Any] | None = None,
        weight_plan: Callable[[Any, Any, BuildOptions], Any] | None = None,
        format_prompt: Callable[[str, int, int], str] | None = None,
        genai_types: Mapping[str, str] | None = None,
        gguf: Callable[[str, Mapping[str, Any], Mapping[str, Any]], Any] | None = None,
    ) -> None:
        self.name = name
        self.model_types = tuple(model_types)
        self.read_config = read_config
        self.build = build or _default_build
        self.weight_plan = weight_plan or _default_plan
        self.format_prompt = format_prompt
        self.genai_types = dict(genai_types or {})
        self.gguf = gguf

    def __repr__(self) -> str:
        return f"DecoderFamily({self.name!r})"

    def _where(self, hook: str) -> str:
        return f"{self.name} family ({type(self).__name__}).{hook}"

    @hookimpl
    def mobius_model_types(self) -> list[ModelTypeInfo]:
        return list(self.model_types)

    @hookimpl
    def mobius_read_config(self, model_type: str, raw: dict[str, Any]):
        return self.read_config(model_type, raw)

    @hookimpl
    def mobius_pipeline_contract(self, config, options: BuildOptions):
        from mobius.lm.decoder import decoder_shape
        from mobius.lm.ports import lm_contract

        return lm_contract(decoder_shape(config), options.port_dtype, logits=options.logits)

    @hookimpl
    def mobius_build_component(self, config, component: str, options: BuildOptions):
        check_component(config, component, self._where("mobius_build_component"), self.name)
        return self.build(config, options)

    @hookimpl
    def mobius_weight_plan(self, config, component: str, checkpoint, options: BuildOptions):
        check_component(config, component, self._where("mobius_weight_plan"), self.name)
        return self.weight_plan(config, checkpoint, options)

    @hookimpl
    def mobius_processors(self, config):
        return text_processors(config, self.format_prompt)

    @hookimpl
    def mobius_runtime_files(self, config, contract, checkpoint, options: BuildOptions):
        # genai_config.json; tokenizer files and the chat template: core copies them
        genai = self.genai_types.get(config.model_type, config.model_type)
        return runtime_files(config, checkpoint, genai)

    @hookimpl
    def mobius_gguf_translation(self, architecture: str, metadata, tensors):
        # a GGUF file's config and tensor names, for the family that reads its architecture
        return None if self.gguf is None else self.gguf(architecture, metadata, tensors)
