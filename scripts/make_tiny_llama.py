"""Make testdata/tiny-llama: a seeded random Llama checkpoint small enough to commit.

    python scripts/make_tiny_llama.py [OUT]   # default testdata/tiny-llama

Writes what a HuggingFace Llama checkpoint folder holds (SmolLM2's layout: a ChatML
template, ``<|im_end|>`` ends a turn), so that ``mobius build`` / ``mobius run`` and the
onnxruntime-genai check (``tox -e genai``) work offline:

- ``model.safetensors`` (bfloat16) + ``config.json`` + ``generation_config.json`` from
  ``LlamaForCausalLM.save_pretrained`` (transformers 5.24, torch CPU): GQA (4 heads on 2
  KV heads), an untied head, ``attention_bias``, and ``llama3`` rope scaling (what the
  Llama 3.x checkpoints use), so the package exercises each of these;
- ``tokenizer.json``, ``tokenizer_config.json`` and ``chat_template.jinja``: the
  byte-level BPE of ``make_tiny_checkpoint.make_tokenizer`` (512 ids) with the special
  tokens of :data:`SPECIAL`, and a ChatML template;
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
from make_tiny_qwen3 import CHAT_TEMPLATE  # ChatML, as SmolLM2's template renders it

SEED = 2718
SPECIAL = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<unk>": 3}
"""SmolLM2's special tokens in the tiny vocabulary."""

CONFIG = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "rope_theta": 500_000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
    "attention_bias": True,
    "tie_word_embeddings": False,
    "initializer_range": 0.2,
    "bos_token_id": SPECIAL["<|im_start|>"],
    "eos_token_id": SPECIAL["<|im_end|>"],
    "pad_token_id": SPECIAL["<|endoftext|>"],
}


def make_model(out: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    generation = {
        "bos_token_id": SPECIAL["<|im_start|>"],
        "eos_token_id": [SPECIAL["<|im_end|>"], SPECIAL["<|endoftext|>"]],
        "pad_token_id": SPECIAL["<|endoftext|>"],
    }
    save_random_model(LlamaForCausalLM, LlamaConfig(**CONFIG), SEED, generation, out)


def write_readme(out: Path) -> None:
    rows = file_rows(out)
    specials = ", ".join(f"`{t}` = {i}" for t, i in SPECIAL.items())
    (out / "README.md").write_text(
        f"""# tiny-llama: a bundled random Llama checkpoint

A `llama` (`LlamaForCausalLM`) checkpoint small enough to commit, so that
`mobius build testdata/tiny-llama out/` and `mobius run out/ --prompt "hello"` work
offline and `tox -e genai` checks onnxruntime-genai on a Llama package.
**The weights are random (seed {SEED}): generated text is gibberish.**

Made with (transformers 5.24, torch CPU, tokenizers; deterministic):

    python scripts/make_tiny_llama.py testdata/tiny-llama

Architecture: vocab {VOCAB}, hidden 64, 3 layers, 4 heads on 2 KV heads, head_dim 16,
q/k/v/o biases, an untied head, RoPE θ 5e5 with `llama3` scaling (factor 8, original
context 256), bfloat16 weights. Norm weights are perturbed (HF initialises them to ones).

Tokenizer: the byte-level BPE of `scripts/make_tiny_checkpoint.py` (public-domain
corpus), exactly {VOCAB} ids; special tokens: {specials}. Stop ids: `<|im_end|>`,
`<|endoftext|>`. `chat_template.jinja` is the ChatML layout of SmolLM2
(`<|im_start|>user\\n…<|im_end|>\\n<|im_start|>assistant\\n`).

| file | bytes |
|---|---|
{rows}
""",
        encoding="utf-8",
    )


def make(out: Path) -> None:
    make_model(out)
    tokens = {"bos": "<|im_start|>", "eos": "<|im_end|>", "pad": "<|endoftext|>", "unk": "<unk>"}
    write_text_tokenizer(out, SPECIAL, tokens, CONFIG["max_position_embeddings"], CHAT_TEMPLATE)
    write_readme(out)


def main(argv: list[str]) -> int:
    return run_maker(argv, "testdata/tiny-llama", "# tiny-llama: ", make)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
