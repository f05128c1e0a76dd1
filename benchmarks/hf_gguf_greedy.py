"""Greedy ids of HF transformers' own GGUF loader on a GGUF file: the real-weights reference.

``python benchmarks/hf_gguf_greedy.py FILE.gguf --ids 1,2,3 --new 64``, run with the python
of a venv that has torch, transformers, gguf and accelerate (never this repository's
environments: building and running mobius imports no torch). transformers dequantizes
every tensor of the file to float32 (``from_pretrained(folder, gguf_file=NAME)``), so
this is the float model the file's bits stand for, with float activations. It feeds the
prompt ids, then one id per step through its KV cache, the next id the argmax of the last
logits row, and prints one JSON object on its last stdout line: ``{"ids": [...],
"margins": [...]}`` (the top-2 logit margin at each step) and the versions.

``benchmarks/llamacpp.py --hf-python PY`` runs it and says, where ours and llama.cpp part,
which of the two the reference chose. Memory: the float32 model (4 bytes a weight;
about 1.1 GiB for a 270 M model).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# this folder holds a profile.py, which would shadow the standard library's ``profile``
# that torch imports: drop the script's own folder from the import path
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--ids", required=True, help="comma-separated prompt ids (BOS included)")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(args.gguf.parent), gguf_file=args.gguf.name, dtype=torch.float32
    )
    model.eval()
    prompt = [int(x) for x in args.ids.split(",")]
    ids: list[int] = []
    margins: list[float] = []
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        while True:
            top = torch.topk(out.logits[0, -1].float(), 2)
            ids.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            if len(ids) == args.new:
                break
            step = torch.tensor([[ids[-1]]])
            out = model(step, past_key_values=out.past_key_values, use_cache=True)
    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    print(json.dumps({"ids": ids, "margins": margins, "versions": versions}))


if __name__ == "__main__":
    main()
