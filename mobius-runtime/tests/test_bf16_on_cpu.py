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
    from mobius_runtime.ort_sessions import computes_bf16

    for dtype, expect in (("bf16", True), ("f16", False)):
        package = read_package(_build(tmp_path_factory, dtype))
        paths = [Path(p) for p in package.components.values()]
        assert [computes_bf16(p) for p in paths] == [expect] * len(paths), dtype
    assert computes_bf16(Path("/nonexistent/model.onnx")) is False


def test_int4_bf16_package_on_cpu_names_op_dtype_and_provider(tmp_path_factory):
    """A quantized bf16 package (built for --target default) has no CPU kernels."""
    from mobius_runtime import Pipeline

    if not (TINY / "config.json").is_file():
        pytest.skip("testdata/tiny-gemma4 is not present")
    import mobius

    package = tmp_path_factory.mktemp("tiny-int4-bf16") / "pkg"
    mobius.build(str(TINY), str(package), dtype="bf16", quant="int4")
    with pytest.raises(DeviceError) as info:
        Pipeline.load(package, device="cpu")
    text = str(info.value)
    assert "CPUExecutionProvider" in text and "MatMulNBits with bfloat16 activations" in text
    assert "GatherBlockQuantized with bfloat16 activations" in text
    assert "--dtype f32" in text


def test_int4_f32_and_f16_packages_load_on_cpu(tmp_path_factory):
    from mobius_runtime import Pipeline

    if not (TINY / "config.json").is_file():
        pytest.skip("testdata/tiny-gemma4 is not present")
    import mobius

    for dtype in ("f32", "f16"):
        package = tmp_path_factory.mktemp(f"tiny-int4-{dtype}") / "pkg"
        mobius.build(str(TINY), str(package), dtype=dtype, quant="int4", target="cpu")
        result = Pipeline.load(package, device="cpu").generate(
            input_ids=[2, 10, 20, 30], max_new_tokens=4, stop_ids=()
        )
        assert len(result.ids) == 4
