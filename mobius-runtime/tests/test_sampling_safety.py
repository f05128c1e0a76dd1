"""Sampling is numerically safe for every accepted setting, and one row's failure in a
batched step ends only that row (issue: one request could fail every request in its batch).

``temperature=1e-310`` used to divide the logits into ``inf`` and ``inf - inf = NaN``;
``rng.choice`` then raised "Probabilities contain NaN" inside the engine's batched step,
and the step's catch-all failed every request of the batch.
"""

from __future__ import annotations

import json
import threading
import warnings

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mobius_runtime.engine import Engine
from mobius_runtime.errors import RequestError
from mobius_runtime.sampling import Penalties, Sampler, SamplingParams, pick

VOCAB = 64

# every temperature the server or the CLI accepts, with the edges drawn often
temperatures = st.one_of(
    st.sampled_from([5e-324, 1e-310, 2.2e-308, 1e-30, 1e-6, 0.7, 1.0, 2.0, 1e30, 1.7e308]),
    st.floats(min_value=5e-324, max_value=1.7e308, allow_nan=False, allow_infinity=False),
)
top_ps = st.one_of(
    st.sampled_from([5e-324, 1e-300, 1e-9, 0.5, 0.9, 0.999999, 1.0]),
    st.floats(min_value=5e-324, max_value=1.0, allow_nan=False, exclude_min=False),
)
top_ks = st.one_of(st.sampled_from([0, 1, 2, VOCAB - 1, VOCAB, VOCAB + 1, 10**30]),
                   st.integers(0, 10**6))  # fmt: skip


def _logits(seed: int, masked: int, scale: float) -> np.ndarray:
    row = np.random.default_rng(seed).standard_normal(VOCAB) * scale
    row = np.clip(row, -3.4e38, 3.4e38).astype(np.float32)  # finite float32 logits
    row[np.random.default_rng(seed + 1).choice(VOCAB, size=masked, replace=False)] = -np.inf
    return row


@settings(max_examples=400, deadline=None)
@given(
    temperature=temperatures,
    top_k=top_ks,
    top_p=top_ps,
    seed=st.integers(0, 2**32),
    masked=st.integers(0, VOCAB - 1),
    scale=st.sampled_from([1e-30, 1.0, 30.0, 1e30, 3e38]),
    min_p=st.one_of(st.sampled_from([0.0, 5e-324, 1e-9, 0.1, 0.5, 1.0]), st.floats(0.0, 1.0)),
)
def test_pick_is_safe_for_every_accepted_setting(
    temperature, top_k, top_p, seed, masked, scale, min_p
):
    logits = _logits(seed, masked, scale)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy overflow / invalid-value warning either
        token = pick(logits, do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p,
                     rng=np.random.default_rng(seed), min_p=min_p)  # fmt: skip
    assert 0 <= token < VOCAB
    assert np.isfinite(logits[token]), "a masked (-inf) token was drawn"
    if top_k:
        assert logits[token] >= np.sort(logits)[-min(top_k, VOCAB)]
    if min_p > 0:  # its probability (at this temperature) is >= min_p * the best one's
        scaled = (np.float64(logits[token]) - np.max(logits.astype(np.float64))) / temperature
        assert scaled >= np.log(min_p) - 1e-9


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    masked=st.integers(0, VOCAB - 1),
    scale=st.sampled_from([1e-30, 1.0, 30.0, 3e38]),
    repetition=st.sampled_from([1e-6, 0.5, 1.0, 1.3, 1e6]),
    presence=st.floats(-2.0, 2.0),
    frequency=st.floats(-2.0, 2.0),
)
def test_penalties_keep_logits_finite_and_masked_tokens_masked(
    seed, masked, scale, repetition, presence, frequency
):
    logits = _logits(seed, masked, scale)
    params = SamplingParams(repetition_penalty=repetition, presence_penalty=presence,
                            frequency_penalty=frequency)  # fmt: skip
    rng = np.random.default_rng(seed)
    penalties = Penalties(params, prompt=rng.integers(0, VOCAB, size=5).tolist())
    for token in rng.integers(0, VOCAB + 3, size=8).tolist():  # ids past the row are ignored
        penalties.push(token)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = penalties.apply(logits)
    finite = np.isfinite(logits)
    assert np.isfinite(out[finite]).all() and (out[~finite] == -np.inf).all()
    greedy = Sampler(SamplingParams(temperature=0.7, seed=seed)).pick(out)
    assert finite[greedy]


def test_penalties_follow_their_definitions():
    logits = np.array([2.0, -2.0, 1.0, 0.5, 3.0], dtype=np.float32)
    params = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    penalties = Penalties(params, prompt=[0, 1])  # the repetition penalty counts the prompt
    for token in (2, 2, 4):
        penalties.push(token)
    out = penalties.apply(logits)
    # 0, 1: prompt only (repetition: 2 / 2, -2 * 2); 2: twice in the reply (1 / 2 - 0.5 -
    # 0.25 * 2); 3: never seen; 4: once (3 / 2 - 0.5 - 0.25)
    assert out.tolist() == [1.0, -4.0, 0.5 - 0.5 - 0.5, 0.5, 1.5 - 0.5 - 0.25]


@pytest.mark.parametrize(
    ("field", "value"),
    [("min_p", -0.1), ("min_p", 1.5), ("repetition_penalty", 0.0), ("presence_penalty", 2.5),
     ("frequency_penalty", float("nan")), ("logprobs", 21), ("logprobs", True)],
)  # fmt: skip
def test_bad_new_settings_are_refused_naming_them(field, value):
    with pytest.raises(RequestError, match=field):
        SamplingParams(**{field: value})


def test_a_subnormal_temperature_is_greedy():
    logits = _logits(3, 10, 4.0)
    rng = np.random.default_rng(0)
    for t in (5e-324, 1e-310, 1e-300):
        assert {pick(logits, do_sample=True, temperature=t, rng=rng) for _ in range(50)} == {
            int(np.argmax(logits))
        }


def test_a_huge_temperature_is_close_to_uniform():
    logits = _logits(4, 0, 10.0)
    rng = np.random.default_rng(0)
    drawn = np.bincount(
        [pick(logits, do_sample=True, temperature=1e300, rng=rng) for _ in range(6400)],
        minlength=VOCAB,
    )
    assert drawn.min() > 40 and drawn.max() < 170  # 100 each expected


def test_pick_refuses_what_it_cannot_sample():
    row = np.zeros(4, dtype=np.float32)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
            pick(row, do_sample=True, temperature=bad)
    with pytest.raises(ValueError, match="maximum is nan"):
        pick(np.full(4, np.nan, dtype=np.float32), do_sample=True)


def test_the_cli_sampler_takes_a_subnormal_temperature():
    sampler = Sampler(SamplingParams(temperature=1e-310, seed=1))
    logits = _logits(5, 3, 2.0)
    assert sampler.pick(logits) == int(np.argmax(logits))


# ---------------------------------------------------------------- the batched step


def _collect(engine: Engine, prompt: list[int], sampling: SamplingParams, sink_fails: bool = False):
    """Queue ``prompt``; its events land in the box. ``sink_fails``: the sink raises on the
    request's third text delta (a client gone mid-stream, inside a batched step)."""
    done = threading.Event()
    box: dict[str, object] = {"text": "", "deltas": 0}

    def sink(kind: str, data: object) -> None:
        if kind == "delta":
            box["deltas"] = int(box["deltas"]) + 1
            if sink_fails and box["deltas"] == 3:
                raise BrokenPipeError("the client went away")
            box["text"] = str(box["text"]) + str(data)
        else:
            box[kind] = data
            done.set()

    ids = np.asarray([prompt], dtype=np.int64)
    engine.submit({"input_ids": ids}, sampling, sink)
    return box, done


def _serve(pipeline, requests, max_batch):
    """Run ``requests`` ((prompt, SamplingParams, sink_fails)) queued together in one engine."""
    engine = Engine(pipeline, max_batch=max_batch)
    engine.stops = set()
    runs = [_collect(engine, p, s, f) for p, s, f in requests]  # all queued before start
    engine.start()
    try:
        for _, done in runs:
            assert done.wait(120)
    finally:
        engine.stop()
    assert engine.peak_batch == min(max_batch, len(requests))
    return [box for box, _ in runs]


@pytest.fixture(scope="module")
def pipeline(tiny_gqa_package):
    from mobius_runtime import Pipeline

    return Pipeline.load(tiny_gqa_package, device="cpu", threads=2)


PROMPTS = [[2, *np.random.default_rng(i).integers(7, 500, size=n).tolist()]
           for i, n in enumerate([5, 9, 3, 12, 7, 4])]  # fmt: skip


def test_random_sampling_rows_leave_the_other_rows_unchanged(pipeline):
    """Fuzz: per row a random sampling setting (edges drawn often); every row answers,
    each exactly as it answers alone (a sampled row with its seed too)."""
    rng = np.random.default_rng(2026)
    edges_t = [0.0, 1e-310, 5e-324, 1e-30, 2.0]
    edges_p = [5e-324, 1e-300, 1.0, 0.5]
    for round_ in range(3):
        requests = []
        for prompt in PROMPTS:
            temperature = float(rng.choice(edges_t)) if rng.random() < 0.6 else rng.uniform(0, 2)
            top_p = float(rng.choice(edges_p)) if rng.random() < 0.5 else rng.uniform(1e-6, 1)
            # min_p and the penalties: off half of the time, else drawn (edges included)
            more = {} if rng.random() < 0.5 else {
                "min_p": float(rng.choice([0.0, 1e-300, 0.2, 1.0])),
                "repetition_penalty": float(rng.choice([1e-6, 1.0, 1.5, 1e6])),
                "presence_penalty": rng.uniform(-2, 2),
                "frequency_penalty": rng.uniform(-2, 2),
            }  # fmt: skip
            sampling = SamplingParams(max_tokens=6, temperature=temperature, top_p=top_p,
                                seed=int(rng.integers(0, 2**63)), **more)  # fmt: skip
            requests.append((prompt, sampling, False))
        together = _serve(pipeline, requests, max_batch=len(requests))
        for (prompt, sampling, _), box in zip(requests, together):
            assert "error" not in box, (round_, sampling, box["error"])
            alone = _serve(pipeline, [(prompt, sampling, False)], max_batch=1)[0]
            assert box["done"].text == alone["done"].text, (round_, sampling)
            assert box["done"].completion_tokens == 6


def test_a_subnormal_temperature_row_answers_greedily_beside_greedy_rows(pipeline):
    requests = [(p, SamplingParams(max_tokens=6), False) for p in PROMPTS[:3]]
    requests.insert(1, (PROMPTS[3], SamplingParams(max_tokens=6, temperature=1e-310), False))
    boxes = _serve(pipeline, requests, max_batch=4)
    for (prompt, _, _), box in zip(requests, boxes):
        want = pipeline.generate(input_ids=prompt, max_new_tokens=6, stop_ids=())
        assert box["done"].text == want.text


def test_a_failing_row_ends_only_its_request(pipeline, monkeypatch):
    """In a batched decode step, one row whose pick raises and one whose client sink
    raises: both end with their own error; the other rows answer as alone."""
    import mobius_runtime.sampling as sampling_module

    real_pick, calls = sampling_module.pick, []

    def picky(logits, **kwargs):
        if kwargs.get("temperature") == 0.625:
            calls.append(1)
            if len(calls) == 3:  # its third token: a decode step of the whole batch
                raise FloatingPointError("a sampler bug in one row")
        return real_pick(logits, **kwargs)

    monkeypatch.setattr(sampling_module, "pick", picky)
    requests = [
        (PROMPTS[0], SamplingParams(max_tokens=6), False),
        (PROMPTS[1], SamplingParams(max_tokens=6, temperature=0.625, seed=1), False),
        (PROMPTS[2], SamplingParams(max_tokens=6), True),
        (PROMPTS[4], SamplingParams(max_tokens=6), False),
    ]
    boxes = _serve(pipeline, requests, max_batch=4)
    assert "a sampler bug in one row" in str(boxes[1]["error"]) and "done" not in boxes[1]
    assert "the client went away" in str(boxes[2]["error"]) and "done" not in boxes[2]
    for i in (0, 3):
        want = pipeline.generate(input_ids=requests[i][0], max_new_tokens=6, stop_ids=())
        assert boxes[i]["done"].text == want.text


# ---------------------------------------------------------------- over HTTP


def test_a_subnormal_temperature_request_over_http_fails_no_one(pipeline):
    """Eight concurrent chat requests, one at temperature 1e-310: every one answers 200;
    afterwards /health and a normal request answer as before."""
    pytest.importorskip("fastapi")
    pytest.importorskip("openai")
    from servekit import running

    def body(temperature, i):
        return {"model": "tiny", "messages": [{"role": "user", "content": f"hi {i}"}],
                "max_tokens": 8, "temperature": temperature}  # fmt: skip

    with running(pipeline) as server:
        before = httpx.post(server.url + "/v1/chat/completions", json=body(0, 0), timeout=60)
        assert before.status_code == 200
        answers: dict[int, httpx.Response] = {}

        def send(i: int) -> None:
            t = 1e-310 if i == 3 else 0
            answers[i] = httpx.post(server.url + "/v1/chat/completions", json=body(t, i),
                                    timeout=60)  # fmt: skip

        threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert sorted(answers) == list(range(8))
        for i, answer in answers.items():
            assert answer.status_code == 200, (i, answer.text)
        greedy_3 = httpx.post(server.url + "/v1/chat/completions", json=body(0, 3), timeout=60)
        assert (
            answers[3].json()["choices"][0]["message"]["content"]
            == greedy_3.json()["choices"][0]["message"]["content"]
        )
        assert httpx.get(server.url + "/health", timeout=10).json()["status"] == "ok"
        after = httpx.post(server.url + "/v1/chat/completions", json=body(0, 0), timeout=60)
        assert after.json()["choices"] == before.json()["choices"]


def test_mobius_run_samples_at_a_subnormal_temperature(tiny_gqa_package):
    import typer
    from typer.testing import CliRunner

    from mobius_runtime import plugin

    app = typer.Typer()
    plugin.mobius_add_commands(app)
    app.command("noop", hidden=True)(lambda: None)
    args = ["run", str(tiny_gqa_package), "--prompt", "Hello", "--max-new-tokens", "4",
            "--json", "--device", "cpu"]  # fmt: skip
    greedy = CliRunner().invoke(app, args)
    assert greedy.exit_code == 0, greedy.output
    result = CliRunner().invoke(app, [*args, "--sample", "--temperature", "1e-310", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    ids = json.loads(result.stdout.strip().splitlines()[-1])["ids"]
    assert ids == json.loads(greedy.stdout.strip().splitlines()[-1])["ids"]
