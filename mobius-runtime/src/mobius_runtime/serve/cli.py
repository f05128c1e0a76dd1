"""``mobius serve PACKAGE``: the OpenAI-compatible server, run by uvicorn.

Needs the ``[serve]`` extra (FastAPI, uvicorn); without it the command says how to
install it. The port is bound before the model loads, so a busy one fails at once.
SIGINT / SIGTERM stop accepting connections and answer every open request with its 503
``shutting_down`` error object (a stream: an error chunk, then ``[DONE]``); connections
get ``GRACE_S`` seconds to take it; then the process waits for the engine thread to end
its current model step (it may be inside onnxruntime, which must not be torn down under
it) and exits with status 0.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from pathlib import Path
from typing import Annotated, Any

import typer

from mobius.cli._common import is_debug
from mobius.errors import MobiusError
from mobius_runtime.cli import SPIN_HELP, Threads
from mobius_runtime.limits import PREFILL_CHUNK

GRACE_S = 3
log = logging.getLogger("mobius_runtime.serve")


def serve(
    ctx: typer.Context,
    packages: Annotated[
        list[Path],
        typer.Argument(help="Model package folder (has mobius.json); with --ray, one or more."),
    ],
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Port (0: any free one).")
    ] = 8000,
    model_name: Annotated[
        str | None, typer.Option("--model-name", help="Model id (default: the folder's name).")
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", envvar="MOBIUS_API_KEY", help="Require `Bearer KEY`."),
    ] = None,
    api_key_file: Annotated[
        Path | None,
        typer.Option(
            "--api-key-file",
            help="Read the key from this file (its first line), keeping it out of `ps`.",
        ),
    ] = None,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--cors-origin",
            help="A browser origin allowed to call the API (repeatable; '*' for any).",
        ),
    ] = None,
    max_batch: Annotated[
        int, typer.Option("--max-batch", min=1, help="Requests decoded together.")
    ] = 8,
    max_queue: Annotated[
        int,
        typer.Option(
            "--max-queue",
            min=0,
            help="Requests waiting beyond the free batch slots before 429 (0: no queue).",
        ),
    ] = 64,
    prefix_cache_mb: Annotated[
        float,
        typer.Option(
            "--prefix-cache-mb",
            min=0.0,
            help="Keep recent prompts' KV rows (LRU, this many MB) for prompts that begin "
            "alike (0: off).",
        ),
    ] = 0.0,
    prefill_chunk: Annotated[
        int,
        typer.Option(
            "--prefill-chunk",
            min=0,
            help="Most prompt tokens prefilled between two decode steps, so new prompts "
            "never stall the running replies for longer than that: a longer prompt is "
            "prefilled this many tokens at a time, and short waiting prompts are prefilled "
            "together up to this many (padded) tokens. Smaller: smoother streaming while "
            "prompts arrive; larger: faster first tokens. 0: each prompt whole and alone.",
        ),
    ] = PREFILL_CHUNK,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    threads: Threads = None,
    spin: Annotated[str, typer.Option("--spin", help=SPIN_HELP)] = "auto",
    allow_remote_media: Annotated[
        bool,
        typer.Option(
            "--allow-remote-media",
            help="Fetch http(s) image URLs of public hosts (size/time limited).",
        ),
    ] = False,
    allow_private_media: Annotated[
        bool,
        typer.Option(
            "--allow-private-media",
            help="With --allow-remote-media: also loopback, private and link-local hosts.",
        ),
    ] = False,
    max_request_mb: Annotated[
        float,
        typer.Option("--max-request-mb", min=0.001, help="Largest request body (MB); 413 above."),
    ] = 8.0,
    literal_special: Annotated[
        bool,
        typer.Option(
            "--literal-special-in-content/--special-in-content",
            help="Special markers typed in messages (<|turn>, <|im_start|> ...) are plain "
            "text, so a client cannot forge a turn (the default); or control tokens, as HF.",
        ),
    ] = True,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Serve as a Ray Serve application: replicas, autoscaling, several packages "
            "(needs mobius-runtime[ray]).",
        ),
    ] = False,
    replicas: Annotated[
        int | None, typer.Option("--replicas", min=1, help="With --ray: replicas per package.")
    ] = None,
    autoscale: Annotated[
        str | None,
        typer.Option("--autoscale", help="With --ray: MIN:MAX replicas per package, autoscaled."),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="With --ray: join this cluster (default: start one)."),
    ] = None,
    replica_cpus: Annotated[
        float | None, typer.Option("--replica-cpus", min=0, help="With --ray: CPUs per replica.")
    ] = None,
    replica_gpus: Annotated[
        float | None, typer.Option("--replica-gpus", min=0, help="With --ray: GPUs per replica.")
    ] = None,
    write_ray_config: Annotated[
        Path | None,
        typer.Option(
            "--write-ray-config",
            help="With --ray: write a Ray Serve config file for `serve deploy` and exit.",
        ),
    ] = None,
) -> None:
    """Serve PACKAGE over the OpenAI HTTP API (chat, completions, streaming, batching)."""
    options = {
        "allow_remote_media": allow_remote_media,
        "allow_private_media": allow_private_media,
        "max_request_mb": max_request_mb,
        "literal_special": literal_special,
        "cors_origins": tuple(cors_origin or ()),
    }
    ray_flags = {
        "--replicas": replicas,
        "--autoscale": autoscale,
        "--ray-address": ray_address,
        "--replica-cpus": replica_cpus,
        "--replica-gpus": replica_gpus,
        "--write-ray-config": write_ray_config,
    }
    try:
        if api_key_file is not None:
            api_key = _key_from(api_key_file, api_key)
        if ray:
            from mobius_runtime.serve.ray_app import serve_on_ray

            serve_on_ray(packages, host, port, ray_flags, model_name, api_key=api_key,
                         max_batch=max_batch, max_queue=max_queue,
                         prefix_cache_mb=prefix_cache_mb, prefill_chunk=prefill_chunk,
                         device=device, threads=threads, spin=spin,
                         settings=options)  # fmt: skip
            return
        _single(packages, ray_flags)
        server = _server(
            packages[0],
            host,
            port,
            model_name,
            api_key,
            (max_batch, max_queue, prefix_cache_mb, prefill_chunk),
            device,
            (threads, spin),
            options,
        )
    except MobiusError as exc:
        if is_debug(ctx, debug):  # `mobius --debug serve` as well as `serve --debug`
            raise
        typer.echo(f"error: {exc.render()}", err=True)
        raise typer.Exit(1) from None
    try:
        server.run(sockets=[server.socket])
    except SystemExit as exc:  # uvicorn exits this way when it cannot start
        if exc.code in (0, None):
            raise
        server.started = False
    finally:
        # the engine thread may be inside onnxruntime: let it end its step before the
        # interpreter tears the session down (that aborts the process)
        server.settings.engine.stop(timeout=None)
    if not server.started:
        typer.echo(
            f"error: could not listen on {host}:{port} (uvicorn's log above says why)\n"
            "  fix: choose a free --port (0 picks one) or stop what holds this one",
            err=True,
        )
        raise typer.Exit(1)


def _key_from(path: Path, given: str | None) -> str:
    """The API key in the first line of ``path`` (surrounding whitespace dropped)."""
    if given is not None:
        raise MobiusError(
            "both --api-key (or MOBIUS_API_KEY) and --api-key-file are given",
            where="--api-key-file",
            fix="give the key one way",
        )
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise MobiusError(
            f"cannot read the API key file {path}: {exc}",
            where="--api-key-file",
            fix="pass a readable UTF-8 file whose first line is the key",
        ) from None
    key = lines[0].strip() if lines else ""
    if not key:
        raise MobiusError(
            f"the API key file {path} has an empty first line",
            where="--api-key-file",
            fix="write the key on the file's first line",
        )
    return key


def _single(packages: list[Path], ray_flags: dict[str, Any]) -> None:
    """Without --ray: one package, and no flag that only --ray reads."""
    given = [flag for flag, value in ray_flags.items() if value is not None]
    if given:
        raise MobiusError(
            f"{', '.join(given)} only apply to a Ray Serve application",
            where=given[0],
            fix="add --ray (needs mobius-runtime[ray]), or drop " + ", ".join(given),
        )
    if len(packages) > 1:
        raise MobiusError(
            f"{len(packages)} packages given; one `mobius serve` process serves one",
            where="PACKAGE",
            fix="serve one package, or serve several in one application with --ray",
        )


def _server(
    package: Path,
    host: str,
    port: int,
    model_name: str | None,
    api_key: str | None,
    batching: tuple[int, int, float],
    device: str,
    cpu: tuple[int | None, str],
    options: dict[str, Any],
) -> Any:

    try:
        import uvicorn

        from mobius_runtime.serve.app import Settings, create_app
    except ImportError as exc:
        raise MobiusError(
            f"`mobius serve` needs FastAPI and uvicorn ({exc})",
            where="mobius-runtime[serve]",
            fix='pip install "./mobius-runtime[serve]" (from a clone of the repository)',
        ) from None
    from mobius_runtime.cli import require_package
    from mobius_runtime.engine import Engine
    from mobius_runtime.pipeline import Pipeline

    require_package(package)
    _configure_logging()
    sock = _bind(host, port)  # before loading: a busy port fails in seconds, not minutes
    log.info("loading %s (device %s)", package, device)
    threads, spin = cpu
    pipeline = Pipeline.load(package, device=device, threads=threads, spin=spin)
    require_logits(pipeline)
    if api_key is None and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("listening on %s without --api-key: anyone who can reach it may use it", host)
    max_batch, max_queue, prefix_cache_mb, prefill_chunk = batching
    engine = Engine(
        pipeline,
        max_batch=max_batch,
        max_queue=max_queue,
        prefix_cache_mb=prefix_cache_mb,
        prefill_chunk=prefill_chunk,
    )
    name = model_name or package.resolve().name
    settings = Settings(engine, name, api_key, **options)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any):
        engine.start()
        yield
        settings.shut_down()  # the engine thread is joined after the loop ends

    app = create_app(settings)
    app.router.lifespan_context = lifespan
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        timeout_graceful_shutdown=GRACE_S,
        log_config=None,
        access_log=False,
    )
    server = _make_server(config, name, settings)
    server.socket = sock
    return server


def require_logits(pipeline: Any) -> None:
    """A one-line error for a package that cannot generate (no logits output)."""
    from mobius_runtime.errors import RequestError

    if pipeline.plan.logits is None:
        raise RequestError(
            "this package has no logits output, so it cannot generate",
            where="mobius.json: contract.outputs",
            fix="serve a text-generation package",
        )


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (uvicorn listens on it), or a one-line error."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        sock.bind(address)
    except OSError as exc:
        raise MobiusError(
            f"could not listen on {host}:{port}: {exc.strerror or exc}",
            where="--host / --port",
            fix="choose a free --port (0 picks one) or stop what holds this one",
        ) from None
    return sock


def _configure_logging() -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("mobius_runtime", "uvicorn"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        logger.propagate = False


def _make_server(config: Any, name: str, settings: Any) -> Any:
    """uvicorn's Server that logs the bound address and, on a signal, answers every open
    request with its 503 at once (then exits 0)."""
    import asyncio

    import uvicorn

    engine = settings.engine

    class Server(uvicorn.Server):
        loop: Any = None

        async def startup(self, sockets: Any = None) -> None:
            self.loop = asyncio.get_running_loop()
            await super().startup(sockets)
            for server in self.servers:
                for sock in server.sockets:
                    bound_host, bound_port = sock.getsockname()[:2]
                    log.info(
                        "serving %r at http://%s:%d/v1 (max batch %d, max queue %d, "
                        "prefill chunk %d)",
                        name,
                        bound_host,
                        bound_port,
                        engine.max_batch,
                        engine.max_queue,
                        engine.prefill_chunk,
                    )

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.should_exit and self.loop is not None:  # the first signal
                self.loop.call_soon_threadsafe(settings.shut_down)
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):  # type: ignore[override]
            with super().capture_signals():
                yield
                # the signal was handled by shutting down gracefully: uvicorn would
                # re-raise it once its handlers are restored; clear it so we exit 0
                self._captured_signals.clear()

    server = Server(config)
    server.settings = settings
    return server
