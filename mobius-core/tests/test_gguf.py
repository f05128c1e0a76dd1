"""GGUF checkpoints: the opener (file, folder, split), lazy dequantized reads, the
transforms that undo llama.cpp's conversion, the family hook, and the tokenizer files
made from the metadata."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from mobius import hookimpl
from mobius.checkpoint.gguf import (
    GGUFCheckpoint,
    add_constant,
    gguf_files,
    pad_rows,
    unpermute_rows,
)
from mobius.errors import CheckpointError
from mobius.plugins import PluginHost
from mobius.records import GGUFTensor, GGUFTranslation
from mobius_testing.gguf_files import gpt2_tokenizer_metadata, write_gguf

REPO = Path(__file__).resolve().parents[2]
TINY_QWEN3 = REPO / "testdata" / "tiny-qwen3"
RNG = np.random.default_rng(5)


class ToyFamily:
    """Translates architecture ``toy``: names kept, except those given in ``names``
    (a GGUF name mapped to a HF name, a GGUFTensor, or None) and ``unknown.*`` ones."""

    def __init__(self, names: dict | None = None) -> None:
        self.names = names or {}
        self.seen: list = []

    @hookimpl
    def mobius_gguf_translation(self, architecture, metadata, tensors):
        if architecture != "toy":
            return None
        self.seen.append((architecture, dict(metadata), dict(tensors)))
        mapped = {n: self.names.get(n, n) for n in tensors if not n.startswith("unknown.")}
        return GGUFTranslation(config={"model_type": "toy", "hidden_size": 64}, tensors=mapped)


def host_with(family: ToyFamily | None = None) -> PluginHost:
    return PluginHost.from_plugins({"toy": family or ToyFamily()})


def toy_file(path: Path, tensors: list, metadata: dict | None = None) -> Path:
    return write_gguf(path, "toy", {"general.name": "toy", **(metadata or {})}, tensors)


def open_toy(path: Path, family: ToyFamily | None = None) -> GGUFCheckpoint:
    checkpoint = host_with(family).open_checkpoint(str(path), None)
    assert isinstance(checkpoint, GGUFCheckpoint)
    return checkpoint


def reference(path: Path, name: str) -> np.ndarray:
    """gguf's own dequantization of tensor ``name`` (the reference for "same values")."""
    reader = gguf.GGUFReader(path)
    t = next(t for t in reader.tensors if t.name == name)
    return gguf.quants.dequantize(np.array(t.data), t.tensor_type).astype(np.float32)


TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"]
K_SCALES = {"Q4_K": (0, 2), "Q6_K": (-2, None)}
"""Byte positions of the fp16 super-block scale ``d`` (gguf-py's block layouts); gguf cannot
quantize K-quants, so their blocks are random bytes with a sane scale."""


def k_blocks(kind: str, rows: int, cols: int) -> np.ndarray:
    qtype = gguf.GGMLQuantizationType[kind]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = RNG.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    start, stop = K_SCALES[kind]
    raw[:, start:stop] = np.full((len(raw), 1), 0.01, np.float16).view(np.uint8)
    if kind == "Q4_K":
        raw[:, 2:4] = np.full((len(raw), 1), 0.02, np.float16).view(np.uint8)  # dmin
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind", TYPES)
def test_every_type_reads_as_gguf_dequantizes_it(tmp_path, kind):
    w = RNG.standard_normal((8, 256)).astype(np.float32)
    stored = k_blocks(kind, 8, 256) if kind in K_SCALES else w
    path = toy_file(tmp_path / "m.gguf", [("w", stored, kind), ("norm", w[0], kind)])
    ckpt = open_toy(path)
    info = ckpt.info("w")
    assert info.shape == (8, 256) and info.ggml_type == kind
    assert ckpt.info("norm").ggml_type == "F32"  # 1-D tensors stay F32, as llama.cpp keeps them
    want = reference(path, "w")
    got = ckpt.read("w")
    assert got.dtype.name == {"F16": "float16", "BF16": "bfloat16"}.get(kind, "float32")
    np.testing.assert_array_equal(got.astype(np.float32), want)
    if kind not in K_SCALES:  # and the encoding is the one asked for
        tol = {"F32": 0, "F16": 1e-3, "BF16": 1e-2, "Q8_0": 0.03}.get(kind, 0.5)
        assert np.abs(want - w).max() <= tol * np.abs(w).max() + 1e-7
    # streamed in odd pieces: the same values, never more than `step` elements at once
    chunks = [c.copy() for c in ckpt.read_chunks("w", 7, 2000, 300)]
    assert max(c.size for c in chunks) <= 300
    np.testing.assert_array_equal(np.concatenate(chunks), got.reshape(-1)[7:2000])


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter stores for Llama q/k (the fact from its converter)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_transforms_undo_the_conversion_streamed_or_whole(tmp_path):
    q = RNG.standard_normal((64, 32)).astype(np.float32)  # 4 heads of 16
    norm = RNG.standard_normal(32).astype(np.float32)
    embed = RNG.standard_normal((10, 32)).astype(np.float32)
    path = toy_file(
        tmp_path / "m.gguf",
        [("q", llama_cpp_permute(q, 4), "F32"), ("n", norm + 1, "F32"), ("e", embed, "F16")],
    )
    family = ToyFamily({
        "q": GGUFTensor("model.q", (unpermute_rows(4),)),
        "n": GGUFTensor("model.norm", (add_constant(-1.0),)),
        "e": GGUFTensor("model.embed", (pad_rows(16),)),
    })  # fmt: skip
    ckpt = open_toy(path, family)
    assert set(ckpt.tensors) == {"model.q", "model.norm", "model.embed"}
    np.testing.assert_array_equal(ckpt.read("model.q"), q)
    np.testing.assert_allclose(ckpt.read("model.norm"), norm, atol=1e-6)
    embed_out = ckpt.read("model.embed")
    assert embed_out.shape == (16, 32) and ckpt.info("model.embed").shape == (16, 32)
    np.testing.assert_array_equal(embed_out[:10], embed.astype(np.float16))
    assert not embed_out[10:].any()
    for name in ckpt.tensors:  # streamed in pieces smaller than a head: still exact
        whole = ckpt.read(name).reshape(-1)
        pieces = np.concatenate([c.copy() for c in ckpt.read_chunks(name, 3, whole.size, 50)])
        np.testing.assert_array_equal(pieces, whole[3:])


def test_unpermute_refuses_rows_that_do_not_fit(tmp_path):
    path = toy_file(tmp_path / "m.gguf", [("q", np.zeros((12, 32), np.float32), "F32")])
    family = ToyFamily({"q": GGUFTensor("q", (unpermute_rows(4),))})
    with pytest.raises(CheckpointError, match="multiple of 2 × heads"):
        open_toy(path, family)


def test_family_sees_metadata_and_shapes_and_config_gains_ids(tmp_path):
    meta = {"toy.block_count": 3, "tokenizer.ggml.eos_token_id": 2}
    path = toy_file(tmp_path / "m.gguf", [("w", np.ones((4, 32), np.float32), "F32")], meta)
    family = ToyFamily()
    ckpt = open_toy(path, family)
    arch, metadata, tensors = family.seen[0]
    assert arch == "toy" and metadata["toy.block_count"] == 3 and tensors == {"w": (4, 32)}
    assert ckpt.raw_config == {"model_type": "toy", "hidden_size": 64, "eos_token_id": 2}
    assert ckpt.source.kind == "gguf" and dict(ckpt.source.files).keys() == {"m.gguf"}


def test_folder_holding_one_file_and_splits(tmp_path):
    a, b = np.ones((2, 32), np.float32), np.full((3, 32), 2, np.float32)
    one = tmp_path / "one"
    one.mkdir()
    toy_file(one / "m.gguf", [("a", a, "F32")])
    (one / "mmproj-m.gguf").write_bytes(b"an encoder companion is not the model")
    assert set(open_toy(one).tensors) == {"a"}

    split = tmp_path / "split"
    split.mkdir()
    toy_file(split / "m-00001-of-00002.gguf", [("a", a, "F32")], {"split.count": 2})
    toy_file(split / "m-00002-of-00002.gguf", [("b", b, "F32")], {"split.count": 2})
    for source in (split, split / "m-00001-of-00002.gguf"):
        ckpt = open_toy(source)
        np.testing.assert_array_equal(ckpt.read("b"), b)
        assert len(gguf_files(source)) == 2
    with pytest.raises(CheckpointError, match="pass the first part"):
        gguf_files(split / "m-00002-of-00002.gguf")
    (split / "m-00002-of-00002.gguf").unlink()
    with pytest.raises(CheckpointError, match="misses 1 of its 2 parts"):
        open_toy(split)

    two = tmp_path / "two"
    two.mkdir()
    toy_file(two / "x.gguf", [("a", a, "F32")])
    toy_file(two / "y.gguf", [("a", a, "F32")])
    with pytest.raises(CheckpointError, match="holds 2 GGUF models"):
        open_toy(two)


def test_a_missing_gguf_file_is_named(tmp_path):
    import mobius

    with pytest.raises(CheckpointError, match="GGUF file not found"):
        mobius.build(str(tmp_path / "nope.gguf"), tmp_path / "out", host=host_with())
    assert not (tmp_path / "out").exists()


def test_no_family_for_the_architecture(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", "mamba9", {}, [("w", np.ones(32, np.float32), "F32")])
    with pytest.raises(CheckpointError, match="no installed plugin reads GGUF architecture"):
        host_with().open_checkpoint(str(path), None)


# --------------------------------------------------------------------------- tokenizers


def test_gpt2_tokenizer_from_metadata_matches_the_checkpoint(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    meta = gpt2_tokenizer_metadata(TINY_QWEN3, pre="gpt-2")
    path = toy_file(tmp_path / "m.gguf", [("w", np.ones(32, np.float32), "F32")], meta)
    ckpt = open_toy(path)
    mine = tokenizers.Tokenizer.from_file(str(ckpt.file("tokenizer.json")))
    theirs = tokenizers.Tokenizer.from_file(str(TINY_QWEN3 / "tokenizer.json"))
    for text in ["hello world", "  two  spaces\n\nand tabs\t", "ünï ✓ 2024", "<|im_end|>x"]:
        assert mine.encode(text).ids == theirs.encode(text).ids
    assert json.loads(ckpt.file("generation_config.json").read_text())["eos_token_id"] == [2]
    config = json.loads(ckpt.file("tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" and config["pad_token"] == "<|endoftext|>"
    assert ckpt.file("chat_template.jinja").read_text().startswith("{% for message")
    assert ckpt.file("tokenizer.model") is None


@pytest.mark.parametrize("pre", ["qwen2", "smollm"])
def test_digit_splitting_pre_tokenizers_and_eot_as_a_stop(tmp_path, pre):
    tokenizers = pytest.importorskip("tokenizers")
    meta = gpt2_tokenizer_metadata(TINY_QWEN3, pre=pre)
    meta["tokenizer.ggml.eot_token_id"] = 0
    path = toy_file(tmp_path / "m.gguf", [("w", np.ones(32, np.float32), "F32")], meta)
    ckpt = open_toy(path)
    tok = tokenizers.Tokenizer.from_file(str(ckpt.file("tokenizer.json")))
    pieces = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("year 2024")]
    assert pieces[-4:] == ["2", "0", "2", "4"]  # one digit per piece
    gpt2 = tokenizers.Tokenizer.from_file(str(TINY_QWEN3 / "tokenizer.json"))
    assert [p for p, _ in gpt2.pre_tokenizer.pre_tokenize_str("year 2024")][-1] == "Ġ2024"
    assert json.loads(ckpt.file("generation_config.json").read_text())["eos_token_id"] == [2, 0]


def test_unknown_pre_tokenizer_is_refused(tmp_path):
    meta = gpt2_tokenizer_metadata(TINY_QWEN3, pre="some-new-model")
    path = toy_file(tmp_path / "m.gguf", [("w", np.ones(32, np.float32), "F32")], meta)
    with pytest.raises(CheckpointError, match="'some-new-model' is a pre-tokenizer mobius"):
        open_toy(path)


def spm_metadata(add_bos: bool = True) -> dict:
    """A SentencePiece-style (``llama``) vocabulary: control tokens, byte tokens, pieces
    with scores (a higher score merges first)."""
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    pieces += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    pieces += [
        ("▁", -1.0, 1), ("h", -2.0, 1), ("e", -2.0, 1), ("l", -2.0, 1), ("o", -2.0, 1),
        ("ll", -3.0, 1), ("▁h", -4.0, 1), ("he", -5.0, 1), ("▁he", -6.0, 1), ("llo", -7.0, 1),
        ("▁hello", -8.0, 1), ("lo", -9.0, 1),
    ]  # fmt: skip
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [p for p, _, _ in pieces],
        "tokenizer.ggml.scores": [s for _, s, _ in pieces],
        "tokenizer.ggml.token_type": [t for _, _, t in pieces],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": add_bos,
    }


def test_sentencepiece_tokenizer_merges_by_score_with_byte_fallback(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    path = toy_file(tmp_path / "m.gguf", [("w", np.ones(32, np.float32), "F32")], spm_metadata())
    ckpt = open_toy(path)
    tok = tokenizers.Tokenizer.from_file(str(ckpt.file("tokenizer.json")))
    vocab = spm_metadata()["tokenizer.ggml.tokens"]
    enc = tok.encode("hello hex")
    # BOS first; "▁hello" whole; "hex": ▁h+e -> ▁he (▁h scores above he), x by byte fallback
    assert [vocab[i] for i in enc.ids] == ["<s>", "▁hello", "▁he", "<0x78>"]
    assert tok.decode(enc.ids, skip_special_tokens=True) == "hello hex"
    assert tok.encode("</s>", add_special_tokens=False).ids == [2]  # a control token
    config = json.loads(ckpt.file("tokenizer_config.json").read_text())
    assert config["add_bos_token"] is True and config["bos_token"] == "<s>"
    no_bos = toy_file(
        tmp_path / "n.gguf", [("w", np.ones(32, np.float32), "F32")], spm_metadata(False)
    )
    ckpt = open_toy(no_bos)  # kept: its side files live as long as it does
    tok = tokenizers.Tokenizer.from_file(str(ckpt.file("tokenizer.json")))
    assert [vocab[i] for i in tok.encode("hello").ids] == ["▁hello"]


def gemma4_metadata(merges: list[str] | None = None) -> dict:
    """A ``gemma4`` vocabulary as llama.cpp's ``Gemma4Model.set_vocab`` writes it: control
    tokens, byte tokens, UTF-8 pieces with ``▁`` (one holding a real space, its merge
    written with U+0120), placeholder scores, merges in rank order."""
    pieces = [("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 3), ("<|turn>", 3)]
    pieces += [(f"<0x{b:02X}>", 6) for b in range(256)]
    pieces += [(p, 1) for p in ("▁", "h", "e", "l", "o", "\n", "a b", "a", " b", "ll",
                                 "he", "▁he", "llo", "▁hello", "lo", "a b!", "!")]  # fmt: skip
    if merges is None:
        merges = ["l l", "h e", "▁ he", "ll o", "▁he llo", "l o", "a \u0120b", "a\u0120b !"]
    return {
        "tokenizer.ggml.model": "gemma4",
        "tokenizer.ggml.tokens": [p for p, _ in pieces],
        "tokenizer.ggml.scores": [-1000.0] * len(pieces),
        "tokenizer.ggml.token_type": [t for _, t in pieces],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.ggml.add_bos_token": True,
    }


def test_gemma4_tokenizer_merges_in_rank_order_with_byte_fallback(tmp_path):
    """``gemma4``: merges by rank (not score), spaces as ``▁`` with no prefix space, byte
    fallback, BOS added, control tokens whole; a merge piece holding a space (written
    ``Ġ`` by gguf's SpecialVocab) is read back."""
    tokenizers = pytest.importorskip("tokenizers")
    meta = gemma4_metadata()
    path = toy_file(tmp_path / "m.gguf", [("w", np.ones(32, np.float32), "F32")], meta)
    ckpt = open_toy(path)
    tok = tokenizers.Tokenizer.from_file(str(ckpt.file("tokenizer.json")))
    vocab = meta["tokenizer.ggml.tokens"]
    enc = tok.encode("hello hex\n<|turn>é")
    # "hello": no prefix space; "llo" before "lo" (rank); "x" / "é" by their UTF-8 bytes
    assert [vocab[i] for i in enc.ids] == [
        "<bos>", "he", "llo", "▁he", "<0x78>", "\n", "<|turn>", "<0xC3>", "<0xA9>"
    ]  # fmt: skip
    assert tok.decode(enc.ids, skip_special_tokens=True) == "hello hex\né"
    merges = json.loads(tok.to_str())["model"]["merges"]
    assert merges[6:] == [["a", " b"], ["a b", "!"]]  # U+0120 read back as the space
    config = json.loads(ckpt.file("tokenizer_config.json").read_text())
    assert (config["bos_token"], config["add_bos_token"]) == ("<bos>", True)
    generation = json.loads(ckpt.file("generation_config.json").read_text())
    assert generation["eos_token_id"] == [1] and generation["bos_token_id"] == 2


@pytest.mark.parametrize(
    ("merges", "match"),
    [
        ([], r"gemma4 tokenizer has no tokenizer\.ggml\.merges"),
        (["hello"], r"merge 'hello' of the gemma4 tokenizer has no space"),
        (["h x"], r"merge 'h x' uses a token outside the vocabulary"),
    ],
)
def test_gemma4_tokenizer_bad_merges(tmp_path, merges, match):
    meta = gemma4_metadata(merges)
    path = toy_file(tmp_path / "m.gguf", [("w", np.ones(32, np.float32), "F32")], meta)
    with pytest.raises(CheckpointError, match=match):
        open_toy(path)


@pytest.mark.parametrize(("kind", "bits"), [("Q8_0", 8), ("Q4_0", 4), ("Q5_0", 8)])
def test_stored_blocks_are_the_matmulnbits_scheme(tmp_path, kind, bits):
    """Q8_0 / Q4_0 / Q5_0 blocks repacked for MatMulNBits (zero point 128 / 8 / 128) read
    back as exactly gguf's dequantization; any other scheme, type or transform gets None."""
    from mobius.weights.quantize import QuantScheme, dequantize_rows

    w = RNG.standard_normal((6, 96)).astype(np.float32)
    path = toy_file(tmp_path / "m.gguf", [("w", w, kind), ("f", w, "F16"), ("t", w, kind)])
    family = ToyFamily({"t": GGUFTensor("t", (add_constant(1.0),))})
    ckpt = open_toy(path, family)
    read = ckpt.stored_quantized("w", QuantScheme(bits=bits), np.float32)
    rows = read(1, 5)
    assert rows.packed.shape == (4, 3, 32 * bits // 8) and rows.zero_points is None
    back = dequantize_rows(rows, 96, bits=bits, block_size=32)
    np.testing.assert_array_equal(back, reference(path, "w")[1:5])
    other = 4 if bits == 8 else 8
    for scheme in (
        QuantScheme(bits=other),
        QuantScheme(bits=bits, block_size=64),
        QuantScheme(bits=bits, symmetric=False),
        QuantScheme(bits=bits, symmetric=False, float_zero_points=True),
    ):
        assert ckpt.stored_quantized("w", scheme, np.float32) is None
    assert ckpt.stored_quantized("f", QuantScheme(bits=bits), np.float32) is None
    assert ckpt.stored_quantized("t", QuantScheme(bits=bits), np.float32) is None


class ToyWithCompanion(ToyFamily):
    """ToyFamily that also reads ``clip`` companions (their tensors prefixed ``enc.``)."""

    @hookimpl
    def mobius_gguf_companion_translation(self, architecture, metadata, tensors, companion):
        if architecture != "toy" or companion.metadata.get("general.architecture") != "clip":
            return None
        self.seen.append(("companion", companion.file, dict(companion.tensors)))
        mapped = {n: n for n in tensors}
        mapped.update({n: f"enc.{n}" for n in companion.tensors})
        return GGUFTranslation(config={"model_type": "toy-mm"}, tensors=mapped)


def test_a_companion_beside_the_model_is_read_with_it(tmp_path):
    """The one ``mmproj*.gguf`` beside the model goes to the family's companion hook; its
    tensors join the checkpoint and its hash the manifest's files; ``--mmproj none``, a
    family that reads no companions, several candidates or a damaged one leave the model
    file alone, with a note."""
    a, e = np.ones((2, 32), np.float32), np.full((3, 32), 2, np.float32)
    toy_file(tmp_path / "m.gguf", [("a", a, "F32")])
    write_gguf(tmp_path / "mmproj-m.gguf", "clip", {}, [("e", e, "F32")])
    family = ToyWithCompanion()
    ckpt = host_with(family).open_checkpoint(str(tmp_path), None)
    assert ckpt.raw_config["model_type"] == "toy-mm" and ckpt.companion.name == "mmproj-m.gguf"
    np.testing.assert_array_equal(ckpt.read("enc.e"), e)
    assert dict(ckpt.source.files).keys() == {"m.gguf", "mmproj-m.gguf"}
    alone = host_with(ToyWithCompanion()).open_checkpoint(str(tmp_path), None, "none")
    assert alone.raw_config["model_type"] == "toy" and alone.companion is None

    text_only = open_toy(tmp_path / "m.gguf")  # ToyFamily reads no companions
    assert set(text_only.tensors) == {"a"} and "reads no mmproj files" in text_only.companion_note
    write_gguf(tmp_path / "mmproj-m-f16.gguf", "clip", {}, [("e", e, "F16")])
    two = host_with(ToyWithCompanion()).open_checkpoint(str(tmp_path), None)
    assert two.companion is None and "2 mmproj files beside the model" in two.companion_note
    named = host_with(ToyWithCompanion()).open_checkpoint(
        str(tmp_path / "m.gguf"), None, str(tmp_path / "mmproj-m-f16.gguf")
    )
    assert named.companion.name == "mmproj-m-f16.gguf"
    (tmp_path / "mmproj-m-f16.gguf").write_bytes(b"damaged")
    (tmp_path / "mmproj-m.gguf").unlink()
    broken = host_with(ToyWithCompanion()).open_checkpoint(str(tmp_path), None)
    assert broken.companion is None and "beside the model not read: " in broken.companion_note


def test_a_named_companion_is_checked(tmp_path):
    """``--mmproj FILE``: missing, not .gguf, the model itself, damaged, clashing names,
    or unread by every family: one-line errors naming it."""
    a = np.ones((2, 32), np.float32)
    model = toy_file(tmp_path / "m.gguf", [("a", a, "F32")])
    (tmp_path / "enc.bin").write_bytes(b"x")
    (tmp_path / "bad.gguf").write_bytes(b"damaged" * 8)
    clash = write_gguf(tmp_path / "clash.gguf", "clip", {}, [("a", a, "F32")])
    other = write_gguf(tmp_path / "other.gguf", "vits", {}, [("e", a, "F32")])
    cases = [
        (tmp_path / "gone.gguf", "mmproj file not found"),
        (tmp_path / "enc.bin", "not a .gguf file"),
        (model, "the model file itself"),
        (tmp_path / "bad.gguf", "not a readable GGUF file"),
        (clash, "tensor 'a' is in both the model file and its mmproj file"),
        (other, "no installed plugin reads an mmproj file with GGUF architecture 'toy'"),
    ]
    for path, match in cases:
        with pytest.raises(CheckpointError, match=match) as info:
            host_with(ToyWithCompanion()).open_checkpoint(str(model), None, str(path))
        assert "\n" not in info.value.what and info.value.fix
