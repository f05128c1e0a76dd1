"""Refusing packages that cannot be trusted: hash mismatch, missing files, port drift."""

from __future__ import annotations

import json

import pytest
import toypkg

from mobius.errors import ContractError, PackageError
from mobius_runtime import Pipeline


def test_altered_weights_are_refused_naming_the_file(single_pkg):
    data = single_pkg / "model" / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(PackageError) as info:
        Pipeline.load(single_pkg, device="cpu")
    assert "model/model.onnx.data" in str(info.value)
    assert "sha256" in str(info.value)


def test_altered_runtime_file_is_refused(single_pkg):
    (single_pkg / "tokenizer.json").write_text("{}")
    with pytest.raises(PackageError, match=r"tokenizer\.json"):
        Pipeline.load(single_pkg, device="cpu")


def test_missing_component_file_is_refused(single_pkg):
    (single_pkg / "model" / "model.onnx").unlink()
    with pytest.raises(PackageError, match=r"model/model\.onnx: missing"):
        Pipeline.load(single_pkg, device="cpu")


def test_not_a_package(tmp_path):
    with pytest.raises(PackageError):
        Pipeline.load(tmp_path / "nowhere", device="cpu")


def test_port_mismatch_names_component_and_port(single_pkg):
    manifest = json.loads((single_pkg / "mobius.json").read_text())
    for port in manifest["contract"]["components"][0]["inputs"]:
        if port["name"] == "attention_mask":
            port["dtype"] = "bool"
    (single_pkg / "mobius.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError) as info:
        Pipeline.load(single_pkg, device="cpu")
    assert "'model.attention_mask' has dtype bool in the contract but int64 in graph" in str(
        info.value
    )


def test_port_drift_past_the_package_check_is_caught_by_the_session(single_pkg):
    """The session check stays as a second line: a contract the graph check cannot see
    (a port the toy graph leaves untyped) still fails naming component and port."""
    import onnxruntime as ort

    from mobius_runtime.ort_sessions import check_ports

    session = ort.InferenceSession(str(single_pkg / "model" / "model.onnx"))
    contract = Pipeline.load(single_pkg, device="cpu").contract.component("model")
    bad = type(contract)(
        contract.name,
        tuple(
            type(p)(p.name, "bool", p.shape) if p.name == "attention_mask" else p
            for p in contract.inputs
        ),
        contract.outputs,
    )
    with pytest.raises(ContractError) as info:
        check_ports(session, bad)
    assert "model.attention_mask" in str(info.value)
    assert "bool" in str(info.value) and "tensor(int64)" in str(info.value)


def test_toy_graphs_are_valid():
    dec = toypkg.decoder_graph(kv_dtype="float16", mask_dtype="bool", embeds_input=True)
    assert next(i.name for i in dec.graph.input) == "inputs_embeds"
