"""`mobius run`: streaming output, --json, and clear errors with exit status 1."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from mobius_runtime import plugin


@pytest.fixture
def app():
    app = typer.Typer()
    plugin.mobius_add_commands(app)

    @app.command("noop", hidden=True)
    def noop() -> None:  # a second command keeps typer from flattening `run`
        pass

    return app


def _run(app, *args):
    return CliRunner().invoke(app, ["run", *map(str, args)])


def test_plugin_module_is_import_light():
    import subprocess
    import sys

    code = "import sys, mobius_runtime.plugin; print('onnxruntime' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_json_output(app, single_pkg):
    result = _run(
        app, single_pkg, "--prompt", "b c", "--max-new-tokens", "3", "--json", "--device", "cpu"
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert 1 <= len(data["ids"]) <= 3
    assert set(data["timings"]) == {"prefill_ms", "decode_ms", "decode_tokens_per_s"}


def test_streams_text(app, single_pkg):
    result = _run(
        app,
        single_pkg,
        "--prompt",
        "b c",
        "--max-new-tokens",
        "4",
        "--sample",
        "--seed",
        "1",
        "--temperature",
        "0.7",
        "--top-k",
        "5",
        "--top-p",
        "0.9",
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("\n")


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("missing", "does not exist"),
        ("corrupt", "sha256"),
        ("image", "cannot read image file"),
        ("audio", "cannot read audio file"),
        ("long", "positions"),
        ("modality", "no image input"),
    ],
)
def test_errors_exit_1_without_traceback(app, single_pkg, tmp_path, case, needle):
    args = [single_pkg, "--prompt", "b", "--max-new-tokens", "2"]
    if case == "missing":
        args[0] = tmp_path / "nope"
    elif case == "corrupt":
        data = single_pkg / "model" / "model.onnx.data"
        data.write_bytes(data.read_bytes()[:-4] + b"oops")
    elif case == "image":
        args += ["--image", tmp_path / "no.png"]
    elif case == "audio":
        args += ["--audio", tmp_path / "no.wav"]
    elif case == "long":
        args[2] = " ".join(["b"] * 70)
    elif case == "modality":
        img = tmp_path / "x.png"
        img.write_bytes(b"\x89PNG")
        args += ["--image", img]
    result = _run(app, *args)
    assert result.exit_code == 1
    assert needle in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("as_json", [False, True])
def test_a_reply_cut_at_the_context_length_says_so(app, single_pkg, as_json):
    """Was silent in plain mode (128 tokens asked, a few given)."""
    args = [single_pkg, "--raw", "--prompt", " ".join(["b"] * 60), "--device", "cpu"]
    result = _run(app, *args, *(["--json"] if as_json else []))
    assert result.exit_code == 0, result.output
    if as_json:
        data = json.loads(result.stdout.strip().splitlines()[-1])
        assert data["stop_reason"] == "context_length"
        assert "note:" not in result.stderr
        return
    n = len(result.stdout.strip().split())
    assert (
        f"note: the reply was cut: 128 tokens asked, {n} given: the context length 64 was "
        "reached" in result.stderr
    ), (result.stdout, result.stderr)


def test_threads_out_of_range_gives_one_range(app, single_pkg, monkeypatch):
    """Was "use 1 to 8" in the message and "pass a number from 1 to 2" in the fix."""
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    result = _run(app, single_pkg, "--prompt", "b", "--threads", "100", "--device", "cpu")
    assert result.exit_code == 1, result.output
    assert "threads=100 is out of range: the limit is 1 to 8 (4 per CPU core" in result.stderr
    assert "fix: pass a number from 1 to 8 (2, one per core" in result.stderr
    assert "from 1 to 2" not in result.stderr


def test_penalty_and_min_p_flags_build_the_same_sampling_as_generate(app, tiny_gqa_package):
    from mobius_runtime import Pipeline, SamplingParams

    args = [tiny_gqa_package, "--raw", "--prompt", "the the the", "--max-new-tokens", "24",
            "--device", "cpu", "--json", "--repetition-penalty", "3"]  # fmt: skip
    greedy = _run(app, *args)
    assert greedy.exit_code == 0, greedy.output
    sampled = _run(app, *args, "--sample", "--seed", "2", "--min-p", "0.2")
    assert sampled.exit_code == 0, sampled.output
    pipeline = Pipeline.load(tiny_gqa_package, device="cpu", threads=1)
    for result, params in (
        (greedy, SamplingParams(max_tokens=24, repetition_penalty=3.0)),
        (sampled, SamplingParams(max_tokens=24, repetition_penalty=3.0, temperature=1.0,
                                 seed=2, min_p=0.2)),
    ):  # fmt: skip
        want = pipeline.generate(prompt="the the the", sampling=params)
        assert json.loads(result.stdout.strip().splitlines()[-1])["ids"] == want.ids
    plain = pipeline.generate(prompt="the the the", max_new_tokens=24)
    assert json.loads(greedy.stdout.strip().splitlines()[-1])["ids"] != plain.ids


def test_min_p_without_sample_is_a_one_line_error(app, single_pkg):
    result = _run(app, single_pkg, "--prompt", "b", "--min-p", "0.1")
    assert result.exit_code == 1
    assert "--min-p given without --sample" in result.stderr and "Traceback" not in result.stderr
