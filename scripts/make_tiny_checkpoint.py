"""Make testdata/tiny-gemma4 (text) or testdata/tiny-gemma4-mm (vision + audio): seeded, random.

    python scripts/make_tiny_checkpoint.py [OUT]   # default testdata/tiny-gemma4
    python scripts/make_tiny_checkpoint.py --multimodal [OUT]
                                                      # default testdata/tiny-gemma4-mm
    python scripts/make_tiny_checkpoint.py --media [OUT]
                                                      # default testdata/media

Writes what a HuggingFace checkpoint folder holds, so ``mobius build`` and
``mobius run`` can be exercised offline:

- ``model.safetensors`` + ``config.json`` + ``generation_config.json`` from
  ``Gemma4ForCausalLM.save_pretrained`` (transformers 5.24, torch CPU, float32);
- ``tokenizer.json``: a byte-level BPE trained with the ``tokenizers`` library on
  the public-domain text below, exactly ``VOCAB`` ids, with Gemma's special tokens
  as added special tokens at the ids in ``SPECIAL``;
- ``tokenizer_config.json`` naming those tokens, and ``chat_template.jinja``: a Gemma 4
  style chat template (system / user / assistant turns, image and audio parts);
- ``README.md`` saying how it was made.

The architecture exercises the Gemma 4 text features (per-layer embeddings, KV
sharing, double-wide MLP, dual head dim, proportional RoPE, final softcap), and
every constant-initialised tensor is perturbed. The weights are random, so the
generated text is gibberish; that is expected. Deterministic: same versions,
same bytes.

``--multimodal`` writes the same text model inside ``Gemma4ForConditionalGeneration``
with tiny vision and audio towers (:data:`VISION_CONFIG`, :data:`AUDIO_CONFIG`), a
70-soft-token image budget, and a tokenizer whose added special tokens also hold the
image / audio / video begin, placeholder and end strings at the ids ``config.json``
names (:data:`MM_SPECIAL`): onnxruntime-genai builds its media prompts from those
strings (docs/gemma4.md §10). The tower clip bounds (±inf at init) get finite
values that bite. The text-only output is unchanged by this mode.

``--media`` writes the small inputs of image and audio prompts: ``tiny.png`` (192×144
RGB: colour gradients plus seeded noise) and ``tiny.wav`` (1.2 s mono 16 kHz float32:
two tones plus seeded noise; float samples so that every reader sees the same values).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SEED = 20240
VOCAB = 512
SPECIAL = {
    "<pad>": 0,
    "<eos>": 1,
    "<bos>": 2,
    "<unk>": 3,
    "<mask>": 4,
    "<|turn>": 5,
    "<turn|>": 6,
}
"""Gemma's special tokens, renumbered into the tiny vocabulary (real Gemma: <|turn> 105, <turn|> 106)."""

TEXT_CONFIG = {
    "vocab_size": VOCAB,
    "vocab_size_per_layer_input": VOCAB,
    "hidden_size": 64,
    "hidden_size_per_layer_input": 16,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "global_head_dim": 32,
    "layer_types": ["sliding_attention"] * 2
    + ["full_attention"]
    + ["sliding_attention"] * 2
    + ["full_attention"],
    "sliding_window": 16,
    "num_kv_shared_layers": 2,
    "use_double_wide_mlp": True,
    "final_logit_softcapping": 30.0,
    "max_position_embeddings": 4096,
    "initializer_range": 0.05,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "pad_token_id": SPECIAL["<pad>"],
    "eos_token_id": [SPECIAL["<eos>"], SPECIAL["<turn|>"]],
    "bos_token_id": SPECIAL["<bos>"],
}

# Public-domain text (US Declaration of Independence, Lincoln's Gettysburg Address,
# the opening of Austen's "Pride and Prejudice" and Dickens's "A Tale of Two Cities").
CORPUS = """\
When in the Course of human events, it becomes necessary for one people to dissolve the
political bands which have connected them with another, and to assume among the powers of
the earth, the separate and equal station to which the Laws of Nature and of Nature's God
entitle them, a decent respect to the opinions of mankind requires that they should declare
the causes which impel them to the separation.
We hold these truths to be self-evident, that all men are created equal, that they are
endowed by their Creator with certain unalienable Rights, that among these are Life, Liberty
and the pursuit of Happiness.
Four score and seven years ago our fathers brought forth on this continent, a new nation,
conceived in Liberty, and dedicated to the proposition that all men are created equal.
Now we are engaged in a great civil war, testing whether that nation, or any nation so
conceived and so dedicated, can long endure. We are met on a great battle-field of that war.
We have come to dedicate a portion of that field, as a final resting place for those who here
gave their lives that that nation might live. It is altogether fitting and proper that we
should do this.
It is a truth universally acknowledged, that a single man in possession of a good fortune,
must be in want of a wife. However little known the feelings or views of such a man may be on
his first entering a neighbourhood, this truth is so well fixed in the minds of the
surrounding families, that he is considered the rightful property of some one or other of
their daughters.
It was the best of times, it was the worst of times, it was the age of wisdom, it was the age
of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season
of Light, it was the season of Darkness, it was the spring of hope, it was the winter of
despair, we had everything before us, we had nothing before us, we were all going direct to
Heaven, we were all going direct the other way.
Hello, hello! How are you today? The quick brown fox jumps over the lazy dog. 0123456789
"""

MM_SPECIAL = {
    **SPECIAL,
    "<|image>": 7,
    "<|image|>": 8,
    "<image|>": 9,
    "<|audio>": 10,
    "<|audio|>": 11,
    "<audio|>": 12,
    "<|video|>": 13,
}
"""The multimodal checkpoint's special tokens: SPECIAL plus the media strings."""

MM_TOKEN_IDS = {
    "boi_token_id": MM_SPECIAL["<|image>"],
    "image_token_id": MM_SPECIAL["<|image|>"],
    "eoi_token_id": MM_SPECIAL["<image|>"],
    "boa_token_id": MM_SPECIAL["<|audio>"],
    "audio_token_id": MM_SPECIAL["<|audio|>"],
    "eoa_token_id": MM_SPECIAL["<audio|>"],
    "eoa_token_index": MM_SPECIAL["<audio|>"],
    "video_token_id": MM_SPECIAL["<|video|>"],
}
"""config.json's media token ids (HF reads ``eoa_token_index``; the Hub also ships ``eoa_token_id``)."""

MM_TOKEN_NAMES = {
    "boi_token": "<|image>",
    "image_token": "<|image|>",
    "eoi_token": "<image|>",
    "boa_token": "<|audio>",
    "audio_token": "<|audio|>",
    "eoa_token": "<audio|>",
    "video_token": "<|video|>",
}
"""tokenizer_config.json's names for the media strings, as HF's Gemma4Processor reads them."""

VISION_CONFIG = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "global_head_dim": 16,
    "patch_size": 16,
    "pooling_kernel_size": 3,
    "position_embedding_size": 64,
    "default_output_length": 70,
    "standardize": True,
    "use_clipped_linears": True,
    "initializer_range": 0.05,
}
AUDIO_CONFIG = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "subsampling_conv_channels": [128, 16],
    "output_proj_dims": 48,
    "use_clipped_linears": True,
    "initializer_range": 0.05,
}
SOFT_TOKENS_PER_IMAGE = 70
"""The smallest budget HF's Gemma4ImageProcessor allows: short image prompts."""

CHAT_TEMPLATE = r"""{#- Gemma 4 turn layout of the bundled tiny checkpoints (written for mobius):
    <bos>, then per message <|turn>ROLE\n CONTENT <turn|>\n (assistant is "model"),
    then <|turn>model\n when a generation prompt is asked for. CONTENT is a string
    or a list of parts: text (trimmed); image -> <|image|>; audio -> <|audio|>. -#}
{{- bos_token -}}
{%- for message in messages -%}
    {%- if message['role'] not in ['system', 'user', 'assistant'] -%}
        {{- raise_exception("unknown role '" ~ message['role'] ~ "'") -}}
    {%- endif -%}
    {{- '<|turn>' ~ ('model' if message['role'] == 'assistant' else message['role']) ~ '\n' -}}
    {%- if message['content'] is string -%}
        {{- message['content'] | trim -}}
    {%- else -%}
        {%- for part in message['content'] -%}
            {%- if part['type'] == 'image' -%}
                {{- '<|image|>' -}}
            {%- elif part['type'] == 'audio' -%}
                {{- '<|audio|>' -}}
            {%- elif part['type'] == 'text' -%}
                {{- part['text'] | trim -}}
            {%- else -%}
                {{- raise_exception("unknown content part type '" ~ part['type'] ~ "'") -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{- '<turn|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|turn>model\n' -}}
{%- endif -%}
"""
"""``chat_template.jinja``: the Gemma 4 turn layout with system/user/assistant turns and
image/audio content parts (written for mobius; renders what HF's apply_chat_template does)."""


def make_tokenizer(special: dict[str, int] = SPECIAL):
    """A byte-level BPE of exactly VOCAB ids with ``special`` at their fixed ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = sorted(special, key=special.get)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    n = tok.get_vocab_size(with_added_tokens=True)
    if n < VOCAB:  # a short corpus ran out of merges: fill with unused specials
        tok.add_special_tokens([f"<unused{i}>" for i in range(VOCAB - n)])
    for text, idx in special.items():
        assert tok.token_to_id(text) == idx, (text, tok.token_to_id(text), idx)
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB
    return tok


def make_model(out: Path) -> None:
    """Random Gemma4ForCausalLM (seeded, constants perturbed) saved to ``out``."""
    import torch
    from transformers import GenerationConfig
    from transformers.models.gemma4 import Gemma4ForCausalLM, Gemma4TextConfig

    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED + 1)
    model = Gemma4ForCausalLM(Gemma4TextConfig(**TEXT_CONFIG)).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            flat = p.reshape(-1)
            if bool((flat == flat[0]).all()):  # norm weights: ones → 1 + N(0, 0.1)
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))
    model.generation_config = GenerationConfig(
        bos_token_id=SPECIAL["<bos>"],
        eos_token_id=[SPECIAL["<eos>"], SPECIAL["<turn|>"]],
        pad_token_id=SPECIAL["<pad>"],
    )
    model.save_pretrained(out)


def mm_config():
    """The HF ``Gemma4Config`` of the multimodal checkpoint (same text model, tiny towers)."""
    from transformers.models.gemma4 import configuration_gemma4 as c

    return c.Gemma4Config(
        text_config=c.Gemma4TextConfig(**TEXT_CONFIG),
        vision_config=c.Gemma4VisionConfig(**VISION_CONFIG),
        audio_config=c.Gemma4AudioConfig(**AUDIO_CONFIG),
        vision_soft_tokens_per_image=SOFT_TOKENS_PER_IMAGE,
        initializer_range=0.05,
        tie_word_embeddings=True,
        eos_token_id=[SPECIAL["<eos>"], SPECIAL["<turn|>"]],
        **MM_TOKEN_IDS,
    )


def make_mm_model(out: Path) -> None:
    """Random Gemma4ForConditionalGeneration (seeded, constants and clip bounds perturbed)."""
    import torch
    from transformers import GenerationConfig
    from transformers.models.gemma4 import Gemma4ForConditionalGeneration

    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED + 2)
    model = Gemma4ForConditionalGeneration(mm_config()).eval()
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("input_min", "input_max", "output_min", "output_max"):
                lo, hi = (1.5, 2.5) if leaf.startswith("input") else (0.1, 0.3)
                v = float(lo + (hi - lo) * torch.rand((), generator=gen))
                t.fill_(-v if leaf.endswith("min") else v)
        for _, p in model.named_parameters():
            flat = p.reshape(-1)
            if flat.numel() and bool(torch.isfinite(flat).all()) and bool((flat == flat[0]).all()):
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))
    model.generation_config = GenerationConfig(
        bos_token_id=SPECIAL["<bos>"],
        eos_token_id=[SPECIAL["<eos>"], SPECIAL["<turn|>"]],
        pad_token_id=SPECIAL["<pad>"],
    )
    model.save_pretrained(out)


def write_readme(out: Path, files: dict[str, int]) -> None:
    rows = "\n".join(f"| `{name}` | {size:,} |" for name, size in sorted(files.items()))
    specials = ", ".join(f"`{t}` = {i}" for t, i in SPECIAL.items())
    (out / "README.md").write_text(
        f"""# tiny-gemma4: a bundled random Gemma 4 text checkpoint

A `gemma4_text` (`Gemma4ForCausalLM`) checkpoint small enough to commit, so that
`mobius build testdata/tiny-gemma4 out/` and `mobius run out/ --prompt "hello"`
work offline. **The weights are random (seed {SEED}): generated text is gibberish.**

Made with (transformers 5.24, torch CPU, tokenizers; deterministic):

    python scripts/make_tiny_checkpoint.py testdata/tiny-gemma4

Architecture: vocab {VOCAB}, hidden 64, 6 layers (`s,s,f,s,s,f`), 4 heads, 2 KV
heads, head_dim 16 (sliding) / 32 (full, `per_layer_config`), sliding window 16,
per-layer embeddings (16 per layer), last 2 layers share KV, double-wide MLP,
proportional RoPE on full layers, final logit softcap 30. Every tensor HF
initialises to a constant (norm weights, `layer_scalar`) is perturbed.

Tokenizer: byte-level BPE trained with `tokenizers` on public-domain text
(Declaration of Independence, Gettysburg Address, openings of "Pride and
Prejudice" and "A Tale of Two Cities"; inline in the script), exactly {VOCAB}
ids. Special tokens (added, special): {specials}. Stop ids: `<eos>`, `<turn|>`.
`chat_template.jinja` is Gemma 4's turn layout (`<bos><|turn>user\\n…<turn|>\\n<|turn>model\\n`,
system and assistant turns, image and audio content parts), written for mobius.

| file | bytes |
|---|---|
{rows}
""",
        encoding="utf-8",
    )


def write_mm_readme(out: Path, files: dict[str, int]) -> None:
    rows = "\n".join(f"| `{name}` | {size:,} |" for name, size in sorted(files.items()))
    specials = ", ".join(f"`{t}` = {i}" for t, i in MM_SPECIAL.items())
    (out / "README.md").write_text(
        f"""# tiny-gemma4-mm: a bundled random Gemma 4 checkpoint with vision and audio

A `gemma4` (`Gemma4ForConditionalGeneration`) checkpoint small enough to commit, so
that image and audio prompts can be built and run offline (`mobius build`, `mobius
run --image/--audio`, and the onnxruntime-genai check of
`mobius-runtime/tests/genai/check_genai.py`). **The weights are random (seed {SEED}):
generated text is gibberish.**

Made with (transformers 5.24, torch CPU, tokenizers; deterministic):

    python scripts/make_tiny_checkpoint.py --multimodal testdata/tiny-gemma4-mm

Text model: the one of `testdata/tiny-gemma4` (vocab {VOCAB}, hidden 64, 6 layers,
PLE, KV sharing, double-wide MLP, dual head dim, proportional RoPE, softcap 30), with
its own random weights. Vision tower: hidden 32, 2 layers, 2 heads, head_dim 16,
patch 16, pooling 3, position table 64, `standardize` on, clipped linears; at most
{SOFT_TOKENS_PER_IMAGE} soft tokens per image (`vision_soft_tokens_per_image`). Audio
tower: hidden 32, 2 layers, 2 heads, subsampling channels [128, 16], output
projection 48, clipped linears. Every constant-initialised tensor is perturbed and
the clip bounds are finite (inputs ±U(1.5, 2.5), outputs ±U(0.1, 0.3)).

Tokenizer: the byte-level BPE of `tiny-gemma4` (same corpus), exactly {VOCAB} ids,
with added special tokens {specials}. The media strings are special tokens because
onnxruntime-genai builds its image/audio prompts from them; `config.json` names the
same ids (`boi/image/eoi/boa/audio/eoa(_index)/video_token_id`).

| file | bytes |
|---|---|
{rows}
""",
        encoding="utf-8",
    )


def make_media(out: Path) -> None:
    """``tiny.png`` and ``tiny.wav``: seeded synthetic inputs for image / audio prompts."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(SEED)
    h, w = 144, 192
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    rgb = np.stack([255 * x / (w - 1), 255 * y / (h - 1), 128 + 100 * np.sin(x / 9 + y / 13)], -1)
    rgb = np.clip(rgb + rng.normal(0, 20, rgb.shape), 0, 255).astype(np.uint8)
    Image.fromarray(rgb, "RGB").save(out / "tiny.png", optimize=False)
    sr, seconds = 16000, 1.2
    t = np.arange(int(sr * seconds)) / sr
    wave = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 1230 * t)
    wave = (wave + rng.normal(0, 0.05, t.shape)).astype(np.float32)
    write_float_wav(out / "tiny.wav", wave, sr)


def write_float_wav(path: Path, wave, sr: int) -> None:
    """A mono IEEE-float WAV, written by hand: libsndfile adds a time-stamped PEAK chunk."""
    import struct

    data = wave.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, sr, sr * 4, 4, 32)  # format 3 = IEEE float
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(data)) + data
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)


TITLES = {
    "text": "# tiny-gemma4: ",
    "multimodal": "# tiny-gemma4-mm: ",
    "media": "# media: ",
}
"""First words of the README.md in a folder each mode writes (media's is written by hand)."""


def foreign_out(out: Path, title: str) -> str | None:
    """Why this script must not write into ``out`` (None when it may).

    It overwrites files by name, so ``out`` must be new, empty, or a folder it made
    before (its README.md starts with ``title``): never a user's folder.
    """
    if not out.exists():
        return None
    if not out.is_dir():
        return f"{out} exists and is not a folder; pass a new folder"
    if not any(out.iterdir()):
        return None
    readme = out / "README.md"
    try:
        if readme.is_file() and not readme.is_symlink():
            with readme.open(encoding="utf-8") as f:
                if f.read(len(title)) == title:
                    return None
    except (OSError, UnicodeDecodeError):
        pass
    return (
        f"{out} is not empty and not a folder this script wrote (its README.md does not "
        f"start with {title.strip()!r}); pass a new folder, nothing was written"
    )


def perturb_constants(model, seed: int) -> None:
    """Add N(0, 0.1) to every constant-initialised parameter (norm weights, HF's ones or
    Gemma's zeros) of a torch ``model``, from a generator seeded ``seed`` (no grad)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            flat = p.reshape(-1)
            if bool((flat == flat[0]).all()):
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)


def save_random_model(model_cls, config, seed: int, generation: dict, out: Path) -> None:
    """A seeded random ``model_cls(config)`` (constants perturbed, :func:`perturb_constants`
    with ``seed + 1``) with a ``GenerationConfig(**generation)``, saved in bfloat16."""
    import torch
    from transformers import GenerationConfig

    torch.manual_seed(seed)
    model = model_cls(config).eval()
    perturb_constants(model, seed + 1)
    model.generation_config = GenerationConfig(**generation)
    model.to(torch.bfloat16).save_pretrained(out)


def write_text_tokenizer(
    out: Path, special: dict[str, int], tokens: dict[str, str | None], max_len: int, template: str
) -> None:
    """``tokenizer.json`` (:func:`make_tokenizer` of ``special``), ``tokenizer_config.json``
    naming ``tokens`` (bos / eos / pad / unk), and ``chat_template.jinja``."""
    make_tokenizer(special).save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **{f"{k}_token": v for k, v in tokens.items()},
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": max_len,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(template)


def file_rows(out: Path) -> str:
    """The ``| `name` | bytes |`` rows of every file in ``out`` but README.md."""
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.name != "README.md"}
    return "\n".join(f"| `{name}` | {size:,} |" for name, size in files.items())


def run_maker(argv: list[str], default: str, title: str, make) -> int:
    """The ``main`` of a one-folder maker script: refuse a foreign ``out``, then ``make(out)``."""
    out = Path(argv[1] if len(argv) > 1 else default)
    name = Path(argv[0]).stem
    if reason := foreign_out(out, title):
        print(f"{name}: {reason}", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    make(out)
    print(f"wrote {out}")
    return 0


def main(argv: list[str]) -> int:
    if "--media" in argv[1:]:
        args = [a for a in argv[1:] if a != "--media"]
        out = Path(args[0] if args else "testdata/media")
        if reason := foreign_out(out, TITLES["media"]):
            print(f"make_tiny_checkpoint: {reason}", file=sys.stderr)
            return 1
        out.mkdir(parents=True, exist_ok=True)
        make_media(out)
        print(
            f"wrote {out}: " + ", ".join(f"{p.name} {p.stat().st_size:,} B" for p in out.iterdir())
        )
        return 0
    multimodal = "--multimodal" in argv[1:]
    args = [a for a in argv[1:] if a != "--multimodal"]
    default = "testdata/tiny-gemma4-mm" if multimodal else "testdata/tiny-gemma4"
    out = Path(args[0] if args else default)
    if reason := foreign_out(out, TITLES["multimodal" if multimodal else "text"]):
        print(f"make_tiny_checkpoint: {reason}", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    (make_mm_model if multimodal else make_model)(out)
    tok = make_tokenizer(MM_SPECIAL if multimodal else SPECIAL)
    tok.save(str(out / "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": TEXT_CONFIG["max_position_embeddings"],
        "extra_special_tokens": {"sot_token": "<|turn>", "eot_token": "<turn|>"},
    }
    if multimodal:
        tok_cfg["extra_special_tokens"].update(MM_TOKEN_NAMES)
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    files = {p.name: p.stat().st_size for p in out.iterdir() if p.name != "README.md"}
    (write_mm_readme if multimodal else write_readme)(out, files)
    total = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {out} ({total:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
