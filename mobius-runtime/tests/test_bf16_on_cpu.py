"""A bf16 package on CPU fails with a mobius DeviceError that says what to do, not ORT's text."""

from __future__ import annotations

from pathlib import Path

import pytest

from mobius.errors import MobiusError
from mobius_runtime.errors import DeviceError

TINY = Path(__file__).resolve().parents[2] / "testdata" / "tiny-gemma4"


def _build(tmp_path_factory, dtype: str) -> Path:
    if not (TINY / "config.json").is_file():
        pytest.skip("testdata/tiny-gemma4 is not present")
    pytest.importorskip("mobius_gemma4")
    import mobius

    out = tmp_path_factory.mktemp(f"tiny-{dtype}") / "pkg"
    mobius.build(str(TINY), str(out), dtype=dtype)
    return out


def test_bf16_package_on_cpu_says_use_cuda_or_rebuild(tmp_path_factory):
    from mobius_runtime import Pipeline

    package = _build(tmp_path_factory, "bf16")
    with pytest.raises(DeviceError) as info:
        Pipeline.load(package, device="cpu")
    err = info.value
    assert isinstance(err, MobiusError)
    text = str(err)
    assert "bfloat16" in text and "no bfloat16 kernels" in text
    assert "cuda" in text.lower() and "--dtype f32" in text
    assert str(package) in text  # where: the component graph


def test_computes_bf16_tells_builds_apart(tmp_path_factory):
    from mobius.package import read_package
    from mobius_runtime.sessions import computes_bf16

    for dtype, expect in (("bf16", True), ("f16", False)):
        package = read_package(_build(tmp_path_factory, dtype))
        paths = [Path(p) for p in package.components.values()]
        assert [computes_bf16(p) for p in paths] == [expect] * len(paths), dtype
    assert computes_bf16(Path("/nonexistent/model.onnx")) is False
