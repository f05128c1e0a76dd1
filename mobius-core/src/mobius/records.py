"""Frozen records that cross the plugin boundary.

Hooks return these (never bare dicts) so that core, plugins and the runtime agree
on field names and a typo is an AttributeError, not a silent ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mobius.dtypes import BUILD_DTYPES

DTYPES = tuple(BUILD_DTYPES)
"""Build dtypes accepted by ``mobius build --dtype``."""

TARGETS = ("default", "cpu", "cuda")
LOGITS = ("all", "last")
"""Which positions a decoder's ``logits`` output covers: every one (forward, perplexity,
parity tests) or the last only (generation: the output projection runs on one row)."""
"""Build targets accepted by ``mobius build --target``."""

PORT_DTYPE_OF_BUILD_DTYPE = BUILD_DTYPES
"""The contract port dtype that a build dtype produces for float tensors."""


@dataclass(frozen=True)
class ModelTypeInfo:
    """One model type a plugin serves (answer of ``mobius_model_types``).

    ``model_type`` is the value of ``config.json["model_type"]``; ``tasks`` and
    ``modalities`` are informational (``mobius plugins`` shows them).
    """

    model_type: str
    tasks: tuple[str, ...] = ("text-generation",)
    modalities: tuple[str, ...] = ("text",)
    description: str = ""


QUANT_METHODS = {"int4": 4, "int8": 8}
"""``mobius build --quant`` values and their bit widths."""

BLOCK_SIZES = (16, 32, 64, 128, 256)
"""``--block-size`` values: the ones onnxruntime's MatMulNBits kernels accept (a package
built with 512 or 1024 failed to load; 2^40 ran numpy out of memory while packing)."""


@dataclass(frozen=True)
class QuantOptions:
    """Weight-only block quantization asked of a build (``mobius build --quant``).

    ``accuracy_level`` None means the default for the target (4 on ``cpu``, else 0);
    ``exclude`` holds globs over initializer names kept float (``docs/quantization.md``).
    ``lm_head`` (``"int8"``, ``"int4"`` or ``"float"``; None: like the rest) asks for
    another type for the output projection; core does not know its name, so the family
    maps it onto its tensors in ``mobius_quant_overrides``. ``search`` False: plain
    round-to-nearest scales (onnxruntime's quantizer's choice), about 3x faster to
    quantize than the default per-block scale search, whose RMS weight error is ~0.94x.
    """

    method: str = "int4"
    block_size: int = 32
    symmetric: bool = True
    accuracy_level: int | None = None
    exclude: tuple[str, ...] = ()
    lm_head: str | None = None
    search: bool = True

    def __post_init__(self) -> None:
        if self.method not in QUANT_METHODS:
            raise ValueError(f"quant must be one of {tuple(QUANT_METHODS)}, got {self.method!r}")
        size = self.block_size
        if not isinstance(size, int) or size not in BLOCK_SIZES:
            raise ValueError(
                f"block size must be a power of two from {BLOCK_SIZES[0]} to {BLOCK_SIZES[-1]} "
                f"(what onnxruntime's MatMulNBits kernels accept), got {size!r}"
            )
        level = self.accuracy_level
        if level is not None and level not in range(5):
            raise ValueError(f"accuracy level must be 0..4, got {level!r}")
        if self.lm_head not in (None, "int4", "int8", "float"):
            raise ValueError(f"lm_head must be int4, int8 or float, got {self.lm_head!r}")

    @property
    def bits(self) -> int:
        """Bit width of quantized tensors (4 or 8)."""
        return QUANT_METHODS[self.method]

    def level_for(self, target: str) -> int:
        """The MatMulNBits ``accuracy_level`` for ``target``."""
        if self.accuracy_level is not None:
            return self.accuracy_level
        return 4 if target == "cpu" else 0


@dataclass(frozen=True)
class BuildOptions:
    """What the user asked of a build; passed to every per-model hook.

    ``quant`` is None for a float package (see :class:`QuantOptions`). ``logits``: one of
    :data:`LOGITS` (families built on :mod:`mobius.lm` honour ``"last"``).
    """

    dtype: str = "f32"
    target: str = "default"
    quant: QuantOptions | None = None
    logits: str = "all"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {self.target!r}")
        if self.logits not in LOGITS:
            raise ValueError(f"logits must be one of {LOGITS}, got {self.logits!r}")

    @property
    def port_dtype(self) -> str:
        """Contract dtype name of float tensors in this build (``float32`` …)."""
        return PORT_DTYPE_OF_BUILD_DTYPE[self.dtype]


@dataclass(frozen=True)
class RuntimeFile:
    """A file a plugin adds to the package beside the graphs.

    Exactly one of ``content`` (bytes written as-is) or ``source`` (a file copied)
    is set. ``path`` is relative to the package root and may not leave it.
    """

    path: str
    content: bytes | None = None
    source: Path | None = None

    def __post_init__(self) -> None:
        if (self.content is None) == (self.source is None):
            raise ValueError("RuntimeFile needs exactly one of content or source")
        p = Path(self.path)
        if p.is_absolute() or ".." in p.parts:
            raise ValueError(f"RuntimeFile path must stay inside the package: {self.path!r}")


@dataclass(frozen=True)
class Processors:
    """A family's preprocessing, all in numpy (answer of ``mobius_processors``).

    The runtime calls these; it never knows a family's token ids or image sizes.

    - ``format_prompt(text, images, audio)``: the chat-formatted prompt text for a
      user message with that many images and audio clips (placeholders included
      but not yet expanded), or ``None`` for base models that take raw text.
    - ``preprocess_image(images)`` / ``preprocess_audio(clips)``: arrays keyed by
      contract port name (e.g. ``pixel_values``), plus ``num_soft_tokens``: a list
      with one soft-token count per item.
    - ``expand_prompt(text, image_tokens, audio_tokens)``: the prompt with each
      media placeholder expanded to its soft-token count.
    - ``stop_token_ids``: ids that end generation; ``bos_token_id``: prepended
      by the tokenizer step when the formatted prompt does not contain it.
    - ``extra``: read by nothing. Accepted only so that plugins built against core
      0.1.0 – 0.1.3 (mobius-gemma4 0.1.0 sets it) still load; removed in 0.2.
    """

    format_prompt: Callable[[str, int, int], str] | None = None
    preprocess_image: Callable[[Sequence[Any]], Mapping[str, Any]] | None = None
    preprocess_audio: Callable[[Sequence[Any]], Mapping[str, Any]] | None = None
    expand_prompt: Callable[[str, Sequence[int], Sequence[int]], str] | None = None
    stop_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GGUFTensor:
    """Where one tensor of a GGUF file goes: its HF weight name and the transforms that undo
    llama.cpp's conversion (``mobius.checkpoint.gguf.unpermute_rows`` …), applied in order
    to the dequantized values."""

    name: str
    transforms: tuple[Any, ...] = ()


@dataclass(frozen=True)
class GGUFTranslation:
    """A family's reading of a GGUF file (answer of ``mobius_gguf_translation``).

    ``config`` is the HF-style ``config.json`` object the file describes (``model_type``
    included); ``tensors`` maps every GGUF tensor name of the file to its HF weight name,
    a :class:`GGUFTensor` (name and transforms), or ``None`` for a tensor the family does
    not use (llama.cpp's precomputed ``rope_freqs``, say). A tensor of the file that is
    missing from ``tensors`` is refused as unknown.
    """

    config: Mapping[str, Any]
    tensors: Mapping[str, str | GGUFTensor | None]


@dataclass(frozen=True)
class GGUFCompanion:
    """A companion GGUF file of a model (llama.cpp's ``mmproj`` file: its vision / audio
    encoders), as ``mobius_gguf_companion_translation`` sees it.

    ``metadata`` holds every key of the companion (``general.architecture`` is ``clip``
    for llama.cpp's files), ``tensors`` every tensor name with its shape in numpy order;
    ``file`` is the companion's path (for messages).
    """

    file: str
    metadata: Mapping[str, Any]
    tensors: Mapping[str, tuple[int, ...]]
