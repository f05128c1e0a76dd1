"""L3 parity of ``gemma4_unified`` (Gemma 4 12B, encoder-free) against HF 5.24 in float32.

A tiny seeded ``Gemma4UnifiedForConditionalGeneration`` (reference/unified.py: k_eq_v text,
sliding window 8, ``"vision"`` image-block mask, 48-px patch embedder, 640-sample audio
embedder, every constant-initialised tensor perturbed) is written with ``save_pretrained``,
built with ``mobius.build`` (f32) and run through ``mobius_runtime.Pipeline.step`` (the
runtime's executor): the prompt step with the media (presence-gated encoders), then cached
single-token decode steps (``[0, H]`` zero features). The reference is one HF no-cache
forward over prompt + decoded tokens with the same media and ``mm_token_type_ids``.

Bars: logits max|Δ| ≤ 1e-4 (aim 1e-5) with 100 % top-1; encoder features ≤ 1e-5.
Figures are printed (run with ``-s``).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from reference.run import step_logits
from reference.specs import MAX_PROMPT_ID, MM_TOKEN_IDS

pytestmark = [pytest.mark.reference, pytest.mark.l3]

LOGITS_ATOL = 1e-4
FEATURES_ATOL = 1e-5
DECODE_STEPS = 4
HIDDEN = 64
IMG, BOI, EOI = (MM_TOKEN_IDS[k] for k in ("image_token_id", "boi_token_id", "eoi_token_id"))
AUD, BOA, EOA = (MM_TOKEN_IDS[k] for k in ("audio_token_id", "boa_token_id", "eoa_token_index"))
VID = MM_TOKEN_IDS["video_token_id"]


class _Unified:
    """Checkpoint, HF model and loaded f32 package, made once per module."""

    def __init__(self, root) -> None:
        from reference.unified import load_unified, make_unified_checkpoint

        import mobius
        from mobius_runtime import Pipeline

        self.folder = make_unified_checkpoint(root / "ckpt")
        self.build = mobius.build(str(self.folder), str(root / "pkg"), dtype="f32")
        self.hf = load_unified(self.folder)
        self.pipeline = Pipeline.load(self.build.out, device="cpu", threads=1)


@pytest.fixture(scope="module")
def unified(tmp_path_factory):
    return _Unified(tmp_path_factory.mktemp("gemma4-unified"))


def _image(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def _pixels(images: list[np.ndarray]):
    """48-px patches at native size (no resize), padded to 70 rows with (−1, −1)."""
    from mobius_gemma4.unified.processor import UnifiedImageBatch, UnifiedImageProcessor

    proc = UnifiedImageProcessor(max_soft_tokens=70)
    done = [proc.patchify(im, resize=False) for im in images]
    return UnifiedImageBatch(
        np.stack([d[0] for d in done]), np.stack([d[1] for d in done]), tuple(d[2] for d in done)
    )


def _prompt(rows: list[list[tuple[int, int, int, int]]], length: int, seed: int) -> np.ndarray:
    """``[B, length]`` ids: text with each media block (begin, n × token, end) cut in."""
    rng = np.random.default_rng(seed)
    out = []
    for blocks in rows:
        text = length - sum(n + 2 for _, _, n, _ in blocks)
        assert text >= len(blocks) + 1
        cuts = np.sort(rng.choice(np.arange(1, text), size=len(blocks), replace=False))
        ids = list(rng.integers(3, MAX_PROMPT_ID, size=text))
        row: list[int] = []
        prev = 0
        for cut, (begin, token, n, end) in zip(cuts, blocks):
            row += ids[prev:cut] + [begin] + [token] * n + [end]
            prev = cut
        out.append(row + ids[prev:])
    return np.asarray(out, dtype=np.int64)


def _with_decode(prompt: np.ndarray, seed: int) -> np.ndarray:
    extra = np.random.default_rng(seed).integers(
        3, MAX_PROMPT_ID, size=(prompt.shape[0], DECODE_STEPS)
    )
    return np.concatenate([prompt, extra], axis=1)


def _hf_logits(model, ids: np.ndarray, *, token_types: bool = True, **media) -> np.ndarray:
    import torch

    t = torch.from_numpy(ids)
    kwargs = dict(media)
    if token_types:  # what Gemma4UnifiedProcessor emits; HF needs it for the "vision" mask
        kwargs["mm_token_type_ids"] = (
            (t == IMG).long() + 2 * (t == VID).long() + 3 * (t == AUD).long()
        )
    with torch.no_grad():
        out = model(input_ids=t, attention_mask=torch.ones_like(t), use_cache=False, **kwargs)
    return out.logits.float().numpy()


def _report(label: str, ref: np.ndarray, got: np.ndarray, prompt_len: int) -> float:
    delta = np.abs(ref - got)
    top1 = float((ref.argmax(-1) == got.argmax(-1)).mean())
    print(
        f"\n[L3-unified] {label}: logits max|Δ| {delta.max():.3e} (prefill "
        f"{delta[:, :prompt_len].max():.3e}, decode {delta[:, prompt_len:].max():.3e}), "
        f"top-1 {top1:.1%}"
    )
    assert top1 == 1.0, label
    return float(delta.max())


def _features(label: str, ref: np.ndarray, got: np.ndarray, rows: int) -> None:
    assert got.shape == ref.shape == (rows, HIDDEN)
    fd = float(np.abs(got - ref).max())
    print(f"\n[L3-unified] {label}: max|Δ| {fd:.3e}")
    assert fd <= FEATURES_ATOL


def _image_case(case, images, rows, length, seed, label):
    import torch

    batch = _pixels(images)
    assert list(batch.num_soft_tokens) == [b[2] for r in rows for b in r]
    prompt = _prompt(rows, length, seed)
    ids = _with_decode(prompt, seed + 1)
    pv, pos = torch.from_numpy(batch.pixel_values), torch.from_numpy(batch.pixel_position_ids)
    ref = _hf_logits(case.hf, ids, pixel_values=pv, image_position_ids=pos)
    media = {"pixel_values": batch.pixel_values, "pixel_position_ids": batch.pixel_position_ids}
    got, outs = step_logits(case.pipeline, ids, prompt.shape[1], media)
    with torch.no_grad():
        feats = case.hf.model.get_image_features(pv, pos, return_dict=True).pooler_output
    ref_feats = torch.cat(list(feats), dim=0).numpy()
    got_feats = outs["vision_encoder.image_features"]
    _features(f"{label} image_features", ref_feats, got_feats, sum(batch.num_soft_tokens))
    assert _report(label, ref, got, prompt.shape[1]) <= LOGITS_ATOL
    return batch, ids, ref


def test_text_only_prompt(unified):
    """No media: encoders skipped, ``[0, H]`` features, logits match HF."""
    ids = _with_decode(_prompt([[]], 20, 1), 2)
    ref = _hf_logits(unified.hf, ids)
    got, outs = step_logits(unified.pipeline, ids, 20, {})
    assert not any(k.startswith(("vision_encoder.", "audio_encoder.")) for k in outs)
    assert _report("text only", ref, got, 20) <= LOGITS_ATOL


def test_image_prompt_with_bidirectional_block(unified):
    """One 144×192 image → 12 merged patches (padded to 70) in a 24-token prompt; the
    12-token block is longer than the window (8), so the ``"vision"`` overlay matters."""
    import torch

    batch, ids, ref = _image_case(
        unified, [_image(144, 192, 3)], [[(BOI, IMG, 12, EOI)]], 24, 4, "image 144x192"
    )
    causal = _hf_logits(
        unified.hf,
        ids,
        token_types=False,
        pixel_values=torch.from_numpy(batch.pixel_values),
        image_position_ids=torch.from_numpy(batch.pixel_position_ids),
    )
    assert np.abs(causal - ref).max() > 1e-3  # the overlay is exercised


def test_image_batch_two_sizes_and_two_blocks(unified):
    """Batch 2: row 0 holds two images (block ids 0 and 1), row 1 one; HF's flattened order."""
    _image_case(
        unified,
        [_image(96, 144, 5), _image(144, 96, 6), _image(144, 192, 7)],
        [[(BOI, IMG, 6, EOI), (BOI, IMG, 6, EOI)], [(BOI, IMG, 12, EOI)]],
        26,
        8,
        "image batch 2, two blocks in row 0",
    )


def test_audio_prompts_right_padded(unified):
    """Clips of 1.0 s (25 frames) and 0.7 s (18 frames, tail zero-padded) in one batch:
    HF's feature extractor output is reproduced exactly, padded frames give no tokens."""
    import torch
    from transformers.models.gemma4_unified.feature_extraction_gemma4_unified import (
        Gemma4UnifiedAudioFeatureExtractor,
    )

    from mobius_gemma4.unified.processor import UnifiedAudioFrames

    rng = np.random.default_rng(9)
    clips = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (16_000, 11_200)]
    batch = UnifiedAudioFrames()(clips)
    hf_batch = Gemma4UnifiedAudioFeatureExtractor()(clips, return_tensors="np")
    np.testing.assert_array_equal(batch.input_features, hf_batch["input_features"])
    np.testing.assert_array_equal(batch.input_features_mask, hf_batch["input_features_mask"])
    assert batch.num_soft_tokens == (25, 18)

    rows = [[(BOA, AUD, n, EOA)] for n in batch.num_soft_tokens]
    prompt = _prompt(rows, 36, 10)
    ids = _with_decode(prompt, 11)
    x, m = torch.from_numpy(batch.input_features), torch.from_numpy(batch.input_features_mask)
    ref = _hf_logits(unified.hf, ids, input_features=x, input_features_mask=m)
    media = {
        "input_features": batch.input_features,
        "input_features_mask": batch.input_features_mask,
    }
    got, outs = step_logits(unified.pipeline, ids, prompt.shape[1], media)
    with torch.no_grad():
        enc = unified.hf.model.get_audio_features(x, m, return_dict=True)
    ref_feats = enc.pooler_output[enc.attention_mask].numpy()
    _features("audio_features", ref_feats, outs["audio_encoder.audio_features"], 43)
    assert _report("audio batch 2", ref, got, prompt.shape[1]) <= LOGITS_ATOL


def test_image_and_audio_in_one_prompt(unified):
    """Both encoders on the prompt step; each feature set lands on its own placeholders."""
    import torch

    from mobius_gemma4.unified.processor import UnifiedAudioFrames

    images = _pixels([_image(96, 144, 12)])
    audio = UnifiedAudioFrames()([np.linspace(-0.5, 0.5, 5_000, dtype=np.float32)])
    rows = [[(BOI, IMG, 6, EOI), (BOA, AUD, audio.num_soft_tokens[0], EOA)]]
    prompt = _prompt(rows, 30, 13)
    ids = _with_decode(prompt, 14)
    ref = _hf_logits(
        unified.hf,
        ids,
        pixel_values=torch.from_numpy(images.pixel_values),
        image_position_ids=torch.from_numpy(images.pixel_position_ids),
        input_features=torch.from_numpy(audio.input_features),
        input_features_mask=torch.from_numpy(audio.input_features_mask),
    )
    media = {
        "pixel_values": images.pixel_values,
        "pixel_position_ids": images.pixel_position_ids,
        "input_features": audio.input_features,
        "input_features_mask": audio.input_features_mask,
    }
    got, _ = step_logits(unified.pipeline, ids, prompt.shape[1], media)
    assert _report("image + audio", ref, got, prompt.shape[1]) <= LOGITS_ATOL


def test_package_reads_every_tensor_and_ignores_ple_keys(unified):
    """All checkpoint tensors are read (HF's on-disk ``vision_embedder.*`` names included);
    the text config's ``hidden_size_per_layer_input`` 16 is ignored (no PLE ports)."""
    assert unified.build.unused == ()
    assert set(unified.build.components) == {
        "vision_encoder",
        "audio_encoder",
        "embedding",
        "decoder",
    }
    from mobius.package import read_package

    contract = read_package(unified.build.out).contract
    assert contract.component("decoder").input("per_layer_inputs") is None
    assert contract.component("decoder").input("input_ids") is not None  # "vision" overlay
    # onnxruntime-genai refuses a speech section without its processor config
    import json

    genai = json.loads((unified.build.out / "genai_config.json").read_text())["model"]
    assert genai["speech"]["config_filename"] == "audio_processor.json"
    assert genai["vision"]["config_filename"] == "image_processor.json"
    audio = json.loads((unified.build.out / "audio_processor.json").read_text())
    frames = audio["feature_extraction"]["sequence"][1]["operation"]
    assert frames["type"] == "Gemma4UnifiedAudioFrames"
    assert frames["attrs"]["audio_samples_per_token"] == 640


def test_merged_patches_match_hf_merge_order():
    """48-px patchify == HF's 16-px ``convert_image_to_patches`` + ``patches_merge``."""
    import torch
    from reference.unified import hf_patch_functions

    from mobius_gemma4.unified.processor import UnifiedImageProcessor

    fns = hf_patch_functions()
    for h, w in ((144, 192), (96, 240), (48, 48)):
        rgb = _image(h, w, h + w)
        ours, pos, n = UnifiedImageProcessor(max_soft_tokens=70).patchify(rgb, resize=False)
        image = torch.from_numpy(rgb.astype(np.float32) / 255.0).permute(2, 0, 1)
        small = fns["convert_image_to_patches"](image, 16)
        ph, pw = h // 16, w // 16
        grid = torch.meshgrid(torch.arange(pw), torch.arange(ph), indexing="xy")
        xy = torch.stack(grid, dim=-1).reshape(-1, 2)
        merged, merged_pos = fns["patches_merge"](small[None], xy[None], small.shape[0] // 9)
        assert n == merged.shape[1]
        np.testing.assert_allclose(ours[:n], merged[0].numpy(), rtol=0, atol=1e-7)
        np.testing.assert_array_equal(pos[:n], merged_pos[0].numpy())
        assert (pos[n:] == -1).all() and not ours[n:].any()
