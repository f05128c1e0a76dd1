"""End to end: build the bundled tiny Gemma 4 checkpoint and generate with `mobius run`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TINY = Path(__file__).resolve().parents[2] / "testdata" / "tiny-gemma4"


@pytest.fixture(scope="module")
def tiny_package(tmp_path_factory):
    if not (TINY / "config.json").is_file():
        pytest.skip("testdata/tiny-gemma4 is not present")
    pytest.importorskip("mobius_gemma4")
    import mobius

    out = tmp_path_factory.mktemp("tiny") / "pkg"
    mobius.build(str(TINY), str(out))
    return out


def test_mobius_run_generates_and_is_deterministic(tiny_package):
    cmd = [
        str(Path(sys.executable).parent / "mobius"),
        "run",
        str(tiny_package),
        "--prompt",
        "Hello",
        "--max-new-tokens",
        "6",
        "--json",
        "--device",
        "cpu",
    ]
    runs = [subprocess.run(cmd, capture_output=True, text=True, timeout=300) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
        assert "Traceback" not in run.stderr
    a, b = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert a["ids"] == b["ids"] and 1 <= len(a["ids"]) <= 6


def test_forward_and_generate_agree(tiny_package):
    import numpy as np

    from mobius_runtime import Pipeline

    p = Pipeline.load(tiny_package, device="cpu")
    result = p.generate(prompt="Hello", max_new_tokens=4, stop_ids=())
    full = np.array([result.prompt_ids + result.ids[:-1]])
    logits = p.forward(input_ids=full)["logits"][0]
    n = len(result.prompt_ids)
    assert np.argmax(logits[n - 1 :], axis=-1).tolist() == result.ids
