"""OpenAI's error object (``{"error": {"message", "type", "param", "code"}}``) and statuses.

400 for a request the server cannot take as written (wrong type or range, a media URL
it will not read, a prompt longer than the model), 401 for a wrong or missing API key,
404 for an unknown model or path, 413 for a body over ``--max-request-mb``, 429 when
the queue is full, 503 while shutting down, 500 for a failure inside the model. Any other
exception a handler raises is answered with the same error object and status 500, and its
traceback is logged (the server keeps serving).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

log = logging.getLogger("mobius_runtime.serve")

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "requests",
    500: "server_error",
    503: "server_error",
}


class ApiError(Exception):
    """An error answered with ``status`` and OpenAI's error object."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def install(app: Any) -> None:
    """Answer every error of ``app`` with OpenAI's error object."""

    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems, param = [], None
        for err in exc.errors():
            if err.get("type") == "json_invalid":  # loc is (body, character offset)
                where = err.get("loc", ("body", "?"))[-1]
                reason = (err.get("ctx") or {}).get("error", "invalid JSON")
                message = f"the request body is not valid JSON: {reason} at character {where}"
                return ApiError(400, message, None, "invalid_json").response()
            loc = [str(p) for p in err.get("loc", ()) if p != "body"]
            # a union's alternatives (str | list[...]) name the branch tried: keep the field
            where = ".".join(p for p in loc if not p.startswith(("list[", "str", "int")))
            param = param or where or None
            problems.append(f"{where or 'body'}: {err.get('msg', 'invalid')}")
        message = "invalid request: " + "; ".join(problems)
        return ApiError(400, message, param, "invalid_value").response()

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        code = "request_too_large" if exc.status_code == 413 else None
        return ApiError(exc.status_code, str(exc.detail), None, code).response()

    app.add_middleware(_CatchAll)


class _CatchAll:
    """ASGI middleware: an exception no handler took → a 500 error object, logged once.

    (Starlette's own ``exception_handler(Exception)`` answers too but then re-raises,
    so uvicorn would log the traceback a second time.) A response that has started
    (a stream) cannot change its status: it is only logged and closed.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            log.error("%s %s failed", scope.get("method"), scope.get("path"), exc_info=exc)
            if not started:
                message = f"the server failed on this request ({type(exc).__name__}); see its log"
                response = ApiError(500, message, None, "internal_error").response()
                await response(scope, receive, send)
