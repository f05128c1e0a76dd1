"""Write the example's tiny ``tinymlp`` checkpoint (seeded: the same bytes on every run).

    python examples/mobius-example-mlp/scripts/make_checkpoint.py OUT [--seed 0]

OUT must not exist yet, or be an empty folder (nothing is overwritten). It gets
``config.json`` and ``model.safetensors`` in the layout PyTorch's ``nn.Linear`` saves
(``weight`` is ``[out, in]``). ``examples/mobius-example-mlp/checkpoint`` was made with
the default seed. Needs numpy and safetensors (the example's ``[scripts]`` extra).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

CONFIG = {"model_type": "tinymlp", "in_features": 4, "hidden_size": 8, "num_labels": 3}


def tensors(seed: int) -> dict[str, np.ndarray]:
    """Random float32 weights and biases, drawn in a fixed order from ``seed``."""
    rng = np.random.default_rng(seed)
    i, h, n = CONFIG["in_features"], CONFIG["hidden_size"], CONFIG["num_labels"]
    return {
        "fc1.weight": rng.standard_normal((h, i)).astype(np.float32),
        "fc1.bias": rng.standard_normal(h).astype(np.float32),
        "fc2.weight": rng.standard_normal((n, h)).astype(np.float32),
        "fc2.bias": rng.standard_normal(n).astype(np.float32),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="folder to create (absent or empty)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = ap.parse_args(argv)
    out: Path = args.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        print(
            f"make_checkpoint: {out} exists and is not an empty folder; choose a new one",
            file=sys.stderr,
        )
        return 1
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n", encoding="utf-8")
    save_file(tensors(args.seed), str(out / "model.safetensors"))
    print(f"wrote {out}/config.json and {out}/model.safetensors (seed {args.seed})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
