"""Write ``testdata/tiny-gemma4-unified``: the seeded tiny ``gemma4_unified`` checkpoint.

The model is the one mobius-gemma4's L3 unified parity test builds
(``mobius-gemma4/tests/reference/unified.py``: ``make_unified_checkpoint``, seed 0,
``save_pretrained`` with transformers 5.24 and torch CPU); the tokenizer files and
chat template are those of ``testdata/tiny-gemma4`` (text only: the model's media
token ids, 1000 and up, are outside that 512-id vocabulary, so this fixture serves
text prompts). It exists so that the onnxruntime-genai check
(``mobius-runtime/tests/genai/check_genai.py``), whose venv has no torch, can build a
``gemma4_unified`` package.

Usage: python scripts/make_tiny_unified_checkpoint.py [OUT]   (needs torch + transformers)
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = ROOT / "testdata" / "tiny-gemma4"
COPIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else ROOT / "testdata" / "tiny-gemma4-unified"
    if out.exists() and any(out.iterdir()):
        print(f"{out} is not empty; pass a new folder", file=sys.stderr)
        return 1
    sys.path.insert(0, str(ROOT / "mobius-gemma4" / "tests"))
    from reference.unified import make_unified_checkpoint

    out.mkdir(parents=True, exist_ok=True)
    make_unified_checkpoint(out, seed=0)
    for name in COPIED:
        shutil.copyfile(TEXT / name, out / name)
    rows = "\n".join(
        f"| `{p.name}` | {p.stat().st_size:,} |" for p in sorted(out.iterdir()) if p.is_file()
    )
    (out / "README.md").write_text(
        f"""# tiny-gemma4-unified: a bundled random `gemma4_unified` checkpoint

The seeded tiny `Gemma4UnifiedForConditionalGeneration` of mobius-gemma4's L3 parity
test (`mobius-gemma4/tests/reference/unified.py`, seed 0; k_eq_v text, sliding
window 8, 48-px patch embedder, 640-sample audio embedder), saved with transformers
5.24 / torch CPU. **The weights are random: generated text is gibberish.**

Made with:

    python scripts/make_tiny_unified_checkpoint.py testdata/tiny-gemma4-unified

Tokenizer files and chat template: copied from `testdata/tiny-gemma4` (512 ids). The
model's media token ids (1000 and up) are outside that vocabulary, so this fixture is
for text prompts: it lets the onnxruntime-genai check build a `gemma4_unified`
package without torch.

| file | bytes |
|---|---|
{rows}
"""
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
