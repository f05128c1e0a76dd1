"""onnxruntime-genai agrees with mobius-runtime: 16 greedy tokens, identical ids.

Run in a venv that has onnxruntime-genai (with its own plain onnxruntime) and NOT
onnxruntime-gpu, plus the four mobius distributions (tox env ``genai``)::

    python mobius-runtime/tests/genai/check_genai.py [--out /tmp/genai-check]

Builds the bundled tiny checkpoint(s) under testdata/, then for a text prompt
generates 16 greedy tokens with ``og.Model``/``og.Generator`` on the package
folder and with ``mobius_runtime.Pipeline`` on the same prompt ids, and exits
non-zero when the ids differ. It is a script (not collected by pytest in the
main venv) because the two onnxruntime distributions cannot live together.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CHECKPOINTS = ("tiny-gemma4",)
NEW_TOKENS = 16
PROMPT = "Hello, tell me about the sea."


def genai_ids(package: Path, prompt_ids: list[int]) -> list[int]:
    import onnxruntime_genai as og

    model = og.Model(str(package))
    params = og.GeneratorParams(model)
    params.set_search_options(
        do_sample=False, max_length=len(prompt_ids) + NEW_TOKENS, min_length=0
    )
    generator = og.Generator(model, params)
    generator.append_tokens(prompt_ids)
    out: list[int] = []
    while not generator.is_done() and len(out) < NEW_TOKENS:
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("/tmp/genai-check"))
    args = ap.parse_args()

    import mobius
    from mobius_runtime import Pipeline

    failures = 0
    for name in CHECKPOINTS:
        source = ROOT / "testdata" / name
        if not source.is_dir():
            print(f"skip {name}: {source} does not exist")
            continue
        package = args.out / name
        mobius.build(str(source), str(package), force=True)
        pipeline = Pipeline.load(package, device="cpu")
        prompt_ids = pipeline.generate(prompt=PROMPT, max_new_tokens=1).prompt_ids
        ours = pipeline.generate(input_ids=prompt_ids, max_new_tokens=NEW_TOKENS).ids
        theirs = genai_ids(package, prompt_ids)
        n = min(len(ours), len(theirs))
        same = ours[:n] == theirs[:n] and n > 0 and (len(ours) == len(theirs))
        print(
            f"{name}: mobius {ours}\n{' ' * len(name)}  genai  {theirs}\n  -> {'OK' if same else 'DIFFER'}"
        )
        failures += not same
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
