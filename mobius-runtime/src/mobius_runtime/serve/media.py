"""Media parts of a request → bytes for the family's processors.

Only ``data:`` URLs (base64) are read by default. ``http(s)://`` URLs are fetched only
when the server runs with ``--allow-remote-media``, with a size and a time limit;
``file://`` and every other scheme are always refused, so a request can never make
the server read its own files.
"""

from __future__ import annotations

import base64
import binascii

from mobius_runtime.serve.errors import ApiError

MAX_MEDIA_BYTES = 20 * 1024 * 1024
FETCH_TIMEOUT_S = 10.0


def decode_base64(data: str, param: str) -> bytes:
    """``data`` (base64) as bytes, or a 400 naming ``param``."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "media data is not valid base64", param, "invalid_value") from None
    if not raw:
        raise ApiError(400, "media data is empty", param, "invalid_value")
    if len(raw) > MAX_MEDIA_BYTES:
        raise ApiError(400, f"media is larger than {MAX_MEDIA_BYTES} bytes", param, "too_large")
    return raw


def url_bytes(url: str, param: str, allow_remote: bool) -> bytes:
    """The bytes an ``image_url`` points to (see the module doc for what is read)."""
    if url.startswith("data:"):
        header, sep, payload = url[5:].partition(",")
        if not sep or not header.endswith(";base64"):
            raise ApiError(
                400,
                "data URLs must be base64: data:<type>;base64,<data>",
                param,
                "invalid_value",
            )
        return decode_base64(payload, param)
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in ("http", "https"):
        if not allow_remote:
            raise ApiError(
                400,
                "this server reads only data: URLs; send the image as "
                "data:image/png;base64,... (or start the server with --allow-remote-media)",
                param,
                "invalid_url",
            )
        return _fetch(url, param)
    raise ApiError(
        400,
        f"URL scheme {scheme or '(none)'!r} is not read; send a data: URL",
        param,
        "invalid_url",
    )


def _fetch(url: str, param: str) -> bytes:
    import time

    import httpx

    chunks, size = [], 0
    deadline = time.monotonic() + FETCH_TIMEOUT_S
    try:
        with httpx.stream("GET", url, timeout=FETCH_TIMEOUT_S, follow_redirects=True) as r:
            if r.status_code != 200:
                raise ApiError(400, f"fetching {url} answered HTTP {r.status_code}", param)
            for chunk in r.iter_bytes():
                size += len(chunk)
                if size > MAX_MEDIA_BYTES:
                    raise ApiError(400, f"{url} is larger than {MAX_MEDIA_BYTES} bytes", param)
                if time.monotonic() > deadline:
                    raise ApiError(400, f"fetching {url} took over {FETCH_TIMEOUT_S} s", param)
                chunks.append(chunk)
    except httpx.HTTPError as exc:
        raise ApiError(400, f"cannot fetch {url}: {exc}", param, "invalid_url") from None
    return b"".join(chunks)
