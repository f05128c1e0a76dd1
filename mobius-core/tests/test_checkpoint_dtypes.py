"""An integer or bool tensor where a float parameter belongs is refused, by name and dtype.

Why: a raw int8 or bitsandbytes checkpoint was cast to float without a word, and the
package generated garbage.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

from mobius.cli import make_app


@pytest.mark.parametrize("dtype", ["int8", "int64", "bool", "uint8"])
def test_an_integer_float_parameter_is_refused(tiny_host, tiny_checkpoint, tmp_path, dtype) -> None:
    weight = np.arange(12).reshape(3, 4).astype(dtype)
    save_file({"proj.weight": weight}, str(tiny_checkpoint / "model.safetensors"))
    out = tmp_path / "out"
    for extra in ([], ["--quant", "int8"]):
        result = CliRunner().invoke(
            make_app(), ["build", str(tiny_checkpoint), str(out), *extra], obj={"host": tiny_host}
        )
        assert result.exit_code == 1, result.output
        assert (
            f"error: checkpoint tensor 'proj.weight' is {dtype}, but it holds the float "
            "parameter 'w'" in result.stderr
        )
        assert "where: model.safetensors: proj.weight" in result.stderr
        assert "build from the float" in result.stderr and "Traceback" not in result.output
        assert not out.exists()


def test_float_checkpoints_still_build(tiny_host, tiny_checkpoint, tmp_path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        make_app(), ["build", str(tiny_checkpoint), str(out)], obj={"host": tiny_host}
    )
    assert result.exit_code == 0, result.output
    assert json.loads((out / "mobius.json").read_text())["model_type"] == "tinytest"
