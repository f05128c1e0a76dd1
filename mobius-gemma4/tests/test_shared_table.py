"""The tied embedding / lm_head of the split (multimodal) Gemma 4 package is stored once:
``embedding/shared.data`` and ``decoder/shared.data`` are one file (a hard link), in f32
and int4; the package runs exactly as the one that stores the table twice, verifies,
and a tampered link is caught (``docs/internals.md``, shared external data)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from typer.testing import CliRunner

import mobius
from mobius.cli import make_app
from mobius.package import SHARED_NAME, verify_package
from mobius.weights.plan import PlannedTensor

pytestmark = pytest.mark.l1
TESTDATA = Path(__file__).resolve().parents[2] / "testdata"
SRC = TESTDATA / "tiny-gemma4-mm"
PROMPT = "Describe this. <|image|>"
IMAGE = str(TESTDATA / "media" / "tiny.png")


def _distinct_bytes(root: Path) -> int:
    """Bytes on disk of every file under ``root``, each inode counted once."""
    seen: dict[tuple[int, int], int] = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            info = path.stat()
            seen[(info.st_dev, info.st_ino)] = info.st_size
    return sum(seen.values())


def _shared_tensor_bytes(package: Path) -> tuple[set[str], int]:
    """Names and summed bytes of the decoder's tensors stored in its shared.data."""
    model = ir.load(package / "decoder" / "model.onnx")
    names, total = set(), 0
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if isinstance(tensor, ir.ExternalTensor) and str(tensor.location) == SHARED_NAME:
            names.add(value.name)
            total += tensor.nbytes
    return names, total


def _greedy_ids(package: Path) -> list[int]:
    from mobius_runtime import Pipeline

    pipeline = Pipeline.load(package, device="cpu")
    return list(pipeline.generate(prompt=PROMPT, images=[IMAGE], max_new_tokens=6).ids)


def _logits(package: Path) -> np.ndarray:
    from mobius_testing.quant_accuracy import prompt_logits

    return prompt_logits(package, [int(i) for i in np.arange(5, 40)])


@pytest.fixture(scope="module", params=[None, "int4"], ids=["f32", "int4"])
def built(request, tmp_path_factory) -> tuple[str | None, Path, Path]:
    """(quant, package storing the table once, package storing it twice as before)."""
    root = tmp_path_factory.mktemp(f"shared-{request.param or 'f32'}")
    once, twice = root / "once", root / "twice"
    mobius.build(str(SRC), once, quant=request.param)
    with pytest.MonkeyPatch.context() as patch:
        # No share key: every component writes its own copy, as before shared data.
        patch.setattr(PlannedTensor, "share_key", lambda self: None)
        mobius.build(str(SRC), twice, quant=request.param)
    return request.param, once, twice


def test_table_is_one_file_and_the_package_shrinks_by_it(built) -> None:
    quant, once, twice = built
    first, link = once / "embedding" / SHARED_NAME, once / "decoder" / SHARED_NAME
    assert os.path.samefile(first, link)
    assert not (twice / "decoder" / SHARED_NAME).exists()
    names, table = _shared_tensor_bytes(once)
    if quant is None:
        assert names == {"lm_head.weight"}  # the decoder's name for embed_tokens.weight
    else:  # the packed table and its scales, read by GatherBlockQuantized and MatMulNBits
        assert len(names) == 2 and all(n.startswith("lm_head.weight") for n in names), names
    config = json.loads((SRC / "config.json").read_text())["text_config"]
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    assert table == (
        vocab * hidden * 4 if quant is None else vocab * hidden // 2 + vocab * (hidden // 32) * 4
    )
    saved = _distinct_bytes(twice) - _distinct_bytes(once)
    # Besides the table: the manifest and the stamp name two more files (~300 bytes each),
    # model.onnx files differ by a few bytes (location names), padding by < 64 per tensor.
    assert table - 1024 <= saved <= table + 256, (saved, table)
    manifest = json.loads((once / "mobius.json").read_text())["components"]
    assert manifest["decoder"]["shared"]["same_file_as"] == "embedding/shared.data"
    assert manifest["decoder"]["shared"]["sha256"] == manifest["embedding"]["shared"]["sha256"]
    print(
        f"\n{quant or 'f32'}: table {table} bytes, package {_distinct_bytes(once)} vs "
        f"{_distinct_bytes(twice)} bytes on disk"
    )


def test_outputs_are_those_of_the_table_stored_twice(built) -> None:
    _, once, twice = built
    assert _greedy_ids(once) == _greedy_ids(twice)
    np.testing.assert_array_equal(_logits(once), _logits(twice))


def test_verify_passes_and_catches_a_tampered_link(built, tmp_path) -> None:
    _, once, _ = built
    app = make_app()
    result = CliRunner().invoke(app, ["verify", str(once)])
    assert result.exit_code == 0, result.output
    # A copy that does not keep hard links (two files, same bytes) is intact too.
    copy = tmp_path / "copy"
    shutil.copytree(once, copy)
    assert not os.path.samefile(copy / "embedding" / SHARED_NAME, copy / "decoder" / SHARED_NAME)
    assert verify_package(copy) == []
    # One byte changed through one link changes both paths: both are named.
    tampered = tmp_path / "tampered"
    shutil.copytree(once, tampered)
    data = tampered / "decoder" / SHARED_NAME
    (tampered / "embedding" / SHARED_NAME).unlink()
    os.link(data, tampered / "embedding" / SHARED_NAME)
    with data.open("r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    problems = verify_package(tampered)
    assert any(p.startswith("decoder/shared.data: sha256") for p in problems), problems
    assert any(p.startswith("embedding/shared.data: sha256") for p in problems), problems
    # A link replaced by a different file of the same size: that path alone is named.
    swapped = tmp_path / "swapped"
    shutil.copytree(once, swapped)
    target = swapped / "decoder" / SHARED_NAME
    target.write_bytes(b"\0" * target.stat().st_size)
    problems = verify_package(swapped)
    assert [p.split(":")[0] for p in problems] == ["decoder/shared.data"], problems
    with pytest.raises(mobius.errors.PackageError, match=r"decoder/shared\.data"):
        from mobius_runtime import Pipeline

        Pipeline.load(swapped, device="cpu")
