"""The whole mobius plugin API, in one place.

mobius is a pluggy host with project name and entry-point group ``mobius``. A
model family ships as its own distribution and declares::

    [project.entry-points.mobius]
    myfamily = "myfamily_package.plugin"

The module named there implements some of the hooks below with
``@mobius.hookimpl``. Hooks are called with keyword arguments only; an
implementation may name any subset of a hook's arguments and receives just those,
so adding an argument to a hook never breaks an existing plugin.

Two kinds of hooks:

- **Broadcast** hooks (``mobius_model_types``, ``mobius_optimize_component``,
  ``mobius_add_commands``) are called on every loaded plugin.
- **Owner-only** hooks (config, contract, building, weights, processors, runtime
  files) are called only on the plugin that claimed the ``model_type`` being
  built, through :class:`mobius.plugins.PluginHost`. Two plugins claiming one
  model type is an error naming both distributions.

``mobius_open_checkpoint`` is ``firstresult``: the first plugin that recognises
the source answers. Core registers three built-in implementations (a GGUF file, a
local folder and the HuggingFace Hub) that run after every external plugin.
``mobius_gguf_translation`` is ``firstresult`` too: the family that knows a GGUF
file's ``general.architecture`` answers; so is ``mobius_gguf_companion_translation``
(the same, with the model's ``mmproj`` companion file).

``HOOK_API_VERSION`` is the version of this API. It rises when a hook or an
argument is added (compatible) and its major part when one is removed or renamed
(after a deprecation window; see ``docs/plugins.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import onnx_ir as ir
    import typer

    from mobius.checkpoint import Checkpoint
    from mobius.contract import Contract
    from mobius.plugins import PluginHost
    from mobius.records import (
        BuildOptions,
        GGUFCompanion,
        GGUFTranslation,
        ModelTypeInfo,
        Processors,
        RuntimeFile,
    )
    from mobius.weights import WeightPlan

PROJECT = "mobius"
HOOK_API_VERSION = "1.3"
"""1.1 added ``mobius_quant_overrides``; 1.2 added ``mobius_gguf_translation`` and the
``host`` argument of ``mobius_open_checkpoint``; 1.3 added
``mobius_gguf_companion_translation`` and the ``companion`` argument of
``mobius_open_checkpoint``."""

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --------------------------------------------------------------------------- discovery


@hookspec
def mobius_model_types() -> list[ModelTypeInfo]:
    """Declare the model types this plugin builds.

    Called: once on every plugin, when the plugin host is created.
    Who answers: every family plugin; plugins that build nothing (a runtime, a
    test harness) do not implement it.
    Returns: a list of :class:`mobius.records.ModelTypeInfo`, one per
    ``config.json["model_type"]`` value served. Core builds the registry
    model_type → owning plugin from these answers and refuses a model type
    claimed twice.
    """


# --------------------------------------------------------------------------- config


@hookspec
def mobius_read_config(model_type: str, raw: dict[str, Any]) -> Any:
    """Turn the raw JSON of ``config.json`` into the plugin's typed config.

    Called: once per build, on the owner of ``model_type`` only, after core has
    read the file as plain JSON (never through transformers).
    Who answers: the owning family plugin.
    Returns: a frozen object the plugin understands; core passes it back
    unchanged to the other owner-only hooks. Raise
    :class:`mobius.errors.ConfigError` for values the plugin cannot build.
    """


# --------------------------------------------------------------------------- contracts


@hookspec
def mobius_pipeline_contract(config: Any, options: BuildOptions) -> Contract:
    """Describe the package: its sub-models, their ports and the edges between them.

    Called: once per build, on the owner only, before any graph is built.
    Who answers: the owning family plugin.
    Returns: a :class:`mobius.contract.Contract`. Core validates it against the
    built graphs before anything is written, and stores it in the manifest; the
    runtime executes it.
    """


# --------------------------------------------------------------------------- building


@hookspec
def mobius_build_component(config: Any, component: str, options: BuildOptions) -> ir.Model:
    """Construct the ONNX graph of one component of the contract.

    Called: once per component named in the contract, on the owner only.
    Who answers: the owning family plugin.
    Returns: an ``onnx_ir.Model`` whose initializers have names, dtypes and
    shapes but no data yet (parameters are bound by the weight plan).
    Initializers that are constants of the architecture (RoPE tables, masks)
    may carry their data.
    """


@hookspec
def mobius_optimize_component(model: ir.Model, component: str, target: str) -> ir.Model | None:
    """Rewrite a built component for an execution-provider target.

    Called: on every plugin, in registration order, after building and before
    weights are bound; each answer is fed to the next plugin.
    Who answers: any plugin with fusions or lowerings for ``target``
    (``default``, ``cpu`` or ``cuda``).
    Returns: the rewritten model, or ``None`` to leave it unchanged. A rewrite
    must keep every contract port.
    """


# --------------------------------------------------------------------------- weights


@hookspec(firstresult=True)
def mobius_open_checkpoint(
    source: str, revision: str | None, host: PluginHost | None, companion: str | None
) -> Checkpoint | None:
    """Open the checkpoint a user named on the command line.

    Called: once per build; the first non-``None`` answer wins. ``host`` is the
    :class:`mobius.plugins.PluginHost` calling, for an opener that needs other
    plugins' answers (core's GGUF opener asks ``mobius_gguf_translation``); ``None``
    when the hook is called outside a host. ``companion`` is the companion file the
    user named (``mobius build --mmproj FILE``: a GGUF model's ``mmproj`` file, or
    ``"none"`` for no companion), ``None`` when none was named; an opener of sources
    that have no companions raises a CheckpointError when one is named.
    Who answers: core's built-ins (a ``.gguf`` file, a folder holding one or the first
    file of a split; a local folder; a HuggingFace Hub id through
    ``huggingface_hub.snapshot_download``) and any plugin adding another source.
    Returns: a :class:`mobius.checkpoint.Checkpoint`, or ``None`` when the
    source is not one this plugin recognises.
    """


@hookspec(firstresult=True)
def mobius_gguf_translation(
    architecture: str, metadata: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]]
) -> GGUFTranslation | None:
    """Read a GGUF file (llama.cpp's format) as the family's HF checkpoint.

    Called: by core's GGUF opener, once per build from a GGUF file, on every plugin
    until one answers; ``architecture`` is the file's ``general.architecture``,
    ``metadata`` every metadata key with its value (numbers, strings, lists; the
    tokenizer keys included), ``tensors`` every tensor name with its shape in numpy
    order (slowest axis first: a linear weight is ``[out_features, in_features]``,
    as HF stores it).
    Who answers: the family that serves that architecture (core knows none).
    Returns: a :class:`mobius.records.GGUFTranslation`: the HF ``config.json``
    object the metadata describes (as HF's GGUF loader builds it, ``model_type``
    included) and every GGUF tensor name mapped to its HF weight name, with the
    transforms that undo llama.cpp's conversion (``mobius.checkpoint.gguf``:
    ``unpermute_rows`` for Llama / Mistral q and k, ``add_constant(-1.0)`` for
    Gemma 1–3 norms, ``pad_rows`` for a cut embedding); ``None`` for an
    architecture the plugin does not serve. Core builds the tokenizer, chat template
    and stop ids from the metadata itself; ``bos_token_id`` / ``eos_token_id`` /
    ``pad_token_id`` it adds to the config when the family's has none.
    """


@hookspec(firstresult=True)
def mobius_gguf_companion_translation(
    architecture: str,
    metadata: Mapping[str, Any],
    tensors: Mapping[str, tuple[int, ...]],
    companion: GGUFCompanion,
) -> GGUFTranslation | None:
    """Read a GGUF model file together with its companion file (llama.cpp's ``mmproj``
    file, which holds the vision / audio encoders) as one HF checkpoint.

    Called: by core's GGUF opener instead of ``mobius_gguf_translation`` when the model
    has a companion (named by ``--mmproj FILE``, or the one ``mmproj*.gguf`` file
    beside the model), on every plugin until one answers; ``architecture``,
    ``metadata`` and ``tensors`` are the model file's, as for
    ``mobius_gguf_translation``; ``companion`` is a :class:`mobius.records.GGUFCompanion`
    (its metadata and tensor shapes). Core refuses a tensor name found in both files
    before calling.
    Who answers: the family that serves that architecture and reads its companions.
    Returns: a :class:`mobius.records.GGUFTranslation` whose ``config`` describes the
    whole model (e.g. a multimodal ``config.json``) and whose ``tensors`` maps every
    tensor of both files; ``None`` when the plugin does not read this companion (core
    then builds the model file alone, saying so, or refuses when the user named the
    companion). A companion that does not belong to the model (another projector type,
    other widths) is a CheckpointError saying so.
    """


@hookspec
def mobius_weight_plan(
    config: Any, component: str, checkpoint: Checkpoint, options: BuildOptions
) -> WeightPlan:
    """Say how each initializer of a component is made from checkpoint tensors.

    Called: once per component, on the owner only, after the graph is built.
    Who answers: the owning family plugin.
    Returns: a :class:`mobius.weights.WeightPlan` mapping initializer names to
    lazy tensor expressions (checkpoint tensor + cast / transpose / reshape /
    scale / slice / concat). Nothing is read until the package is saved.
    """


@hookspec
def mobius_quant_overrides(
    config: Any, component: str, options: BuildOptions
) -> Mapping[str, str] | None:
    """Say which initializers of a component keep float or get another bit width.

    Called: once per component, on the owner only, and only when the user asked for
    ``--quant`` (``options.quant`` is set), after the weight plan and before core
    rewrites ``MatMul`` / ``Gemm`` / ``Gather`` on planned 2-D initializers into
    com.microsoft ``MatMulNBits`` / ``GatherBlockQuantized`` (``docs/quantization.md``).
    Who answers: a family plugin with tensors that lose too much when quantized
    (router weights, small encoder projections) or that want a wider type (an int8
    lm_head); a family need not implement it to get quantized packages.
    Returns: a mapping of ``fnmatch`` globs over initializer names to ``"float"``,
    ``"int4"`` or ``"int8"`` (first matching glob wins; the user's
    ``--quant-exclude`` globs win over it), or ``None`` for no overrides.
    """


# --------------------------------------------------------------------------- runtime


@hookspec
def mobius_processors(config: Any) -> Processors:
    """Give the runtime the family's preprocessing (prompt, images, audio) in numpy.

    Called: by the runtime when it loads a package, on the owner only, with the config
    read (``mobius_read_config``) from the package's copy of ``config.json``; when the
    package holds a ``generation_config.json``, its object is in the raw dict under
    ``mobius.config.GENERATION_CONFIG_KEY`` (``"_generation_config"``), so the family
    can add its ``eos_token_id`` to the stop ids as it did for ``genai_config.json``.
    Who answers: the owning family plugin.
    Returns: a :class:`mobius.records.Processors`.
    """


@hookspec
def mobius_runtime_files(
    config: Any, contract: Contract, checkpoint: Checkpoint, options: BuildOptions
) -> list[RuntimeFile]:
    """List the files a package needs besides its graphs.

    Called: once per build, on the owner only, while the package is written.
    Who answers: the owning family plugin.
    Returns: :class:`mobius.records.RuntimeFile` records, e.g.
    ``genai_config.json``, tokenizer files copied from the checkpoint,
    processor configs.
    """


# --------------------------------------------------------------------------- CLI


@hookspec
def mobius_add_commands(app: typer.Typer) -> None:
    """Add commands to the ``mobius`` CLI.

    Called: on every plugin, once, before the CLI parses its arguments.
    Who answers: plugins with commands (the runtime adds ``run``, the testing
    plugin adds ``golden``). Keep the plugin module import-light: import heavy
    libraries inside the command bodies so ``mobius --help`` stays fast.
    Returns: nothing; call ``app.command()`` or ``app.add_typer()``.
    """
