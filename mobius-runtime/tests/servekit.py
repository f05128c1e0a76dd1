"""A `mobius serve` app running in this process on 127.0.0.1 (a free port), for tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class Running:
    url: str  # http://127.0.0.1:PORT
    pipeline: Any
    engine: Any
    settings: Any

    def client(self, api_key: str = "none", **kwargs: Any) -> Any:
        import openai

        return openai.OpenAI(
            base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=60, **kwargs
        )


@contextlib.contextmanager
def running(
    pipeline: Any,
    *,
    name: str = "tiny",
    api_key: str | None = None,
    max_batch: int = 8,
    max_queue: int = 16,
    start_engine: bool = True,
    allow_remote_media: bool = False,
    prefix_cache_mb: float = 0.0,
    **options: Any,
) -> Iterator[Running]:
    """Serve ``pipeline`` until the block ends (the engine is started unless told not to).

    ``options`` are :class:`~mobius_runtime.serve.app.Settings`' keyword options.
    """
    import uvicorn

    from mobius_runtime.engine import Engine
    from mobius_runtime.serve.app import Settings, create_app

    engine = Engine(
        pipeline, max_batch=max_batch, max_queue=max_queue, prefix_cache_mb=prefix_cache_mb
    )
    settings = Settings(engine, name, api_key, allow_remote_media, **options)
    app = create_app(settings)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan="off", log_level="warning", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    if start_engine:
        engine.start()
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield Running(f"http://127.0.0.1:{port}", pipeline, engine, settings)
    finally:
        server.should_exit = True
        thread.join(10)
        engine.stop()
        sock.close()
