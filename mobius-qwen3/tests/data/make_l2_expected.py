"""One-off: HF transformers 5.24 parameter counts of the full-size Qwen3 configs (meta device).

Run: python mobius-qwen3/tests/data/make_l2_expected.py
Writes l2_expected.json next to this file; the L2 test never imports torch (a
``reference``-marked test recomputes these counts to keep the file honest).
Count: :func:`mobius_testing.lm_parity.hf_meta_counts` (``sum(p.numel())``, a tied head
counted once, plus each layer's KV geometry ``[num_key_value_heads, head_dim]``).
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
CONFIGS = HERE.parents[2] / "testdata" / "configs"
NAMES = ("Qwen3-0.6B.json", "Qwen3-8B.json", "Qwen3-30B-A3B.json")


def main() -> None:
    from mobius_testing.lm_parity import write_expectations

    write_expectations(CONFIGS, NAMES, HERE / "l2_expected.json")


if __name__ == "__main__":
    main()
