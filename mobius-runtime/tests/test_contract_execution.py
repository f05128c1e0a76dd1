"""Contract execution on hand-made packages: edges, state, fallbacks, generated inputs, dtypes."""

from __future__ import annotations

import numpy as np
import pytest
import toypkg

from mobius_runtime import Pipeline
from mobius_runtime.errors import RequestError


def test_single_graph_prefill_matches_reference(single_pkg):
    p = Pipeline.load(single_pkg, device="cpu")
    ids = np.array([[3, 4, 5, 6]])
    out = p.forward(input_ids=ids)
    np.testing.assert_allclose(out["logits"], toypkg.reference_logits([ids])[0], rtol=1e-5)
    assert set(out) == {"logits", "model.logits", "model.present.0.key"}
    assert out["model.present.0.key"].shape == (1, 1, 4, toypkg.D)


def test_batch_and_state_across_steps(single_pkg):
    """State edges carry present -> past; positions and mask grow with the past."""
    p = Pipeline.load(single_pkg, device="cpu")
    chunks = [np.array([[3, 4, 5], [6, 7, 8]]), np.array([[9], [10]]), np.array([[11], [12]])]
    ref = toypkg.reference_logits(chunks)
    state, past = None, 0
    for chunk, want in zip(chunks, ref):
        values = p.executor.step({"input_ids": chunk}, state, past)
        got = values["model.logits"].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        state = p.executor.next_state(values)
        past += chunk.shape[1]
    assert state["model.past.0.key"].shape() == [2, 1, 5, toypkg.D]


def test_f16_state_and_bool_mask_fed_as_declared(tmp_path):
    pkg = toypkg.single_package(tmp_path / "f16", kv_dtype="float16", mask_dtype="bool")
    p = Pipeline.load(pkg, device="cpu")
    types = {a.name: a.type for a in p.session("model").get_inputs()}
    assert types["past.0.key"] == "tensor(float16)"
    assert types["attention_mask"] == "tensor(bool)"
    chunks = [np.array([[3, 4]]), np.array([[5]])]
    ref = toypkg.reference_logits(chunks, kv_dtype="float16")
    values = p.executor.step({"input_ids": chunks[0]}, None, 0)
    assert values["model.present.0.key"].data_type() == "tensor(float16)"
    values = p.executor.step({"input_ids": chunks[1]}, p.executor.next_state(values), 2)
    np.testing.assert_allclose(values["model.logits"].numpy(), ref[1], rtol=1e-3, atol=1e-3)


def test_split_edges_and_optional_zero_fallback(split_pkg):
    p = Pipeline.load(split_pkg, device="cpu")
    assert set(p._sessions) == {"embedding", "decoder"}, "vision encoder opens lazily"
    ids = np.array([[3, 4, 5]])
    out = p.forward(input_ids=ids)
    np.testing.assert_allclose(out["logits"], toypkg.reference_logits([ids])[0], rtol=1e-5)
    assert "vision_encoder.image_features" not in out
    assert "embedding.inputs_embeds" in out


def test_split_presence_component_runs_with_its_modality(split_pkg):
    p = Pipeline.load(split_pkg, device="cpu")
    ids = np.array([[3, 4, 5]])
    image = np.linspace(0, 1, 2 * toypkg.D, dtype=np.float32).reshape(2, toypkg.D)
    out = p.forward(input_ids=ids, pixel_values=image)
    ref = toypkg.reference_logits([ids], image=image)[0]
    np.testing.assert_allclose(out["logits"], ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["vision_encoder.image_features"], 2 * image)


def test_missing_required_input_fails_before_any_session_runs(split_pkg, monkeypatch):
    p = Pipeline.load(split_pkg, device="cpu")
    ran = []
    for name, session in p._sessions.items():
        original = session.run_with_iobinding
        monkeypatch.setattr(
            session,
            "run_with_iobinding",
            lambda *a, _n=name, _o=original, **k: (ran.append(_n), _o(*a, **k)),
        )
    with pytest.raises(RequestError) as info:
        p.forward(pixel_values=np.zeros((1, toypkg.D), np.float32))
    assert "embedding.input_ids" in str(info.value)
    assert "never zero-filled" in str(info.value)
    assert ran == []


def test_unknown_input_is_named(single_pkg):
    p = Pipeline.load(single_pkg, device="cpu")
    with pytest.raises(RequestError, match="pixel_values"):
        p.forward(input_ids=np.array([[3]]), pixel_values=np.zeros((1, 8)))


def test_contract_without_source_is_refused_at_load(tmp_path):
    from mobius.contract import Contract
    from mobius.errors import PackageError

    dec = toypkg.decoder_graph(kv_dtype="float32", mask_dtype="int64", embeds_input=False)
    full = toypkg.single_contract(dec)
    broken = Contract(
        components=full.components,
        states=full.states,
        externals=tuple(e for e in full.externals if e.name != "position_ids"),
        outputs=full.outputs,
    )
    pkg = toypkg.write(tmp_path / "broken", {"model": dec}, broken)
    with pytest.raises(PackageError, match=r"contract: 'model\.position_ids' has no source"):
        Pipeline.load(pkg, device="cpu")
