"""Prompt text and media → the caller inputs of a contract, and ids → text.

The runtime knows no family's token ids or image sizes: the family plugin's
:class:`mobius.records.Processors` (via ``mobius_processors``) formats the chat
prompt, preprocesses images and audio, expands media placeholders, and names the
BOS and stop ids. The plugin needs the family's typed config, read from the
package's copy of ``config.json`` (``mobius.json["config"]`` or the file
``config.json`` beside it), with the package's ``generation_config.json`` object under
``mobius.config.GENERATION_CONFIG_KEY`` (its eos ids end generation too). A package whose family plugin is not installed can
still run from raw text and ids; only media then fail, with a clear error.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mobius.config import GENERATION_CONFIG_KEY, GENERATION_CONFIG_NAME, read_generation_config
from mobius.errors import ConfigError, PackageError
from mobius.records import Processors
from mobius_runtime.errors import RequestError
from mobius_runtime.tools import fold_tools, renders_tools

if TYPE_CHECKING:
    from mobius_runtime.chat import ChatTemplate, Conversation

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
    generation = read_generation_config(root / GENERATION_CONFIG_NAME)
    if generation is not None:  # its eos ids are stop ids too (hookspecs.mobius_processors)
        config = {**config, GENERATION_CONFIG_KEY: generation}
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
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problem = f"has no readable model.context_length ({type(exc).__name__}: {exc})"
        else:
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
            problem = f"model.context_length is {value!r}, not a positive integer"
        logging.getLogger(__name__).warning(
            "%s %s; generation runs without a context-length cap: fix the file or rebuild "
            "the package",
            genai,
            problem,
        )
    return None


class TextSide:
    """Tokenizer + processors of one package, loaded on first use."""

    def __init__(self, root: Path, manifest: dict, host: Any | None) -> None:
        self.root = root
        self.manifest = manifest
        self._host = host
        self._tokenizer: Any = None
        self._processors: tuple[Processors, bool] | None = None
        self._chat: tuple[ChatTemplate | None] | None = None
        self._special: dict[str, str] | None = None
        self._no_bos: bool | None = None
        self._max_token_bytes: int | None = None
        self._literal_tokenizer: Any = None
        self._markers: re.Pattern[str] | None = None
        self._kept: tuple[bool, re.Pattern[str] | None] | None = None
        self._single: dict[int, str] = {}  # decode_one's answers (read without a lock)

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

            try:
                self._tokenizer = Tokenizer.from_file(str(path))
            except Exception as exc:  # the library raises a bare Exception for bad files
                raise PackageError(
                    f"{TOKENIZER_FILE} cannot be loaded by the tokenizers library: "
                    f"{str(exc).strip()[:300]}",
                    where=str(path),
                    fix="rebuild the package from a checkpoint with a valid tokenizer.json",
                ) from exc
        return self._tokenizer

    @property
    def max_token_bytes(self) -> int:
        """UTF-8 bytes of the longest token string in the vocabulary (added tokens too).

        Token strings spell what a token covers, never shorter: SentencePiece's ``▁``
        (3 bytes) and byte-level BPE's stand-in characters (1-2 bytes) each stand for one
        input byte, ``<0xAB>`` for one. So ``n`` tokens cover at most
        ``n * max_token_bytes`` bytes of normalized text. Computed once.
        """
        if self._max_token_bytes is None:
            vocab = self.tokenizer.get_vocab(with_added_tokens=True)
            self._max_token_bytes = max((len(t.encode("utf-8")) for t in vocab), default=1)
        return self._max_token_bytes

    @property
    def markers(self) -> re.Pattern[str] | None:
        """A pattern of the tokenizer's special tokens (control markers), longest first."""
        if self._markers is None:
            added = self.tokenizer.get_added_tokens_decoder().values()
            specials = sorted({t.content for t in added if t.special and t.content}, key=len)
            alternatives = "|".join(re.escape(t) for t in reversed(specials))
            self._markers = re.compile(alternatives or r"(?!)")
        return None if self._markers.pattern == r"(?!)" else self._markers

    def hide_markers(self, conversation: Conversation) -> tuple[Conversation, dict[str, str]]:
        """The conversation with every special marker typed in its messages (``<|turn>``,
        ``<start_of_turn>`` ...) swapped for a private-use character, and the map back.

        The template then renders the stand-ins, and :meth:`encode` tokenizes each as
        its marker's plain text, so a user cannot forge a turn. Roles and part types are
        left alone; the stand-ins are characters of Unicode plane 15 that no message holds.
        """
        from mobius_runtime.chat import Conversation

        markers = self.markers if (self.root / TOKENIZER_FILE).is_file() else None
        if markers is None:
            return conversation, {}
        used: set[str] = set()

        def note(text: str) -> str:  # the stand-ins must not be characters a message holds
            used.update(_PLANE_15.findall(text))
            return text

        _walk(conversation.messages, note)
        free = (chr(c) for c in range(0xF0000, 0xFFFFE) if chr(c) not in used)
        hidden: dict[str, str] = {}  # marker → its stand-in

        def swap(match: re.Match[str]) -> str:
            return hidden.setdefault(match.group(0), next(free))

        messages = _walk(conversation.messages, lambda text: markers.sub(swap, text))
        out = Conversation(messages, conversation.images, conversation.audio)
        return out, {stand_in: marker for marker, stand_in in hidden.items()}

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
                fix=f"install the plugin of the family that builds model_type "
                f"{self.manifest.get('model_type')!r} (from a clone of the repository: "
                "pip install ./mobius-<family>)",
            )
        out = dict(fn(list(items)))
        counts = [int(n) for n in out.pop("num_soft_tokens", [])]
        return out, counts

    @property
    def chat(self) -> ChatTemplate | None:
        """The package's chat template (None when the checkpoint shipped none)."""
        if self._chat is None:
            from mobius_runtime.chat import ChatTemplate

            self._chat = (ChatTemplate.load(self.root),)
        return self._chat[0]

    @property
    def special_tokens(self) -> dict[str, str]:
        if self._special is None:
            from mobius_runtime.chat import special_tokens

            self._special = special_tokens(self.root)
        return self._special

    @property
    def bos_id(self) -> int | None:
        """The BOS id: the family's, else the tokenizer config's ``bos_token`` unless
        it says ``"add_bos_token": false`` (SmolLM2's names ``<|im_start|>`` as its BOS
        but adds none)."""
        if self.processors.bos_token_id is not None:
            return self.processors.bos_token_id
        name = self.special_tokens.get("bos_token")
        if name is None or self._adds_no_bos:
            return None
        return self.tokenizer.token_to_id(name)

    @property
    def _adds_no_bos(self) -> bool:
        if self._no_bos is None:
            from mobius_runtime.chat import tokenizer_config

            self._no_bos = tokenizer_config(self.root).get("add_bos_token") is False
        return self._no_bos

    def token_id(self, name: str) -> int | None:
        """The id of a named special token (``image_token`` …), if the package has it."""
        text = self.special_tokens.get(name)
        if text is None or not (self.root / TOKENIZER_FILE).is_file():
            return None
        return self.tokenizer.token_to_id(text)

    def chat_prompt(
        self,
        conversation: Conversation,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text of checked messages: the checkpoint's template, else the family's.

        ``tools`` (HF's ``apply_chat_template(tools=...)`` shape) reach the template as
        ``tools``; a template that does not read ``tools`` gets them folded into the
        messages instead (:func:`~mobius_runtime.tools.fold_tools`). The family's built-in layout (``Processors.format_prompt``) serves only
        a conversation of one user message, with its media before its text, and no tools.
        """
        if self.chat is not None:
            if tools and not renders_tools(self.chat.source):  # Gemma 3's, among others
                folded = fold_tools(conversation.messages, tools)
                return self.chat.render(folded, add_generation_prompt)
            if tools:
                return self.chat.render(conversation.messages, add_generation_prompt, tools=tools)
            return self.chat.render(conversation.messages, add_generation_prompt)
        if tools:
            raise RequestError(
                "this package has no chat template, so it cannot be given tools",
                where="tools",
                fix="rebuild from a checkpoint whose chat template renders tools",
            )
        fmt = self.processors.format_prompt
        messages = conversation.messages
        single = len(messages) == 1 and messages[0].get("role") == "user"
        if fmt is None or not single or not add_generation_prompt:
            raise RequestError(
                "this package has no chat template"
                + ("" if fmt is None else " and its family layout takes one user message"),
                where=str(self.root / "chat_template.jinja"),
                fix="rebuild from a checkpoint with chat_template.jinja (or a chat_template in "
                "tokenizer_config.json), or pass prompt= with the text laid out yourself",
            )
        content = messages[0].get("content") or ""
        if not isinstance(content, str):
            content = "".join(p["text"] for p in content if p.get("type") == "text")
        text = fmt(content, len(conversation.images), len(conversation.audio))
        return content if text is None else text

    def check_placeholders(self, text: str, conversation: Conversation) -> None:
        """The rendered chat must hold one media placeholder per media part."""
        for kind, items in (("image", conversation.images), ("audio", conversation.audio)):
            token = self.special_tokens.get(f"{kind}_token")
            if token is None or not items:
                continue
            found = text.count(token)
            if found != len(items):
                raise RequestError(
                    f"the messages have {len(items)} {kind} part(s) but the chat template "
                    f"rendered {found} {token} placeholder(s)",
                    where=str(self.root / "chat_template.jinja"),
                    fix=f"give the {kind}s as parts of messages the template renders "
                    f"(it may drop media from some roles), one part per {kind}",
                )

    def encode(
        self,
        text: str,
        image_tokens: Sequence[int] = (),
        audio_tokens: Sequence[int] = (),
        literal: Mapping[str, str] | None = None,
    ) -> list[int]:
        """Verbatim text → ids: media placeholders expanded, BOS added when the text has none.

        Each media placeholder the text holds (``<|image|>`` …, the family decides)
        takes the next item's soft tokens, in order; placeholders and items must
        match one to one. ``literal`` maps stand-ins (from :meth:`hide_markers`) to the
        marker text each is tokenized as, as plain text.
        """
        if not isinstance(text, str):
            raise RequestError(
                f"the prompt must be a str, got {type(text).__name__}",
                where="prompt",
                fix="pass text, or input_ids=[...] for ids",
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RequestError(
                f"the prompt is not valid Unicode text: {exc.reason} at character {exc.start}",
                where="prompt",
                fix="remove lone surrogates (decode input bytes with errors='replace')",
            ) from None
        expand = self.processors.expand_prompt
        if expand is not None:  # a family without it lays media out in format_prompt
            text = expand(text, list(image_tokens), list(audio_tokens))
        bos = self.bos_id
        if bos is None:
            return self._tokenize(text, literal or {}, add_special_tokens=True)
        ids = self._tokenize(text, literal or {}, add_special_tokens=False)
        if not ids or ids[0] != bos:
            ids.insert(0, bos)
        return ids

    def _tokenize(
        self, text: str, literal: Mapping[str, str], add_special_tokens: bool
    ) -> list[int]:
        """Ids of ``text``; each stand-in of ``literal`` as its marker's plain text."""
        stand_ins = [c for c in literal if c in text]
        if not stand_ins:
            return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)
        from tokenizers import Encoding, Tokenizer

        if self._literal_tokenizer is None:  # a second copy: the flag is the tokenizer's
            plain = Tokenizer.from_file(str(self.root / TOKENIZER_FILE))
            plain.encode_special_tokens = True
            self._literal_tokenizer = plain
        pieces = re.split("([" + "".join(stand_ins) + "])", text)
        encodings = [
            self._literal_tokenizer.encode(literal[piece], add_special_tokens=False)
            if piece in literal
            else self.tokenizer.encode(piece, add_special_tokens=False)
            for piece in pieces
            if piece
        ]
        merged = Encoding.merge(encodings, growing_offsets=True)
        if add_special_tokens:
            merged = self.tokenizer.post_process(merged)
        return list(merged.ids)

    def decode(self, ids: Sequence[int]) -> str:
        # the file check only until the tokenizer is loaded (it ran on every streamed token)
        if self._tokenizer is None and not (self.root / TOKENIZER_FILE).is_file():
            return ""
        if self._kept is None:
            self._kept = self._kept_markers()
        keep, others = self._kept
        if not keep:
            return self.tokenizer.decode(list(map(int, ids)), skip_special_tokens=True)
        text = self.tokenizer.decode(list(map(int, ids)), skip_special_tokens=False)
        return others.sub("", text) if others is not None else text

    def _kept_markers(self) -> tuple[bool, re.Pattern[str] | None]:
        """(the tokenizer has special tokens that mark tool calls, a pattern of its other
        special tokens). A reply's text keeps the call markers (Gemma 4's ``<|tool_call>``,
        ``<|"|>`` ...: :mod:`mobius_runtime.tools` reads the calls off them) and drops
        every other special token, as ``skip_special_tokens`` does."""
        from mobius_runtime.tools import CALL_MARKERS

        added = self.tokenizer.get_added_tokens_decoder().values()
        specials = {t.content for t in added if t.special and t.content}
        if not specials & CALL_MARKERS:
            return False, None
        others = sorted(specials - CALL_MARKERS, key=len, reverse=True)
        return True, re.compile("|".join(map(re.escape, others))) if others else None

    SINGLE_CACHE = 1 << 16  # decode_one keeps at most this many ids' texts

    def decode_one(self, token: int) -> str:
        """``decode([token])``, remembered: a stream needs each released id's own text as
        the context of its next piece, once per token, and replies reuse ids."""
        text = self._single.get(token)
        if text is None:
            text = self.decode([token])
            if len(self._single) < self.SINGLE_CACHE and self._tokenizer is not None:
                self._single[token] = text
        return text


class TextStream:
    """One reply's text, released piece by piece as its ids come, with constant work per id.

    Each :meth:`push` decodes only the ids not yet released plus one id of context (so a
    tokenizer's leading-space handling sees the same neighbour), never the whole reply,
    in one tokenizer call (the context id's own text, which the piece is cut after, comes
    from :meth:`TextSide.decode_one`'s memory once that id has been seen);
    an incomplete UTF-8 character is held back until it completes (at most
    ``MAX_PENDING`` ids, then released as decoded). Text that may begin one of ``stops``
    is held back until it is known not to; a stop string is searched for only in the
    held-back tail and the new piece, where a new match must lie. :attr:`stopped` is
    set when one is found; the text is cut where it begins. :meth:`finish` gives the
    final text: ``decode(all ids)`` cut at the earliest stop string (one whole decode,
    once) and the rest of it not yet released. ``live=False`` (nobody reads the pieces
    and no stop string is asked for) skips the incremental decoding.
    """

    MAX_PENDING = 8  # ids an unfinished character may span before it is released anyway

    def __init__(self, text: TextSide, stops: Sequence[str] = (), live: bool = True) -> None:
        self._decode = text.decode
        one = getattr(text, "decode_one", None)  # a stand-in may offer decode() alone
        self._decode_one = one if one is not None else (lambda token: text.decode([token]))
        self.stops = tuple(s for s in stops if s)
        self.live = live or bool(self.stops)
        self.ids: list[int] = []
        self.stopped = False
        self._start = 0  # ids[:_start] are decoded into released or held text
        self._prefix = ""  # decode of ids[_start - 1 : _start] (the context)
        self._held = ""  # decoded text not released: it may begin a stop string
        self._released: list[str] = []

    @property
    def released(self) -> str:
        """The text released so far."""
        return "".join(self._released)

    def push(self, token: int) -> str:
        """Add ``token``; returns the text it releases (possibly empty)."""
        self.ids.append(token)
        if not self.live or self.stopped:
            return ""
        decoded = self._decode(self.ids[max(self._start - 1, 0) :])
        whole = decoded.startswith(self._prefix) and not decoded.endswith("\ufffd")
        if not whole and len(self.ids) - self._start < self.MAX_PENDING:
            return ""  # an incomplete character: wait for the next id
        new = decoded[len(self._prefix) :] if decoded.startswith(self._prefix) else decoded
        self._start = len(self.ids)
        self._prefix = self._decode_one(self.ids[-1])
        text = self._held + new
        cut = first_stop(text, self.stops)
        if cut is not None:
            self.stopped = True
            piece, self._held = text[:cut], ""
        else:
            keep = held_back(text, self.stops)
            piece, self._held = text[: len(text) - keep], text[len(text) - keep :]
        if piece:
            self._released.append(piece)
        return piece

    def finish(self) -> tuple[str, str]:
        """(the final text, the part of it not released yet: now released)."""
        final = self._decode(self.ids)
        cut = first_stop(final, self.stops)
        if cut is not None:
            final = final[:cut]
        released = self.released
        rest = final[len(released) :] if final.startswith(released) else ""
        if rest:
            self._released.append(rest)
        return final, rest


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Index where the earliest stop string begins in ``text``, or None."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None


def held_back(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of ``text`` that could begin a stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[-n:]):
                longest = n
                break
    return longest


_PLANE_15 = re.compile("[\U000f0000-\U000ffffd]")  # private use: the markers' stand-ins


def _walk(value: Any, change: Any) -> Any:
    """``value`` with ``change(text)`` applied to each string in it (not to keys, roles or
    part types)."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, Mapping):
        return {k: v if k in ("role", "type") else _walk(v, change) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, change) for v in value]
    return value


def as_ids(input_ids: Any) -> np.ndarray:
    """Caller ids as int64 [1, S]."""
    try:
        ids = np.asarray(input_ids, dtype=np.int64)
    except OverflowError:  # an id beyond int64 (2**63, 10**30): no vocabulary has it
        flat = list(np.asarray(input_ids, dtype=object).reshape(-1))
        position, bad = next((i, x) for i, x in enumerate(flat) if not -(2**63) <= int(x) < 2**63)
        raise RequestError(
            f"token id {bad} at position {position} is outside the vocabulary "
            "(it does not even fit in 64 bits)",
            where="input_ids",
            fix="pass ids the package's tokenizer produces",
        ) from None
    if ids.ndim == 1:
        ids = ids[None, :]
    if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
        raise RequestError(
            f"generate() takes one non-empty sequence of ids, got shape {list(ids.shape)}",
            where="input_ids",
            fix="pass a 1-D list of ids (or shape [1, S])",
        )
    return ids
