"""`mobius serve --ray`: the Ray Serve application on a local Ray cluster (num_cpus=2).

One cluster and one application for the whole module (starting them costs seconds):
model ``tiny`` (the bundled tiny Gemma 4, 2 replicas) and model ``tiny-b`` (the same
package under another name, 1 replica), half a CPU and one onnxruntime thread each.
Answers are compared with the single-process server (``servekit``) on the same package.
The replica-killing test runs last: it leaves a restarted replica behind.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time

import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from test_serve import IDS  # noqa: E402
from test_serve_cli import ENDLESS  # noqa: E402

from mobius_runtime.serve import ray_app  # noqa: E402

NEW = 12
KEY = "k3y"  # the application's --api-key
AUTH = {"authorization": f"Bearer {KEY}"}
WAIT_S = 180  # bound for Ray to (re)start a replica on a loaded 2-core machine


# no usage report (tests never reach the network), no auth token written to ~/.ray
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


@pytest.fixture(scope="module")
def cluster():
    import os
    import socket

    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def app(cluster, tiny_gqa_package):
    path = str(tiny_gqa_package)
    models = [ray_app.Model(path, "tiny", replicas=2), ray_app.Model(path, "tiny-b", replicas=1)]
    opts = ray_app.RayOptions(models, replica_cpus=0.5, threads=1, device="cpu", max_batch=4,
                              api_key=KEY, prefix_cache_mb=16)  # fmt: skip
    serve.run(ray_app.application(opts), name=ray_app.APP_NAME, route_prefix="/")
    return cluster


def client(url: str, key: str = "k3y") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def handle(model: str = "tiny"):
    index = ["tiny", "tiny-b"].index(model)
    name = ray_app.deployment_name(index, model)
    return serve.get_deployment_handle(name, app_name=ray_app.APP_NAME)


def all_stats(model: str = "tiny", replicas: int = 2) -> dict[str, dict]:
    """Each replica's engine stats (asked until every replica has answered once)."""
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + 60
    while len(seen) < replicas and time.monotonic() < deadline:
        stats = handle(model).stats.remote().result(timeout_s=30)
        seen[stats["replica"]] = stats
    assert len(seen) == replicas, f"only replicas {sorted(seen)} answered"
    return seen


def test_eight_concurrent_requests_equal_the_single_process_answers(app, server):
    want = [server.client().completions.create(model="tiny", prompt=p, max_tokens=NEW,
                                               temperature=0).choices[0].text for p in IDS]  # fmt: skip
    remote = client(app)

    def ask(prompt):
        raw = remote.completions.with_raw_response.create(
            model="tiny", prompt=prompt, max_tokens=NEW, temperature=0
        )
        return raw.parse().choices[0].text, raw.headers[ray_app.REPLICA_HEADER]

    replicas: set[str] = set()
    for _ in range(3):  # Ray picks replicas by their load: both get some within a few rounds
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(ask, IDS))
        assert [text for text, _ in got] == want
        replicas |= {replica for _, replica in got}
        if len(replicas) == 2:
            break
    assert len(replicas) == 2, f"one replica answered all: {replicas}"


def test_a_replica_reuses_its_prefix_cache_with_the_same_answer(app, server):
    """``mobius serve --ray --prefix-cache-mb N``: each replica keeps the KV rows of its
    recent prompts (``tiny-b`` has one replica, so the second prompt finds the first's)."""
    from test_prefix_cache import BASE, PROMPTS

    ray_client = client(app)
    ray_client.completions.create(model="tiny-b", prompt=PROMPTS[0], max_tokens=4, temperature=0)
    again = ray_client.completions.create(model="tiny-b", prompt=PROMPTS[1], max_tokens=NEW,
                                          temperature=0)  # fmt: skip
    want = server.client().completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=NEW,
                                              temperature=0)  # fmt: skip
    assert again.usage.prompt_tokens_details.cached_tokens == len(BASE)
    assert want.usage.prompt_tokens_details.cached_tokens == 0
    assert again.choices[0].text == want.choices[0].text


def test_a_stream_yields_chunks_as_tokens_are_made(app, server):
    want = server.client().completions.create(model="tiny", prompt=IDS[2], max_tokens=40,
                                              temperature=0).choices[0].text  # fmt: skip
    chat = client(app).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=20,
        temperature=0, stream=True,
    )  # fmt: skip
    chunks = list(chat)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    stream = client(app).completions.create(
        model="tiny", prompt=IDS[2], max_tokens=40, temperature=0, stream=True
    )
    texts = [c.choices[0].text for c in stream]
    assert sum(1 for t in texts[:-1] if t) > 1  # several text chunks before the finish chunk
    assert "".join(texts) == want


def test_a_client_that_leaves_mid_stream_frees_its_replicas_slot(app):
    before = all_stats()
    body = {"model": "tiny", "prompt": ENDLESS[0], "max_tokens": 1500, "temperature": 0,
            "stream": True}  # fmt: skip
    with httpx.stream("POST", app + "/v1/completions", json=body, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200
        replica = r.headers[ray_app.REPLICA_HEADER]
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    # the connection is closed: the replica's engine cancels the request at its next step
    deadline = time.monotonic() + 60
    while True:
        stats = all_stats()[replica]
        cancelled = stats["finished"].get("cancelled", 0)
        if stats["active"] == 0 and cancelled > before[replica]["finished"].get("cancelled", 0):
            break
        assert time.monotonic() < deadline, f"the slot was not freed: {stats}"
        time.sleep(0.2)
    assert stats["finished"].get("max_new_tokens", 0) == before[replica]["finished"].get(
        "max_new_tokens", 0
    )


def test_two_models_in_one_application_route_by_model(app):
    remote = client(app)
    assert sorted(m.id for m in remote.models.list().data) == ["tiny", "tiny-b"]
    b_replica = next(iter(all_stats("tiny-b", 1)))
    raw = remote.completions.with_raw_response.create(
        model="tiny-b", prompt=IDS[0], max_tokens=4, temperature=0
    )
    assert raw.parse().model == "tiny-b"
    assert raw.headers[ray_app.REPLICA_HEADER] == b_replica
    assert remote.models.retrieve("tiny-b").id == "tiny-b"
    with pytest.raises(openai.NotFoundError) as err:
        remote.completions.create(model="nope", prompt=IDS[0], max_tokens=4)
    assert err.value.code == "model_not_found" and "'tiny-b'" in err.value.message
    # the replicas' own errors pass through unchanged (here: the body's validation)
    with pytest.raises(openai.BadRequestError):
        remote.completions.create(model="tiny", prompt=IDS[0], max_tokens=-3)


def test_the_key_is_checked_as_by_the_single_process_server(app):
    stranger = client(app, key="wrong")
    for model in ("tiny", "tiny-b", "nope"):  # the replicas' check, and the ingress's own
        with pytest.raises(openai.AuthenticationError) as err:
            stranger.completions.create(model=model, prompt=IDS[0], max_tokens=2)
        assert err.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()
    assert httpx.get(app + "/health", timeout=30).status_code == 200  # no key needed


def test_health_reflects_the_replicas(app):
    health = httpx.get(app + "/health", timeout=30)
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "ok"
    assert body["models"]["tiny"]["running_replicas"] == 2
    assert body["models"]["tiny-b"]["running_replicas"] == 1


def test_a_killed_replica_fails_its_requests_with_an_error_and_is_restarted(app):
    remote = client(app)
    with contextlib.ExitStack() as open_streams:
        streams = []
        for prompt in ENDLESS[:4]:
            response = open_streams.enter_context(remote.completions.with_streaming_response.create(
                model="tiny", prompt=prompt, max_tokens=1500, temperature=0, stream=True
            ))  # fmt: skip
            stream = response.parse()
            assert next(iter(stream)).choices  # the request is running
            streams.append((response.headers[ray_app.REPLICA_HEADER], stream))
        victim, old = _kill_one_of(streams)
    # new requests are answered (by the survivor, then by the restarted replica too)
    out = remote.completions.create(model="tiny", prompt=IDS[0], max_tokens=4, temperature=0)
    assert out.choices[0].text
    deadline = time.monotonic() + WAIT_S
    while True:
        health = httpx.get(app + "/health", timeout=30).json()
        if health["models"]["tiny"]["running_replicas"] == 2:
            break
        assert time.monotonic() < deadline, f"the replica was not restarted: {health}"
        time.sleep(1)
    now = set(all_stats())
    assert victim not in now and len(now - old) == 1


def _kill_one_of(streams):
    """Kill the replica of the first stream: its streams end with an OpenAI error object
    (not a hang), the others run to their end. The replica ids before, and the victim."""
    victim = streams[0][0]
    old = set(all_stats())
    actor = ray.get_actor(
        f"SERVE_REPLICA::{ray_app.APP_NAME}#{ray_app.deployment_name(0, 'tiny')}#{victim}",
        namespace="serve",
    )
    ray.kill(actor, no_restart=True)

    def drain(stream):
        try:
            for _ in stream:
                pass
        except openai.APIError as exc:
            return exc
        return None

    with concurrent.futures.ThreadPoolExecutor(len(streams)) as pool:
        outcomes = list(pool.map(lambda s: drain(s[1]), streams))  # bounded by the client timeout
    for (replica, _), outcome in zip(streams, outcomes, strict=True):
        if replica == victim:
            assert outcome is not None, "a request on the killed replica ended normally"
            assert outcome.code == "replica_failed", outcome.body
        else:
            assert outcome is None, outcome
    return victim, old


def test_a_replica_whose_engine_stopped_fails_its_health_check(pipeline):
    """What Ray's health check reads: it replaces a replica whose engine thread ended."""
    from mobius_runtime.engine import Engine

    replica = ray_app.ModelServer.__new__(ray_app.ModelServer)  # no Ray replica context
    replica.engine, replica.replica = Engine(pipeline, max_batch=1), "r"
    with pytest.raises(RuntimeError, match="engine thread has stopped"):
        replica.check_health()  # not started
    replica.engine.start()
    replica.check_health()
    replica.engine.stop()
    with pytest.raises(RuntimeError, match="engine thread has stopped"):
        replica.check_health()
