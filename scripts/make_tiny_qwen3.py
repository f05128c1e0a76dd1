"""Make testdata/tiny-qwen3: a seeded random Qwen3 checkpoint small enough to commit.

    python scripts/make_tiny_qwen3.py [OUT]   # default testdata/tiny-qwen3

Writes what a HuggingFace Qwen3 checkpoint folder holds, so ``mobius build`` /
``mobius run`` and the onnxruntime-genai check work offline:

- ``model.safetensors`` (bfloat16, as released Qwen3 checkpoints) + ``config.json`` +
  ``generation_config.json`` from ``Qwen3ForCausalLM.save_pretrained`` (transformers
  5.24, torch CPU);
- ``tokenizer.json``: the byte-level BPE of ``make_tiny_checkpoint.make_tokenizer``
  (same public-domain corpus, 512 ids) with Qwen3's ChatML special tokens renumbered
  into the tiny vocabulary (:data:`SPECIAL`);
- ``tokenizer_config.json`` naming those tokens, and ``chat_template.jinja``: a ChatML
  template (``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then
  ``<|im_start|>assistant\\n``), which is what Qwen3's own template renders for plain
  user / assistant turns in its default thinking mode;
- ``README.md`` saying how it was made.

Every norm weight (HF initialises them to ones) is perturbed. Deterministic: same
versions, same bytes. The weights are random: generated text is gibberish.
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

SEED = 31337
SPECIAL = {
    "<|endoftext|>": 0,
    "<|im_start|>": 1,
    "<|im_end|>": 2,
    "<unk>": 3,
    "<think>": 4,
    "</think>": 5,
}
"""Qwen3's special tokens in the tiny vocabulary (real Qwen3: 151643, 151644, 151645)."""

CONFIG = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True,
    "initializer_range": 0.2,
    "bos_token_id": SPECIAL["<|endoftext|>"],
    "eos_token_id": SPECIAL["<|im_end|>"],
    "pad_token_id": SPECIAL["<|endoftext|>"],
}

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_model(out: Path) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    generation = {
        "bos_token_id": SPECIAL["<|endoftext|>"],
        "eos_token_id": [SPECIAL["<|im_end|>"], SPECIAL["<|endoftext|>"]],
        "pad_token_id": SPECIAL["<|endoftext|>"],
    }
    save_random_model(Qwen3ForCausalLM, Qwen3Config(**CONFIG), SEED, generation, out)


def write_tokenizer(out: Path) -> None:
    tokens = {"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>", "unk": "<unk>"}
    write_text_tokenizer(out, SPECIAL, tokens, CONFIG["max_position_embeddings"], CHAT_TEMPLATE)


def write_readme(out: Path) -> None:
    rows = file_rows(out)
    specials = ", ".join(f"`{t}` = {i}" for t, i in SPECIAL.items())
    (out / "README.md").write_text(
        f"""# tiny-qwen3: a bundled random Qwen3 checkpoint

A `qwen3` (`Qwen3ForCausalLM`) checkpoint small enough to commit, so that
`mobius build testdata/tiny-qwen3 out/` and `mobius run out/ --prompt "hello"` work
offline. **The weights are random (seed {SEED}): generated text is gibberish.**

Made with (transformers 5.24, torch CPU, tokenizers; deterministic):

    python scripts/make_tiny_qwen3.py testdata/tiny-qwen3

Architecture: vocab {VOCAB}, hidden 64, 3 layers, 4 heads on 2 KV heads, head_dim 16
with q/k RMSNorm, tied embeddings, RoPE θ 1e6, bfloat16 weights. Norm weights are
perturbed (HF initialises them to ones).

Tokenizer: the byte-level BPE of `scripts/make_tiny_checkpoint.py` (public-domain
corpus), exactly {VOCAB} ids; special tokens: {specials}. Stop ids: `<|im_end|>`,
`<|endoftext|>`. `chat_template.jinja` is the ChatML layout
(`<|im_start|>user\\n…<|im_end|>\\n<|im_start|>assistant\\n`).

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
    return run_maker(argv, "testdata/tiny-qwen3", "# tiny-qwen3: ", make)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
