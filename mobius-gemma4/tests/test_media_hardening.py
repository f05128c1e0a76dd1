"""Hostile image and audio inputs to the Gemma 4 processors: clear errors, bounded work.

Every crafted file is written in ``tmp_path`` by the test. Each case asserts the error
text a user sees (a :class:`mobius.errors.MediaError`: what, where, fix) or, for the
long clip, that only the part the model keeps is resampled.
"""

from __future__ import annotations

import io
import json
import math
import os
import struct
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest

from mobius.errors import MediaError
from mobius_gemma4.audio import features
from mobius_gemma4.audio.features import load_audio
from mobius_gemma4.config import read_config
from mobius_gemma4.processors import audio_preprocessor, image_preprocessor
from mobius_gemma4.vision.processor import MAX_IMAGE_PIXELS, Gemma4ImageProcessor, load_rgb

pytestmark = pytest.mark.l1

TINY_MM = Path(__file__).resolve().parents[2] / "testdata" / "tiny-gemma4-mm"


def _config():
    return read_config("gemma4", json.loads((TINY_MM / "config.json").read_text()))


def _wav(rate: int, samples: np.ndarray) -> bytes:
    """A 16-bit PCM mono WAV whose header says ``rate`` Hz."""
    data = samples.astype("<i2").tobytes()
    fmt = struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    return (
        b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + fmt
        + b"data" + struct.pack("<I", len(data)) + data
    )  # fmt: skip


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims ``width × height`` pixels but carries one tiny IDAT."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 16))
        + chunk(b"IEND", b"")
    )


def _png(h: int, w: int, seed: int = 0) -> bytes:
    from PIL import Image

    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def _no_hang(fn, *args):
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # handed to the test thread
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "blocked on a pipe with no writer"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


# ---------------------------------------------------------------------- paths


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
@pytest.mark.parametrize(("kind", "load"), [("image", load_rgb), ("audio", load_audio)])
def test_a_fifo_path_is_refused_not_waited_on(tmp_path: Path, kind: str, load) -> None:
    fifo = tmp_path / f"input.{kind}"
    os.mkfifo(fifo)
    with pytest.raises(MediaError) as err:
        _no_hang(load, fifo)
    assert err.value.what == f"{kind} path {fifo} is a named pipe (FIFO), not a regular file"


# ---------------------------------------------------------------------- audio


def test_a_wav_that_says_1_hz_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "one-hertz.wav"
    path.write_bytes(_wav(1, np.zeros(16_000, dtype=np.int16)))
    with pytest.raises(MediaError) as err:
        load_audio(path)
    assert err.value.what == "audio sample rate 1 Hz is outside 4000–768000 Hz"
    assert err.value.where == str(path)
    with pytest.raises(MediaError, match="audio sample rate 1 Hz"):
        load_audio(np.zeros(100, dtype=np.float32), sampling_rate=1)


def test_a_corrupt_audio_file_is_a_media_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.wav"
    path.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk")
    with pytest.raises(MediaError, match=r"^cannot read audio: ") as err:
        load_audio(path)
    # soundfile's text named the in-memory buffer ("<_io.BytesIO object at 0x…>")
    assert "BytesIO" not in err.value.what and str(path) in err.value.what


def test_a_10_minute_44k_clip_is_cut_before_resampling(tmp_path: Path, monkeypatch) -> None:
    rate, seconds = 44_100, 600
    samples = (np.random.default_rng(0).standard_normal(rate * seconds) * 3000).astype(np.int16)
    path = tmp_path / "ten-minutes.wav"
    path.write_bytes(_wav(rate, samples))
    seen: list[int] = []
    real = features.resample

    def spy(wave, sr_in, sr_out=features.SAMPLE_RATE):
        seen.append(len(wave))
        return real(wave, sr_in, sr_out)

    monkeypatch.setattr(features, "resample", spy)
    batch = audio_preprocessor(_config())([str(path)])
    keep = features.input_samples_for(480_000, rate)
    assert seen == [keep] and keep < 31 * rate  # about 30 s of the 600 s were resampled
    assert batch["input_features"].shape[1] == 2999  # 30 s of 10 ms frames, as HF truncates


def test_the_cut_keeps_the_first_samples_exact() -> None:
    rate = 44_100
    wave = np.random.default_rng(1).standard_normal(3 * rate).astype(np.float32)
    full = features.resample(wave, rate)
    cut = load_audio(wave, sampling_rate=rate, max_samples=16_000)
    assert len(cut) == math.ceil(features.input_samples_for(16_000, rate) * 16_000 / rate)
    np.testing.assert_array_equal(cut[:16_000], full[:16_000])


# ---------------------------------------------------------------------- images


def test_a_decompression_bomb_png_is_refused(tmp_path: Path) -> None:
    for w, h in ((100_000, 100_000), (10_000, 10_000)):  # over 2x and over 1x Pillow's limit
        path = tmp_path / f"bomb-{w}.png"
        path.write_bytes(_png_header_only(w, h))
        with pytest.raises(MediaError) as err:
            load_rgb(path)
        assert err.value.what.startswith("image is too large to decode safely: Image size ")
        assert err.value.where == str(path)


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("corrupt", lambda: b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4),
        ("truncated", lambda: _png(64, 64)[: len(_png(64, 64)) // 2]),
        ("not an image", lambda: b"hello, world"),
    ],
)
def test_a_corrupt_or_truncated_image_is_a_media_error(tmp_path: Path, name: str, make) -> None:
    path = tmp_path / "image.png"
    path.write_bytes(make())
    with pytest.raises(MediaError) as err:
        load_rgb(path)
    assert err.value.what.startswith("cannot decode image: "), (name, err.value.what)
    assert err.value.where == str(path)
    assert "BytesIO" not in err.value.what  # Pillow named its buffer, not the file
    with pytest.raises(MediaError, match=r"^cannot decode image: ") as err:
        load_rgb(make())  # the same bytes given directly
    assert "BytesIO" not in err.value.what


def test_a_huge_image_array_is_refused_before_any_copy() -> None:
    # a read-only broadcast view: 1.2 GB of pixels that take no memory until copied
    huge = np.broadcast_to(np.zeros((1, 1, 3), dtype=np.uint8), (20_000, 20_000, 3))
    with pytest.raises(MediaError) as err:
        image_preprocessor(_config())([huge])
    assert err.value.what == (
        f"image of 20000x20000 pixels (400,000,000) is over the limit of {MAX_IMAGE_PIXELS:,} pixels"
    )


def test_running_out_of_memory_is_a_media_error(monkeypatch) -> None:
    def no_memory(self, rgb):
        raise MemoryError

    monkeypatch.setattr(Gemma4ImageProcessor, "patchify", no_memory)
    with pytest.raises(MediaError, match=r"^not enough memory to decode and resize the image"):
        image_preprocessor(_config())([np.zeros((48, 48, 3), dtype=np.uint8)])


@pytest.mark.parametrize("shape", [(1, 20_000, 3), (20_000, 1, 3)])
def test_a_20000_by_1_image_outruns_the_tiny_position_table(shape) -> None:
    """HF's processor gives this image positions up to 209 (see the reference test below);
    the tiny model's table has 64 rows, where HF's model fails with an index error."""
    image = np.zeros(shape, dtype=np.uint8)
    with pytest.raises(MediaError) as err:
        image_preprocessor(_config())([image])
    cols, rows = (210, 3) if shape[0] == 1 else (3, 210)
    assert err.value.what == (
        f"image is {cols}x{rows} patches after resizing, but the model's position table "
        "(vision_config.position_embedding_size) has 64 entries per axis"
    )
    # a real model's table (10240) takes it
    done = Gemma4ImageProcessor(max_soft_tokens=70, position_embedding_size=10_240)([image])
    assert done.pixel_position_ids.max() == 209


@pytest.mark.reference
@pytest.mark.l3
@pytest.mark.parametrize("shape", [(1, 20_000, 3), (20_000, 1, 3)])
def test_hf_processor_gives_the_20000_by_1_image_the_same_positions(shape) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    image = np.random.default_rng(3).integers(0, 256, shape, dtype=np.uint8)
    hf = Gemma4ImageProcessorPil(max_soft_tokens=70)([Image.fromarray(image)], return_tensors="np")
    ours = Gemma4ImageProcessor(max_soft_tokens=70)([image])
    np.testing.assert_array_equal(ours.pixel_position_ids, hf["image_position_ids"])
    np.testing.assert_array_equal(ours.pixel_values, hf["pixel_values"])
    assert int(hf["image_position_ids"].max()) == 209
