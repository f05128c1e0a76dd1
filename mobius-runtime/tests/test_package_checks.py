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
    with pytest.raises(PackageError, match=r"model/model\.onnx is missing"):
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
    with pytest.raises(ContractError) as info:
        Pipeline.load(single_pkg, device="cpu")
    assert "model.attention_mask" in str(info.value)
    assert "bool" in str(info.value) and "tensor(int64)" in str(info.value)


def test_hash_cache_rehashes_after_a_rewrite(tmp_path):
    from mobius_runtime.hashing import sha256_of

    f = tmp_path / "x.bin"
    f.write_bytes(b"one")
    first = sha256_of(f)
    assert sha256_of(f) == first
    f.write_bytes(b"three")
    assert sha256_of(f) != first


def test_toy_graphs_are_valid():
    dec = toypkg.decoder_graph(kv_dtype="float16", mask_dtype="bool", embeds_input=True)
    assert next(i.name for i in dec.graph.input) == "inputs_embeds"
