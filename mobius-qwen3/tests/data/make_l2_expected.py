"""One-off: HF transformers 5.24 parameter counts of the full-size Qwen3 configs (meta device).

Run: python mobius-qwen3/tests/data/make_l2_expected.py
Writes l2_expected.json next to this file; the L2 test never imports torch (a
``reference``-marked test recomputes these counts to keep the file honest).
Count: ``sum(p.numel() for p in model.parameters())`` (a tied head shares the table,
counted once), plus each layer's KV geometry ``[num_key_value_heads, head_dim]``.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
CONFIGS = HERE.parents[2] / "testdata" / "configs"
NAMES = ("Qwen3-0.6B.json", "Qwen3-8B.json", "Qwen3-30B-A3B.json")


def hf_expectation(name: str) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(CONFIGS / name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {
        "model_type": config.model_type,
        "params": params,
        "cache_geometry": [[config.num_key_value_heads, head_dim]] * config.num_hidden_layers,
    }


def main() -> None:
    out = {name: hf_expectation(name) for name in NAMES}
    (HERE / "l2_expected.json").write_text(json.dumps(out, indent=1) + "\n")
    for name, e in out.items():
        print(f"{name}: {e['params']:,} parameters")


if __name__ == "__main__":
    main()
