"""The decoder-LM family kit: what every text decoder family otherwise writes again.

One signature each (docs/writing-a-plugin.md §7 shows a whole family on it):

- config (:mod:`mobius.lm.config`): ``DecoderConfig`` (frozen; a family subclasses it),
  ``read_decoder(model_type, raw, where, *, family, defaults, rope_types=STATIC_ROPE_TYPES)
  -> dict`` of its common fields, ``read_rope(raw, where, max_positions, *, family,
  rope_types) -> RopeParams`` (both HF rope shapes), ``read_layer_types(raw, layers, window,
  where, *, default) -> tuple``; ``FULL`` / ``SLIDING``; ``HF_ACTIVATIONS``;
- ports and contract (:mod:`mobius.lm.ports`): ``kv_port(i, kind, *, present=False)`` (the
  one spelling of ``past_key_values.{i}.key`` / ``present.{i}.key``), ``LMShape(vocab_size,
  kv_heads, head_dims, shared=frozenset())`` / ``LMShape.uniform(...)``, ``lm_ports(shape,
  dtype) -> (inputs, outputs)``, ``lm_contract(shape, dtype, component="model")``,
  ``kv_states(shape, component)`` (the KV loop of a component of a larger contract),
  ``to_ports(specs)``, ``build_graph(name, inputs, outputs, forward) -> ir.Model``;
- the model (:mod:`mobius.lm.decoder`): ``attention_path(target, dtype, *, family, layers)``
  (Attention vs GroupQueryAttention, reason logged; ``attention_paths(target, dtype, *,
  family, gqa_exact)`` per layer where some masks GroupQueryAttention cannot express), ``SelfAttention``, ``DecoderLayer``,
  ``DecoderLM``, ``build_decoder(cfg, build_dtype, target, *, family, qk_norm=False,
  mlp=gated_mlp)``, ``decoder_shape(cfg)``; on ``--target cpu`` float32 the RMSNorms and
  residual adds are onnxruntime's fused norm ops (``fused_rmsnorm_available``; a layer
  returns ``(h, pending, present_key, present_value)``, ``pending`` the residual the next
  norm adds);
- the Gemma shape (:mod:`mobius.lm.gemma`): ``GemmaConfig`` (in :mod:`mobius.lm.config`),
  ``build_gemma(cfg, build_dtype, target, *, family)``, ``gemma_plan(cfg, checkpoint, dtype)``,
  ``GemmaDecoderLM`` (overrides ``DecoderLM.rotary`` / ``logits``);
- weights (:mod:`mobius.lm.weights`): ``hf_linear(name, dtype, prefix="model.")``,
  ``hf_plain(...)``, ``add_head(plan, tied, checkpoint, dtype)``, ``decoder_plan(cfg,
  checkpoint, dtype, *, qk_norm=False, dense_mlp=None)``;
- runtime files (:mod:`mobius.lm.runtime`): ``stop_ids(config, generation_eos_ids, *extra)``,
  ``genai_config(config, genai_type, eos, filename=...)``, ``runtime_files(config,
  checkpoint, genai_type)``, ``text_processors(config, format_prompt, *, bos_token_id=None)``,
  ``check_component(config, component, where, family)``;
- the plugin object (:mod:`mobius.lm.family`): ``DecoderFamily(name, model_types,
  read_config, *, build=None, weight_plan=None, format_prompt=None, genai_types=None)``,
  whose methods are the hooks (entry point ``name = "pkg.plugin:FAMILY"``).

Import cost: :mod:`mobius.lm.decoder` and :mod:`mobius.lm.ports` import onnx_ir and
onnxscript; a plugin module imports them inside its hook bodies.
"""
