"""The `mobius serve` command as a process: start-up line, request log, signals → exit 0."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

LISTENING = re.compile(r"serving 'pkg' at (http://127\.0\.0\.1:\d+)/v1")
REQUEST_LOG = re.compile(
    r"(cmpl-\w+) prompt_tokens=(\d+) completion_tokens=(\d+) ttft_ms=[\d.]+ "
    r"tokens_per_s=[\d.]+ finish=(\w+)"
)
LONG_PROMPT = [2, 5, 17, 33, 90, 11]
# prompts the tiny model answers with more than 600 tokens before any stop id (greedy)
ENDLESS = [[2, *np.random.default_rng(s).integers(7, 500, size=8).tolist()]
           for s in (12, 22, 29, 42, 44, 48)]  # fmt: skip


def _start(
    package, max_batch: int = 4, extra: tuple[str, ...] = (), wait_s: float = 120
) -> tuple[subprocess.Popen, str, list[str]]:
    code = "import sys; from mobius.cli import main; sys.exit(main())"
    args = [sys.executable, "-c", code, "serve", str(package), "--port", "0", "--device", "cpu",
            "--threads", "1", "--max-batch", str(max_batch), *extra]  # fmt: skip
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            lines.append(line)
            m = LISTENING.search(line)
            if m:
                found.append(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(wait_s) or not found:
        proc.kill()
        pytest.fail("the server did not start:\n" + "".join(lines[-20:]))
    return proc, found[0], lines


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_logs_requests_and_exits_0_on_signal(tiny_gqa_package, tmp_path, sig):
    package = tmp_path / "pkg"
    package.symlink_to(tiny_gqa_package, target_is_directory=True)
    proc, url, lines = _start(package)
    try:
        body = {"model": "pkg", "prompt": "hi", "max_tokens": 3, "temperature": 0}
        r = httpx.post(url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        rid = r.json()["id"]
        # a long stream is running when the signal comes
        streamed: list[str] = []
        body = {"model": "pkg", "prompt": LONG_PROMPT, "max_tokens": 3000, "stream": True}

        def stream() -> None:
            try:
                with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as s:
                    for line in s.iter_lines():
                        streamed.append(line)
            except httpx.HTTPError:
                pass  # the server may cut the stream when its grace period ends

        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        deadline = time.monotonic() + 30
        while len(streamed) < 4:
            assert time.monotonic() < deadline, "the stream did not start"
            time.sleep(0.02)
        sent = time.monotonic()
        proc.send_signal(sig)
        assert proc.wait(timeout=15) == 0, "".join(lines[-20:])
        assert time.monotonic() - sent < 8, "shutdown took too long"
        reader.join(10)
        # OpenAI has no "cancelled" finish_reason: a stream cut by shutdown ends in an error
        assert not any('"finish_reason": "cancelled"' in line for line in streamed)
        ended = any(
            '"finish_reason": "stop"' in x or '"finish_reason": "length"' in x for x in streamed
        )
        if "data: [DONE]" in streamed and not ended:  # cut by the shutdown, within its grace
            assert any('"code": "shutting_down"' in line for line in streamed), streamed[-6:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    logged = {m.group(1): m.groups() for m in map(REQUEST_LOG.search, lines) if m}
    assert rid in logged and logged[rid][2:] == ("3", "max_new_tokens"), "".join(lines)
    assert len(logged) == 2, "the interrupted stream is logged as well"


def test_serve_without_a_package_is_a_one_line_error(tmp_path):
    import typer
    from typer.testing import CliRunner

    from mobius_runtime.serve.cli import serve

    app = typer.Typer()
    app.command("serve")(serve)
    app.command("noop", hidden=True)(lambda: None)
    result = CliRunner().invoke(app, ["serve", str(tmp_path / "missing")])
    assert result.exit_code == 1
    assert "does not exist" in result.output and "Traceback" not in result.output


def test_a_port_in_use_is_a_one_line_error(tiny_gqa_package):
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    code = "import sys; from mobius.cli import main; sys.exit(main())"
    args = [sys.executable, "-c", code, "serve", str(tiny_gqa_package), "--port", str(port),
            "--device", "cpu"]  # fmt: skip
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    finally:
        taken.close()
    assert done.returncode == 1
    assert f"could not listen on 127.0.0.1:{port}: Address already in use" in done.stderr
    assert "fix: choose a free --port" in done.stderr
    assert "loading" not in done.stderr, "the port was tried only after loading the model"
    assert "Traceback" not in done.stderr


def test_sigterm_answers_every_open_request_with_its_503(tiny_gqa_package, tmp_path):
    """Six running streams and two waiting whole answers, then SIGTERM: six error chunks
    (``shutting_down``) each followed by [DONE], two HTTP 503 objects, exit status 0."""
    package = tmp_path / "pkg"
    package.symlink_to(tiny_gqa_package, target_is_directory=True)
    proc, url, lines = _start(package, max_batch=8)
    streams: list[list[str]] = [[] for _ in ENDLESS]
    wholes: list[httpx.Response] = []
    failures: list[BaseException] = []

    def stream(i: int) -> None:
        body = {"model": "pkg", "prompt": ENDLESS[i], "max_tokens": 3000, "temperature": 0,
                "stream": True}  # fmt: skip
        try:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as s:
                for line in s.iter_lines():
                    if line:
                        streams[i].append(line)
        except BaseException as exc:
            failures.append(exc)

    def whole(i: int) -> None:
        body = {"model": "pkg", "prompt": ENDLESS[i], "max_tokens": 3000, "temperature": 0}
        try:
            wholes.append(httpx.post(url + "/v1/completions", json=body, timeout=60))
        except BaseException as exc:
            failures.append(exc)

    readers = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
    readers += [threading.Thread(target=whole, args=(i,)) for i in range(2)]
    started = lambda: min(len(s) for s in streams) >= 3 and _active(url) == 8  # noqa: E731
    _signal_when_started(proc, lines, readers, started, signal.SIGTERM)
    assert not failures, failures
    for lines_of_one in streams:
        assert lines_of_one[-1] == "data: [DONE]", lines_of_one[-3:]
        error = json.loads(lines_of_one[-2].removeprefix("data: "))["error"]
        assert error["code"] == "shutting_down" and error["type"] == "server_error"
        assert error["message"].startswith("the server is shutting down: this request was")
        assert not any('"finish_reason": "' in line for line in lines_of_one)
    assert [r.status_code for r in wholes] == [503, 503]
    for r in wholes:
        assert r.json()["error"]["code"] == "shutting_down"


def _active(url: str) -> int:
    """Requests the server is decoding now (its /health)."""
    try:
        return httpx.get(url + "/health", timeout=5).json()["active"]
    except httpx.HTTPError:
        return 0


def _in_engine(url: str) -> int:
    """Requests the server holds now: decoding or queued (its /health)."""
    try:
        health = httpx.get(url + "/health", timeout=5).json()
    except httpx.HTTPError:
        return 0
    return int(health["active"]) + int(health["queued"])


def _signal_when_started(proc, lines, clients, started, sig) -> None:
    """Start ``clients``, send ``sig`` once ``started()``; the server must exit 0."""
    try:
        for c in clients:
            c.start()
        deadline = time.monotonic() + 60
        while not started():
            assert time.monotonic() < deadline, "the requests did not start"
            time.sleep(0.005)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0, "".join(lines[-20:])
        for c in clients:
            c.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_signal_during_long_prefills_exits_0(tiny_gqa_package, tmp_path):
    """SIGINT while the engine prefills long prompts: the process waits for the engine's
    step to end (it is inside onnxruntime) and exits 0, not SIGABRT."""
    package = tmp_path / "pkg"
    package.symlink_to(tiny_gqa_package, target_is_directory=True)
    proc, url, lines = _start(package)
    rng = np.random.default_rng(5)
    statuses: list[int] = []

    def ask() -> None:
        prompt = [2, *rng.integers(7, 500, size=4000).tolist()]
        body = {"model": "pkg", "prompt": prompt, "max_tokens": 50}
        try:
            statuses.append(httpx.post(url + "/v1/completions", json=body, timeout=60).status_code)
        except httpx.HTTPError:
            statuses.append(0)

    clients = [threading.Thread(target=ask) for _ in range(4)]

    def reached() -> bool:  # all four in the server (was: the first one, which left the
        # others unconnected when the signal came: HTTP errors instead of 503s, under load)
        done = sum("prompt_tokens=" in x for x in lines)
        return done + _in_engine(url) >= 4 and (done or _active(url) > 0)

    _signal_when_started(proc, lines, clients, reached, signal.SIGINT)
    assert "terminate called" not in "".join(lines)
    assert len(statuses) == 4 and set(statuses) <= {200, 503}, statuses
