"""mobius: build HuggingFace checkpoints into ready-to-run ONNX model packages.

The public surface is small: :func:`build`, :data:`hookimpl` for plugins, and the
records and errors that cross the plugin boundary. Everything heavy (onnx,
onnxscript) is imported lazily so that ``import mobius`` and ``mobius --help``
stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mobius.hookspecs import HOOK_API_VERSION, hookimpl

__version__ = "0.1.9.dev0"

__all__ = ["HOOK_API_VERSION", "__version__", "build", "hookimpl"]

if TYPE_CHECKING:
    from mobius.builder import BuildResult


def build(
    source: str,
    out: str,
    *,
    dtype: str | None = None,
    target: str = "default",
    revision: str | None = None,
    force: bool = False,
    quant: Any = None,
    **kwargs: Any,
) -> BuildResult:
    """Build ``source`` (a folder, a GGUF file or Hub id) into a model package at ``out``.

    ``dtype`` None: ``f32``, and a GGUF file keeps its own quantization, as ``mobius
    build`` without ``--dtype`` does; a ``dtype`` given dequantizes it.
    ``quant``: ``"int4"``, ``"int8"`` or a :class:`mobius.records.QuantOptions` for a
    weight-only quantized package (``docs/quantization.md``). See
    :func:`mobius.builder.build` for the other arguments.
    """
    from mobius.builder import build as _build

    return _build(
        source, out, dtype=dtype, target=target, revision=revision, force=force, quant=quant,
        **kwargs,
    )  # fmt: skip
