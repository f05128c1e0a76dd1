"""Make testdata/tiny-gemma3: a seeded random Gemma 3 text checkpoint small enough to commit.

    python scripts/make_tiny_gemma3.py [OUT]   # default testdata/tiny-gemma3

Writes what a HuggingFace ``gemma3_text`` checkpoint folder holds, so ``mobius build`` /
``mobius run`` and the onnxruntime-genai check work offline:

- ``model.safetensors`` (bfloat16, as released Gemma 3 checkpoints) + ``config.json`` +
  ``generation_config.json`` from ``Gemma3ForCausalLM.save_pretrained`` (transformers
  5.24, torch CPU): 6 layers, every third one global, a sliding window of 8;
- ``tokenizer.json``: the byte-level BPE of ``make_tiny_checkpoint.make_tokenizer`` (same
  public-domain corpus, 512 ids) with Gemma 3's special tokens renumbered into the tiny
  vocabulary (:data:`SPECIAL`);
- ``tokenizer_config.json`` and ``chat_template.jinja``: Gemma 3's turn layout
  (``<bos><start_of_turn>user\\n{content}<end_of_turn>\\n`` per message, then
  ``<start_of_turn>model\\n``; HF's template writes the assistant role as ``model``);
- ``README.md`` saying how it was made.

Every norm weight (HF initialises Gemma's ``1 + w`` norms to zeros) is perturbed.
Deterministic: same versions, same bytes. The weights are random: text is gibberish.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from make_tiny_checkpoint import (
    VOCAB,
    file_rows,
    run_maker,
    save_random_model,
    write_text_tokenizer,
)

SEED = 4242
SPECIAL = {
    "<pad>": 0,
    "<eos>": 1,
    "<bos>": 2,
    "<unk>": 3,
    "<start_of_turn>": 4,
    "<end_of_turn>": 5,
}
"""Gemma 3's special tokens in the tiny vocabulary (real Gemma 3: <start_of_turn> 105,
<end_of_turn> 106)."""

CONFIG = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "sliding_window": 8,
    "sliding_window_pattern": 3,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "query_pre_attn_scalar": 16,
    "tie_word_embeddings": False,
    "initializer_range": 0.2,
    "bos_token_id": SPECIAL["<bos>"],
    "eos_token_id": [SPECIAL["<eos>"], SPECIAL["<end_of_turn>"]],
    "pad_token_id": SPECIAL["<pad>"],
}

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n{{ message['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def make_model(out: Path) -> None:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    generation = {
        "bos_token_id": SPECIAL["<bos>"],
        "eos_token_id": [SPECIAL["<eos>"], SPECIAL["<end_of_turn>"]],
        "pad_token_id": SPECIAL["<pad>"],
    }
    save_random_model(Gemma3ForCausalLM, Gemma3TextConfig(**CONFIG), SEED, generation, out)


def write_tokenizer(out: Path) -> None:
    tokens = {"bos": "<bos>", "eos": "<eos>", "pad": "<pad>", "unk": "<unk>"}
    write_text_tokenizer(out, SPECIAL, tokens, CONFIG["max_position_embeddings"], CHAT_TEMPLATE)


def write_readme(out: Path) -> None:
    rows = file_rows(out)
    specials = ", ".join(f"`{t}` = {i}" for t, i in SPECIAL.items())
    (out / "README.md").write_text(
        f"""# tiny-gemma3: a bundled random Gemma 3 text checkpoint

A `gemma3_text` (`Gemma3ForCausalLM`) checkpoint small enough to commit, so that
`mobius build testdata/tiny-gemma3 out/` and `mobius run out/ --prompt "hello"` work
offline. **The weights are random (seed {SEED}): generated text is gibberish.**

Made with (transformers 5.24, torch CPU, tokenizers; deterministic):

    python scripts/make_tiny_gemma3.py testdata/tiny-gemma3

Architecture: vocab {VOCAB}, hidden 64, 6 layers (sliding, sliding, full, …: every
third layer global), sliding window 8, 4 heads on 1 KV head, head_dim 16 with q/k
RMSNorm, sandwich norms, an untied head (tied, the scaled embedding makes a random
model repeat its last token), RoPE θ 1e6 (global) / 1e4 (local),
`query_pre_attn_scalar` 16, bfloat16 weights. Norm weights are perturbed (HF
initialises Gemma's `1 + w` norms to zeros).

Tokenizer: the byte-level BPE of `scripts/make_tiny_checkpoint.py` (public-domain
corpus), exactly {VOCAB} ids; special tokens: {specials}. Stop ids: `<eos>`,
`<end_of_turn>`. `chat_template.jinja` is Gemma 3's turn layout
(`<bos><start_of_turn>user\\n…<end_of_turn>\\n<start_of_turn>model\\n`).

| file | bytes |
|---|---|
{rows}
""",
        encoding="utf-8",
    )


def make(out: Path) -> None:
    make_model(out)
    write_tokenizer(out)
    write_readme(out)


def main(argv: list[str]) -> int:
    return run_maker(argv, "testdata/tiny-gemma3", "# tiny-gemma3: ", make)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
