"""Make testdata/tiny-gemma4: a seeded, random, ~1 MB Gemma 4 text checkpoint.

    /work/venv/bin/python scripts/make_tiny_checkpoint.py [OUT]   # default testdata/tiny-gemma4

Writes what a HuggingFace checkpoint folder holds, so ``mobius build`` and
``mobius run`` can be exercised offline:

- ``model.safetensors`` + ``config.json`` + ``generation_config.json`` from
  ``Gemma4ForCausalLM.save_pretrained`` (transformers 5.24, torch CPU, float32);
- ``tokenizer.json``: a byte-level BPE trained with the ``tokenizers`` library on
  the public-domain text below, exactly ``VOCAB`` ids, with Gemma's special tokens
  as added special tokens at the ids in ``SPECIAL``;
- ``tokenizer_config.json`` naming those tokens and a minimal Gemma-style chat template;
- ``README.md`` saying how it was made.

The architecture exercises the Gemma 4 text features (per-layer embeddings, KV
sharing, double-wide MLP, dual head dim, proportional RoPE, final softcap), and
every constant-initialised tensor is perturbed. The weights are random, so the
generated text is gibberish; that is expected. Deterministic: same versions,
same bytes.
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

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{{ message['content'] | trim }}<turn|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)


def make_tokenizer():
    """A byte-level BPE of exactly VOCAB ids with SPECIAL at their fixed ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = sorted(SPECIAL, key=SPECIAL.get)
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
    for text, idx in SPECIAL.items():
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


def write_readme(out: Path, files: dict[str, int]) -> None:
    rows = "\n".join(f"| `{name}` | {size:,} |" for name, size in sorted(files.items()))
    specials = ", ".join(f"`{t}` = {i}" for t, i in SPECIAL.items())
    (out / "README.md").write_text(
        f"""# tiny-gemma4: a bundled random Gemma 4 text checkpoint

A `gemma4_text` (`Gemma4ForCausalLM`) checkpoint small enough to commit, so that
`mobius build testdata/tiny-gemma4 out/` and `mobius run out/ --prompt "hello"`
work offline. **The weights are random (seed {SEED}): generated text is gibberish.**

Made with (transformers 5.24, torch CPU, tokenizers; deterministic):

    /work/venv/bin/python scripts/make_tiny_checkpoint.py testdata/tiny-gemma4

Architecture: vocab {VOCAB}, hidden 64, 6 layers (`s,s,f,s,s,f`), 4 heads, 2 KV
heads, head_dim 16 (sliding) / 32 (full, `per_layer_config`), sliding window 16,
per-layer embeddings (16 per layer), last 2 layers share KV, double-wide MLP,
proportional RoPE on full layers, final logit softcap 30. Every tensor HF
initialises to a constant (norm weights, `layer_scalar`) is perturbed.

Tokenizer: byte-level BPE trained with `tokenizers` on public-domain text
(Declaration of Independence, Gettysburg Address, openings of "Pride and
Prejudice" and "A Tale of Two Cities"; inline in the script), exactly {VOCAB}
ids. Special tokens (added, special): {specials}. Stop ids: `<eos>`, `<turn|>`.
The chat template is Gemma's turn layout (`<bos><|turn>user\\n…<turn|>\\n<|turn>model\\n`).

| file | bytes |
|---|---|
{rows}
""",
        encoding="utf-8",
    )


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else "testdata/tiny-gemma4")
    out.mkdir(parents=True, exist_ok=True)
    make_model(out)
    tok = make_tokenizer()
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
        "chat_template": CHAT_TEMPLATE,
        "extra_special_tokens": {"sot_token": "<|turn>", "eot_token": "<turn|>"},
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    files = {p.name: p.stat().st_size for p in out.iterdir() if p.name != "README.md"}
    write_readme(out, files)
    total = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {out} ({total:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
