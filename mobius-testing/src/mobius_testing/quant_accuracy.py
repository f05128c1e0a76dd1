"""Accuracy of a quantized package against its float package and onnxruntime's quantizer.

The figure the quantization docs promise (``docs/quantization.md``): the logits
RMSE over all positions of our int4 package against the f32 package of the same
checkpoint, next to the RMSE of the f32 package quantized by onnxruntime's own
``MatMulNBitsQuantizer`` (round-to-nearest, the default config, same bits / block /
symmetry) on the same op types, plus top-1 agreement of each with the f32 package.
onnxruntime's quantizer is applied as a ``Pipeline.load(graph_transform=...)`` so
both quantized models run through the same runtime code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


def ort_quantizer(
    *,
    bits: int = 4,
    block_size: int = 32,
    symmetric: bool = True,
    op_types: Sequence[str] = ("MatMul",),
    accuracy_level: int | None = None,
    exclude_initializers: Sequence[str] = (),
) -> Callable[[Any], Any]:
    """A graph transform quantizing a model with onnxruntime's MatMulNBitsQuantizer (RTN).

    ``exclude_initializers`` keeps the nodes reading those initializers float.
    """

    def transform(model: Any) -> Any:
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            MatMulNBitsQuantizer,
        )

        skip = [
            n.name
            for n in model.graph.node
            if any(i in exclude_initializers for i in n.input) and n.name
        ]
        axes = tuple((op, 1 if op == "Gather" else 0) for op in op_types)
        config = DefaultWeightOnlyQuantConfig(
            block_size=block_size,
            is_symmetric=symmetric,
            accuracy_level=accuracy_level,
            op_types_to_quantize=tuple(op_types),
            quant_axes=axes,
            bits=bits,
        )
        quantizer = MatMulNBitsQuantizer(
            model,
            bits=bits,
            block_size=block_size,
            is_symmetric=symmetric,
            accuracy_level=accuracy_level,
            nodes_to_exclude=skip,
            op_types_to_quantize=tuple(op_types),
            quant_axes=axes,
            algo_config=config,
        )
        quantizer.process()
        return quantizer.model.model

    return transform


def prompt_logits(
    package: Path, ids: Sequence[int], transform: Callable[[Any], Any] | None = None
) -> np.ndarray:
    """float32 logits ``[positions, vocab]`` of one prefill over ``ids``."""
    from mobius_runtime import Pipeline

    pipeline = Pipeline.load(package, device="cpu", graph_transform=transform)
    logits = pipeline.forward(input_ids=np.asarray([list(ids)], dtype=np.int64))["logits"]
    return np.asarray(logits, dtype=np.float32)[0]


@dataclass(frozen=True)
class Accuracy:
    """Logits error of two quantized variants against the float reference."""

    rmse_ours: float
    rmse_ort: float
    top1_ours: float
    top1_ort: float

    @property
    def ratio(self) -> float:
        """Our RMSE over onnxruntime's (below 1: more accurate)."""
        return self.rmse_ours / self.rmse_ort if self.rmse_ort else float("inf")

    def line(self) -> str:
        return (
            f"logits RMSE ours {self.rmse_ours:.5f} vs onnxruntime RTN {self.rmse_ort:.5f} "
            f"(ratio {self.ratio:.3f}); top-1 agreement ours {self.top1_ours:.1%}, "
            f"onnxruntime {self.top1_ort:.1%}"
        )


def compare(
    float_package: Path,
    quant_package: Path,
    ids: Sequence[int],
    ort_transform: Callable[[Any], Any],
) -> Accuracy:
    """RMSE / top-1 of ``quant_package`` and of ``ort_transform(float_package)``."""
    ref = prompt_logits(float_package, ids)
    ours = prompt_logits(quant_package, ids)
    theirs = prompt_logits(float_package, ids, ort_transform)
    top = ref.argmax(-1)
    return Accuracy(
        rmse_ours=float(np.sqrt(np.mean((ours - ref) ** 2))),
        rmse_ort=float(np.sqrt(np.mean((theirs - ref) ** 2))),
        top1_ours=float(np.mean(ours.argmax(-1) == top)),
        top1_ort=float(np.mean(theirs.argmax(-1) == top)),
    )
