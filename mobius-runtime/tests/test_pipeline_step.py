"""``Pipeline.step`` (caller-driven prefill + decode) and the ``graph_transform`` load hook.

Built from the bundled tiny Gemma 4 checkpoint: stepping a prompt and then one token at a
time must give the logits of one ``forward`` over the whole sequence, in both KV modes; a
transform must be applied to every component before its session opens, and the bf16
emulation of ``mobius_testing`` must make a bf16 package runnable on CPU through it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

TINY = Path(__file__).resolve().parents[2] / "testdata" / "tiny-gemma4"
IDS = np.random.default_rng(3).integers(7, 500, size=(1, 14), dtype=np.int64)
PROMPT = 10


def _build(tmp_path_factory, dtype: str) -> Path:
    if not (TINY / "config.json").is_file():
        pytest.skip("testdata/tiny-gemma4 is not present")
    pytest.importorskip("mobius_gemma4")
    import mobius

    out = tmp_path_factory.mktemp(f"step-{dtype}") / "pkg"
    mobius.build(str(TINY), str(out), dtype=dtype)
    return out


@pytest.fixture(scope="module")
def f32_package(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "f32")


def _stepped(pipeline, capacity: int | None = None) -> np.ndarray:
    from mobius_runtime.pipeline import StepState

    out, state = pipeline.step(input_ids=IDS[:, :PROMPT], capacity=capacity)
    assert isinstance(state, StepState) and state.past == PROMPT
    assert not any(".present" in k for k in out), "KV state is not copied to numpy"
    chunks = [out["logits"]]
    for s in range(PROMPT, IDS.shape[1]):
        out, state = pipeline.step(state, input_ids=IDS[:, s : s + 1])
        assert state.past == s + 1 and state.capacity == capacity
        chunks.append(out["logits"])
    return np.concatenate(chunks, axis=1).astype(np.float32)


@pytest.mark.parametrize("capacity", [None, 32], ids=["concat-kv", "shared-kv"])
def test_steps_equal_one_forward(f32_package, capacity):
    from mobius_runtime import Pipeline

    pipeline = Pipeline.load(f32_package, device="cpu", threads=1)
    full = pipeline.forward(input_ids=IDS)["logits"]
    stepped = _stepped(pipeline, capacity)
    assert stepped.shape == full.shape
    assert np.abs(stepped - full).max() <= 1e-5
    assert (stepped.argmax(-1) == full.argmax(-1)).all()


def test_graph_transform_is_applied_to_every_component(f32_package):
    import onnx

    from mobius_runtime import Pipeline

    seen: list[str] = []

    def transform(model: onnx.ModelProto) -> onnx.ModelProto:
        assert isinstance(model, onnx.ModelProto) and len(model.graph.initializer) > 0
        seen.append(model.graph.name)
        return model

    plain = Pipeline.load(f32_package, device="cpu", threads=1)
    hooked = Pipeline.load(
        f32_package, device="cpu", threads=1, graph_transform=transform, optimize=False
    )
    assert len(seen) == len([n for n in hooked.plan.order if hooked.plan.presence[n] is None])
    a = plain.forward(input_ids=IDS)["logits"]
    b = hooked.forward(input_ids=IDS)["logits"]
    assert np.abs(a - b).max() <= 1e-5


def test_bf16_package_runs_on_cpu_through_the_emulation(tmp_path_factory, f32_package):
    """The transform feeds f32 to the rewritten sessions while the ports stay bf16."""
    emulation = pytest.importorskip("mobius_testing.bf16_emulation")
    from mobius_runtime import Pipeline

    package = _build(tmp_path_factory, "bf16")
    pipeline = Pipeline.load(
        package, device="cpu", threads=1, graph_transform=emulation.emulate_bf16, optimize=False
    )
    types = {i.type for s in pipeline._sessions.values() for i in s.get_inputs()}
    assert "tensor(bfloat16)" not in types and "tensor(float)" in types
    got = _stepped(pipeline)
    ref = Pipeline.load(f32_package, device="cpu", threads=1).forward(input_ids=IDS)["logits"]
    delta = float(np.abs(got - ref).max())
    assert np.isfinite(got).all() and 0 < delta < 0.5, delta
