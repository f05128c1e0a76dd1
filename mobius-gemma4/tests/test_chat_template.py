"""The package's chat template gives HF's ids: ``apply_chat_template`` + media expansion.

The bundled tiny checkpoints ship a Gemma 4 style ``chat_template.jinja``; the build
copies it into the package and ``mobius_runtime`` renders it. The reference side is
transformers' own tokenizer / ``Gemma4Processor`` on the same checkpoint folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXT, MM = ROOT / "testdata" / "tiny-gemma4", ROOT / "testdata" / "tiny-gemma4-mm"
IMAGE, AUDIO = ROOT / "testdata" / "media" / "tiny.png", ROOT / "testdata" / "media" / "tiny.wav"

CONVERSATIONS = {
    "one user turn": [{"role": "user", "content": "Hello there"}],
    "system and history": [
        {"role": "system", "content": "  Answer briefly. "},
        {"role": "user", "content": "It was the best of times."},
        {"role": "assistant", "content": "It was the worst of times."},
        {"role": "user", "content": [{"type": "text", "text": "Four score and seven"}]},
    ],
    "a <bos> the user wrote is text": [{"role": "user", "content": "say <bos> twice"}],
}


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    import mobius

    out = {}
    for name, src in (("text", TEXT), ("mm", MM)):
        out[name] = tmp_path_factory.mktemp(name) / "pkg"
        mobius.build(str(src), str(out[name]))
    return out


def test_the_build_copies_the_template(packages):
    for name, src in (("text", TEXT), ("mm", MM)):
        copied = (packages[name] / "chat_template.jinja").read_text(encoding="utf-8")
        assert copied == (src / "chat_template.jinja").read_text(encoding="utf-8")


@pytest.mark.reference
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_text_ids_equal_hf(packages, name):
    transformers = pytest.importorskip("transformers")
    from mobius_runtime import Pipeline

    messages = CONVERSATIONS[name]
    tok = transformers.AutoTokenizer.from_pretrained(str(TEXT))
    hf_text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    hf_ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    p = Pipeline.load(packages["text"], device="cpu")
    assert p.apply_chat_template(messages) == hf_text
    result = p.generate(messages=messages, max_new_tokens=2)
    assert result.prompt_ids == list(hf_ids)
    # the rendered text as prompt= (verbatim, its <bos> kept single) gives the same ids
    assert p.generate(prompt=hf_text, max_new_tokens=2).prompt_ids == list(hf_ids)


def _hf_processor(transformers, tok, monkeypatch):
    """HF's ``Gemma4Processor`` for the tiny checkpoint, made from its config.

    The folder ships no processor config, and without torchvision transformers
    cannot resolve a video processor class; video is not used here, so the class
    check is skipped for it."""
    import json

    monkeypatch.setattr(
        transformers.ProcessorMixin, "check_argument_for_proper_class", lambda *a, **k: None
    )
    cfg = json.loads((MM / "config.json").read_text())
    vision = cfg["vision_config"]
    images = transformers.Gemma4ImageProcessorPil(
        patch_size=vision["patch_size"],
        pooling_kernel_size=vision["pooling_kernel_size"],
        max_soft_tokens=cfg["vision_soft_tokens_per_image"],
    )
    audio = transformers.Gemma4AudioFeatureExtractor(
        feature_size=cfg["audio_config"].get("num_mel_bins", 128)
    )
    return transformers.Gemma4Processor(
        feature_extractor=audio,
        image_processor=images,
        tokenizer=tok,
        video_processor=None,
        chat_template=tok.chat_template,
        image_seq_length=cfg["vision_soft_tokens_per_image"],
    )


@pytest.mark.reference
def test_media_ids_equal_hf_processor(packages, monkeypatch):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from mobius_gemma4.audio import load_audio
    from mobius_runtime import Pipeline

    tok = transformers.AutoTokenizer.from_pretrained(str(MM))
    processor = _hf_processor(transformers, tok, monkeypatch)
    wave = load_audio(AUDIO)  # 16 kHz samples: HF's file loader needs soxr, absent here
    messages = [
        {"role": "system", "content": "Look and listen."},
        {
            "role": "user",
            "content": [
                {"type": "image", "path": str(IMAGE)},
                {"type": "text", "text": "What is this, and"},
                {"type": "audio", "audio": wave},
                {"type": "text", "text": "what is that?"},
            ],
        },
    ]
    hf = processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    hf_ids = [int(i) for i in hf["input_ids"][0]]
    p = Pipeline.load(packages["mm"], device="cpu")
    ours = p.generate(messages=messages, max_new_tokens=2)
    assert ours.prompt_ids == hf_ids
    assert hf_ids.count(tok.convert_tokens_to_ids("<|image|>")) > 0
