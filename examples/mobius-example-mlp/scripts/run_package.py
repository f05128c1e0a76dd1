"""Run a built ``tinymlp`` package and check it against numpy on the checkpoint's weights.

    python examples/mobius-example-mlp/scripts/run_package.py PACKAGE [CHECKPOINT]

CHECKPOINT defaults to ``examples/mobius-example-mlp/checkpoint`` (the folder the
package was built from). A ``tinymlp`` package has no tokenizer and no processors, so
it is run through :meth:`mobius_runtime.Pipeline.forward` with its one contract input,
``features``, rather than ``mobius run`` (which generates text). Exits 1 when the
package's logits differ from numpy's by more than 1e-5.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from mobius_runtime import Pipeline

HERE = Path(__file__).resolve().parent


def reference(checkpoint: Path, features: np.ndarray) -> np.ndarray:
    """``fc2(relu(fc1(x)))`` with the checkpoint's ``[out, in]`` weights."""
    w = load_file(str(checkpoint / "model.safetensors"))
    hidden = np.maximum(features @ w["fc1.weight"].T + w["fc1.bias"], 0.0)
    return hidden @ w["fc2.weight"].T + w["fc2.bias"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("package", type=Path)
    ap.add_argument("checkpoint", type=Path, nargs="?", default=HERE.parent / "checkpoint")
    args = ap.parse_args(argv)
    pipeline = Pipeline.load(args.package, device="cpu")
    features = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    logits = pipeline.forward(features=features)["logits"]
    expected = reference(args.checkpoint, features)
    delta = float(np.abs(logits - expected).max())
    print(f"logits {logits.shape}: {np.array2string(logits, precision=4)}")
    print(f"max |logits - numpy| = {delta:.2e}")
    if delta > 1e-5:
        print("run_package: the package disagrees with numpy", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
