"""Fixtures: hand-made packages (see toypkg) and a toy family plugin."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import toypkg

from mobius import hookimpl
from mobius.records import ModelTypeInfo, Processors, RuntimeFile


class ToyFamily:
    """A family plugin for model_type "toy": chat template, BOS 1, stop 2, images."""

    @hookimpl
    def mobius_model_types(self):
        return [ModelTypeInfo("toy", modalities=("text", "image"))]

    @hookimpl
    def mobius_read_config(self, model_type, raw):
        return dict(raw)

    @hookimpl
    def mobius_processors(self, config):
        def preprocess_image(images):
            import numpy as np

            return {
                "pixel_values": np.full((len(images), toypkg.D), 0.5, np.float32),
                "num_soft_tokens": [1] * len(images),
            }

        return Processors(
            format_prompt=lambda text, n_img, n_aud: "a " * n_img + text,
            preprocess_image=preprocess_image,
            stop_token_ids=(2,),
            bos_token_id=1,
        )


@pytest.fixture
def host():
    from mobius.plugins import PluginHost

    return PluginHost.from_plugins({"toy": ToyFamily()}, builtins=False)


def _text_files(tmp_path: Path) -> tuple[RuntimeFile, ...]:
    tok = toypkg.tokenizer_file(tmp_path)
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "toy", "max_position_embeddings": 64}')
    return (RuntimeFile("tokenizer.json", source=tok), RuntimeFile("config.json", source=cfg))


@pytest.fixture
def single_pkg(tmp_path):
    return toypkg.single_package(
        tmp_path / "single", runtime_files=_text_files(tmp_path), extra={"context_length": 64}
    )


@pytest.fixture
def split_pkg(tmp_path):
    return toypkg.split_package(
        tmp_path / "split", runtime_files=_text_files(tmp_path), extra={"context_length": 64}
    )


TINY_GEMMA4 = Path(__file__).resolve().parents[2] / "testdata" / "tiny-gemma4"


def _build_tiny(tmp_path_factory, target: str) -> Path:
    if not (TINY_GEMMA4 / "config.json").is_file():
        pytest.skip("testdata/tiny-gemma4 is not present")
    pytest.importorskip("mobius_gemma4")
    import mobius

    out = tmp_path_factory.mktemp(f"tiny-{target}") / "pkg"
    mobius.build(str(TINY_GEMMA4), str(out), target=target)
    return out


@pytest.fixture(scope="session")
def tiny_gqa_package(tmp_path_factory):
    """The bundled tiny Gemma 4 built with ``--target cpu`` (GroupQueryAttention layers)."""
    return _build_tiny(tmp_path_factory, "cpu")


@pytest.fixture(scope="session")
def tiny_attention_package(tmp_path_factory):
    """The bundled tiny Gemma 4 built with ``--target default`` (ONNX Attention layers)."""
    return _build_tiny(tmp_path_factory, "default")


@pytest.fixture(scope="session")
def tiny_mm_package(tmp_path_factory):
    """The bundled tiny multimodal Gemma 4 (image + audio), ``--target default``."""
    source = TINY_GEMMA4.parent / "tiny-gemma4-mm"
    if not (source / "config.json").is_file():
        pytest.skip("testdata/tiny-gemma4-mm is not present")
    pytest.importorskip("mobius_gemma4")
    import mobius

    out = tmp_path_factory.mktemp("tiny-mm") / "pkg"
    mobius.build(str(source), str(out))
    return out


@pytest.fixture(scope="module")
def pipeline(tiny_gqa_package):
    """The bundled tiny Gemma 4 (GroupQueryAttention), loaded once per test module."""
    from mobius_runtime import Pipeline

    return Pipeline.load(tiny_gqa_package, device="cpu", threads=2)


@pytest.fixture(scope="module")
def server(pipeline):
    """``pipeline`` served on 127.0.0.1 (``servekit.running``), once per test module."""
    from servekit import running

    with running(pipeline) as srv:
        yield srv
