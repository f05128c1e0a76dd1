"""L3 synthetic parity of Gemma 3 text: mobius packages on ORT CPU vs HF transformers 5.24.

Each tiny seeded checkpoint of ``gemma3_specs.py`` is built with ``mobius.build`` and run
through ``mobius_runtime.Pipeline`` (checks: :mod:`mobius_testing.lm_parity`): a 24-token
prefill and 16 cached single-token steps against one HF float32 no-cache forward; f32
max|Δ logits| ≤ 1e-4 and 100 % top-1 on every target; 16 greedy ids equal HF
``generate``'s; f16 tie-aware top-1 100 %; both config shapes build identically.
Figures are printed (``-s``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from gemma3_specs import SPECS

from mobius_testing import lm_parity as lp

pytestmark = [pytest.mark.reference, pytest.mark.l3]

(
    test_f32_parity,
    test_greedy_16_steps,
    test_f16_top1,
    test_config_shapes_build_identically,
) = lp.parity_tests(SPECS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_specs_slide_inside_the_prompt(name):
    """Every spec has ≥ 2 sliding layers per full one and a window shorter than the
    prompt, or it tests nothing of the local/global pattern."""
    from mobius_gemma3.config import read_config

    cfg = read_config("gemma3_text", SPECS[name])
    kinds = cfg.layer_types
    assert kinds.count("sliding_attention") >= 2 * kinds.count("full_attention") >= 2
    assert cfg.sliding_window < lp.PREFILL


def test_bundled_tiny_gemma3_matches_hf(tmp_path, parity_ids):
    """testdata/tiny-gemma3 (bf16 weights, untied, what ``tox -e genai`` builds): its f32
    package matches HF's f32 model of the same files over prefill + cached steps, and
    greedy ids agree."""
    from conftest import TESTDATA

    import mobius

    source = TESTDATA / "tiny-gemma3"
    model = lp.load_model(source)
    package = mobius.build(str(source), str(tmp_path / "pkg")).out
    pipeline = lp.load_pipeline(package)
    ref = lp.hf_logits(model, parity_ids)
    got = lp.step_logits(pipeline, parity_ids, lp.PREFILL)
    delta, strict, _ = lp.report("tiny-gemma3 (bundled) f32", ref, got)
    assert delta <= lp.F32_ATOL and strict == 1.0
    prompt = parity_ids[:, : lp.PREFILL]
    want = lp.hf_greedy(model, prompt, lp.DECODE)
    assert pipeline.generate(input_ids=prompt, max_new_tokens=lp.DECODE, stop_ids=()).ids == want
