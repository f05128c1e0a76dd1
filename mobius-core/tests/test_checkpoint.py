"""Checkpoint folders (single, sharded, pickle-only, config-only), the Hub opener, the hooks."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pluggy
import pytest
from safetensors.numpy import save_file

from mobius import hookspecs
from mobius.checkpoint import (
    ALLOW_PATTERNS,
    Checkpoint,
    looks_like_repo_id,
    open_hub,
    open_local,
)
from mobius.checkpoint import builtin as builtin_plugin
from mobius.errors import CheckpointError, ConfigError

CONFIG = {"model_type": "tiny", "hidden_size": 4}


def make_folder(root: Path, *, config: dict | None = CONFIG) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (root / "config.json").write_text(json.dumps(config))
    return root


def make_sharded(root: Path) -> Path:
    make_folder(root)
    save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(root / "m-1.safetensors"))
    save_file(
        {"b": np.ones(4, dtype=np.int64), "c": np.zeros(2, dtype=ml_dtypes.bfloat16)},
        str(root / "m-2.safetensors"),
    )
    index = {
        "metadata": {"total_size": 0},
        "weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors", "c": "m-2.safetensors"},
    }
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    return root


def test_single_file_checkpoint(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "ckpt")
    save_file({"w": np.arange(3, dtype=np.float32)}, str(root / "model.safetensors"))
    (root / "tokenizer.json").write_text("{}")
    ckpt = open_local(root, require_weights=True)
    assert isinstance(ckpt, Checkpoint)
    assert ckpt.raw_config == CONFIG
    assert list(ckpt.tensors) == ["w"]
    np.testing.assert_array_equal(ckpt.read("w"), [0, 1, 2])
    assert ckpt.file("tokenizer.json") == root / "tokenizer.json"
    assert ckpt.file("tokenizer_config.json") is None
    assert ckpt.file("../ckpt/tokenizer.json") is None
    src = ckpt.source
    assert (src.kind, src.commit, src.revision) == ("local", None, None)
    assert set(src.files) == {"config.json", "model.safetensors", "tokenizer.json"}
    expected = hashlib.sha256((root / "model.safetensors").read_bytes()).hexdigest()
    assert src.files["model.safetensors"] == expected
    assert src.to_dict()["files"]["tokenizer.json"] == hashlib.sha256(b"{}").hexdigest()


def test_sharded_checkpoint_reads_every_shard(tmp_path: Path) -> None:
    ckpt = open_local(make_sharded(tmp_path / "ckpt"))
    assert sorted(ckpt.tensors) == ["a", "b", "c"]
    assert ckpt.tensors["b"].file.name == "m-2.safetensors"
    np.testing.assert_array_equal(ckpt.read("a"), np.arange(6).reshape(2, 3))
    assert ckpt.read("c").dtype == np.dtype(ml_dtypes.bfloat16)
    assert "model.safetensors.index.json" in ckpt.source.files
    assert {"m-1.safetensors", "m-2.safetensors"} <= set(ckpt.source.files)


def test_index_pointing_outside_the_folder_is_refused(tmp_path: Path) -> None:
    root = make_sharded(tmp_path / "ckpt")
    save_file({"a": np.zeros(1, dtype=np.float32)}, str(tmp_path / "outside.safetensors"))
    for shard in (
        "../outside.safetensors",
        str(tmp_path / "outside.safetensors"),
        "sub/x.safetensors",
    ):
        (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": shard}}))
        with pytest.raises(CheckpointError, match="not a plain file name"):
            open_local(root)


def test_index_with_missing_shard_or_tensor(tmp_path: Path) -> None:
    root = make_sharded(tmp_path / "ckpt")
    index = root / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "m-3.safetensors"}}))
    with pytest.raises(CheckpointError, match="missing"):
        open_local(root)
    index.write_text(json.dumps({"weight_map": {"a": "m-2.safetensors"}}))
    with pytest.raises(CheckpointError, match="does not hold it"):
        open_local(root)
    index.write_text(json.dumps({"weight_map": {"zz": "m-1.safetensors"}}))
    with pytest.raises(CheckpointError, match="does not hold it"):
        open_local(root)
    index.write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        open_local(root)
    index.write_text(json.dumps({"metadata": {}}))
    with pytest.raises(CheckpointError, match="weight_map"):
        open_local(root)


def test_duplicate_tensor_across_files_is_refused(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "ckpt")
    save_file({"a": np.zeros(1, dtype=np.float32)}, str(root / "x.safetensors"))
    save_file({"a": np.zeros(1, dtype=np.float32)}, str(root / "y.safetensors"))
    with pytest.raises(CheckpointError, match="stored twice"):
        open_local(root)


def test_pickle_only_folder_explains_and_says_how_to_convert(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "ckpt")
    (root / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(CheckpointError) as info:
        open_local(root, require_weights=True)
    text = str(info.value)
    assert "pytorch_model.bin" in text and "arbitrary code" in text
    assert "safe_serialization=True" in text and "convert" in text
    # Graph-only use still opens it; the build asks for weights explicitly.
    ckpt = open_local(root)
    assert not ckpt.has_weights
    with pytest.raises(CheckpointError, match="arbitrary code"):
        ckpt.require_weights()


def test_config_only_folder_gives_zero_tensors(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "ckpt")
    ckpt = open_local(root)
    assert dict(ckpt.tensors) == {}
    assert set(ckpt.source.files) == {"config.json"}
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        open_local(root, require_weights=True)


def test_missing_folder_config_or_bad_json(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        open_local(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="not a folder"):
        open_local(tmp_path / "file")
    root = make_folder(tmp_path / "noconfig", config=None)
    with pytest.raises(ConfigError, match=r"no config\.json"):
        open_local(root)
    (root / "config.json").write_text("{bad")
    with pytest.raises(ConfigError, match="not valid JSON"):
        open_local(root)


def test_missing_tensor_read_is_an_error(tmp_path: Path) -> None:
    ckpt = open_local(make_sharded(tmp_path / "ckpt"))
    with pytest.raises(CheckpointError, match="'nope' is not in the checkpoint"):
        ckpt.read("nope")


# --------------------------------------------------------------------------- hub


def _fake_snapshot(tmp_path: Path, commit: str = "a" * 40) -> Path:
    snap = tmp_path / "hub" / "models--o--n" / "snapshots" / commit
    make_folder(snap)
    save_file({"w": np.ones(2, dtype=np.float32)}, str(snap / "model.safetensors"))
    return snap


def test_open_hub_downloads_with_allow_patterns_and_records_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    snap = _fake_snapshot(tmp_path)
    calls = []

    def fake(repo_id, *, revision=None, allow_patterns=None, **kw):
        calls.append((repo_id, revision, allow_patterns))
        return str(snap)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    ckpt = open_hub("owner/name", "main")
    assert calls == [("owner/name", "main", list(ALLOW_PATTERNS))]
    assert not any(p.endswith((".bin", ".pt")) for p in ALLOW_PATTERNS)
    assert ckpt.source.kind == "hub" and ckpt.source.commit == "a" * 40
    assert ckpt.source.revision == "main" and ckpt.source.source == "owner/name"
    assert list(ckpt.tensors) == ["w"]


def test_hub_cache_blob_names_are_used_as_hashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    snap = _fake_snapshot(tmp_path)
    weights = snap / "model.safetensors"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    blob = tmp_path / "hub" / "models--o--n" / "blobs" / digest
    blob.parent.mkdir(parents=True)
    weights.rename(blob)
    weights.symlink_to(blob)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: str(snap))
    ckpt = open_hub("o/n")
    assert ckpt.source.files["model.safetensors"] == digest


def _hub_error(name: str, text: str | None = None) -> Exception:
    from huggingface_hub import errors

    cls = getattr(errors, name)
    exc = cls.__new__(cls)
    Exception.__init__(exc, text or f"fake {name}")
    return exc


@pytest.mark.parametrize(
    ("error", "offline", "message", "fix"),
    [
        ("RepositoryNotFoundError", "", "does not exist", "hf auth login"),
        ("GatedRepoError", "", "gated", "accept the license"),
        ("RevisionNotFoundError", "", "revision", "--revision"),
        ("LocalEntryNotFoundError", "1", "HF_HUB_OFFLINE is set", "unset HF_HUB_OFFLINE"),
        ("LocalEntryNotFoundError", "", "cannot reach", "network"),
    ],
)
def test_hub_errors_become_checkpoint_errors(
    monkeypatch: pytest.MonkeyPatch, error: str, offline: str, message: str, fix: str
) -> None:
    import huggingface_hub

    def fake(*args, **kwargs):
        raise _hub_error(error)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    with pytest.raises(CheckpointError, match=message) as info:
        open_hub("owner/name", "v1")
    assert fix in str(info.value) and "owner/name@v1" in str(info.value)


def _network_errors() -> dict[str, Exception]:
    httpx = pytest.importorskip("httpx")
    request = httpx.Request("GET", "https://huggingface.co/api/models/owner/name")
    wrapped = RuntimeError("snapshot failed")
    wrapped.__cause__ = httpx.ConnectError("[Errno 101] Network is unreachable")
    return {
        "proxy": httpx.ProxyError("407 Proxy Authentication Required", request=request),
        "timeout": httpx.ReadTimeout("timed out", request=request),
        "connection": httpx.ConnectError("[Errno -3] name resolution failed", request=request),
        "wrapped": wrapped,
        "builtin": ConnectionRefusedError(111, "Connection refused"),
    }


@pytest.mark.parametrize(
    ("case", "kind", "fix"),
    [
        ("proxy", "proxy", "HTTPS_PROXY"),
        ("timeout", "timeout", "HF_HUB_DOWNLOAD_TIMEOUT"),
        ("connection", "connection", "network connection"),
        ("wrapped", "connection", "network connection"),
        ("builtin", "connection", "network connection"),
    ],
)
def test_network_errors_are_named_as_network_problems(
    monkeypatch: pytest.MonkeyPatch, entry_points, case: str, kind: str, fix: str
) -> None:
    """Through the plugin host too: never reported as a bug in core's opener."""
    import huggingface_hub

    from mobius.plugins import PluginHost

    error = _network_errors()[case]

    def fake(*args, **kwargs):
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    with pytest.raises(CheckpointError) as info:
        PluginHost.load().open_checkpoint("owner/name", None)
    text = str(info.value)
    assert f"network problem ({kind})" in text and fix in text, text
    assert "bug" not in text
    assert info.value.__cause__ is error


def test_a_non_network_exception_is_not_renamed(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    monkeypatch.setattr(
        huggingface_hub, "snapshot_download", lambda *a, **k: (_ for _ in ()).throw(KeyError("x"))
    )
    with pytest.raises(KeyError):
        open_hub("owner/name")


@pytest.mark.parametrize(("offline", "hub_says"), [("", "cannot reach"), ("1", "HF_HUB_OFFLINE")])
def test_a_mistyped_local_path_says_no_such_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, offline: str, hub_says: str
) -> None:
    """The folder comes first, in one line, whatever HF_HUB_OFFLINE the caller has set."""
    import huggingface_hub

    def unreachable(*args, **kwargs):
        raise _hub_error("LocalEntryNotFoundError", "line one\nline two\n  line three")

    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(CheckpointError) as info:
        open_hub("models/tiny-gemma")
    what = info.value.what
    assert what.startswith("no such folder models/tiny-gemma (its parent models/ exists); ")
    assert hub_says in what and "\n" not in what and "line one" not in what
    assert "correct the path" in info.value.fix
    # a real Hub id whose first part is no local folder gets no such hint; its text is one line
    with pytest.raises(CheckpointError) as info:
        open_hub("google/gemma-x")
    assert "no such folder" not in info.value.what
    assert "line one line two line three" in info.value.what


@pytest.mark.parametrize(
    ("source", "ok"),
    [
        ("google/gemma-4-E2B-it", True),
        ("owner/name", True),
        ("gpt2", False),
        ("a/b/c", False),
        ("owner/na..me", False),
        ("owner/-name", False),
        ("/abs/path", False),
        ("./rel", False),
        ("", False),
    ],
)
def test_repo_id_shape(source: str, ok: bool) -> None:
    assert looks_like_repo_id(source) is ok


# --------------------------------------------------------------------------- hooks


def _plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(builtin_plugin, name="mobius.checkpoint")
    pm.check_pending()
    return pm


def test_builtin_impls_order_gguf_then_local_then_hub() -> None:
    impls = _plugin_manager().hook.mobius_open_checkpoint.get_hookimpls()
    # pluggy calls the list back to front.
    called = [impl.function.__name__ for impl in reversed(impls)]
    assert called == [
        "open_checkpoint_as_gguf",
        "open_checkpoint_from_folder",
        "open_checkpoint_from_hub",
    ]
    assert all(impl.trylast for impl in impls)


def test_hook_opens_folder_and_refuses_file(tmp_path: Path) -> None:
    pm = _plugin_manager()
    root = make_sharded(tmp_path / "owner" / "name")
    ckpt = pm.hook.mobius_open_checkpoint(
        source=str(root), revision=None, host=None, companion=None
    )
    assert ckpt is not None and ckpt.source.kind == "local" and ckpt.source.source == str(root)
    with pytest.raises(CheckpointError, match="--revision"):
        pm.hook.mobius_open_checkpoint(source=str(root), revision="main", host=None, companion=None)
    with pytest.raises(CheckpointError, match="not a folder"):
        pm.hook.mobius_open_checkpoint(
            source=str(root / "m-1.safetensors"), revision=None, host=None, companion=None
        )


def test_hook_local_folder_wins_over_hub_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    def fail(*a, **k):
        raise AssertionError("the Hub must not be asked for an existing folder")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    make_sharded(tmp_path / "owner" / "name")
    monkeypatch.chdir(tmp_path)
    ckpt = _plugin_manager().hook.mobius_open_checkpoint(
        source="owner/name", revision=None, host=None, companion=None
    )
    assert ckpt.source.kind == "local"


def test_hook_hub_id_and_unrecognised_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    snap = _fake_snapshot(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: str(snap))
    monkeypatch.chdir(tmp_path)
    pm = _plugin_manager()
    ckpt = pm.hook.mobius_open_checkpoint(
        source="owner/name", revision="r", host=None, companion=None
    )
    assert ckpt.source.kind == "hub" and ckpt.source.revision == "r"
    assert (
        pm.hook.mobius_open_checkpoint(
            source="./not/there/at/all", revision=None, host=None, companion=None
        )
        is None
    )
    assert (
        pm.hook.mobius_open_checkpoint(source="noslash", revision=None, host=None, companion=None)
        is None
    )
