"""One-off: HF transformers 5.24 parameter counts of the full-size Llama / Mistral configs.

Run: python mobius-llama/tests/data/make_l2_expected.py
Writes l2_expected.json next to this file (counts on the meta device,
:func:`mobius_testing.lm_parity.hf_meta_counts`); the L2 test never imports torch, and a
``reference``-marked test recomputes these counts to keep the file honest.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
CONFIGS = HERE.parents[2] / "testdata" / "configs"
NAMES = ("Llama-3.2-1B.json", "Llama-3.1-8B.json", "Mistral-7B-v0.3.json")


def main() -> None:
    from mobius_testing.lm_parity import write_expectations

    write_expectations(CONFIGS, NAMES, HERE / "l2_expected.json")


if __name__ == "__main__":
    main()
