"""Media parts of a request → bytes for the family's processors.

Only ``data:`` URLs (base64) are read by default. ``http(s)://`` URLs are fetched only
when the server runs with ``--allow-remote-media``, and then only from public
addresses: the host is resolved first and the connection goes to the address that was
checked (no second lookup), on every redirect as well; loopback, private, link-local,
multicast, reserved and unspecified addresses are refused unless the server also has
``--allow-private-media``. Every failure of a remote fetch (refused address, DNS
failure, closed port, HTTP status, size, time) answers one error text, so the server
cannot be used to map a network; the operator's log has the reason. ``file://`` and
every other scheme are always refused, so a request can never make the server read its
own files.

Fetches are asynchronous (they hold no worker thread) and at most ``MAX_FETCHES`` run
at once; an image's pixel count is read from its header and checked against
``MAX_IMAGE_PIXELS`` before anything decodes it (PIL's own decompression-bomb limit is
set to the same number), and the app preprocesses at most ``MAX_DECODES`` requests
with media at once.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import ipaddress
import logging
import socket
import warnings
from dataclasses import dataclass, field

from mobius_runtime.serve.errors import ApiError

MAX_MEDIA_BYTES = 20 * 1024 * 1024
FETCH_TIMEOUT_S = 10.0  # for the whole fetch, redirects included
MAX_REDIRECTS = 5
MAX_FETCHES = 8  # remote fetches at once (more wait, on the event loop)
MAX_DECODES = 2  # requests with media preprocessed (decoded, resized) at once
MAX_IMAGE_PIXELS = 40_000_000  # 40 MP: an 8K photo; a decoded RGB copy is 120 MB

log = logging.getLogger("mobius_runtime.serve")

FETCH_FAILED = (
    "the image URL could not be fetched: the server reads only public http(s) addresses "
    f"(not loopback, private, link-local, multicast or reserved ones) that answer HTTP 200 "
    f"with at most {MAX_MEDIA_BYTES} bytes within {FETCH_TIMEOUT_S:g} s, at most "
    f"{MAX_REDIRECTS} redirects away; send the image as a data: URL instead"
)


@dataclass
class Policy:
    """What a server fetches (its flags), and its bounds on concurrent fetches and decodes."""

    allow_remote: bool = False
    allow_private: bool = False
    fetches: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_FETCHES))
    decodes: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_DECODES))


class _Failed(Exception):
    """Why a remote fetch failed (logged for the operator, never told to the client)."""


def limit_image_pixels() -> None:
    """Set PIL's decompression-bomb limit to ``MAX_IMAGE_PIXELS`` (it errors past twice)."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS


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


def check_image(data: bytes, param: str) -> None:
    """A 400 unless ``data`` is an image whose header says at most ``MAX_IMAGE_PIXELS``."""
    from PIL import Image

    too_large = f"more than the {MAX_IMAGE_PIXELS} this server decodes; send a smaller image"
    try:
        with warnings.catch_warnings():  # between 1x and 2x the limit PIL only warns
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
    except Image.DecompressionBombError:  # past twice the limit PIL refuses to open it
        message = f"the image is over {2 * MAX_IMAGE_PIXELS} pixels, {too_large}"
        raise ApiError(400, message, param, "too_large") from None
    except (OSError, ValueError, SyntaxError):  # PIL's plugins raise these for bad files
        raise ApiError(
            400,
            "the image is not a file PIL can read (PNG, JPEG, WebP, GIF, ...)",
            param,
            "invalid_value",
        ) from None
    if width * height > MAX_IMAGE_PIXELS:
        message = f"the image is {width}x{height} pixels, {too_large}"
        raise ApiError(400, message, param, "too_large")


async def url_bytes(url: str, param: str, policy: Policy) -> bytes:
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
        if not policy.allow_remote:
            raise ApiError(
                400,
                "this server reads only data: URLs; send the image as "
                "data:image/png;base64,... (or start the server with --allow-remote-media)",
                param,
                "invalid_url",
            )
        async with policy.fetches:
            try:
                return await asyncio.wait_for(_fetch(url, policy), FETCH_TIMEOUT_S)
            except Exception as exc:  # _Failed, a timeout, httpx's and the socket's errors
                log.info("fetching %.200s failed: %s: %s", url, type(exc).__name__, exc)
        raise ApiError(400, FETCH_FAILED, param, "invalid_url")
    raise ApiError(
        400,
        f"URL scheme {scheme[:20] or '(none)'!r} is not read; send a data: URL",
        param,
        "invalid_url",
    )


def is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """True for a globally routable unicast address (an IPv4-mapped one judged as IPv4)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


async def _address(host: str, port: int, allow_private: bool) -> str:
    """The address to connect to for ``host``: every address it resolves to is checked."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise _Failed(f"{host} does not resolve: {exc}") from None
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    refused = [a for a in addresses if not is_public(a)]
    if refused and not allow_private:
        raise _Failed(f"{host} resolves to {refused[0]}, which is not a public address")
    if not addresses:
        raise _Failed(f"{host} resolves to no address")
    return str(addresses[0])


async def _fetch(url: str, policy: Policy) -> bytes:
    import httpx

    # trust_env=False: no proxy from the environment (it would connect on our behalf)
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            target = httpx.URL(url)
            if target.scheme not in ("http", "https") or not target.host:
                raise _Failed(f"{url!r} is not an http(s) URL")
            port = target.port or (443 if target.scheme == "https" else 80)
            address = await _address(target.host, port, policy.allow_private)
            pinned = target.copy_with(host=address)
            headers = {"Host": target.netloc.decode("ascii")}
            request = client.build_request(
                "GET", pinned, headers=headers, extensions={"sni_hostname": target.host}
            )
            response = await client.send(request, stream=True)
            try:
                if response.is_redirect:
                    url = str(target.join(response.headers.get("location", "")))
                    continue
                if response.status_code != 200:
                    raise _Failed(f"HTTP {response.status_code}")
                chunks, size = [], 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_MEDIA_BYTES:
                        raise _Failed(f"larger than {MAX_MEDIA_BYTES} bytes")
                    chunks.append(chunk)
                return b"".join(chunks)
            finally:
                await response.aclose()
    raise _Failed(f"more than {MAX_REDIRECTS} redirects")
