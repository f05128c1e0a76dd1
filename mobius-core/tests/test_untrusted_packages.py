"""``mobius verify`` on crafted packages: every path a package names stays inside it,
malformed manifests are clear errors, what the runtime would allocate is bounded.

The runtime side (``Pipeline.load`` and ``mobius run`` refusing the same packages) is
``mobius-runtime/tests/test_hostile_packages.py``; both go through
``mobius.package.checks.check_package``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import onnx
import pytest
from conftest import write_tiny_checkpoint
from typer.testing import CliRunner

import mobius
from mobius.cli import make_app
from mobius.contract_runtime import MAX_ZERO_ELEMENTS, initial_dims
from mobius.errors import PackageError
from mobius.package import MANIFEST_NAME, read_package, verify_package
from mobius.package.content import load_json, tokenizer_problems
from mobius.package.stamp import STAMP_NAME
from mobius.plugins import PluginHost

GRAPH = "model/model.onnx"
DATA = "model/model.onnx.data"


@pytest.fixture
def package(tmp_path: Path) -> Path:
    from plugins_for_tests import tinytest

    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", in_features=16, out_features=32)
    host = PluginHost.from_plugins({"tinytest": tinytest})
    return mobius.build(str(ckpt), str(tmp_path / "pkg"), host=host).out


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.bin").write_bytes(b"s" * 4096)
    return folder


def verify_cli(package: Path) -> list[str]:
    result = CliRunner().invoke(make_app(), ["verify", str(package), "--json"])
    assert result.exit_code == 1, result.output
    problems = json.loads(result.stdout)["problems"]
    assert problems == verify_package(package)
    return problems


def edit_manifest(package: Path, change) -> None:
    manifest = json.loads((package / MANIFEST_NAME).read_text())
    change(manifest)
    (package / MANIFEST_NAME).write_text(json.dumps(manifest))


def repin_graph(package: Path) -> None:
    data = (package / GRAPH).read_bytes()
    sha, size = hashlib.sha256(data).hexdigest(), len(data)
    edit_manifest(package, lambda m: m["components"]["model"].update(sha256=sha, model_size=size))


def set_location(package: Path, location: str, offset: int | None = None) -> None:
    model = onnx.load(str(package / GRAPH), load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.external_data)
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = location
        if entry.key == "offset" and offset is not None:
            entry.value = str(offset)
    (package / GRAPH).write_bytes(model.SerializeToString())
    repin_graph(package)


def test_a_built_package_is_stamped_and_verifies(package: Path) -> None:
    assert (package / STAMP_NAME).is_file()
    assert verify_package(package) == []


@pytest.mark.parametrize(
    "location, needle",
    [
        ("../../outside/secret.bin", "leaves the package folder"),
        ("/dev/zero", "leaves the package folder"),
        ("OUTSIDE", "leaves the package folder"),
        ("model.onnx", "not a file the manifest pins"),  # the graph file is pinned, but…
    ],
)
def test_external_data_outside_the_package(package, outside, location, needle):
    if location == "OUTSIDE":
        location = str(outside / "secret.bin")
    set_location(package, location)
    problems = verify_cli(package)
    if location == "model.onnx":  # …pinned files are allowed; this one is too small
        assert any("past the end" in p or "needs" in p for p in problems), problems
    else:
        assert any(needle in p and "external data" in p for p in problems), problems


def test_external_data_offset_past_the_end(package):
    set_location(package, "model.onnx.data", offset=1 << 40)
    assert any("past the end" in p for p in verify_cli(package))


def test_symlink_pointing_outside(package, outside):
    target = outside / "model.onnx.data"
    (package / DATA).rename(target)
    (package / DATA).symlink_to(target)
    problems = verify_cli(package)
    assert any(
        p.startswith(f"{DATA}: resolves to") and "outside the package" in p for p in problems
    )


def test_a_manifest_symlinked_from_outside_is_not_read(package, outside):
    target = outside / MANIFEST_NAME
    (package / MANIFEST_NAME).rename(target)
    (package / MANIFEST_NAME).symlink_to(target)
    (problem,) = verify_cli(package)
    assert problem.startswith(f"{MANIFEST_NAME} resolves to {target}, outside the package")


def test_format_version_must_be_the_integer(package):
    edit_manifest(package, lambda m: m.update(format_version=1.0))
    (problem,) = verify_cli(package)
    assert "unknown package format_version 1.0" in problem


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this OS")
def test_a_fifo_is_not_read(package):
    (package / DATA).unlink()
    os.mkfifo(package / DATA)
    assert f"{DATA}: not a regular file" in verify_cli(package)


def test_sparse_terabyte_file_is_refused_on_its_size(package, monkeypatch):
    import mobius.package.checks as checks

    hashed = []
    real = checks._sha256_size
    monkeypatch.setattr(checks, "_sha256_size", lambda p: hashed.append(p) or real(p))
    os.truncate(package / DATA, 1 << 40)
    assert any(p.startswith(f"{DATA}: size 1099511627776 bytes") for p in verify_cli(package))
    assert (package / DATA).resolve() not in hashed


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda m: m["components"]["model"].update(sha256=7), "is not a 64-digit"),
        (lambda m: m["components"]["model"].update(data_size=-1), "not a non-negative integer"),
        (lambda m: m.update(files=[]), "files is not an object"),
        (lambda m: m["files"].update({"x": "y"}), "files.x is not an object"),
        (lambda m: m["components"].update({"../up": {"path": "x"}}), "not a plain folder name"),
        (lambda m: m.update(components={f"c{i}": {"path": "p"} for i in range(30_000)}), "30000"),
        (lambda m: m["contract"].update(outputs=["nodot"]), "is not written 'component.port'"),
        (
            lambda m: m["contract"]["edges"].append({"producer": "a.b", "consumer": "model.x"}),
            "names unknown component 'a'",
        ),
    ],
)
def test_malformed_manifests_are_listed_not_raised(package, change, needle):
    edit_manifest(package, change)
    assert any(needle in p for p in verify_cli(package))


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[" * 50_000, "nested too deeply"),
        ('{"a": ' * 80 + "0" + "}" * 80, "more than 64 deep"),
        ('{"format_version": 1, "n": ' + "1" * 5000 + "}", "is not valid JSON"),
        ('{"a": 1, "a": 2}', "appears twice"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_unparseable_manifest(package, text, needle):
    path = package / MANIFEST_NAME
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(PackageError, match=needle):
        read_package(package)
    (problem,) = verify_cli(package)
    assert needle in problem


def test_tokenizer_schema():
    assert tokenizer_problems([]) == ["is not a JSON object"]
    assert tokenizer_problems({"model": {"type": "Nope", "vocab": {}}})[0].startswith("model.type")
    ok = {"model": {"type": "WordLevel", "vocab": {"a": 0}}, "added_tokens": []}
    assert tokenizer_problems(ok) == []
    bad_added = {**ok, "added_tokens": [{"id": "1", "content": "x"}]}
    assert tokenizer_problems(bad_added) == [
        "added_tokens is not a list of {id: int, content: str}"
    ]


def test_json_files_are_size_bounded_before_reading(tmp_path):
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(2000)
    with pytest.raises(PackageError, match="more than the 1000 this reader accepts"):
        load_json(big, "big.json", "fix", max_bytes=1000)


def test_initial_dims_and_zero_bounds():
    assert initial_dims(("batch", 2, "past_seq", 4), 3) == (3, 2, 0, 4)
    with pytest.raises(ValueError, match="cannot size symbolic dim 'heads'"):
        initial_dims(("heads",), 1)
    assert MAX_ZERO_ELEMENTS == 1 << 24


def test_stamp_is_not_refreshed_by_a_failed_verify(package):
    before = (package / STAMP_NAME).read_text()
    (package / "tinytest.txt").write_text("changed\n")
    assert verify_cli(package)
    assert (package / STAMP_NAME).read_text() == before
