"""Pipeline contracts: JSON round trip, self-consistency and validation against graphs."""

from __future__ import annotations

import json

import onnx_ir as ir
import pytest

from mobius.components import add_input, add_output, finish_model, new_graph
from mobius.components.dtypes import DTYPE_NAMES
from mobius.contract import (
    DTYPES,
    Component,
    Contract,
    Edge,
    ExternalInput,
    OptionalInput,
    Port,
    StateEdge,
    validate,
)
from mobius.errors import ContractError


def _graph(name: str, inputs: list[Port], outputs: list[Port]) -> ir.Model:
    """A graph whose every output is a Cast of the first input: ports exactly as given."""
    graph, _, op = new_graph(name)
    values = [add_input(op, p.name, p.dtype, p.shape) for p in inputs]
    for port in outputs:
        y = op.Cast(values[0], to=ir.DataType[_IR[port.dtype]])
        y = op.Expand(op.ReduceSum(y, keepdims=0), [1] * len(port.shape))
        add_output(op, y, port.name, dtype=port.dtype, shape=port.shape)
    return finish_model(graph)


_IR = {"float32": "FLOAT", "float16": "FLOAT16", "int64": "INT64", "bool": "BOOL"}


def _pipeline() -> tuple[Contract, dict[str, ir.Model]]:
    """audio_encoder -> embedding -> decoder with a KV state loop; valid as built."""
    audio = Component(
        "audio_encoder",
        inputs=(Port("input_features", "float32", ("batch", "frames", 8)),),
        outputs=(Port("audio_features", "float32", ("num_audio_tokens", 16)),),
        presence="audio",
    )
    embedding = Component(
        "embedding",
        inputs=(
            Port("input_ids", "int64", ("batch", "sequence_len")),
            Port("audio_features", "float32", ("num_audio_tokens", 16)),
        ),
        outputs=(Port("inputs_embeds", "float32", ("batch", "sequence_len", 16)),),
    )
    decoder = Component(
        "decoder",
        inputs=(
            Port("inputs_embeds", "float32", ("batch", "sequence_len", 16)),
            Port("attention_mask", "int64", ("batch", "total_sequence_len")),
            Port("past_key_values.0.key", "float32", ("batch", 2, "past_sequence_len", 8)),
        ),
        outputs=(
            Port("logits", "float32", ("batch", "sequence_len", 32)),
            Port("present.0.key", "float32", ("batch", 2, "total_sequence_len", 8)),
        ),
    )
    contract = Contract(
        components=(audio, embedding, decoder),
        edges=(
            Edge("audio_encoder.audio_features", "embedding.audio_features"),
            Edge("embedding.inputs_embeds", "decoder.inputs_embeds"),
        ),
        states=(
            StateEdge("decoder.present.0.key", "decoder.past_key_values.0.key", ("batch", 2, 0, 8)),
        ),
        externals=(
            ExternalInput("audio_encoder.input_features", "input_features"),
            ExternalInput("embedding.input_ids", "input_ids"),
            ExternalInput("decoder.attention_mask", "attention_mask", kind="generated"),
        ),
        optionals=(OptionalInput("embedding.audio_features", "audio", (0, 16)),),
        outputs=("decoder.logits",),
    )
    graphs = {c.name: _graph(c.name, list(c.inputs), list(c.outputs)) for c in contract.components}
    return contract, graphs


def _errors(contract: Contract, graphs: dict[str, ir.Model]) -> str:
    with pytest.raises(ContractError) as info:
        validate(contract, graphs)
    return str(info.value)


def _replace_component(contract: Contract, comp: Component) -> Contract:
    comps = tuple(comp if c.name == comp.name else c for c in contract.components)
    return Contract(
        comps,
        contract.edges,
        contract.states,
        contract.externals,
        contract.optionals,
        contract.outputs,
    )


def test_valid_pipeline_passes() -> None:
    contract, graphs = _pipeline()
    contract.check()
    validate(contract, graphs)
    assert contract.component("decoder").output("logits").shape[-1] == 32
    with pytest.raises(ContractError, match="no component 'vision_encoder'"):
        contract.component("vision_encoder")


def test_dtype_names_match_components() -> None:
    assert tuple(DTYPES) == tuple(DTYPE_NAMES)


def test_json_round_trip() -> None:
    contract, _ = _pipeline()
    text = contract.to_json()
    data = json.loads(text)
    assert data["states"][0]["initial_shape"] == ["batch", 2, 0, 8]
    assert data["components"][0]["outputs"][0]["shape"] == ["num_audio_tokens", 16]
    back = Contract.from_json(text)
    assert back == contract
    assert Contract.from_dict(contract.to_dict()) == contract
    assert isinstance(back.components[0].inputs, tuple)
    assert isinstance(back.states[0].initial_shape, tuple)


def test_malformed_json_is_a_contract_error() -> None:
    with pytest.raises(ContractError, match="malformed"):
        Contract.from_dict({"components": [{"name": "x", "inputs": [{"name": "a"}]}]})
    with pytest.raises(ContractError, match="not valid JSON"):
        Contract.from_json("{nope")


def test_unsourced_required_input() -> None:
    contract, graphs = _pipeline()
    contract = Contract(
        contract.components,
        contract.edges,
        contract.states,
        tuple(x for x in contract.externals if x.name != "attention_mask"),
        contract.optionals,
        contract.outputs,
    )
    msg = _errors(contract, graphs)
    assert "'decoder.attention_mask' has no source" in msg
    assert "1 problem(s)" in msg


def test_optional_input_needs_a_source_besides_fallback() -> None:
    contract, graphs = _pipeline()
    contract = Contract(
        contract.components,
        contract.edges[1:],
        contract.states,
        contract.externals,
        contract.optionals,
        contract.outputs,
    )
    msg = _errors(contract, graphs)
    assert "'embedding.audio_features' has no source" in msg
    assert "fallback is not a source" in msg


def test_dtype_mismatch_on_edge_and_graph() -> None:
    contract, graphs = _pipeline()
    embedding = contract.component("embedding")
    bad = Component(
        "embedding",
        inputs=(embedding.inputs[0], Port("audio_features", "float16", ("num_audio_tokens", 16))),
        outputs=embedding.outputs,
    )
    msg = _errors(_replace_component(contract, bad), graphs)
    assert (
        "'audio_encoder.audio_features -> embedding.audio_features' has incompatible dtypes: "
        "producer float32, consumer float16"
    ) in msg
    # the graph still says float32: that is reported too, with the port
    assert (
        "'embedding.audio_features' has dtype float16 in the contract but float32 in graph" in msg
    )


def test_rank_mismatch_on_edge() -> None:
    contract, graphs = _pipeline()
    audio = contract.component("audio_encoder")
    bad_audio = Component(
        "audio_encoder",
        inputs=audio.inputs,
        outputs=(Port("audio_features", "float32", ("B", "T", "H")),),
        presence="audio",
    )
    embedding = contract.component("embedding")
    bad_embedding = Component(
        "embedding",
        inputs=(embedding.inputs[0], Port("audio_features", "float32", ("N", "H"))),
        outputs=embedding.outputs,
    )
    contract = _replace_component(_replace_component(contract, bad_audio), bad_embedding)
    graphs["audio_encoder"] = _graph(
        "audio_encoder", list(bad_audio.inputs), list(bad_audio.outputs)
    )
    msg = _errors(contract, graphs)
    assert (
        "'audio_encoder.audio_features -> embedding.audio_features' has incompatible ranks: "
        "producer rank 3 [B,T,H], consumer rank 2 [N,H]"
    ) in msg
    assert "1 problem(s)" in msg


def test_static_dim_mismatch_on_edge() -> None:
    contract, graphs = _pipeline()
    embedding = contract.component("embedding")
    bad = Component(
        "embedding",
        inputs=(embedding.inputs[0], Port("audio_features", "float32", ("num_audio_tokens", 24))),
        outputs=embedding.outputs,
    )
    msg = _errors(_replace_component(contract, bad), graphs)
    assert "incompatible static dims on axis 1: producer 16" in msg
    assert "has static dim 24 on axis 1 in the contract but 16 in graph 'embedding'" in msg


def test_two_sources() -> None:
    contract, graphs = _pipeline()
    contract = Contract(
        contract.components,
        contract.edges,
        contract.states,
        (*contract.externals, ExternalInput("embedding.audio_features", "audio_features")),
        contract.optionals,
        contract.outputs,
    )
    msg = _errors(contract, graphs)
    assert "'embedding.audio_features' has 2 sources" in msg
    assert "edge from 'audio_encoder.audio_features'" in msg


def test_port_missing_in_graph() -> None:
    contract, graphs = _pipeline()
    decoder = contract.component("decoder")
    graphs["decoder"] = _graph(
        "decoder", [p for p in decoder.inputs if p.name != "attention_mask"], list(decoder.outputs)
    )
    msg = _errors(contract, graphs)
    assert (
        "'decoder.attention_mask' is declared as an input in the contract but graph 'decoder' has no input"
        in msg
    )


def test_undeclared_graph_input() -> None:
    contract, graphs = _pipeline()
    decoder = contract.component("decoder")
    extra = [*decoder.inputs, Port("per_layer_inputs", "float32", ("batch", "sequence_len", 4))]
    graphs["decoder"] = _graph("decoder", extra, list(decoder.outputs))
    msg = _errors(contract, graphs)
    assert "graph 'decoder' has input 'per_layer_inputs' that the contract does not declare" in msg


def test_graph_and_component_sets_must_match() -> None:
    contract, graphs = _pipeline()
    graphs["vision_encoder"] = graphs.pop("audio_encoder")
    msg = _errors(contract, graphs)
    assert "component 'audio_encoder' has no graph" in msg
    assert "graph 'vision_encoder' is not a component" in msg


def test_self_consistency_lists_every_problem() -> None:
    contract, _ = _pipeline()
    comps = (*contract.components, Component("embedding", (), ()))
    bad = Contract(
        comps,
        (
            *contract.edges,
            Edge("decoder.logits", "embedding.inputs_embeds"),
            Edge("nowhere.x", "decoder.inputs_embeds"),
        ),
        (StateEdge("decoder.present.0.key", "decoder.past_key_values.0.key", ("batch", 0, 8)),),
        (
            *contract.externals,
            ExternalInput("decoder.inputs_embeds", "inputs_embeds", kind="generated"),
        ),
        (OptionalInput("embedding.audio_features", "audio", (0,)),),
        ("decoder.nope",),
    )
    problems = bad.problems()
    text = "\n".join(problems)
    assert "component name 'embedding' is used twice" in text
    assert (
        "'embedding.inputs_embeds' must be an input of 'embedding' but is not (it is an output)"
        in text
    )
    assert "names unknown component 'nowhere'" in text
    assert (
        "initial_shape [batch,0,8] of rank 3 but the port [batch,2,past_sequence_len,8] has rank 4"
        in text
    )
    assert "generated as 'inputs_embeds'" in text
    assert "absent_shape [0] of rank 1" in text
    assert "contract output 'decoder.nope'" in text
    assert "'decoder.inputs_embeds' has 3 sources" in text
    with pytest.raises(ContractError) as info:
        bad.check()
    assert f"{len(problems)} problem(s)" in str(info.value)


def test_state_edge_dtype_mismatch() -> None:
    contract, graphs = _pipeline()
    decoder = contract.component("decoder")
    bad = Component(
        "decoder",
        inputs=decoder.inputs,
        outputs=(
            decoder.outputs[0],
            Port("present.0.key", "float16", ("batch", 2, "total_sequence_len", 8)),
        ),
    )
    graphs["decoder"] = _graph("decoder", list(bad.inputs), list(bad.outputs))
    msg = _errors(_replace_component(contract, bad), graphs)
    assert (
        "state edge 'decoder.present.0.key -> decoder.past_key_values.0.key' has incompatible dtypes"
        in msg
    )
