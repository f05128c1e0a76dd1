"""Prompt text and media → the caller inputs of a contract, and ids → text.

The runtime knows no family's token ids or image sizes: the family plugin's
:class:`mobius.records.Processors` (via ``mobius_processors``) formats the chat
prompt, preprocesses images and audio, expands media placeholders, and names the
BOS and stop ids. The plugin needs the family's typed config, read from the
package's copy of ``config.json`` (``mobius.json["config"]`` or the file
``config.json`` beside it). A package whose family plugin is not installed can
still run from raw text and ids; only media then fail, with a clear error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mobius.errors import ConfigError, PackageError
from mobius.records import Processors
from mobius_runtime.errors import RequestError

TOKENIZER_FILE = "tokenizer.json"


def raw_config(root: Path, manifest: dict) -> dict | None:
    """The package's config.json contents, if it carries one."""
    embedded = manifest.get("config")
    if isinstance(embedded, dict):
        return embedded
    path = root / "config.json"
    if path.is_file():
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PackageError(
                f"config.json in the package is not readable JSON: {exc}",
                where=str(path),
                fix="rebuild the package with `mobius build`",
            ) from exc
    return None


def load_processors(root: Path, manifest: dict, host: Any | None) -> tuple[Processors, bool]:
    """(the family's processors, True) or (plain ``Processors()``, False) when unavailable."""
    model_type = manifest.get("model_type")
    config = raw_config(root, manifest)
    if not model_type or config is None:
        return Processors(), False
    if host is None:
        from mobius.plugins import PluginHost

        host = PluginHost.load()
    try:
        host.owner(model_type)
    except ConfigError:
        return Processors(), False
    typed = host.read_config(model_type, config)
    return host.processors(model_type, typed), True


def context_length(root: Path, manifest: dict) -> int | None:
    """The model's maximum positions: manifest first, then genai_config.json."""
    for key in ("context_length", "max_position_embeddings"):
        value = manifest.get(key)
        if isinstance(value, int) and value > 0:
            return value
    config = manifest.get("config")
    if isinstance(config, dict):
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        value = text.get("max_position_embeddings")
        if isinstance(value, int) and value > 0:
            return value
    genai = root / "genai_config.json"
    if genai.is_file():
        try:
            value = json.loads(genai.read_text(encoding="utf-8"))["model"]["context_length"]
            if isinstance(value, int) and value > 0:
                return value
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return None


class TextSide:
    """Tokenizer + processors of one package, loaded on first use."""

    def __init__(self, root: Path, manifest: dict, host: Any | None) -> None:
        self.root = root
        self.manifest = manifest
        self._host = host
        self._tokenizer: Any = None
        self._processors: tuple[Processors, bool] | None = None

    @property
    def processors(self) -> Processors:
        if self._processors is None:
            self._processors = load_processors(self.root, self.manifest, self._host)
        return self._processors[0]

    @property
    def has_family(self) -> bool:
        self.processors  # noqa: B018 - loads
        return bool(self._processors and self._processors[1])

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            path = self.root / TOKENIZER_FILE
            if not path.is_file():
                raise PackageError(
                    f"the package has no {TOKENIZER_FILE}, so a text prompt cannot be tokenized",
                    where=str(path),
                    fix="pass input_ids instead, or rebuild from a checkpoint with tokenizer.json",
                )
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(path))
        return self._tokenizer

    def media_inputs(
        self, kind: str, items: Sequence[Any], modalities: set[str]
    ) -> tuple[dict[str, Any], list[int]]:
        """Arrays keyed by port name and soft-token counts for ``kind`` (image/audio)."""
        if not items:
            return {}, []
        if kind not in modalities:
            raise RequestError(
                f"this package has no {kind} input (it accepts: "
                f"{', '.join(['text', *sorted(modalities)])})",
                where=f"{kind} inputs",
                fix=f"drop the {kind}(s), or build a package with the {kind} encoder",
            )
        fn = getattr(self.processors, f"preprocess_{kind}")
        if fn is None:
            raise RequestError(
                f"no {kind} preprocessing is available for model type "
                f"{self.manifest.get('model_type')!r}",
                where="mobius_processors",
                fix="install the model family's plugin (pip install mobius-<family>)",
            )
        out = dict(fn(list(items)))
        counts = [int(n) for n in out.pop("num_soft_tokens", [])]
        return out, counts

    def encode(
        self, prompt: str, image_tokens: Sequence[int] = (), audio_tokens: Sequence[int] = ()
    ) -> list[int]:
        """Chat-format, expand media placeholders, tokenize, add BOS when missing."""
        procs = self.processors
        text = prompt
        if procs.format_prompt is not None:
            formatted = procs.format_prompt(prompt, len(image_tokens), len(audio_tokens))
            text = prompt if formatted is None else formatted
        if procs.expand_prompt is not None and (image_tokens or audio_tokens):
            text = procs.expand_prompt(text, list(image_tokens), list(audio_tokens))
        if not self.has_family:
            return list(self.tokenizer.encode(text, add_special_tokens=True).ids)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        bos = procs.bos_token_id
        if bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        if not (self.root / TOKENIZER_FILE).is_file():
            return ""
        return self.tokenizer.decode(list(map(int, ids)), skip_special_tokens=True)


def as_ids(input_ids: Any) -> np.ndarray:
    """Caller ids as int64 [1, S]."""
    ids = np.asarray(input_ids, dtype=np.int64)
    if ids.ndim == 1:
        ids = ids[None, :]
    if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
        raise RequestError(
            f"generate() takes one non-empty sequence of ids, got shape {list(ids.shape)}",
            where="input_ids",
            fix="pass a 1-D list of ids (or shape [1, S])",
        )
    return ids
