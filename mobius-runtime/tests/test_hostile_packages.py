"""A package is untrusted input: crafted packages are refused by ``Pipeline.load``,
``mobius run`` and ``mobius verify`` alike, with the same problem text, before
anything outside the package is opened and before anything is allocated.

Each crafted package is made consistent first (:func:`repin` rewrites the
manifest's sizes and sha256 sums), so the crafted defect is the only one and the
hashes cannot be what catches it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
import pytest
import typer
from typer.testing import CliRunner

from mobius.errors import PackageError
from mobius.package import verify_package
from mobius_runtime import Pipeline

_WATCH: list[tuple[Path, list[str]]] = []


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _WATCH and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        for folder, seen in _WATCH:
            if os.path.realpath(path).startswith(str(folder)):
                seen.append(path)


sys.addaudithook(_audit)


@contextmanager
def opened_under(folder: Path) -> Iterator[list[str]]:
    """Paths under ``folder`` that Python code opens inside the block (audit hook "open")."""
    seen: list[str] = []
    _WATCH.append((folder.resolve(), seen))
    try:
        yield seen
    finally:
        _WATCH.pop()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the package with a file a crafted package points at."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.bin").write_bytes(b"s" * 4096)
    return folder


def manifest_of(pkg: Path) -> dict:
    return json.loads((pkg / "mobius.json").read_text())


def save_manifest(pkg: Path, manifest: dict) -> None:
    (pkg / "mobius.json").write_text(json.dumps(manifest))


def _pin(path: Path) -> tuple[str, int]:
    data = path.read_bytes()
    return hashlib.sha256(data).hexdigest(), len(data)


def repin(pkg: Path) -> None:
    """Make the manifest's sums and sizes match the files on disk (where they resolve)."""
    manifest = manifest_of(pkg)
    for entry in manifest["components"].values():
        for key, sha, size in (
            ("path", "sha256", "model_size"),
            ("data", "data_sha256", "data_size"),
        ):
            target = pkg / entry[key]
            if target.exists():
                entry[sha], entry[size] = _pin(target)
    for rel, entry in manifest["files"].items():
        target = pkg / rel
        if target.exists():
            entry["sha256"], entry["size"] = _pin(target)
    save_manifest(pkg, manifest)


def refused(pkg: Path, outside: Path, *needles: str) -> str:
    """Load, run and verify ``pkg``: all refuse naming ``needles``, nothing outside is opened."""
    with opened_under(outside) as seen:
        with pytest.raises(PackageError) as info:
            Pipeline.load(pkg, device="cpu")
        problems = verify_package(pkg)
        run = CliRunner().invoke(_cli(), ["run", str(pkg), "--prompt", "a b"])
    text = str(info.value)
    for needle in needles:
        assert needle in text, text
        assert any(needle in p for p in problems), problems
        assert needle in run.output, run.output
    assert run.exit_code == 1 and "Traceback" not in run.output
    assert seen == []
    return text


def _cli() -> typer.Typer:
    from mobius_runtime import plugin

    app = typer.Typer()
    plugin.mobius_add_commands(app)
    app.command("noop", hidden=True)(lambda: None)  # keeps typer from flattening `run`
    return app


def set_location(model_path: Path, location: str, offset: int | None = None) -> None:
    """Point the first external initializer of a graph at ``location`` (and ``offset``)."""
    model = onnx.load(str(model_path), load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.external_data)
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = location
        if entry.key == "offset" and offset is not None:
            entry.value = str(offset)
    model_path.write_bytes(model.SerializeToString())


# ---------------------------------------------------------------- reads outside the package


@pytest.mark.parametrize(
    "where",
    ["files", "component data", "component path"],
)
@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_manifest_paths_leaving_the_package(single_pkg, outside, where, how):
    target = "../outside/secret.bin" if how == "dotdot" else str(outside / "secret.bin")
    manifest = manifest_of(single_pkg)
    if where == "files":
        manifest["files"][target] = {"sha256": _pin(outside / "secret.bin")[0], "size": 4096}
    else:
        manifest["components"]["model"]["data" if where == "component data" else "path"] = target
    save_manifest(single_pkg, manifest)
    refused(single_pkg, outside, "leaves the package folder")


@pytest.mark.parametrize(
    "location, needle",
    [
        ("../../outside/secret.bin", "leaves the package folder"),
        ("ABSOLUTE", "leaves the package folder"),
        ("/dev/zero", "leaves the package folder"),
        ("../model/model.onnx.data", "leaves the package folder"),
    ],
)
def test_external_data_locations_leaving_the_package(single_pkg, outside, location, needle):
    if location == "ABSOLUTE":
        location = str(outside / "secret.bin")
    set_location(single_pkg / "model" / "model.onnx", location)
    repin(single_pkg)
    refused(single_pkg, outside, needle, "external data")


def test_external_data_offset_past_the_end(single_pkg, outside):
    set_location(single_pkg / "model" / "model.onnx", "model.onnx.data", offset=10**9)
    repin(single_pkg)
    refused(single_pkg, outside, "past the end")


def test_external_data_naming_an_unpinned_file_inside(single_pkg, outside):
    (single_pkg / "model" / "stray.bin").write_bytes(b"\0" * 4096)
    set_location(single_pkg / "model" / "model.onnx", "stray.bin")
    repin(single_pkg)
    refused(single_pkg, outside, "not a file the manifest pins")


def test_symlinked_tokenizer_pointing_outside(single_pkg, outside):
    secret = outside / "tokenizer.json"
    secret.write_bytes((single_pkg / "tokenizer.json").read_bytes())
    (single_pkg / "tokenizer.json").unlink()
    (single_pkg / "tokenizer.json").symlink_to(secret)
    refused(single_pkg, outside, "tokenizer.json: resolves to", "outside the package")


def test_symlinked_component_folder_pointing_outside(single_pkg, outside):
    moved = outside / "model"
    (single_pkg / "model").rename(moved)
    (single_pkg / "model").symlink_to(moved, target_is_directory=True)
    refused(single_pkg, outside, "model/model.onnx: resolves to", "outside the package")


def test_symlinked_manifest_pointing_outside(single_pkg, outside):
    target = outside / "mobius.json"
    (single_pkg / "mobius.json").rename(target)
    (single_pkg / "mobius.json").symlink_to(target)
    refused(single_pkg, outside, "mobius.json resolves to", "outside the package")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this OS")
def test_a_fifo_named_like_the_stamp_is_never_opened(single_pkg):
    """A package shipping ``.mobius-verified.json`` as a FIFO: reading it would block forever.

    In a child process with a timeout, so that a regression fails instead of hanging.
    """
    stamp = single_pkg / ".mobius-verified.json"
    stamp.unlink()
    os.mkfifo(stamp)
    code = (
        "from mobius.package import verify_package\n"
        "from mobius_runtime import Pipeline\n"
        f"Pipeline.load({str(single_pkg)!r}, device='cpu')\n"
        f"assert verify_package({str(single_pkg)!r}) == []\n"
        "print('loaded')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "loaded" in done.stdout, done.stderr
    assert stamp.is_fifo()  # not replaced: it is not a stamp mobius wrote


def test_symlink_inside_the_package_is_fine(single_pkg):
    real = single_pkg / "tok-real.json"
    (single_pkg / "tokenizer.json").rename(real)
    (single_pkg / "tokenizer.json").symlink_to(real.name)
    assert verify_package(single_pkg) == []
    Pipeline.load(single_pkg, device="cpu")


# ---------------------------------------------------------------- malformed mobius.json


def _edit(pkg: Path, change) -> None:
    manifest = manifest_of(pkg)
    change(manifest)
    save_manifest(pkg, manifest)


@pytest.mark.parametrize(
    "change, needle",
    [
        (
            lambda m: m["components"]["model"].update(sha256=12345),
            "components.model.sha256 is not a 64-digit lowercase hex sha256",
        ),
        (lambda m: m.update(files=["tokenizer.json"]), "files is not an object"),
        (
            lambda m: m["contract"]["edges"].append(
                {"producer": "ghost.out", "consumer": "model.input_ids"}
            ),
            "names unknown component 'ghost'",
        ),
        (lambda m: m["contract"].update(outputs=["logits"]), "is not written 'component.port'"),
        (
            lambda m: m["contract"]["components"].append(m["contract"]["components"][0]),
            "component name 'model' is used twice",
        ),
        (
            lambda m: m.update(config="garbage"),
            "config (the embedded config.json) is not an object",
        ),
    ],
    ids=["sha256-int", "files-list", "edge-ghost", "output-no-dot", "duplicate", "config-str"],
)
def test_malformed_manifest(single_pkg, outside, change, needle):
    _edit(single_pkg, change)
    refused(single_pkg, outside, needle)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[" * 100_000 + "]" * 100_000, "mobius.json is nested too deeply"),
        ('{"a":' * 100 + "1" + "}" * 100, "nests arrays/objects more than 64 deep"),
        ('{"format_version": 1, "x": ' + "9" * 5000 + "}", "mobius.json is not valid JSON"),
        ('{"format_version": 1, "format_version": 1}', "appears twice"),
    ],
    ids=["recursion", "deep", "5000-digits", "duplicate-key"],
)
def test_unparseable_manifest(single_pkg, outside, text, needle):
    (single_pkg / "mobius.json").write_text(text)
    refused(single_pkg, outside, needle)


def test_thirty_thousand_components_are_refused_by_count(single_pkg, outside):
    def many(m):
        entry = m["components"]["model"]
        m["components"] = {f"c{i}": dict(entry) for i in range(30_000)}

    _edit(single_pkg, many)
    refused(single_pkg, outside, "declares 30000 components, more than the 256")


# ---------------------------------------------------------------- verify must not say OK


def _state(m: dict) -> dict:
    return m["contract"]["states"][0]


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda m: _state(m).update(initial_shape=["batch", 3, 0, 8]), "initial_shape"),
        (lambda m: _state(m).update(initial_shape=["batch", 1, -4, 8]), "negative dim"),
        (lambda m: _state(m).update(initial_shape=["batch", 1, 10**7, 8]), "zero-fill"),
        (
            lambda m: m["contract"]["components"][0].update(presence="image"),
            "which runs only with 'image'",
        ),
    ],
    ids=["initial-mismatch", "initial-negative", "initial-huge", "presence-on-decoder"],
)
def test_contract_the_runtime_cannot_run(single_pkg, outside, change, needle):
    _edit(single_pkg, change)
    refused(single_pkg, outside, needle)


@pytest.mark.parametrize(
    "shape, needle", [([-1, 8], "negative dim"), ([10**6, 10**6], "zero-fill")]
)
def test_optional_absent_shape_the_runtime_cannot_allocate(split_pkg, outside, shape, needle):
    _edit(split_pkg, lambda m: m["contract"]["optionals"][0].update(absent_shape=shape))
    refused(split_pkg, outside, needle)


def test_state_initial_shape_mismatching_the_graph(single_pkg, outside):
    """The contract port says a symbolic dim; the graph's static dim still catches it."""

    def change(m):
        comp = m["contract"]["components"][0]
        port = next(
            p for p in comp["inputs"] if p["name"] == _state(m)["consumer"].split(".", 1)[1]
        )
        port["shape"][-1] = "head_dim"
        _state(m)["initial_shape"][-1] = 5

    _edit(single_pkg, change)
    refused(single_pkg, outside, "but graph 'model' takes")


@pytest.mark.parametrize(
    "name, text, needle",
    [
        ("config.json", "garbage{", "config.json: config.json is not valid JSON"),
        ("config.json", "[1, 2]", "config.json: is not a JSON object"),
        ("tokenizer.json", "{not json", "tokenizer.json: tokenizer.json is not valid JSON"),
        ("tokenizer.json", '{"model": {"type": "BPE"}}', "model.vocab is not an object"),
        ("tokenizer.json", '{"foo": 1}', "has no 'model' object"),
    ],
)
def test_broken_runtime_files(single_pkg, outside, name, text, needle):
    (single_pkg / name).write_text(text)
    repin(single_pkg)
    refused(single_pkg, outside, needle)


def test_unpinned_tokenizer_is_refused(single_pkg, outside):
    _edit(single_pkg, lambda m: m["files"].pop("tokenizer.json"))
    refused(single_pkg, outside, "tokenizer.json: in the package folder but not pinned")


def test_tokenizer_the_library_rejects_is_a_clear_error_at_run(tmp_path):
    """Defence in depth: a tokenizer that passes the schema check but not the library."""
    from mobius_runtime.text import TextSide

    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": 7}})
    )
    with pytest.raises(PackageError, match=r"tokenizer\.json cannot be loaded by the tokenizers"):
        TextSide(tmp_path, {}, None).tokenizer  # noqa: B018


# ---------------------------------------------------------------- hangs and slow paths


def test_sparse_terabyte_data_file_is_refused_on_its_size(single_pkg, outside, monkeypatch):
    import mobius.package.checks as checks

    hashed: list[Path] = []
    real = checks._sha256_size
    monkeypatch.setattr(checks, "_sha256_size", lambda p: hashed.append(p) or real(p))
    data = single_pkg / "model" / "model.onnx.data"
    os.truncate(data, 1 << 40)
    refused(single_pkg, outside, "model/model.onnx.data: size 1099511627776 bytes")
    assert data.resolve() not in hashed


@pytest.mark.parametrize("threads", [100_000, -1])
def test_absurd_thread_counts_are_refused_before_loading(single_pkg, threads):
    from mobius_runtime.errors import RequestError

    with pytest.raises(RequestError, match=r"threads=.* is out of range"):
        Pipeline.load(single_pkg, device="cpu", threads=threads)


def test_plan_compilation_is_linear_in_components():
    """A chain of 20,000 components declared consumer-first orders correctly (the old
    quadratic sort took minutes on this)."""
    from mobius_runtime.plan import Source, _topological

    n = 20_000
    components = {f"c{i}": None for i in reversed(range(n))}
    sources = {f"c{i}.x": Source("edge", f"c{i - 1}.y") for i in range(1, n)}
    assert _topological(components, sources) == tuple(f"c{i}" for i in range(n))


# ---------------------------------------------------------------- writes outside the package


def test_running_a_model_writes_nothing_outside(single_pkg, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    code = (
        "import numpy as np\n"
        "from mobius_runtime import Pipeline\n"
        f"p = Pipeline.load({str(single_pkg)!r}, device='cpu')\n"
        "p.generate(input_ids=[1, 3, 4], max_new_tokens=2)\n"
    )
    env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}
    env.pop("ORT_DISABLE_TELEMETRY", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not (home / ".cache" / "Microsoft").exists()
    assert list(home.rglob("*")) == []


# ---------------------------------------------------------------- the build


@pytest.mark.parametrize(
    "text, needle",
    [("{broken", "tokenizer.json is not valid JSON"), ('{"foo": 1}', "has no 'model' object")],
)
def test_build_refuses_a_checkpoint_with_a_broken_tokenizer(tmp_path, text, needle):
    """Refused before any graph is built, with nothing written; not at the first run."""
    pytest.importorskip("mobius_gemma4")
    from conftest import TINY_GEMMA4

    import mobius

    if not (TINY_GEMMA4 / "config.json").is_file():
        pytest.skip("testdata/tiny-gemma4 is not present")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(TINY_GEMMA4, ckpt)
    (ckpt / "tokenizer.json").write_text(text)
    with pytest.raises(PackageError) as info:
        mobius.build(str(ckpt), str(tmp_path / "out"))
    assert needle in info.value.what
    assert info.value.where == str(ckpt / "tokenizer.json")
    assert "repair or replace the checkpoint's tokenizer.json" in (info.value.fix or "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
