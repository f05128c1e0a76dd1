"""Constrained decoding: output that must match a grammar (a JSON schema, any JSON
object, a Lark grammar), with `llguidance <https://github.com/guidance-ai/llguidance>`_
working on the package's own ``tokenizer.json``.

A :class:`Constraint` is built once per request (:meth:`Constraint.json_schema`,
:meth:`Constraint.json_object`, :meth:`Constraint.lark`): the grammar is compiled and
checked then, so a schema llguidance cannot honour is a :class:`RequestError` before
anything runs. Each generated row gets its own :class:`Matcher` (a copy of the compiled
one); :meth:`Matcher.mask` sets the logits of every token the grammar forbids next to
``-inf`` in that row alone, so a constrained row in a batched step costs the others
nothing but its own mask (tens of microseconds for a 49k vocabulary). The request's stop
ids stay allowed whenever the grammar could end there; when the grammar can take no more
(the JSON value is closed) the row ends (``FinishReason.GRAMMAR``).

Why llguidance and not outlines-core (both ship dependency-free wheels; xgrammar needs
torch): measured on SmolLM2's 49,152-token byte-level vocabulary, llguidance compiles a
schema in 2-31 ms where outlines-core builds its index in 2.4-51 s (``{"type":
"object"}``: 51 s), and a server compiles a new schema per request; its mask takes
0.02-0.15 ms a token (p50); and it honours recursive ``$ref`` schemas, which
outlines-core's regex translation cuts off. See the runtime's README ("Structured output").
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mobius_runtime.errors import RequestError

# JSON as OpenAI's structured outputs write it: no free whitespace between tokens (a
# random or weak model would otherwise spend its tokens on whitespace)
JSON_OPTIONS = {"whitespace_flexible": False}


def _llguidance() -> Any:
    try:
        import llguidance
        import llguidance.numpy  # the bitmask helpers
    except ImportError:
        raise RequestError(
            "structured output needs the llguidance package, which is not installed",
            where="response_format",
            fix="pip install 'mobius-runtime[serve]'",
        ) from None
    return llguidance


@functools.lru_cache(maxsize=8)
def tokenizer(path: str, vocab: int, stop_ids: tuple[int, ...]) -> Any:
    """llguidance's view of the tokenizer at ``path`` (cached: it reads every token once).

    ``vocab``: the model's logit width (at least the tokenizer's size); ``stop_ids``:
    the tokens that end a reply, allowed where the grammar may end.
    """
    llg = _llguidance()
    base = llg.LLTokenizer(path)
    return llg.LLTokenizer(
        path, n_vocab=max(vocab, base.vocab_size), eos_token=list(stop_ids) or None
    )


@dataclass(frozen=True)
class Constraint:
    """A compiled grammar for one request's output, bound to a tokenizer.

    Build it with :meth:`json_schema`, :meth:`json_object` or :meth:`lark`; pass it as
    ``SamplingParams(constraint=...)``. ``where`` names the request field it came from
    (in errors).
    """

    grammar: str
    where: str
    compiled: Any = field(repr=False, compare=False)
    vocab: int = 0

    @classmethod
    def build(
        cls, grammar: str, text: Any, vocab: int | None, stop_ids: Iterable[int], where: str
    ) -> Constraint:
        """Compile ``grammar`` (llguidance's JSON or Lark form) for the package of
        ``text`` (a :class:`~mobius_runtime.text.TextSide`): refused if it does not compile."""
        llg = _llguidance()
        path = Path(text.root) / "tokenizer.json"
        if not path.is_file():
            raise RequestError(
                "structured output needs the package's tokenizer.json, and it has none",
                where=where,
                fix="rebuild the package from a checkpoint with tokenizer.json",
            )
        tok = tokenizer(str(path), int(vocab or 0), tuple(sorted(int(i) for i in stop_ids)))
        matcher = llg.LLMatcher(tok, grammar, log_level=0)
        if matcher.is_error():
            raise RequestError(
                f"the grammar cannot be used: {matcher.get_error()[:300]}",
                where=where,
                fix="simplify the schema to what JSON Schema draft 2020-12 allows",
            )
        return cls(grammar, where, matcher, int(tok.vocab_size))

    @classmethod
    def json_schema(
        cls,
        schema: Any,
        text: Any,
        vocab: int | None,
        stop_ids: Iterable[int],
        where: str = "response_format.json_schema.schema",
    ) -> Constraint:
        """Output that is one JSON value valid for ``schema`` (a dict, or its JSON text)."""
        llg = _llguidance()
        try:
            grammar = llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except (ValueError, TypeError) as exc:
            raise RequestError(
                f"the JSON schema cannot be used: {str(exc)[:300]}",
                where=where,
                fix="pass a JSON Schema object",
            ) from None
        return cls.build(grammar, text, vocab, stop_ids, where)

    @classmethod
    def json_object(
        cls, text: Any, vocab: int | None, stop_ids: Iterable[int], where: str = "response_format"
    ) -> Constraint:
        """Output that is one JSON object (OpenAI's ``{"type": "json_object"}``)."""
        return cls.json_schema({"type": "object"}, text, vocab, stop_ids, where)

    @classmethod
    def lark(
        cls, source: str, text: Any, vocab: int | None, stop_ids: Iterable[int], where: str
    ) -> Constraint:
        """Output matching a Lark grammar (llguidance's dialect: ``%json {...}`` embeds a
        JSON schema)."""
        grammar = _llguidance().LLMatcher.grammar_from_lark(source)
        return cls.build(grammar, text, vocab, stop_ids, where)

    def matcher(self) -> Matcher:
        """A fresh matcher for one row (a copy of the compiled one: no recompilation)."""
        return Matcher(self.compiled.deep_copy(), self.vocab, self.where)


class Matcher:
    """The grammar state of one generated row."""

    def __init__(self, matcher: Any, vocab: int, where: str) -> None:
        llg = _llguidance()
        self._m = matcher
        self._fill = llg.numpy.fill_next_token_bitmask
        self._bits = llg.numpy.allocate_token_bitmask(1, vocab)
        self.vocab = vocab
        self.where = where

    def allowed(self) -> np.ndarray:
        """A bool array over the vocabulary: the tokens the grammar allows next."""
        self._fill(self._m, self._bits, 0)
        self._check()
        bits = np.unpackbits(self._bits[0].view(np.uint8), bitorder="little")
        return bits[: self.vocab].astype(bool)

    def mask(self, logits: np.ndarray, stop_ids: Iterable[int]) -> np.ndarray:
        """``logits`` (float64 copy) with every forbidden token at ``-inf``.

        ``stop_ids`` stay allowed while the grammar may end here. At least one token is
        always left with a finite value: if the model gave every allowed token ``-inf``,
        the allowed tokens become equally likely.
        """
        row = np.asarray(logits, dtype=np.float64).reshape(-1)
        allowed = np.zeros(row.size, dtype=bool)
        bits = self.allowed()
        width = min(row.size, bits.size)
        allowed[:width] = bits[:width]
        if self._m.is_accepting():
            for i in stop_ids:
                if 0 <= i < row.size:
                    allowed[i] = True
        if not allowed.any():
            raise RequestError(
                "the grammar allows no token of this model's vocabulary next",
                where=self.where,
                fix="the schema needs text this tokenizer cannot write: simplify it",
            )
        out = np.where(allowed, row, -np.inf)
        if not np.isfinite(np.max(out)):
            out = np.where(allowed, 0.0, -np.inf)
        return out

    def accept(self, token: int, stop_ids: Iterable[int]) -> bool:
        """Advance past ``token``; True when the grammar takes no more tokens after it."""
        if token in stop_ids:
            return False  # the row ends on its stop id anyway
        if not self._m.consume_token(int(token)):
            self._check()
        return bool(self._m.is_stopped())

    def _check(self) -> None:
        if self._m.is_error():
            raise RequestError(
                f"constrained decoding failed: {self._m.get_error()[:300]}",
                where=self.where,
                fix="simplify the schema, or raise max_tokens",
            )
