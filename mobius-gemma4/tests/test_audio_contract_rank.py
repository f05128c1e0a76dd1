"""Regression: a rank-3 audio producer must fail contract validation with the rank message."""

from __future__ import annotations

import json

import onnx_ir as ir
import pytest
from reference.paths import TINY_HUBSTYLE

from mobius.components.graph import add_input, add_output, finish_model, new_graph
from mobius.contract import Component, Contract, Edge, ExternalInput, Port, validate
from mobius.errors import ContractError
from mobius.records import BuildOptions
from mobius_gemma4.audio import build_audio_encoder, read_audio_config

TINY = TINY_HUBSTYLE
H = 64


def _ports(values) -> tuple[Port, ...]:
    names = {ir.DataType.FLOAT: "float32", ir.DataType.BOOL: "bool"}
    return tuple(
        Port(v.name, names[v.dtype], tuple(d if isinstance(d, int) else str(d) for d in v.shape))
        for v in values
    )


def _consumer() -> ir.Model:
    graph, _, op = new_graph("embedding")
    x = add_input(op, "audio_features", "float32", ("num_audio_tokens", H))
    add_output(op, op.Identity(x), "inputs_embeds", shape=("num_audio_tokens", H))
    return finish_model(graph)


def _rank3(model: ir.Model) -> ir.Model:
    """The real encoder with its feature output re-exposed as ``[1, n, H]`` (the old bug)."""
    graph = model.graph
    old = next(v for v in graph.outputs if v.name == "audio_features")
    old.name = "audio_features_rank2"
    axes = ir.Value(name="unsq_axes", const_value=ir.tensor([0], dtype=ir.DataType.INT64))
    axes.type, axes.shape = ir.TensorType(ir.DataType.INT64), ir.Shape([1])
    graph.register_initializer(axes)
    node = ir.node("Unsqueeze", [old, axes], num_outputs=1)
    graph.append(node)
    new = node.outputs[0]
    new.name, new.type = "audio_features", ir.TensorType(ir.DataType.FLOAT)
    new.shape = ir.Shape([1, "num_audio_tokens", H])
    graph.outputs[[v.name for v in graph.outputs].index("audio_features_rank2")] = new
    return model


def _contract(audio: ir.Model, embedding: ir.Model) -> Contract:
    return Contract(
        components=(
            Component("audio_encoder", _ports(audio.graph.inputs), _ports(audio.graph.outputs)),
            Component("embedding", _ports(embedding.graph.inputs), _ports(embedding.graph.outputs)),
        ),
        edges=(Edge("audio_encoder.audio_features", "embedding.audio_features"),),
        externals=(
            ExternalInput("audio_encoder.input_features", "input_features"),
            ExternalInput("audio_encoder.input_features_mask", "input_features_mask"),
        ),
        outputs=("embedding.inputs_embeds",),
    )


def _audio() -> ir.Model:
    cfg = read_audio_config(json.loads(TINY.read_text())["audio_config"])
    return build_audio_encoder(cfg, H, BuildOptions())


@pytest.mark.l1
def test_rank2_audio_producer_validates() -> None:
    audio, emb = _audio(), _consumer()
    validate(_contract(audio, emb), {"audio_encoder": audio, "embedding": emb})


@pytest.mark.l1
def test_rank3_audio_producer_fails_with_rank_message() -> None:
    audio, emb = _rank3(_audio()), _consumer()
    with pytest.raises(ContractError) as err:
        validate(_contract(audio, emb), {"audio_encoder": audio, "embedding": emb})
    assert (
        "'audio_encoder.audio_features -> embedding.audio_features' has incompatible ranks: "
        "producer rank 3" in str(err.value)
    )
