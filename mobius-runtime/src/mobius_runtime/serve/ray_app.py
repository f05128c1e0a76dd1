"""``mobius serve --ray``: the OpenAI server as one Ray Serve application (the ``[ray]`` extra).

Ray Serve does the cluster work (replicas as actors, load balancing, autoscaling, restarts,
multi-node placement, draining); this module only says what runs in each replica:

* one deployment per package (:class:`ModelServer`): each replica loads the package
  (``Pipeline.load`` runs the package check of ``mobius verify`` first), starts one
  batching :class:`~mobius_runtime.engine.Engine` and keeps the FastAPI app
  :func:`~mobius_runtime.serve.app.create_app` builds for ``mobius serve``: the same
  endpoints, errors and auth. :meth:`ModelServer.forward` runs one HTTP request through
  that app in the replica and streams its response messages back through Ray as the app
  sends them (SSE chunks as tokens are made). ``max_ongoing_requests`` is the engine's
  batch size, so Ray never hands a replica more requests than it decodes together.
* the ingress (:class:`Ingress`), Ray Serve's FastAPI integration (``@serve.ingress``):
  picks the deployment by the body's ``model`` and forwards the request through a streaming
  ``DeploymentHandle`` (Ray's router picks the replica). A client that disconnects cancels
  the handle's call, which cancels the app's request in the replica, which frees its
  engine slot. A replica that dies under a request answers it with an OpenAI error object
  (503 ``replica_failed``; in a stream: an error chunk, then ``data: [DONE]``); Ray
  restarts the replica. ``/health`` says how many replicas of each model run.

Ray is imported lazily: the module imports without it; :func:`require_ray` says how to
install it. :func:`build` is the application builder for ``serve deploy`` config files
(``import_path: mobius_runtime.serve.ray_app:build``); ``mobius serve --ray`` runs the
same application with ``serve.run`` (:func:`run`).
"""

# no `from __future__ import annotations`: FastAPI reads the annotations of the ingress
# routes, whose types are imported where the routes are made
import asyncio
import contextlib
import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mobius.errors import MobiusError
from mobius_runtime.limits import PREFILL_CHUNK

log = logging.getLogger("mobius_runtime.serve")

APP_NAME = "mobius"  # the Ray Serve application's name (`serve status`, `serve delete`)
REPLICA_HEADER = "x-mobius-replica"  # names the replica that answered
DRAIN_S = 60.0  # a replica being stopped waits this long for its in-flight requests
HEALTH_PERIOD_S = 5.0  # how often Ray calls each replica's check_health
INGRESS_MAX_ONGOING = 10_000  # the ingress only forwards: the replicas bound the work
POST_PATHS = ("v1/chat/completions", "v1/completions")  # the bodies carry `model`
HOP_BY_HOP = {b"content-length", b"transfer-encoding", b"connection"}


def require_ray() -> tuple[Any, Any]:
    """``(ray, ray.serve)``, or a one-line error naming the extra to install."""
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        raise MobiusError(
            f"`mobius serve --ray` needs Ray Serve ({exc})",
            where="mobius-runtime[ray]",
            fix='pip install "./mobius-runtime[ray,serve]" (from a clone of the repository), '
            "or serve without --ray",
        ) from None
    return ray, serve


# ---------------------------------------------------------------------- options


@dataclass
class Model:
    """One package of the application and the model id clients ask for."""

    path: str
    name: str
    replicas: int | None = None  # this model's fixed replica count (default: the options')


@dataclass
class RayOptions:
    """Everything the application needs; plain data, so a ``serve deploy`` config's
    ``args`` carry it (:func:`build`) as well as ``mobius serve --ray`` (:func:`run`)."""

    models: list[Model]
    replicas: int = 1
    autoscale: tuple[int, int] | None = None  # (min, max) replicas per model
    replica_cpus: float = 1.0
    replica_gpus: float = 0.0
    max_batch: int = 8
    max_queue: int = 64  # requests waiting at the ingress per model beyond the replicas' slots
    prefix_cache_mb: float = 0.0  # each replica's own prefix cache (mobius_runtime.prefix_cache)
    prefill_chunk: int = PREFILL_CHUNK  # prompt ids prefilled between two decode steps
    device: str = "auto"
    threads: int | None = None
    spin: str = "auto"  # onnxruntime intra-op spinning (mobius_runtime.ort_sessions.decide_spin)
    api_key: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # Settings' keyword options

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> "RayOptions":
        """From a config file's ``args`` (also reads ``MOBIUS_API_KEY`` when no key is given)."""
        args = dict(args)
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(args) - known)
        if unknown:
            raise MobiusError(
                f"unknown option(s) {', '.join(unknown)} in the application's args",
                where="the Ray Serve config's applications[].args",
                fix=f"use only {', '.join(sorted(known))}",
            )
        models = args.pop("models", None)
        if not models:
            raise MobiusError(
                "the application's args name no model",
                where="the Ray Serve config's applications[].args.models",
                fix="list the packages: models: [{path: /shared/pkg, name: my-model}]",
            )
        autoscale = args.pop("autoscale", None)
        opts = cls([Model(**m) for m in models], **args)
        opts.autoscale = None if autoscale is None else (int(autoscale[0]), int(autoscale[1]))
        if opts.api_key is None:
            opts.api_key = os.environ.get("MOBIUS_API_KEY")
        return opts

    def to_args(self, *, with_key: bool = True) -> dict[str, Any]:
        out = asdict(self)
        out["autoscale"] = None if self.autoscale is None else list(self.autoscale)
        if not with_key:
            out.pop("api_key")
        return out


def parse_autoscale(text: str) -> tuple[int, int]:
    """``"MIN:MAX"`` → ``(MIN, MAX)``, 0 <= MIN <= MAX, MAX >= 1."""
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if not m or int(m[2]) < 1 or int(m[1]) > int(m[2]):
        raise MobiusError(
            f"--autoscale {text!r} is not MIN:MAX replicas",
            where="--autoscale",
            fix="give two whole numbers, MIN <= MAX and MAX >= 1, e.g. --autoscale 1:4",
        )
    return int(m[1]), int(m[2])


def deployment_options(opts: RayOptions, model: Model) -> dict[str, Any]:
    """What each model deployment gets from the flags (the docs' table says the same).

    Autoscaling aims at three quarters of the batch per replica, so a replica is added
    before the others are full; ``max_ongoing_requests`` is the batch itself.
    """
    out: dict[str, Any] = {
        "max_ongoing_requests": opts.max_batch,
        "max_queued_requests": opts.max_queue,
        "ray_actor_options": {"num_cpus": opts.replica_cpus, "num_gpus": opts.replica_gpus},
        "graceful_shutdown_timeout_s": DRAIN_S,
        "health_check_period_s": HEALTH_PERIOD_S,
    }
    if opts.autoscale is None:
        out["num_replicas"] = model.replicas or opts.replicas
    else:
        low, high = opts.autoscale
        out["autoscaling_config"] = {
            "min_replicas": low,
            "max_replicas": high,
            "initial_replicas": max(low, 1),
            "target_ongoing_requests": max(1.0, 0.75 * opts.max_batch),
        }
    return out


def deployment_name(index: int, name: str) -> str:
    return f"model{index}-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:48]


# ---------------------------------------------------------------------- the replicas


class ModelServer:
    """One replica: one package, one engine, the ``mobius serve`` FastAPI app around it."""

    def __init__(self, model: dict[str, str], opts: dict[str, Any]) -> None:
        from ray import serve

        from mobius_runtime.engine import Engine
        from mobius_runtime.pipeline import Pipeline
        from mobius_runtime.serve.app import Settings, create_app
        from mobius_runtime.serve.cli import require_logits

        options = RayOptions.from_args({**opts, "models": [model]})
        # Pipeline.load checks the package as `mobius verify` does before opening it
        pipeline = Pipeline.load(
            model["path"], device=options.device, threads=options.threads, spin=options.spin
        )
        require_logits(pipeline)
        # max_queue: room for a request Ray sends as one leaves, before the engine's next
        # step has freed its slot; Ray itself never sends more than max_batch at once
        self.engine = Engine(
            pipeline,
            max_batch=options.max_batch,
            max_queue=options.max_batch,
            prefix_cache_mb=options.prefix_cache_mb,
            prefill_chunk=options.prefill_chunk,
        )
        self.settings = Settings(self.engine, model["name"], options.api_key, **options.settings)
        self.app = create_app(self.settings)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.engine.start()
        log.info("replica %s serves %r from %s", self.replica, model["name"], model["path"])

    async def forward(
        self, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Any:
        """Run one HTTP request through the app; yield ``{"status", "headers"}``, then the
        body's bytes as the app sends them. Cancelled (the client left): the app sees a
        disconnect and cancels its engine request."""
        sent: asyncio.Queue[Any] = asyncio.Queue()
        gone = asyncio.Event()
        given = False

        async def receive() -> dict[str, Any]:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": query,
            "headers": headers,
            "client": None,
            "server": None,
        }
        task = asyncio.ensure_future(self.app(scope, receive, sent.put))
        task.add_done_callback(lambda _: sent.put_nowait(None))
        try:
            while (message := await sent.get()) is not None:
                if message["type"] == "http.response.start":
                    tagged = [
                        *message.get("headers", []),
                        (REPLICA_HEADER.encode(), self.replica.encode()),
                    ]
                    yield {"status": message["status"], "headers": tagged}
                elif message["type"] == "http.response.body":
                    if message.get("body"):
                        yield message["body"]
                    if not message.get("more_body"):
                        break
        finally:
            gone.set()  # a stream still running sees its client leave: the engine drops it
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, timeout=5)

    def stats(self) -> dict[str, Any]:
        """This replica's engine: requests decoding and queued, finished by reason."""
        engine = self.engine
        return {
            "replica": self.replica,
            "active": engine.active,
            "queued": engine.queued,
            "finished": {str(k): v for k, v in engine.finished.items()},
        }

    def check_health(self) -> None:
        """Ray calls this every ``HEALTH_PERIOD_S``; raising makes it replace the replica."""
        if not self.engine.running:
            raise RuntimeError(f"replica {self.replica}: the engine thread has stopped")

    def __del__(self) -> None:
        # Ray calls this after draining (graceful_shutdown_timeout_s): end the engine's step
        settings = getattr(self, "settings", None)
        if settings is not None:
            settings.engine.stop(timeout=5)


# ---------------------------------------------------------------------- the ingress


class Ingress:
    """The HTTP entry: routes by ``model`` to the model deployments, streams their answers."""

    def __init__(self, handles: dict[str, Any], opts: dict[str, Any]) -> None:
        from ray import serve

        options = RayOptions.from_args(opts)
        self.handles = handles  # model name -> DeploymentHandle
        self.names = list(handles)
        self.deployments = {
            m.name: deployment_name(i, m.name) for i, m in enumerate(options.models)
        }
        self.api_key = None if options.api_key is None else options.api_key.encode("utf-8")
        self.max_request_mb = options.settings.get("max_request_mb")
        self.app_name = serve.get_replica_context().app_name

    def __serve_build_asgi_app__(self) -> Any:
        return _ingress_app(self)

    # the routing: which deployment answers a request

    def pick(self, request: Any, body: bytes) -> str:
        """The model a request goes to: the one its body names; with one model, that one
        (its own app answers a wrong name as the single-process server does)."""
        from mobius_runtime.serve.app import check_key, unknown_model

        if len(self.names) == 1:
            return self.names[0]
        name = _named_model(request.url.path, body)
        if name is None or name in self.handles:
            return name or self.names[0]  # no name: the app's own 400/422 explains it
        check_key(self.api_key, request)
        raise unknown_model(name, ", ".join(repr(n) for n in self.names))

    async def forward(self, name: str, request: Any, body: bytes) -> Any:
        """The replica's answer: an SSE stream relayed as it comes, or the whole body."""
        from fastapi.responses import Response, StreamingResponse

        call = self.handles[name].options(stream=True).forward
        answer = call.remote(request.method, request.url.path, request.url.query.encode(),
                             list(request.headers.raw), body)  # fmt: skip
        relayed = False
        try:
            start = await _next(answer, name)
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in start["headers"]
                       if k.lower() not in HOP_BY_HOP}  # fmt: skip
            if headers.get("content-type", "").startswith("text/event-stream"):
                relayed = True
                return StreamingResponse(_relay(answer, name), start["status"], headers)
            chunks = [chunk async for chunk in _guarded(answer, name)]
            return Response(b"".join(chunks), start["status"], headers)
        finally:
            if not relayed:
                answer.cancel()  # done already, or the client left while it was running

    async def models(self, request: Any) -> dict[str, Any]:
        """``/v1/models`` of every model, each as its own app lists it (auth: theirs)."""
        from fastapi.responses import Response

        cards: list[Any] = []
        for name in self.names:
            answer = await self.forward(name, request, b"")
            if answer.status_code != 200:
                return answer
            cards.extend(json.loads(answer.body)["data"])
        return Response(json.dumps({"object": "list", "data": cards}), 200,
                        media_type="application/json")  # fmt: skip

    def health(self) -> tuple[int, dict[str, Any]]:
        """How many replicas of each model run (Ray's view); 503 while one has none."""
        from ray import serve

        app = serve.status().applications.get(self.app_name)
        models: dict[str, Any] = {}
        for name, deployment in self.deployments.items():
            status = None if app is None else app.deployments.get(deployment)
            states = {} if status is None else {str(getattr(k, "value", k)): v
                                                for k, v in status.replica_states.items()}  # fmt: skip
            models[name] = {
                "status": "UNKNOWN"
                if status is None
                else str(getattr(status.status, "value", status.status)),
                "running_replicas": states.get("RUNNING", 0),
                "replicas": states,
            }
        ok = all(m["running_replicas"] > 0 for m in models.values())
        return (200 if ok else 503), {"status": "ok" if ok else "unavailable", "models": models}


def _ingress_app(ingress: Ingress) -> Any:
    from fastapi import FastAPI, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse

    from mobius_runtime.serve import errors
    from mobius_runtime.serve.app import DEFAULT_MAX_REQUEST_MB, BodyLimit

    app = FastAPI(title="mobius serve --ray", docs_url=None, redoc_url=None, openapi_url=None)
    errors.install(app)
    mb = ingress.max_request_mb or DEFAULT_MAX_REQUEST_MB
    app.add_middleware(BodyLimit, limit=int(mb * 1024 * 1024))

    @app.get("/health")
    async def health() -> Any:
        code, body = await run_in_threadpool(ingress.health)
        return JSONResponse(body, status_code=code)

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        return await ingress.models(request)

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def anything(path: str, request: Request) -> Any:
        body = await request.body()
        return await ingress.forward(ingress.pick(request, body), request, body)

    return app


def _named_model(path: str, body: bytes) -> str | None:
    """The ``model`` a request's body or path names, if any."""
    if path.lstrip("/") in POST_PATHS:
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            data = json.loads(body)
            if isinstance(data, dict) and isinstance(data.get("model"), str):
                return data["model"]
        return None
    prefix = "/v1/models/"
    return path[len(prefix) :] if path.startswith(prefix) else None


def _failure(exc: Exception, name: str) -> Any:
    """The OpenAI error object for a replica that failed or was too busy."""
    from ray.serve.exceptions import BackPressureError

    from mobius_runtime.serve.errors import ApiError

    if isinstance(exc, BackPressureError):
        return ApiError(429, f"the {name!r} replicas are busy and their queue is full "
                        "(--max-queue); retry later", None, "queue_full")  # fmt: skip
    log.warning("a %r replica failed under a request: %s: %s", name, type(exc).__name__, exc)
    return ApiError(
        503,
        f"the replica serving this {name!r} request stopped "
        f"({type(exc).__name__}); retry it: the other replicas (or its restart) take it",
        None,
        "replica_failed",
    )


async def _next(answer: Any, name: str) -> Any:
    try:
        return await answer.__anext__()
    except (asyncio.CancelledError, StopAsyncIteration):
        raise
    except Exception as exc:
        raise _failure(exc, name) from None


async def _guarded(answer: Any, name: str) -> Any:
    try:
        async for chunk in answer:
            yield chunk
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        raise _failure(exc, name) from None


async def _relay(answer: Any, name: str) -> Any:
    """An SSE body chunk by chunk; a replica lost mid-stream ends it with an error chunk."""
    from mobius_runtime.serve.app import _sse
    from mobius_runtime.serve.errors import ApiError

    try:
        async for chunk in _guarded(answer, name):
            yield chunk
    except ApiError as exc:
        yield _sse(exc.body())
        yield "data: [DONE]\n\n"
    finally:
        answer.cancel()  # the client left: the replica's app sees a disconnect


# ---------------------------------------------------------------------- building it


def application(opts: RayOptions) -> Any:
    """The Ray Serve application: one deployment per model, the ingress in front."""
    _, serve = require_ray()
    names = [m.name for m in opts.models]
    if len(set(names)) != len(names):
        raise MobiusError(
            f"two packages have the same model name ({', '.join(names)})",
            where="the packages' folder names",
            fix="rename a folder, or serve them from folders with different names",
        )
    args = opts.to_args()
    model_cls = serve.deployment(ModelServer)
    handles = {}
    for i, model in enumerate(opts.models):
        options = deployment_options(opts, model) | {"name": deployment_name(i, model.name)}
        handles[model.name] = model_cls.options(**options).bind(asdict(model), args)
    ingress = serve.deployment(
        serve.ingress()(Ingress),
        name="ingress",
        max_ongoing_requests=INGRESS_MAX_ONGOING,
        ray_actor_options={"num_cpus": 0},
        graceful_shutdown_timeout_s=DRAIN_S,
    )
    return ingress.bind(handles, args)


def build(args: dict[str, Any]) -> Any:
    """The application builder for a Ray Serve config (``serve deploy FILE``)::

    applications:
      - name: mobius
        route_prefix: /
        import_path: mobius_runtime.serve.ray_app:build
        args: {models: [{path: /shared/pkg, name: tiny}], replicas: 2}
    """
    return application(RayOptions.from_args(args))


def config_file(opts: RayOptions, host: str, port: int) -> dict[str, Any]:
    """The ``serve deploy`` config for ``opts`` (the API key is not written: the
    replicas read ``MOBIUS_API_KEY``, set it in ``runtime_env.env_vars``)."""
    return {
        "http_options": {"host": host, "port": port},
        "applications": [
            {
                "name": APP_NAME,
                "route_prefix": "/",
                "import_path": "mobius_runtime.serve.ray_app:build",
                "args": opts.to_args(with_key=False),
            }
        ],
    }


def write_config(opts: RayOptions, host: str, port: int, path: Path) -> None:
    """Write :func:`config_file` as YAML to a new file ``path`` (never over an existing one)."""
    import yaml

    text = yaml.safe_dump(config_file(opts, host, port), sort_keys=False)
    try:
        with open(path, "x", encoding="utf-8") as f:
            f.write("# Ray Serve config for `serve deploy` (written by `mobius serve --ray`)\n")
            f.write(text)
    except FileExistsError:
        raise MobiusError(
            f"{path} exists already",
            where="--write-ray-config",
            fix="choose a new file name, or remove that file yourself",
        ) from None


def run(opts: RayOptions, host: str, port: int, address: str | None) -> None:
    """``mobius serve --ray``: start (or join) Ray, run the application, serve until a
    signal, then delete the application (Ray drains its in-flight requests first)."""
    import signal
    import threading

    ray, serve = require_ray()
    app = application(opts)
    local = address is None
    # "local": a Ray instance of its own, even where `ray start` runs one on this machine
    ray.init(address=address or "local", include_dashboard=False if local else None,
             log_to_driver=True, ignore_reinit_error=True)  # fmt: skip
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
        for model in opts.models:
            log.info("serving %r at http://%s:%d/v1 (Ray Serve, %s, max batch %d)", model.name,
                     host, port, _scaling(opts), opts.max_batch)  # fmt: skip
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
        log.info("stopping: draining in-flight requests (at most %.0f s)", DRAIN_S)
        serve.delete(APP_NAME)
        if local:
            serve.shutdown()
    finally:
        ray.shutdown()


def _scaling(opts: RayOptions) -> str:
    if opts.autoscale is None:
        return f"{opts.replicas} replica(s)"
    return f"{opts.autoscale[0]}..{opts.autoscale[1]} replicas (autoscaled)"


def serve_on_ray(
    packages: list[Path],
    host: str,
    port: int,
    flags: dict[str, Any],
    model_name: str | None,
    **common: Any,
) -> None:
    """``mobius serve PKG... --ray``: the flags checked, then :func:`run` (or the config
    written, with ``--write-ray-config``). ``common``: the options ``mobius serve`` has
    without --ray, as :class:`RayOptions` names them (max_batch, api_key, settings, ...)."""
    from mobius_runtime.cli import require_package
    from mobius_runtime.serve.cli import _bind, _configure_logging

    require_ray()  # before anything else: the one thing a user without the extra must fix
    if flags["--replicas"] is not None and flags["--autoscale"] is not None:
        raise MobiusError(
            "--replicas and --autoscale both given",
            where="--replicas / --autoscale",
            fix="give a fixed --replicas N or an --autoscale MIN:MAX range, not both",
        )
    if model_name is not None and len(packages) > 1:
        raise MobiusError(
            "--model-name names one model but several packages are given",
            where="--model-name",
            fix="drop --model-name: each package is served under its folder's name",
        )
    address = flags["--ray-address"]
    for package in packages:
        # joining a cluster, the replicas' nodes read the path; this one may lack it
        if address is None or (package / "mobius.json").is_file():
            require_package(package)
        else:
            log.warning("%s is not here; the replicas' nodes must have it", package)
    models = [Model(str(p.resolve()), model_name or p.resolve().name) for p in packages]
    autoscale = flags["--autoscale"]
    opts = RayOptions(
        models,
        replicas=flags["--replicas"] or 1,
        autoscale=None if autoscale is None else parse_autoscale(autoscale),
        replica_cpus=1.0 if flags["--replica-cpus"] is None else flags["--replica-cpus"],
        replica_gpus=flags["--replica-gpus"] or 0.0,
        **common,
    )
    _configure_logging()
    if flags["--write-ray-config"] is not None:
        application(opts)  # the same checks as a run
        write_config(opts, host, port or 8000, flags["--write-ray-config"])
        log.info("wrote %s: `serve deploy %s` runs it", *[flags["--write-ray-config"]] * 2)
        return
    with _bind(host, port) as sock:  # a busy port fails now; port 0: pick a free one
        port = sock.getsockname()[1]
    run(opts, host, port, address)
