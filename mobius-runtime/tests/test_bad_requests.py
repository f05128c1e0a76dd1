"""Requests that used to crash inside onnxruntime or numpy get clear errors (what, where, fix).

Each case asserts the error text. CLI cases also assert that the check runs before
the model loads (they name a package that does not exist, and the sampling error
wins).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import toypkg

from mobius_runtime import Pipeline
from mobius_runtime.errors import RequestError
from mobius_runtime.requests import check_sampling

MEDIA = Path(__file__).resolve().parents[2] / "testdata" / "media"


def _mobius(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    cmd = [str(Path(sys.executable).parent / "mobius"), *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--sample", "--temperature", "0"], "--temperature must be a finite number > 0, got 0.0"),
        (["--sample", "--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
        (["--sample", "--seed", "-3"], "--seed must be an integer >= 0, got -3"),
        (["--sample", "--temperature", "nan"], "--temperature must be a finite number > 0"),
        (["--temperature", "0.7"], "--temperature given without --sample"),
        (["--top-k", "5", "--seed", "1"], "--top-k, --seed given without --sample"),
    ],
)
def test_run_sampling_flags_fail_before_loading(tmp_path, flags, needle):
    out = _mobius("run", str(tmp_path / "no-such-package"), "--prompt", "hi", *flags)
    assert out.returncode == 1
    assert needle in out.stderr
    assert "does not exist" not in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.splitlines()[0]) < 200


def test_sampling_checks_in_the_api(single_pkg):
    p = Pipeline.load(single_pkg, device="cpu")
    for kwargs, needle in (
        ({"temperature": math.nan}, "temperature must be a finite number > 0, got nan"),
        ({"do_sample": True, "seed": -1}, "seed must be an integer >= 0, got -1"),
        ({"do_sample": True, "top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"do_sample": True, "top_k": -2}, "top_k must be 0 (off) or a positive integer"),
    ):
        with pytest.raises(RequestError, match=None) as info:
            p.generate(input_ids=[3, 4], max_new_tokens=2, **kwargs)
        assert needle in str(info.value), kwargs
    check_sampling(False, 0.0, None, None, None)  # greedy ignores a zero temperature


@pytest.mark.parametrize(
    ("ids", "needle"),
    [
        ([3, toypkg.V, 4], f"token id {toypkg.V} at position 1 is outside the vocabulary"),
        ([3, -5, 4], "token id -5 at position 1 is outside the vocabulary"),
    ],
)
def test_ids_outside_the_vocabulary(tmp_path, ids, needle):
    pkg = toypkg.single_package(tmp_path / "p", extra={"config": {"vocab_size": toypkg.V}})
    p = Pipeline.load(pkg, device="cpu")
    with pytest.raises(RequestError) as info:
        p.generate(input_ids=ids, max_new_tokens=2)
    assert needle in str(info.value)


def test_negative_ids_without_a_known_vocabulary(single_pkg):
    p = Pipeline.load(single_pkg, device="cpu")
    with pytest.raises(RequestError, match="token id -1 at position 0 is outside"):
        p.generate(input_ids=[-1, 3], max_new_tokens=2)


def test_lone_surrogate_and_non_text_prompts(tiny_attention_package):
    p = Pipeline.load(tiny_attention_package, device="cpu")
    with pytest.raises(RequestError, match="not valid Unicode text: surrogates not allowed"):
        p.generate(prompt="bad \udcff text", max_new_tokens=1)
    with pytest.raises(RequestError, match="the prompt must be a str, got bytes"):
        p.generate(prompt=b"bytes", max_new_tokens=1)


def test_invalid_utf8_on_the_command_line(tiny_attention_package):
    cmd = [str(Path(sys.executable).parent / "mobius"), "run", str(tiny_attention_package)]
    cmd += ["--prompt", b"caf\xe9 \xff".decode("utf-8", "surrogateescape"), "--device", "cpu"]
    out = subprocess.run(cmd, capture_output=True, timeout=300)
    err = out.stderr.decode("utf-8", "replace")
    assert out.returncode == 1 and "Traceback" not in err
    assert "not valid Unicode text" in err


def test_media_placeholders_without_media(tiny_mm_package):
    p = Pipeline.load(tiny_mm_package, device="cpu")
    with pytest.raises(Exception) as info:
        p.generate(prompt="what is <|image|> this", max_new_tokens=1)
    assert "1 <|image|> placeholder(s) but 0 item(s)" in str(info.value)
    image_id, video_id = 8, 13  # testdata/tiny-gemma4-mm/README.md
    with pytest.raises(RequestError) as info:
        p.generate(input_ids=[2, 40, image_id, 41], max_new_tokens=1)
    assert "holds 1 image placeholder id(s) (8) but no image was given" in str(info.value)
    with pytest.raises(RequestError) as info:
        p.generate(input_ids=[2, 40, video_id, 41], max_new_tokens=1)
    assert "video placeholder id 13, but this package takes no video" in str(info.value)
    with pytest.raises(RequestError) as info:
        p.generate(input_ids=[2, 40, image_id, 41], images=[str(MEDIA / "tiny.png")])
    assert "holds 1 image placeholder id(s) (8) but" in str(info.value)
    assert "soft token(s) from the image(s) given" in str(info.value)


def test_image_placeholder_in_a_text_only_package_is_text(tiny_attention_package):
    p = Pipeline.load(tiny_attention_package, device="cpu")
    ids = p.generate(prompt="<|image|>", max_new_tokens=1).prompt_ids
    assert len(ids) > 2  # plain characters, no special id


def test_nan_logits_stop_generation_naming_the_step(tiny_attention_package):
    import onnx.numpy_helper as nh

    def poison(model):
        for init in model.graph.initializer:
            if init.name.endswith("norm.weight") or "norm" in init.name:
                arr = nh.to_array(init).copy()
                if arr.dtype == np.float32:
                    arr[...] = np.nan
                    init.CopyFrom(nh.from_array(arr, init.name))
        return model

    p = Pipeline.load(tiny_attention_package, device="cpu", graph_transform=poison)
    with pytest.raises(RequestError) as info:
        p.generate(input_ids=[2, 40, 41], max_new_tokens=3)
    assert "the model produced NaN logits at generation step 0 (prefill)" in str(info.value)


def test_run_on_a_package_that_does_not_generate(tmp_path):
    vision = toypkg.vision_graph()
    from mobius.contract import Contract, ExternalInput

    contract = Contract(
        components=(toypkg.component("mlp", vision),),
        externals=(ExternalInput("mlp.pixel_values", "pixel_values"),),
        outputs=("mlp.image_features",),
    )
    pkg = toypkg.write(tmp_path / "mlp", {"mlp": vision}, contract, model_type="tinymlp")
    out = _mobius("run", str(pkg), "--prompt", "hi", "--device", "cpu")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "need a text-generation package" in out.stderr
    assert "Pipeline.forward" in out.stderr
    assert "report" not in out.stderr


def test_a_long_prompt_is_refused_from_a_prefix_before_it_is_tokenized_whole(
    tiny_attention_package,
):
    """Where the certain byte bound is far above the context (a vocabulary with long
    tokens, as on E2B), a megabytes prompt is refused from a prefix of 8 characters a
    position: memory stays bounded by the context, not the body."""
    import resource

    p = Pipeline.load(tiny_attention_package, device="cpu")
    limit = p.context_length
    p.text._max_token_bytes = 10**6  # the certain bound never fires
    text = "the quick brown fox jumps over the lazy dog " * (8 * 2**20 // 44)  # 8 MiB
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(RequestError) as info:
        p.generate(prompt=text, max_new_tokens=1)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert f"its first {8 * limit} alone are" in str(info.value)
    assert f"more than the {limit} positions" in str(info.value)
    assert grown < 256, f"grew {grown:.0f} MB"
    short = p.generate(prompt="the quick brown fox", max_new_tokens=2)  # still answers
    assert len(short.ids) == 2
