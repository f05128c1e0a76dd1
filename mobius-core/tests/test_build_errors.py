"""The build pipeline end to end on the ``tinytest`` family, and each way it must fail.

Every failure must exit non-zero with a short error (no traceback) and leave
nothing at OUT, not even a temporary sibling.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import ep, write_tiny_checkpoint
from plugins_for_tests import tinytest
from typer.testing import CliRunner

import mobius
from mobius import hookimpl
from mobius.cli import make_app
from mobius.errors import ContractError, PluginError, WeightPlanError
from mobius.plugins import PluginHost
from mobius.records import ModelTypeInfo


@pytest.fixture(autouse=True)
def _build_modules() -> None:
    for module in ("mobius.contract", "mobius.weights", "mobius.package"):
        pytest.importorskip(module, reason=f"{module} not written yet")


def cli_build(host: PluginHost, source: Path, out: Path, *extra: str):
    return CliRunner().invoke(
        make_app(), ["build", str(source), str(out), *extra], obj={"host": host}
    )


def assert_failed_cleanly(result, out: Path, *needles: str) -> str:
    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    error = result.stderr[result.stderr.index("error: ") :]
    assert len(error.splitlines()) <= 6, error
    for needle in needles:
        assert needle in error, error
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(out.name)] == []
    return error


# --------------------------------------------------------------------------- success


def test_build_writes_a_package(tiny_host, tiny_checkpoint, tmp_path) -> None:
    out = tmp_path / "out"
    result = cli_build(tiny_host, tiny_checkpoint, out)
    assert result.exit_code == 0, (result.output, result.exception)
    assert f"built tinytest package at {out}" in result.stdout
    assert "1 tensors from the checkpoint" in result.stdout and "model:" in result.stdout
    assert "unused checkpoint tensors: 1" in result.stdout

    manifest = json.loads((out / "mobius.json").read_text())
    assert manifest["model_type"] == "tinytest"
    assert manifest["task"] == "feature-extraction"
    assert (manifest["dtype"], manifest["target"]) == ("f32", "default")
    assert manifest["contract"]["components"][0]["name"] == "model"
    assert manifest["source"]["kind"] == "local"
    assert "model.safetensors" in manifest["source"]["files"]
    assert set(manifest["versions"]) == {
        "mobius-core",
        "mobius-tinytest",
        "onnx",
        "onnxscript",
        "onnx-ir",
    }
    assert manifest["config"] == json.loads((tiny_checkpoint / "config.json").read_text())
    assert (out / "tinytest.txt").read_bytes() == b"tiny\n"


def test_built_package_computes_x_times_w_transposed(tiny_host, tiny_checkpoint, tmp_path) -> None:
    ort = pytest.importorskip("onnxruntime")
    from safetensors.numpy import load_file

    from mobius.package import read_package

    result = mobius.build(str(tiny_checkpoint), str(tmp_path / "out"), host=tiny_host)
    assert result.components.keys() == {"model"} and result.components["model"] > 0
    assert (result.n_tensors, result.unused) == (1, ("extra.unused",))
    package = read_package(result.out)
    session = ort.InferenceSession(
        str(package.components["model"]), providers=["CPUExecutionProvider"]
    )
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    (y,) = session.run(None, {"x": x})
    w = load_file(str(tiny_checkpoint / "model.safetensors"))["proj.weight"]
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-6)


def test_unused_tensors_are_reported_through_progress(tiny_host, tiny_checkpoint, tmp_path) -> None:
    from mobius.builder import build

    class Recorder:
        def __init__(self) -> None:
            self.events: list[tuple] = []

        def component_started(self, name, n_tensors):
            self.events.append(("started", name, n_tensors))

        def tensor_written(self, component, name, nbytes):
            self.events.append(("tensor", component, name, nbytes))

        def component_finished(self, name):
            self.events.append(("finished", name))

        def message(self, text):
            self.events.append(("message", text))

    progress = Recorder()
    build(str(tiny_checkpoint), tmp_path / "out", progress=progress, host=tiny_host)
    messages = [e[1] for e in progress.events if e[0] == "message"]
    assert any("extra.unused" in m and "proj.ignored" not in m for m in messages), messages
    # w is 48 bytes: under the package's inline limit it stays inside model.onnx,
    # so the component reports no external tensor writes.
    assert ("started", "model", 0) in progress.events
    assert not [e for e in progress.events if e[0] == "tensor"]
    assert ("finished", "model") in progress.events


def test_inspect_shows_components_ports_and_sizes(tiny_host, tiny_checkpoint, tmp_path) -> None:
    out = tmp_path / "out"
    assert cli_build(tiny_host, tiny_checkpoint, out).exit_code == 0
    text = CliRunner().invoke(make_app(), ["inspect", str(out)])
    assert text.exit_code == 0, (text.output, text.exception)
    assert "component model:" in text.stdout
    assert "input  x: float32[batch, 4]" in text.stdout
    assert "output y: float32[batch, 3]" in text.stdout
    as_json = CliRunner().invoke(make_app(), ["inspect", str(out), "--json"])
    info = json.loads(as_json.stdout)
    (component,) = info["components"]
    assert component["name"] == "model" and component["size"] > 0
    assert info["outputs"] == ["model.y"] and info["model_type"] == "tinytest"


def test_force_replaces_a_previous_package(tiny_host, tiny_checkpoint, tmp_path) -> None:
    out = tmp_path / "out"
    assert cli_build(tiny_host, tiny_checkpoint, out).exit_code == 0
    assert cli_build(tiny_host, tiny_checkpoint, out).exit_code == 1
    result = cli_build(tiny_host, tiny_checkpoint, out, "--force")
    assert result.exit_code == 0, (result.output, result.exception)
    assert (out / "mobius.json").is_file()


def test_a_broken_plugin_does_not_stop_a_build(entry_points, tiny_checkpoint, tmp_path) -> None:
    entry_points(
        [
            ep("broken", "plugins_for_tests.broken_import"),
            ep("tinytest", "plugins_for_tests.tinytest"),
        ]
    )
    result = cli_build(PluginHost.load(), tiny_checkpoint, tmp_path / "out")
    assert result.exit_code == 0, (result.output, result.exception)


# --------------------------------------------------------------------------- broken checkpoints


def test_truncated_safetensors(tiny_host, tiny_checkpoint, tmp_path) -> None:
    path = tiny_checkpoint / "model.safetensors"
    path.write_bytes(path.read_bytes()[:20])  # cut inside the header
    out = tmp_path / "out"
    assert_failed_cleanly(cli_build(tiny_host, tiny_checkpoint, out), out, "model.safetensors")


def test_truncated_tensor_data(tiny_host, tiny_checkpoint, tmp_path) -> None:
    path = tiny_checkpoint / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    out = tmp_path / "out"
    assert_failed_cleanly(cli_build(tiny_host, tiny_checkpoint, out), out, "model.safetensors")


def write_safetensors(path: Path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_header_offsets_past_end_of_file(tiny_host, tmp_path) -> None:
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt")
    write_safetensors(
        ckpt / "model.safetensors",
        {
            "proj.weight": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},
            "extra.unused": {"dtype": "F32", "shape": [1000], "data_offsets": [48, 4048]},
        },
        bytes(48),
    )
    out = tmp_path / "out"
    assert_failed_cleanly(cli_build(tiny_host, ckpt, out), out, "model.safetensors")


def test_tensor_shape_disagrees_with_plan(tiny_host, tmp_path) -> None:
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", weight_shape=(5, 4))
    out = tmp_path / "out"
    error = assert_failed_cleanly(cli_build(tiny_host, ckpt, out), out, "[4, 5]", "[4, 3]")
    assert "w" in error
    with pytest.raises(WeightPlanError):
        mobius.build(str(ckpt), str(out), host=tiny_host)


# --------------------------------------------------------------------------- plugin problems


def test_two_plugins_claiming_the_model_type_refuse_the_build(
    entry_points, tiny_checkpoint, tmp_path
) -> None:
    entry_points(
        [
            ep("tinytest", "plugins_for_tests.tinytest", dist="mobius-tinytest"),
            ep("clone", "plugins_for_tests.tinytest_clone", dist="tinytest-clone"),
        ]
    )
    out = tmp_path / "out"
    assert_failed_cleanly(
        cli_build(PluginHost.load(), tiny_checkpoint, out), out, "mobius-tinytest", "tinytest-clone"
    )


class Variant:
    """tinytest with one hook replaced, to make a build fail at a chosen stage."""

    def __init__(self, **overrides) -> None:
        self.overrides = overrides

    @hookimpl
    def mobius_model_types(self):
        return [ModelTypeInfo("tinytest")]

    @hookimpl
    def mobius_read_config(self, model_type, raw):
        return tinytest.mobius_read_config(model_type, raw)

    @hookimpl
    def mobius_pipeline_contract(self, config, options):
        hook = self.overrides.get("contract", tinytest.mobius_pipeline_contract)
        return hook(config, options)

    @hookimpl
    def mobius_build_component(self, config, component, options):
        hook = self.overrides.get("build", tinytest.mobius_build_component)
        return hook(config, component, options)

    @hookimpl
    def mobius_weight_plan(self, config, component, checkpoint, options):
        return tinytest.mobius_weight_plan(config, component, checkpoint, options)


def test_plugin_bug_in_build_component(tiny_checkpoint, tmp_path) -> None:
    def explode(config, component, options):
        raise ZeroDivisionError("division by zero in the builder")

    host = PluginHost.from_plugins({"variant": Variant(build=explode)})
    out = tmp_path / "out"
    assert_failed_cleanly(
        cli_build(host, tiny_checkpoint, out), out, "plugin variant", "mobius_build_component"
    )
    with pytest.raises(PluginError):
        mobius.build(str(tiny_checkpoint), str(out), host=host)


def test_contract_that_disagrees_with_the_graph(tiny_checkpoint, tmp_path) -> None:
    from dataclasses import replace

    def wrong_contract(config, options):
        contract = tinytest.mobius_pipeline_contract(config, options)
        (model,) = contract.components
        bad = replace(model, outputs=(replace(model.outputs[0], name="z"),))
        return replace(contract, components=(bad,), outputs=("model.z",))

    host = PluginHost.from_plugins({"variant": Variant(contract=wrong_contract)})
    out = tmp_path / "out"
    assert_failed_cleanly(cli_build(host, tiny_checkpoint, out), out, "z")
    with pytest.raises(ContractError):
        mobius.build(str(tiny_checkpoint), str(out), host=host)


@pytest.mark.parametrize(("target", "warned"), [("default", True), ("cpu", True), ("cuda", False)])
def test_bf16_for_a_target_that_includes_cpu_warns_at_build(
    tiny_host, tiny_checkpoint, tmp_path, caplog, target: str, warned: bool
) -> None:
    """Was silent; the package then failed to load on CPU (no bfloat16 kernels)."""
    import logging

    with caplog.at_level(logging.WARNING, logger="mobius.builder"):
        mobius.build(
            str(tiny_checkpoint), tmp_path / "out", dtype="bf16", target=target, host=tiny_host
        )
    expected = f"--dtype bf16 with --target {target}: the package will run on CUDA only"
    assert (expected in caplog.text) == warned, caplog.text


def test_last_logits_from_a_family_that_keeps_every_position(tiny_host, tiny_checkpoint, tmp_path):
    """``logits="last"`` is refused (one line, OUT untouched) for a family whose contract
    does not declare one logits position, instead of a package that ignores it."""
    from mobius.errors import BuildError

    out = tmp_path / "pkg"
    with pytest.raises(BuildError) as err:
        mobius.build(str(tiny_checkpoint), str(out), host=tiny_host, logits="last")
    assert "does not build last-position logits" in str(err.value)
    assert "--logits last" in err.value.fix
    assert not out.exists()
