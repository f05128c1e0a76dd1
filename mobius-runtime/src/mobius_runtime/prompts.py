"""Prompts: what a request's messages, text or ids become before the model sees them.

:class:`Prompts` renders messages with the package's chat template (or the family's
layout), tokenizes text (media placeholders expanded, special markers typed in content
kept literal on request), preprocesses media, and checks the result (a text too long
for the context is refused before it is tokenized; ids in the vocabulary, placeholders
matching the media, within the context). :class:`~mobius_runtime.pipeline.Pipeline`
holds one; ``generate()``, ``ChatSession`` and ``mobius serve`` prepare every prompt
through it, so the same request gives the same ids everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mobius_runtime.errors import RequestError
from mobius_runtime.requests import check_ids, vocab_size
from mobius_runtime.text import TOKENIZER_FILE, TextSide, as_ids

NORMALIZE_SLACK = 3  # how many times Unicode normalization can shrink text's UTF-8 bytes
PREFIX_CHARS = 8  # a long prompt's prefix tokenized first: this many characters a position
PREFIX_SLACK = 16  # tokens a prefix may have more than the same span in the whole text


class Prompts:
    """The prompt side of a loaded package: rendering, tokenizing and checking."""

    def __init__(
        self,
        root: Path,
        manifest: dict,
        text: TextSide,
        modalities: set[str],
        context_length: int | None,
    ) -> None:
        self.root = root
        self.manifest = manifest
        self.text = text
        self.modalities = modalities
        self.context_length = context_length

    def request(
        self,
        prompt: str | None,
        input_ids: Any,
        images: Sequence[Any],
        audio: Sequence[Any],
        messages: Any,
        literal_special: bool,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """(checked prompt ids [1, S], caller inputs) for ``generate()``'s exactly one of
        ``messages`` (their media inside), verbatim ``prompt`` text or ``input_ids``."""
        if sum(x is not None for x in (prompt, input_ids, messages)) != 1:
            raise RequestError(
                "generate() needs exactly one of messages, prompt or input_ids",
                where="generate()",
                fix="pass messages=[…], prompt='…' or input_ids=[…]",
            )
        text, literal = None, None
        if messages is not None:
            if images or audio:
                raise RequestError(
                    "with messages, media go inside the messages, not in images=/audio=",
                    where="generate()",
                    fix='add {"type": "image", "image": …} parts to the user message',
                )
            text, images, audio, literal = self.chat_inputs(messages, literal_special)
        elif prompt is not None:
            text = prompt
        return self.prepare(text, input_ids, images, audio, literal)

    def apply_chat_template(
        self, messages: Any, add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """The prompt text ``messages`` make with the package's chat template.

        ``messages`` are HF-shaped (see :mod:`mobius_runtime.chat`); extra keyword
        arguments reach the template as variables (e.g. ``enable_thinking=False``).
        Without a template in the package, the family's built-in layout serves a
        single user message. Media parts become the template's placeholders; ids
        come from :meth:`encode_messages`.
        """
        from mobius_runtime.chat import parse_messages

        conversation = parse_messages(messages, self.modalities)
        if kwargs and self.text.chat is not None:
            return self.text.chat.render(conversation.messages, add_generation_prompt, **kwargs)
        return self.text.chat_prompt(conversation, add_generation_prompt)

    def encode_messages(
        self, messages: Any, literal_special: bool = False, tools: Any = None
    ) -> dict[str, Any]:
        """The caller inputs ``messages`` make: ``input_ids`` [1, S] and the media arrays.

        The same ids as ``generate(messages=..., literal_special=...)`` feeds (chat
        template with a generation prompt, media placeholders expanded), for callers
        that run the steps themselves (``mobius serve``'s batching engine). Media items
        are preprocessed here; their encoders run with the prompt step. ``tools``: HF's
        ``apply_chat_template(tools=...)`` list, rendered by the template.
        """
        text, images, audio, literal = self.chat_inputs(messages, literal_special, tools)
        ids, caller = self.prepare(text, None, images, audio, literal)
        return {**caller, "input_ids": ids}

    def chat_inputs(
        self, messages: Any, literal_special: bool, tools: Any = None
    ) -> tuple[str, list[Any], list[Any], dict[str, str]]:
        """The prompt text ``messages`` render to (placeholders checked), their media, and
        the stand-ins of special markers typed in them (with ``literal_special``)."""
        from mobius_runtime.chat import parse_messages

        conversation = parse_messages(messages, self.modalities)
        literal: dict[str, str] = {}
        if literal_special:
            conversation, literal = self.text.hide_markers(conversation)
        text = self.text.chat_prompt(conversation, tools=tools)
        self.text.check_placeholders(text, conversation)
        return text, conversation.images, conversation.audio, literal

    def prepare(
        self,
        text: str | None,
        input_ids: Any,
        images: Sequence[Any],
        audio: Sequence[Any],
        literal: dict[str, str] | None = None,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """(checked prompt ids [1, S], caller inputs with the media) for verbatim text or ids.

        ``literal``: stand-ins in ``text`` for markers to tokenize as plain text
        (:meth:`TextSide.hide_markers`).
        """
        caller: dict[str, Any] = {}
        image_inputs, image_tokens = self.text.media_inputs("image", images, self.modalities)
        audio_inputs, audio_tokens = self.text.media_inputs("audio", audio, self.modalities)
        caller.update(image_inputs)
        caller.update(audio_inputs)
        if text is not None:
            self.check_prompt_bytes(text)
            ids = as_ids(self.text.encode(text, image_tokens, audio_tokens, literal))
        else:
            ids = as_ids(input_ids)
        self.check_prompt_ids(ids, sum(image_tokens), sum(audio_tokens))
        return ids, caller

    def check_prompt_bytes(self, text: str) -> None:
        """Refuse, before tokenizing, a text that cannot fit the context whatever its tokens.

        ``n`` tokens cover at most ``n * max_token_bytes`` bytes of normalized text (see
        :attr:`TextSide.max_token_bytes`), and Unicode normalization (NFC, NFKC) shrinks
        text at most ``NORMALIZE_SLACK`` times (three decomposed jamo compose to one
        syllable), so a text longer than ``NORMALIZE_SLACK * max_token_bytes *
        context_length`` bytes certainly has too many tokens. (This assumes the
        tokenizer's normalizer does not delete text, as Gemma's and Qwen's do not.)
        Tokenizing megabytes costs far more memory than the text itself.
        """
        limit = self.context_length
        if limit is None or not isinstance(text, str):  # encode() names a wrong type
            return
        if not (self.root / TOKENIZER_FILE).is_file():
            return
        size = len(text.encode("utf-8", "surrogatepass"))
        if size <= limit:  # fewer bytes than positions: no need to read the vocabulary
            return
        most = NORMALIZE_SLACK * self.text.max_token_bytes * limit
        if size > most:
            raise RequestError(
                f"the prompt is {size} bytes, more than the {limit} positions of the model "
                f"can hold in any tokenization (at most {most} bytes)",
                where="prompt",
                fix=f"shorten the prompt below {limit} tokens",
            )
        # Below that bound a long text may still be far too long (a vocabulary with one
        # 30-byte token allows 90 bytes a position): tokenize a prefix of PREFIX_CHARS
        # characters a position first, whose cost is bounded by the context, not the body.
        # A prefix has at most a few tokens more than the same span inside the whole text
        # (only its last word can split differently), hence PREFIX_SLACK.
        chars = PREFIX_CHARS * limit
        if len(text) > chars:
            head = len(self.text.tokenizer.encode(text[:chars], add_special_tokens=False).ids)
            if head >= limit + PREFIX_SLACK:
                raise RequestError(
                    f"the prompt is {len(text)} characters, and its first {chars} alone are "
                    f"{head} tokens, more than the {limit} positions of the model",
                    where="prompt",
                    fix=f"shorten the prompt below {limit} tokens",
                )

    def check_prompt_ids(self, ids: np.ndarray, image_soft: int, audio_soft: int) -> None:
        """Ids in the vocabulary, placeholders matching the media, within the context."""
        text = self.text
        has_tokenizer = (self.root / TOKENIZER_FILE).is_file()
        placeholders = {}
        unsupported = {}
        if has_tokenizer:
            for kind, soft in (("image", image_soft), ("audio", audio_soft)):
                token = text.token_id(f"{kind}_token")
                if kind in self.modalities:
                    placeholders[kind] = (token, soft)
                else:
                    unsupported[kind] = token
            unsupported["video"] = text.token_id("video_token")
        check_ids(ids, vocab_size(self.manifest), placeholders, unsupported)
        limit = self.context_length
        if limit is not None and ids.shape[1] >= limit:
            raise RequestError(
                f"the prompt is {ids.shape[1]} tokens but the model has {limit} positions",
                where="prompt",
                fix=f"shorten the prompt below {limit} tokens",
            )
