"""The OpenAI-compatible HTTP API over an :class:`~mobius_runtime.engine.Engine`.

``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions`` (both
streamed as server-sent events like OpenAI's, ending with ``data: [DONE]``, or
answered whole) and ``GET /health`` (no key needed). A request is checked and turned
into model inputs (chat template, media preprocessing) *before* it is queued, so a bad
one is a 400 even when it asked for a stream.

Limits: a body over ``max_request_bytes`` is a 413 before it is parsed; remote media
are fetched on the event loop (at most ``media.MAX_FETCHES`` at once, none of them
holding a worker thread) and requests with media are preprocessed at most
``media.MAX_DECODES`` at once, each image's size read from its header first. On
shutdown (:meth:`Settings.shut_down`) every open request gets its 503 ``shutting_down``
error object at once (a stream: an error chunk, then ``data: [DONE]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from mobius.errors import MobiusError
from mobius_runtime import tools
from mobius_runtime.constrained import Constraint
from mobius_runtime.decoding import FinishReason, TokenLogprob
from mobius_runtime.engine import Engine, EngineStopped, Finished, QueueFull
from mobius_runtime.requests import check_ids, vocab_size
from mobius_runtime.sampling import SamplingParams
from mobius_runtime.serve import errors, media
from mobius_runtime.serve.errors import ApiError
from mobius_runtime.serve.metrics import CONTENT_TYPE as METRICS_TYPE
from mobius_runtime.serve.metrics import Counted, Metrics
from mobius_runtime.serve.schemas import (
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    Message,
    TokenizeRequest,
)

DISCONNECT_POLL_S = 0.25  # how often a whole-answer request checks that its client is there
DEFAULT_MAX_TOKENS = 2048  # a chat request without max_tokens (at most the rest of the context)
DEFAULT_MAX_REQUEST_MB = 8.0  # request bodies larger than this are refused (413)
NAME_SHOWN = 80  # characters of a client's model name quoted back in an error


class Settings:
    """What the app serves and how (see ``mobius serve --help``)."""

    def __init__(
        self,
        engine: Engine,
        model_name: str,
        api_key: str | None = None,
        allow_remote_media: bool = False,
        *,
        allow_private_media: bool = False,
        max_request_mb: float = DEFAULT_MAX_REQUEST_MB,
        literal_special: bool = True,
        cors_origins: Sequence[str] = (),
    ) -> None:
        self.engine = engine
        self.pipeline = engine.pipeline
        self.model_name = model_name
        # compared as bytes: a header is Latin-1 bytes, a key may be any text (UTF-8)
        self.api_key = None if api_key is None else api_key.encode("utf-8")
        self.media = media.Policy(allow_remote_media, allow_private_media)
        self.max_request_bytes = int(max_request_mb * 1024 * 1024)
        # special markers a client types in messages are plain text, not control tokens
        self.literal_special = literal_special
        self.created = int(time.time())
        self.cors_origins = tuple(cors_origins)  # browser origins allowed to call the API
        self.metrics = Metrics(engine)
        # the open requests' events: (kind, data, choice index)
        self.open: set[asyncio.Queue[tuple[str, Any, int]]] = set()

    def shut_down(self) -> None:
        """Refuse new requests and answer every open one with its 503 (on the loop's thread).

        The engine thread finishes its current step on its own; whoever started it
        joins it (:meth:`Engine.stop`) before the process exits.
        """
        self.engine.stop(timeout=0)
        for events in self.open:
            events.put_nowait(("shutdown", None, 0))


def create_app(settings: Settings) -> FastAPI:
    """The FastAPI app; the caller starts and stops ``settings.engine``."""
    app = FastAPI(title="mobius serve", docs_url=None, redoc_url=None, openapi_url=None)
    errors.install(app)
    app.add_middleware(BodyLimit, limit=settings.max_request_bytes)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],
        )
    app.add_middleware(Counted, metrics=settings.metrics)  # outermost: sees every status
    media.limit_image_pixels()

    def authorized(request: Request) -> None:
        check_key(settings.api_key, request)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        engine = settings.engine
        return {"status": "ok", "active": engine.active, "queued": engine.queued}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(settings.metrics.text(), media_type=METRICS_TYPE)

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(settings)]}

    @app.get("/v1/models/{name:path}", dependencies=[Depends(authorized)])
    async def model(name: str) -> dict[str, Any]:
        _check_model(settings, name)
        return _model_card(settings)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat(body: ChatRequest, request: Request) -> Any:
        _check_model(settings, body.model)
        body.check_supported()
        messages, has_media = await _hf_messages(settings, body.messages)
        tools = body.tool_list()
        async with settings.media.decodes if has_media else contextlib.nullcontext():
            caller = await run_in_threadpool(_prepare, _chat_inputs, settings, (messages, tools))
        tooling = _tooling(settings, body) if tools else None
        return await _answer(settings, request, body, caller, chat=True, tooling=tooling)

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(body: CompletionRequest, request: Request) -> Any:
        _check_model(settings, body.model)
        body.check_supported()
        caller = await run_in_threadpool(_prepare, _prompt_inputs, settings, body.prompt)
        return await _answer(settings, request, body, caller, chat=False)

    @app.post("/tokenize", dependencies=[Depends(authorized)])
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        """A prompt's ids: ``prompt`` verbatim, or ``messages`` (and ``tools``) through the
        chat template, exactly the ids the completion endpoints would feed."""
        _check_model(settings, body.model)
        if (body.prompt is None) == (body.messages is None):
            raise ApiError(400, "give exactly one of prompt or messages", "prompt")
        if body.messages is not None:
            messages, has_media = await _hf_messages(settings, body.messages)
            tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
            async with settings.media.decodes if has_media else contextlib.nullcontext():
                caller = await run_in_threadpool(
                    _prepare, _chat_inputs, settings, (messages, tools)
                )
        else:
            caller = await run_in_threadpool(_prepare, _prompt_inputs, settings, body.prompt)
        ids = np.asarray(caller["input_ids"])[0].tolist()
        context = settings.pipeline.context_length
        return {"tokens": ids, "count": len(ids), "max_model_len": context}

    @app.post("/detokenize", dependencies=[Depends(authorized)])
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        """The text of ``tokens`` (ids checked against the vocabulary; special tokens skipped)."""
        _check_model(settings, body.model)
        text = await run_in_threadpool(_prepare, _detokenize, settings, body.tokens)
        return {"prompt": text}

    return app


def check_key(api_key: bytes | None, request: Request) -> None:
    """A 401 unless ``request`` carries ``Authorization: Bearer KEY`` (any request when
    ``api_key`` is None). Also the Ray ingress's check (:mod:`~mobius_runtime.serve.ray_app`)."""
    if api_key is None:
        return
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    raw = key.encode("latin-1")  # Starlette decoded the header's bytes as Latin-1
    if scheme.lower() != "bearer" or not secrets.compare_digest(raw, api_key):
        raise ApiError(401, "missing or wrong API key", None, "invalid_api_key")


def _model_card(settings: Settings) -> dict[str, Any]:
    return {
        "id": settings.model_name,
        "object": "model",
        "created": settings.created,
        "owned_by": "mobius",
    }


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is a 413, before it is parsed.

    A declared ``Content-Length`` over the limit is refused before any byte is read; a
    chunked body is counted as it arrives and refused as soon as it passes the limit.
    """

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    def _error(self, size: str) -> str:
        mb = self.limit / (1024 * 1024)
        return f"the request body is {size}, over this server's {mb:g} MB (--max-request-mb)"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.limit:
            message = self._error(f"{int(declared)} bytes")
            await ApiError(413, message, None, "request_too_large").response()(scope, receive, send)
            return
        seen = 0

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:  # FastAPI passes an HTTPException out of body parsing
                raise HTTPException(413, self._error(f"over {self.limit} bytes"))
            return message

        await self.app(scope, counted, send)


def _check_model(settings: Settings, name: str) -> None:
    if name != settings.model_name:
        raise unknown_model(name, repr(settings.model_name))


def unknown_model(name: str, served: str) -> ApiError:
    """The 404 for a request naming a model this server does not serve (``served``: the
    names it serves, as quoted in the message)."""
    shown = name if len(name) <= NAME_SHOWN else name[:NAME_SHOWN] + f"… ({len(name)} chars)"
    return ApiError(
        404, f"the model {shown!r} does not exist; this server serves {served}", "model",
        "model_not_found",
    )  # fmt: skip


# ---------------------------------------------------------------------- inputs


def _prepare(build: Any, settings: Settings, source: Any) -> dict[str, Any]:
    """``build(settings, source)`` → caller inputs; request-caused failures become 400s.

    The pipeline checks what ``generate()`` checks: ids in the vocabulary, one media
    placeholder per item, the prompt shorter than the context.
    """
    try:
        caller = build(settings, source)
    except ApiError:
        raise
    except MobiusError as exc:
        raise ApiError(400, exc.what + (f" ({exc.fix})" if exc.fix else "")) from None
    except (OSError, ValueError) as exc:  # undecodable media (PIL, soundfile)
        raise ApiError(400, f"cannot use the request's media: {exc}") from None
    return caller


async def _hf_messages(
    settings: Settings, messages: list[Message]
) -> tuple[list[dict[str, Any]], bool]:
    """OpenAI messages as HF writes them (media parts as bytes for the processors).

    Remote media are fetched here, on the event loop; each image's header is read
    (its pixel count checked) before any decoding. Also says whether media were given.
    """
    out, has_media = [], False
    for i, message in enumerate(messages):
        role = "system" if message.role == "developer" else message.role
        content = message.content
        extra = _tool_fields(message)
        if content is None or isinstance(content, str):
            out.append({"role": role, "content": content or "", **extra})
            continue
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(content):
            param = f"messages.{i}.content.{j}"
            if part.type == "text":
                parts.append({"type": "text", "text": part.text})
            elif part.type == "image_url":
                where = param + ".image_url.url"
                data = await media.url_bytes(part.image_url.url, where, settings.media)
                media.check_image(data, where)
                parts.append({"type": "image", "image": data})
                has_media = True
            else:
                data = media.decode_base64(part.input_audio.data, param + ".input_audio.data")
                parts.append({"type": "audio", "audio": data})
                has_media = True
        out.append({"role": role, "content": parts, **extra})
    return out, has_media


def _tool_fields(message: Message) -> dict[str, Any]:
    """A message's tool fields as HF's templates read them: an assistant's ``tool_calls``
    with ``arguments`` parsed to a dict (HF's convention; text that is not a JSON object
    stays text), a tool message's ``tool_call_id`` and ``name``."""
    out: dict[str, Any] = {}
    if message.tool_calls:
        calls = []
        for call in message.tool_calls:
            try:
                arguments: Any = json.loads(call.function.arguments)
            except ValueError:
                arguments = call.function.arguments
            function = {"name": call.function.name, "arguments": arguments}
            calls.append({"id": call.id, "type": "function", "function": function})
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        if getattr(message, key) is not None:
            out[key] = getattr(message, key)
    return out


def _chat_inputs(settings: Settings, source: tuple[list[dict[str, Any]], Any]) -> dict[str, Any]:
    messages, tools = source
    return settings.pipeline.encode_messages(messages, settings.literal_special, tools)


@dataclass(frozen=True)
class Tooling:
    """How a chat request with tools reads its reply: the calls in the template's format,
    or (``schema`` set) the list of calls the constrained output is
    (:mod:`mobius_runtime.tools`)."""

    format: tools.ToolFormat
    schema: dict[str, Any] | None  # the forced calls' schema (tool_choice required / named)
    grammar: str | None = None  # or their Lark grammar (forced calls in Gemma 4's notation)

    def split(self, text: str) -> tuple[str | None, list[tools.ToolCall]]:
        """(content, calls) of a finished reply; a call cut short leaves it all content."""
        return self.format.parse(text)


def _tooling(settings: Settings, body: ChatRequest) -> Tooling:
    chat = settings.pipeline.text.chat
    required, name = body.forced()
    own = tools.format_for(chat.source if chat is not None else None)
    if required:
        most = tools.MAX_CALLS if body.parallel_tool_calls else 1
        listed = body.tool_list() or []
        if own.name == "gemma4":  # the checkpoint's own notation, not JSON
            try:
                grammar = tools.gemma_calls_grammar(listed, name, most, _specials(settings))
            except tools.SchemaError as exc:
                raise ApiError(
                    400, f"a forced Gemma 4 call cannot follow this schema: {exc}", "tools"
                ) from None
            return Tooling(own, None, grammar)
        return Tooling(tools.FORCED, tools.calls_schema(listed, name, most))
    return Tooling(own, None)


def _specials(settings: Settings) -> dict[str, int]:
    """The package tokenizer's special tokens: their text and id."""
    added = settings.pipeline.text.tokenizer.get_added_tokens_decoder()
    return {t.content: int(i) for i, t in added.items() if t.special and t.content}


def _detokenize(settings: Settings, tokens: list[int]) -> str:
    pipeline = settings.pipeline
    if tokens:
        check_ids(np.asarray([tokens], dtype=np.int64), vocab_size(pipeline.manifest), {}, {})
    return pipeline.text.decode(tokens)


def _prompt_inputs(settings: Settings, prompt: str | list[int]) -> dict[str, Any]:
    """A raw prompt (verbatim text, or token ids) → checked ids, as ``generate(prompt=)``."""
    text, ids = (prompt, None) if isinstance(prompt, str) else (None, prompt)
    ids, caller = settings.pipeline.prompts.prepare(text, ids, (), ())
    return {**caller, "input_ids": ids}


def _constraint(settings: Settings, body: Any, tooling: Tooling | None) -> Constraint | None:
    """The grammar a forced tool call or ``response_format`` asks for (compiled here, off
    the event loop), or None.

    ``json_schema`` with ``strict: true`` refuses schema keywords the grammar compiler does
    not implement; otherwise they are ignored (the output still parses and follows every
    keyword that is implemented).
    """
    form = body.response_format
    pipeline = settings.pipeline
    package = (pipeline.text, vocab_size(pipeline.manifest), settings.engine.stops)
    if tooling is not None and tooling.grammar is not None:
        try:
            return Constraint.lark(tooling.grammar, *package, where="tools")
        except MobiusError as exc:
            raise ApiError(400, exc.what, "tools") from None
    if tooling is not None and tooling.schema is not None:
        try:
            return Constraint.json_schema(tooling.schema, *package, where="tools")
        except MobiusError as exc:
            raise ApiError(400, exc.what, "tools") from None
    if form is None or form.type == "text":
        return None
    try:
        if form.type == "json_object":
            return Constraint.json_object(*package)
        if form.json_schema is None:
            raise ApiError(
                400,
                'response_format of type "json_schema" needs a json_schema object '
                '({"name": ..., "schema": {...}})',
                "response_format.json_schema",
            )
        schema = dict(form.json_schema.schema_)
        if not form.json_schema.strict:
            schema.setdefault("x-guidance", {"lenient": True})
        return Constraint.json_schema(schema, *package, where="response_format.json_schema")
    except MobiusError as exc:
        raise ApiError(400, exc.what + (f" ({exc.fix})" if exc.fix else ""), exc.where) from None


# ---------------------------------------------------------------------- answers


async def _answer(
    settings: Settings,
    request: Request,
    body: Any,
    caller: dict[str, Any],
    *,
    chat: bool,
    tooling: Tooling | None = None,
) -> Any:
    prompt = int(np.shape(caller["input_ids"])[1])
    limit = body.token_limit()
    if limit is None:  # KV buffers are sized by the limit: a bounded default
        context = settings.pipeline.context_length
        limit = DEFAULT_MAX_TOKENS if context is None else min(DEFAULT_MAX_TOKENS, context - prompt)
    constraint = await run_in_threadpool(_constraint, settings, body, tooling)
    sampling = SamplingParams(
        max_tokens=int(limit),
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        repetition_penalty=body.repetition_penalty,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        seed=body.seed,
        stop=body.stops(),
        constraint=constraint,
        logprobs=body.logprob_k(),
    )
    # n choices: choice i samples with seed + i (one seed gives the same n answers)
    samplings = [
        sampling if i == 0 or body.seed is None else replace(sampling, seed=body.seed + i)
        for i in range(body.n)
    ]
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[str, Any, int]] = asyncio.Queue()

    def sink_of(index: int) -> Any:
        def sink(kind: str, data: Any) -> None:
            # RuntimeError: the server's loop has closed, nobody is listening any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(events.put_nowait, (kind, data, index))

        return sink

    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    try:
        sinks = [sink_of(i) for i in range(body.n)]
        handles = settings.engine.submit_group(caller, samplings, sinks, rid)
    except QueueFull as exc:
        raise ApiError(429, f"the server is busy: {exc}; retry later", None, "queue_full") from None
    except EngineStopped as exc:
        raise ApiError(503, str(exc), None, "shutting_down") from None
    settings.open.add(events)
    head = {"id": rid, "created": int(time.time()), "model": settings.model_name}
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        stream = _stream(settings, handles, events, head, chat, usage, tooling)
        return StreamingResponse(stream, media_type="text/event-stream")
    checked = time.monotonic()
    done: dict[int, Finished] = {}
    try:
        while len(done) < len(handles):
            try:
                kind, data, index = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
            except TimeoutError:
                kind, data, index = "wait", None, 0
            if time.monotonic() - checked >= DISCONNECT_POLL_S:
                checked = time.monotonic()
                if await request.is_disconnected():  # the client left: free the slot
                    return JSONResponse({}, status_code=499)
            if kind == "error":
                raise _engine_error(data)
            if _shut(kind, data):
                generated = data.completion_tokens if data else len(handles[index].ids)
                raise _shutdown_error(generated)
            if kind == "done":
                done[index] = data
        finished = [done[i] for i in range(len(handles))]
        settings.metrics.finished(finished)
        return _whole(head, finished, chat, tooling, lambda: Logprobs(settings.pipeline.text, chat))
    finally:
        settings.open.discard(events)
        for handle in handles:
            settings.engine.cancel(handle)


def _shut(kind: str, data: Any) -> bool:
    """The server is stopping: ``shut_down`` said so, or the engine cancelled the request."""
    return kind == "shutdown" or (kind == "done" and data.reason == FinishReason.CANCELLED)


def _shutdown_error(generated: int) -> ApiError:
    """A request cancelled while its client still waited: the server is stopping.

    OpenAI has no finish_reason for this, so the client gets an error object (503, code
    ``shutting_down``) rather than a truncated answer that looks complete.
    """
    return ApiError(
        503,
        f"the server is shutting down: this request was cancelled after "
        f"{generated} generated tokens; retry it",
        None,
        "shutting_down",
    )


def _engine_error(exc: Exception) -> ApiError:
    if isinstance(exc, MobiusError):
        return ApiError(400, exc.what)
    return ApiError(500, f"the model failed on this request: {type(exc).__name__}: {exc}")


OPENAI_FINISH = {
    FinishReason.STOP_ID: "stop",
    FinishReason.STOP_STRING: "stop",
    FinishReason.MAX_TOKENS: "length",
    FinishReason.CONTEXT: "length",
    FinishReason.GRAMMAR: "stop",
}


def finish_reason(reason: FinishReason) -> str:
    """OpenAI's ``finish_reason`` for the runtime's (a cancelled request gets none: the
    server answers it with an error, see :func:`_shutdown_error`)."""
    return OPENAI_FINISH[reason]


def _usage(done: list[Finished]) -> dict[str, int]:
    """One prompt (prefilled once for all choices), every choice's completion tokens."""
    prompt = done[0].prompt_tokens
    completion = sum(d.completion_tokens for d in done)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": done[0].cached_tokens},
    }


def _reply(done: Finished, tooling: Tooling | None) -> tuple[dict[str, Any], str]:
    """The assistant message of a finished chat request and its OpenAI finish_reason."""
    if tooling is None:
        return {"role": "assistant", "content": done.text}, finish_reason(done.reason)
    content, calls = tooling.split(done.text)
    if not calls:
        return {"role": "assistant", "content": done.text}, finish_reason(done.reason)
    message = {
        "role": "assistant",
        "content": content,
        "tool_calls": [c.to_openai() for c in calls],
    }
    return message, "tool_calls"


class Logprobs:
    """OpenAI's ``logprobs`` objects for :class:`~mobius_runtime.decoding.TokenLogprob`
    entries: chat's ``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}`` and
    completions' ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``. A token's
    text is its id decoded alone (special tokens kept), its bytes that text's UTF-8."""

    def __init__(self, text: Any, chat: bool) -> None:
        self.text, self.chat = text, chat
        self.offset = 0  # completions: where the next token's text begins

    def _token(self, token: int) -> str:
        return self.text.tokenizer.decode([token], skip_special_tokens=False)

    def _entry(self, token: int, logprob: float) -> dict[str, Any]:
        text = self._token(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def of(self, entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
        if entries is None:
            return None
        if self.chat:
            content = [
                {
                    **self._entry(e.token, e.logprob),
                    "top_logprobs": [self._entry(*t) for t in e.top],
                }
                for e in entries
            ]
            return {"content": content}
        tokens = [self._token(e.token) for e in entries]
        offsets = []
        for token in tokens:
            offsets.append(self.offset)
            self.offset += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{self._token(t): lp for t, lp in e.top} for e in entries],
            "text_offset": offsets,
        }


def _whole(
    head: dict[str, Any],
    done: list[Finished],
    chat: bool,
    tooling: Tooling | None,
    logprobs: Callable[[], Logprobs],
) -> dict[str, Any]:
    """The whole answer: one choice per finished request (``logprobs()``: a fresh formatter)."""
    choices = []
    for index, finished in enumerate(done):
        lp = logprobs().of(finished.logprobs)
        if chat:
            message, finish = _reply(finished, tooling)
            choices.append(
                {"index": index, "message": message, "logprobs": lp, "finish_reason": finish}
            )
        else:
            finish = finish_reason(finished.reason)
            choices.append(
                {"index": index, "text": finished.text, "logprobs": lp, "finish_reason": finish}
            )
    kind = "chat.completion" if chat else "text_completion"
    return {**head, "object": kind, "choices": choices, "usage": _usage(done)}


async def _stream(
    settings: Settings,
    handles: list[Any],
    events: asyncio.Queue[tuple[str, Any, int]],
    head: dict[str, Any],
    chat: bool,
    usage: bool,
    tooling: Tooling | None = None,
) -> AsyncIterator[str]:
    """SSE chunks as OpenAI sends them (one ``index`` per choice); the requests are
    cancelled if the client leaves.

    With tools, each choice's text goes through a :class:`~mobius_runtime.tools.CallReader`:
    content as soon as it cannot begin a call, each call as OpenAI streams one (a
    ``delta.tool_calls`` entry with its index, id, type and name, then its arguments in
    fragments), the finish reason the whole answer would have.
    """
    kind_name = "chat.completion.chunk" if chat else "text_completion"
    formatters = [Logprobs(settings.pipeline.text, chat) for _ in handles]
    pending: list[list[TokenLogprob]] = [[] for _ in handles]  # entries of unsent text
    readers = [tooling.format.reader() for _ in handles] if tooling is not None else None

    def chunk(index: int, delta: dict[str, Any] | str, finish: str | None) -> str:
        lp = None
        if pending[index] and (delta or finish):  # an entry goes with its text (or the end)
            lp = formatters[index].of(pending[index])
            pending[index] = []
        field = "delta" if chat else "text"
        choice = {"index": index, field: delta, "logprobs": lp, "finish_reason": finish}
        body = {**head, "object": kind_name, "choices": [choice]}
        if usage:
            body["usage"] = None
        return _sse(body)

    try:
        if chat:
            for index in range(len(handles)):
                yield chunk(index, {"role": "assistant", "content": ""}, None)
        done: dict[int, Finished] = {}
        failed = False
        while len(done) < len(handles) and not failed:
            for kind, data, index in await _ready(events):
                if kind == "logprobs":
                    pending[index].append(data)
                elif kind == "delta":
                    if readers is None:
                        yield chunk(index, {"content": data} if chat else data, None)
                    else:
                        for event in readers[index].feed(data):
                            yield chunk(index, _tool_delta(event), None)
                elif kind == "error":
                    yield _sse(_engine_error(data).body())
                    failed = True
                elif _shut(kind, data):  # only a shutdown cancels a live stream
                    generated = data.completion_tokens if data else len(handles[index].ids)
                    yield _sse(_shutdown_error(generated).body())
                    failed = True
                elif kind == "done":
                    done[index] = data
                    if readers is not None:
                        for event in readers[index].close():
                            yield chunk(index, _tool_delta(event), None)
                    finish = _reply(data, tooling)[1] if tooling else finish_reason(data.reason)
                    yield chunk(index, {} if chat else "", finish)
                if failed:
                    break
        if not failed:
            finished = [done[i] for i in range(len(handles))]
            settings.metrics.finished(finished)
            if usage:
                body = {**head, "object": kind_name, "choices": [], "usage": _usage(finished)}
                yield _sse(body)
        yield "data: [DONE]\n\n"
    finally:
        settings.open.discard(events)
        for handle in handles:
            settings.engine.cancel(handle)


def _tool_delta(event: tools.Event) -> dict[str, Any]:
    """The chat ``delta`` of one :class:`~mobius_runtime.tools.Event`."""
    if event.kind == "content":
        return {"content": event.text}
    if event.kind == "call":
        function = {"name": event.text, "arguments": ""}
        call = {"index": event.index, "id": event.id, "type": "function", "function": function}
    else:
        call = {"index": event.index, "function": {"arguments": event.text}}
    return {"tool_calls": [call]}


async def _ready(events: asyncio.Queue[tuple[str, Any, int]]) -> list[tuple[str, Any, int]]:
    """The next event and every one already queued, consecutive deltas of one choice
    joined into one.

    When the client reads slower than the engine decodes, one chunk then carries several
    tokens' text instead of one chunk per token falling further behind.
    """
    out = [await events.get()]
    while not events.empty():
        kind, data, index = events.get_nowait()
        last = out[-1]
        if kind == "delta" and last[0] == "delta" and last[2] == index:
            out[-1] = ("delta", last[1] + data, index)
        else:
            out.append((kind, data, index))
    return out


def _sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"
