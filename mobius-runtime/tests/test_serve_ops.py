"""Operations of `mobius serve`: ``GET /metrics`` (parsed with prometheus_client's own
parser), CORS, ``/tokenize`` / ``/detokenize`` and ``--api-key-file``."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("fastapi")
parser = pytest.importorskip("prometheus_client.parser")

from servekit import running  # noqa: E402


def _scrape(url: str) -> dict[str, list]:
    r = httpx.get(url + "/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {f.name: f.samples for f in parser.text_string_to_metric_families(r.text)}


def _value(samples, name: str, **labels) -> float:
    found = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(found) == 1, (name, labels, samples)
    return found[0]


def test_metrics_count_requests_tokens_and_latencies(pipeline):
    with running(pipeline) as server:
        client = server.client()
        tokens = 0
        for n in (3, 5):
            out = client.completions.create(model="tiny", prompt="hi", max_tokens=n, temperature=0)
            tokens += out.usage.completion_tokens
        stream = client.completions.create(model="tiny", prompt="hey", max_tokens=4,
                                           temperature=0, stream=True,
                                           stream_options={"include_usage": True})  # fmt: skip
        tokens += [c for c in stream][-1].usage.completion_tokens
        bad = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": ""})
        assert bad.status_code == 400
        m = _scrape(server.url)
    requests = m["mobius_requests"]
    assert _value(requests, "mobius_requests_total", endpoint="/v1/completions", status="200") == 3
    assert _value(requests, "mobius_requests_total", endpoint="/v1/completions", status="400") == 1
    assert _value(m["mobius_generation_tokens"], "mobius_generation_tokens_total") == tokens
    assert _value(m["mobius_prompt_tokens"], "mobius_prompt_tokens_total") > 0
    ttft = m["mobius_time_to_first_token_seconds"]
    assert _value(ttft, "mobius_time_to_first_token_seconds_count") == 3
    assert _value(ttft, "mobius_time_to_first_token_seconds_bucket", le="+Inf") == 3
    assert _value(m["mobius_inter_token_latency_seconds"],
                  "mobius_inter_token_latency_seconds_count") == 3  # fmt: skip
    assert _value(m["mobius_queue_depth"], "mobius_queue_depth") == 0
    assert _value(m["mobius_batch_size"], "mobius_batch_size") == 0
    assert _value(m["mobius_batch_size_peak"], "mobius_batch_size_peak") >= 1
    assert _value(m["mobius_finished"], "mobius_finished_total", reason="max_new_tokens") == 3


def test_cors_allows_only_the_given_origins(pipeline):
    with running(pipeline, cors_origins=("https://app.example",)) as server:
        ask = {
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        }
        ok = httpx.options(server.url + "/v1/completions",
                           headers={"Origin": "https://app.example", **ask})  # fmt: skip
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == "https://app.example"
        other = httpx.options(server.url + "/v1/completions",
                              headers={"Origin": "https://evil.example", **ask})  # fmt: skip
        assert "access-control-allow-origin" not in other.headers
    with running(pipeline) as server:  # no --cors-origin: no CORS headers at all
        plain = httpx.get(server.url + "/health", headers={"Origin": "https://app.example"})
        assert "access-control-allow-origin" not in plain.headers


def test_tokenize_and_detokenize_round_trip(server, pipeline):
    r = httpx.post(server.url + "/tokenize", json={"model": "tiny", "prompt": "The sky is"})
    ids = r.json()["tokens"]
    assert ids == pipeline.generate(prompt="The sky is", max_new_tokens=1).prompt_ids
    assert r.json()["count"] == len(ids) and r.json()["max_model_len"] == pipeline.context_length
    back = httpx.post(server.url + "/detokenize", json={"model": "tiny", "tokens": ids})
    assert back.json()["prompt"] == pipeline.text.decode(ids)
    assert "The sky is" in back.json()["prompt"]
    bad = httpx.post(server.url + "/detokenize", json={"model": "tiny", "tokens": [10**9]})
    assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]["message"]
    both = httpx.post(server.url + "/tokenize", json={"model": "tiny", "prompt": "a",
                                                      "messages": [{"role": "user", "content": "a"}]})  # fmt: skip
    assert both.status_code == 400


def test_the_api_key_file_holds_the_key(pipeline, tmp_path):
    from mobius.errors import MobiusError
    from mobius_runtime.serve.cli import _key_from

    path = tmp_path / "key"
    path.write_text("s3cret-key\n# a comment line is not part of it\n")
    key = _key_from(path, None)
    assert key == "s3cret-key"
    with running(pipeline, api_key=key) as server:
        assert httpx.get(server.url + "/v1/models").status_code == 401
        auth = {"Authorization": "Bearer s3cret-key"}
        assert httpx.get(server.url + "/v1/models", headers=auth).status_code == 200
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for bad, given, words in ((empty, None, "empty first line"), (tmp_path / "none", None,
                              "cannot read"), (path, "k", "both")):  # fmt: skip
        with pytest.raises(MobiusError, match=words):
            _key_from(bad, given)


def test_serve_with_an_unreadable_key_file_is_a_one_line_error(tmp_path):
    import typer
    from typer.testing import CliRunner

    from mobius_runtime.serve.cli import serve

    app = typer.Typer()
    app.command("serve")(serve)
    app.command("noop", hidden=True)(lambda: None)
    result = CliRunner().invoke(
        app, ["serve", str(tmp_path), "--api-key-file", str(tmp_path / "k")]
    )
    assert result.exit_code == 1
    assert "cannot read the API key file" in result.output and "Traceback" not in result.output
