"""The OpenAI-compatible HTTP API over an :class:`~mobius_runtime.engine.Engine`.

``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions`` (both
streamed as server-sent events like OpenAI's, ending with ``data: [DONE]``, or
answered whole) and ``GET /health`` (no key needed). A request is checked and turned
into model inputs (chat template, media preprocessing) *before* it is queued, so a bad
one is a 400 even when it asked for a stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from mobius.errors import MobiusError
from mobius_runtime.engine import Engine, EngineStopped, Finished, QueueFull, Sampling
from mobius_runtime.serve import errors
from mobius_runtime.serve.errors import ApiError
from mobius_runtime.serve.media import decode_base64, url_bytes
from mobius_runtime.serve.schemas import ChatRequest, CompletionRequest, Message

DISCONNECT_POLL_S = 0.25  # how often a whole-answer request checks that its client is there
DEFAULT_MAX_TOKENS = 2048  # a chat request without max_tokens (at most the rest of the context)


class Settings:
    """What the app serves and how (see ``mobius serve --help``)."""

    def __init__(
        self,
        engine: Engine,
        model_name: str,
        api_key: str | None = None,
        allow_remote_media: bool = False,
    ) -> None:
        self.engine = engine
        self.pipeline = engine.pipeline
        self.model_name = model_name
        self.api_key = api_key
        self.allow_remote_media = allow_remote_media
        self.created = int(time.time())


def create_app(settings: Settings) -> FastAPI:
    """The FastAPI app; the caller starts and stops ``settings.engine``."""
    app = FastAPI(title="mobius serve", docs_url=None, redoc_url=None, openapi_url=None)
    errors.install(app)

    def authorized(request: Request) -> None:
        if settings.api_key is None:
            return
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(key, settings.api_key):
            raise ApiError(401, "missing or wrong API key", None, "invalid_api_key")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        engine = settings.engine
        return {"status": "ok", "active": engine.active, "queued": engine.queued}

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
        caller = await run_in_threadpool(_prepare, _chat_inputs, settings, body.messages)
        return await _answer(settings, request, body, caller, chat=True)

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(body: CompletionRequest, request: Request) -> Any:
        _check_model(settings, body.model)
        caller = await run_in_threadpool(_prepare, _prompt_inputs, settings, body.prompt)
        return await _answer(settings, request, body, caller, chat=False)

    return app


def _model_card(settings: Settings) -> dict[str, Any]:
    return {
        "id": settings.model_name,
        "object": "model",
        "created": settings.created,
        "owned_by": "mobius",
    }


def _check_model(settings: Settings, name: str) -> None:
    if name != settings.model_name:
        raise ApiError(
            404,
            f"the model {name!r} does not exist; this server serves {settings.model_name!r}",
            "model",
            "model_not_found",
        )


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


def _hf_messages(settings: Settings, messages: list[Message]) -> list[dict[str, Any]]:
    """OpenAI messages as HF writes them (media parts as bytes for the processors)."""
    out = []
    for i, message in enumerate(messages):
        role = "system" if message.role == "developer" else message.role
        content = message.content
        if content is None or isinstance(content, str):
            out.append({"role": role, "content": content or ""})
            continue
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(content):
            param = f"messages.{i}.content.{j}"
            if part.type == "text":
                parts.append({"type": "text", "text": part.text})
            elif part.type == "image_url":
                data = url_bytes(
                    part.image_url.url, param + ".image_url.url", settings.allow_remote_media
                )
                parts.append({"type": "image", "image": data})
            else:
                data = decode_base64(part.input_audio.data, param + ".input_audio.data")
                parts.append({"type": "audio", "audio": data})
        out.append({"role": role, "content": parts})
    return out


def _chat_inputs(settings: Settings, messages: list[Message]) -> dict[str, Any]:
    return settings.pipeline.encode_messages(_hf_messages(settings, messages))


def _prompt_inputs(settings: Settings, prompt: str | list[int]) -> dict[str, Any]:
    """A raw prompt (verbatim text, or token ids) → checked ids, as ``generate(prompt=)``."""
    text, ids = (prompt, None) if isinstance(prompt, str) else (None, prompt)
    ids, caller = settings.pipeline.prepare(text, ids, (), ())
    return {**caller, "input_ids": ids}


# ---------------------------------------------------------------------- answers


async def _answer(
    settings: Settings, request: Request, body: Any, caller: dict[str, Any], *, chat: bool
) -> Any:
    prompt = int(np.shape(caller["input_ids"])[1])
    limit = body.token_limit()
    if limit is None:  # KV buffers are sized by the limit: a bounded default
        context = settings.pipeline.context_length
        limit = DEFAULT_MAX_TOKENS if context is None else min(DEFAULT_MAX_TOKENS, context - prompt)
    sampling = Sampling(
        max_tokens=int(limit),
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=body.stops(),
    )
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def sink(kind: str, data: Any) -> None:
        # RuntimeError: the server's loop has closed, nobody is listening any more
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(events.put_nowait, (kind, data))

    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    try:
        handle = settings.engine.submit(caller, sampling, sink, rid)
    except QueueFull as exc:
        raise ApiError(429, f"the server is busy: {exc}; retry later", None, "queue_full") from None
    except EngineStopped as exc:
        raise ApiError(503, str(exc), None, "shutting_down") from None
    head = {"id": rid, "created": int(time.time()), "model": settings.model_name}
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        stream = _stream(settings, handle, events, head, chat, usage)
        return StreamingResponse(stream, media_type="text/event-stream")
    checked = time.monotonic()
    try:
        while True:
            try:
                kind, data = await asyncio.wait_for(events.get(), timeout=DISCONNECT_POLL_S)
            except TimeoutError:
                kind, data = "wait", None
            if time.monotonic() - checked >= DISCONNECT_POLL_S:
                checked = time.monotonic()
                if await request.is_disconnected():  # the client left: free the slot
                    return JSONResponse({}, status_code=499)
            if kind == "error":
                raise _engine_error(data)
            if kind == "done":
                if data.finish_reason == "cancelled":
                    raise _shutdown_error(data)
                return _whole(head, data, chat)
    finally:
        settings.engine.cancel(handle)


def _shutdown_error(done: Finished) -> ApiError:
    """A request the engine cancelled while its client still waited: the server stopped.

    OpenAI has no finish_reason for this, so the client gets an error object (503, code
    ``shutting_down``) rather than a truncated answer that looks complete.
    """
    return ApiError(
        503,
        f"the server is shutting down: this request was cancelled after "
        f"{done.completion_tokens} generated tokens; retry it",
        None,
        "shutting_down",
    )


def _engine_error(exc: Exception) -> ApiError:
    if isinstance(exc, MobiusError):
        return ApiError(400, exc.what)
    return ApiError(500, f"the model failed on this request: {type(exc).__name__}: {exc}")


def _usage(done: Finished) -> dict[str, int]:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }


def _whole(head: dict[str, Any], done: Finished, chat: bool) -> dict[str, Any]:
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": done.text},
            "logprobs": None,
            "finish_reason": done.finish_reason,
        }
        return {**head, "object": "chat.completion", "choices": [choice], "usage": _usage(done)}
    choice = {"index": 0, "text": done.text, "logprobs": None, "finish_reason": done.finish_reason}
    return {**head, "object": "text_completion", "choices": [choice], "usage": _usage(done)}


async def _stream(
    settings: Settings,
    handle: Any,
    events: asyncio.Queue[tuple[str, Any]],
    head: dict[str, Any],
    chat: bool,
    usage: bool,
) -> AsyncIterator[str]:
    """SSE chunks as OpenAI sends them; the request is cancelled if the client leaves."""
    kind_name = "chat.completion.chunk" if chat else "text_completion"

    def chunk(delta: dict[str, Any] | str, finish: str | None) -> str:
        if chat:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}
        body = {**head, "object": kind_name, "choices": [choice]}
        if usage:
            body["usage"] = None
        return _sse(body)

    try:
        if chat:
            yield chunk({"role": "assistant", "content": ""}, None)
        done = False
        while not done:
            for kind, data in await _ready(events):
                if kind == "delta":
                    yield chunk({"content": data} if chat else data, None)
                    continue
                done = True
                if kind == "error":
                    yield _sse(_engine_error(data).body())
                    break
                if data.finish_reason == "cancelled":  # only a shutdown cancels a live stream
                    yield _sse(_shutdown_error(data).body())
                    break
                yield chunk({} if chat else "", data.finish_reason)
                if usage:
                    yield _sse({**head, "object": kind_name, "choices": [], "usage": _usage(data)})
                break
        yield "data: [DONE]\n\n"
    finally:
        settings.engine.cancel(handle)


async def _ready(events: asyncio.Queue[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The next event and every one already queued, consecutive deltas joined into one.

    When the client reads slower than the engine decodes, one chunk then carries several
    tokens' text instead of one chunk per token falling further behind.
    """
    out = [await events.get()]
    while not events.empty():
        kind, data = events.get_nowait()
        if kind == "delta" and out[-1][0] == "delta":
            out[-1] = ("delta", out[-1][1] + data)
        else:
            out.append((kind, data))
    return out


def _sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"
