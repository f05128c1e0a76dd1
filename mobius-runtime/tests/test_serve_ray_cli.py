"""`mobius serve --ray` flags, without a cluster: errors, the Ray Serve options they map to,
the `serve deploy` config file. Most of these run without Ray installed (env runtime)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mobius.cli import make_app
from mobius.errors import MobiusError
from mobius_runtime import plugin
from mobius_runtime.serve import ray_app

pytest.importorskip("fastapi")


@pytest.fixture
def app():
    app = make_app()
    plugin.mobius_add_commands(app)
    return app


def serve(app, *args: str):
    return CliRunner().invoke(app, ["serve", *args], obj={})


def test_ray_without_its_extra_says_what_to_install(app, monkeypatch, single_pkg):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    result = serve(app, str(single_pkg), "--ray", "--replicas", "2")
    assert result.exit_code == 1, result.output
    assert "`mobius serve --ray` needs Ray Serve" in result.stderr
    assert "mobius-runtime[ray]" in result.stderr and "fix: pip install" in result.stderr


def test_the_runtime_and_the_server_import_no_ray():
    code = ("import sys, mobius_runtime.serve.app, mobius_runtime.serve.cli, "
            "mobius_runtime.serve.ray_app, mobius_runtime.plugin; "
            "assert 'ray' not in sys.modules, 'ray imported'")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "2"], "--replicas only apply to a Ray Serve application"),
        (["--ray-address", "auto", "--replica-gpus", "1"], "--ray-address, --replica-gpus only"),
        (["SECOND"], "2 packages given; one `mobius serve` process serves one"),
    ],
)
def test_ray_flags_and_several_packages_need_ray(app, single_pkg, args, message):
    args = [str(single_pkg) if a == "SECOND" else a for a in args]
    result = serve(app, str(single_pkg), *args)
    assert result.exit_code == 1 and message in result.stderr, result.output
    assert "fix:" in result.stderr


@pytest.mark.parametrize("text", ["4", "3:1", "0:0", "a:b", "1:2:3", "-1:2"])
def test_autoscale_must_be_min_max(text):
    with pytest.raises(MobiusError, match="--autoscale"):
        ray_app.parse_autoscale(text)


def test_autoscale_parses():
    assert ray_app.parse_autoscale("0:4") == (0, 4) and ray_app.parse_autoscale(" 2 : 2") == (2, 2)


def test_flags_map_to_ray_serve_deployment_options():
    model = ray_app.Model("/shared/pkg", "m")
    fixed = ray_app.RayOptions([model], replicas=3, replica_cpus=2, replica_gpus=0.5,
                               max_batch=6, max_queue=10)  # fmt: skip
    got = ray_app.deployment_options(fixed, model)
    assert got["num_replicas"] == 3 and "autoscaling_config" not in got
    assert got["max_ongoing_requests"] == 6  # a replica gets at most what its engine batches
    assert got["max_queued_requests"] == 10
    assert got["ray_actor_options"] == {"num_cpus": 2, "num_gpus": 0.5}
    assert (
        ray_app.deployment_options(fixed, ray_app.Model("/p", "n", replicas=1))["num_replicas"] == 1
    )
    scaled = ray_app.RayOptions([model], autoscale=(0, 4), max_batch=8)
    got = ray_app.deployment_options(scaled, model)
    assert "num_replicas" not in got and got["max_ongoing_requests"] == 8
    assert got["autoscaling_config"] == {"min_replicas": 0, "max_replicas": 4,
                                         "initial_replicas": 1, "target_ongoing_requests": 6.0}  # fmt: skip


def test_config_args_round_trip_and_unknown_args_are_refused(monkeypatch):
    monkeypatch.setenv("MOBIUS_API_KEY", "k")
    opts = ray_app.RayOptions([ray_app.Model("/p", "a"), ray_app.Model("/q", "b", 2)],
                              autoscale=(1, 3), settings={"max_request_mb": 2.0})  # fmt: skip
    back = ray_app.RayOptions.from_args(opts.to_args(with_key=False))
    assert back.api_key == "k"  # a config file's replicas read the key from their environment
    back.api_key = None
    assert back == opts
    with pytest.raises(MobiusError, match=r"unknown option.*replica_count"):
        ray_app.RayOptions.from_args({**opts.to_args(), "replica_count": 2})
    with pytest.raises(MobiusError, match="name no model"):
        ray_app.RayOptions.from_args({"replicas": 2})


def test_write_ray_config_writes_a_serve_deploy_file_and_never_overwrites(app, single_pkg,
                                                                          tmp_path: Path):  # fmt: skip
    pytest.importorskip("ray.serve")
    yaml = pytest.importorskip("yaml")
    out = tmp_path / "serve.yaml"
    result = serve(app, str(single_pkg), str(single_pkg.parent / "single"), "--ray",
                   "--autoscale", "1:3", "--replica-cpus", "2", "--write-ray-config", str(out),
                   "--api-key", "secret")  # fmt: skip
    assert result.exit_code == 1 and "same model name" in result.stderr  # both are "single"
    assert not out.exists()
    result = serve(app, str(single_pkg), "--ray", "--autoscale", "1:3", "--replica-cpus", "2",
                   "--write-ray-config", str(out), "--api-key", "secret",
                   "--prefix-cache-mb", "16", "--prefill-chunk", "64")  # fmt: skip
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "secret" not in text  # the key stays out of the file
    config = yaml.safe_load(text)
    (application,) = config["applications"]
    assert application["import_path"] == "mobius_runtime.serve.ray_app:build"
    args = application["args"]
    assert args["models"] == [{"path": str(single_pkg.resolve()), "name": "single",
                               "replicas": None}]  # fmt: skip
    assert args["autoscale"] == [1, 3] and args["replica_cpus"] == 2
    assert args["prefix_cache_mb"] == 16  # each replica keeps its own prefix cache
    assert args["prefill_chunk"] == 64  # and prefills as the single-process server would
    built = ray_app.build(args)  # what `serve deploy` calls on the cluster
    assert type(built).__name__ == "Application"
    again = serve(app, str(single_pkg), "--ray", "--write-ray-config", str(out))
    assert again.exit_code == 1 and "exists already" in again.stderr
    assert out.read_text() == text


def test_serve_ray_answers_and_drains_its_requests_on_sigint(
    tiny_gqa_package, tmp_path, monkeypatch
):
    """The command as a process: its own local Ray instance, a stream running when SIGINT
    comes ends complete (Ray drains it), then the process exits 0."""
    import json
    import signal
    import threading

    pytest.importorskip("ray.serve")
    import httpx
    from test_serve_cli import ENDLESS, _start
    from test_serve_ray import RAY_ENV

    for key, value in RAY_ENV.items():  # the command's Ray instance inherits them
        monkeypatch.setenv(key, value)
    package = tmp_path / "pkg"
    package.symlink_to(tiny_gqa_package, target_is_directory=True)
    extra = ("--ray", "--replicas", "1", "--replica-cpus", "0.5")
    proc, url, lines = _start(package, extra=extra, wait_s=300)
    try:
        assert (
            httpx.get(url + "/health", timeout=30).json()["models"]["pkg"]["running_replicas"] == 1
        )
        events: list[str] = []
        first = threading.Event()

        def stream() -> None:
            body = {"model": "pkg", "prompt": ENDLESS[1], "max_tokens": 400, "temperature": 0,
                    "stream": True}  # fmt: skip
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        first.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert first.wait(60)
        proc.send_signal(signal.SIGINT)
        reader.join(120)
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert "error" not in last and last["choices"][0]["finish_reason"] == "length"
        assert proc.wait(120) == 0, "".join(lines[-20:])
    finally:
        if proc.poll() is None:
            proc.kill()
