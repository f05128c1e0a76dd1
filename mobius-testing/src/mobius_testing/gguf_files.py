"""Write GGUF files in tests the way llama.cpp's ``convert_hf_to_gguf.py`` writes them.

Families write their own architecture keys and tensor names; the parts every family
shares live here: the tensor encodings (llama.cpp keeps 1-D tensors in F32 and
quantizes 2-D ones), the ``gpt2`` tokenizer metadata of an HF byte-level BPE
checkpoint (tokens, token types, merges, special ids, chat template), the ``gemma4``
tokenizer metadata of a Gemma-shaped one (:func:`gemma_style_tokenizer` makes one from a
byte-level checkpoint) and the writer call (``gguf.GGUFWriter``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6
GEMMA4_VISIBLE = ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>",
                  "<|tool_response>", "<tool_response|>", '<|"|>')  # fmt: skip
"""Tokens llama.cpp's ``Gemma4Model.set_vocab`` types user-defined (rendered in output)."""
K_QUANT_ROW = 256
"""Values per K-quant super-block: a Q4_K row length is a multiple of it."""


def encode(array: np.ndarray, ggml_type: str) -> tuple[np.ndarray, str]:
    """(data for ``GGUFWriter.add_tensor``, type) of an HF float tensor; 1-D tensors stay
    F32, as llama.cpp's converter keeps them. A uint8 array is taken as already encoded
    blocks of ``ggml_type`` (for types gguf cannot quantize: the K-quants)."""
    import gguf

    if array.dtype == np.uint8:
        return array, ggml_type
    array = np.asarray(array, dtype=np.float32)
    if array.ndim == 1:
        ggml_type = "F32"
    qtype = gguf.GGMLQuantizationType[ggml_type]
    return gguf.quants.quantize(array, qtype), ggml_type


def q4_k_blocks(shape: tuple[int, ...], rng: np.random.Generator, spread: float) -> np.ndarray:
    """Random Q4_K blocks of a tensor of ``shape`` (rows a multiple of 256 long), as
    uint8 ``[..., row bytes]`` for :func:`encode` / :func:`write_gguf`: gguf has no Q4_K
    quantizer, so the blocks are made here (random 4-bit levels and 6-bit sub-scales and
    minimums, fp16 super-scales chosen so that values lie within about ±``spread``);
    ``gguf.quants.dequantize`` gives the values they hold."""
    import gguf

    if shape[-1] % K_QUANT_ROW:
        raise ValueError(f"Q4_K rows are multiples of {K_QUANT_ROW} values, got {list(shape)}")
    size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_K][1]
    blocks = int(np.prod(shape)) // K_QUANT_ROW
    raw = rng.integers(0, 256, size=(blocks, size), dtype=np.uint8)
    # d · sc · q − dmin · m with sc, m < 64 and q < 16: the sub-block ranges centre near 0
    d = np.full((blocks, 1), spread / (63 * 15), np.float16)
    raw[:, 0:2] = d.view(np.uint8)
    raw[:, 2:4] = (d * np.float16(7.5)).view(np.uint8)
    return raw.reshape(*shape[:-1], shape[-1] // K_QUANT_ROW * size)


def llamacpp_name(architecture: str, hf_name: str, blocks: int) -> str:
    """The name llama.cpp's converter gives HF tensor ``hf_name`` in a file of
    ``architecture`` (gguf-py's own tensor map, ``gguf.get_tensor_name_map``: the table
    convert_hf_to_gguf.py maps with). The converter appends ``.weight`` to a bare
    parameter name (Gemma 4's ``layer_scalar``); so does this."""
    if not hf_name.endswith((".weight", ".bias")):
        hf_name += ".weight"
    name = _tensor_map(architecture, blocks).get_name(hf_name, try_suffixes=(".weight", ".bias"))
    if name is None:
        raise KeyError(f"gguf-py maps no {architecture} tensor {hf_name!r}")
    return name


@functools.cache
def _tensor_map(architecture: str, blocks: int) -> Any:
    import gguf

    (arch,) = [a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == architecture]
    return gguf.get_tensor_name_map(arch, blocks)


def fitting_type(ggml_type: str, row: int) -> str:
    """``ggml_type``, or what llama.cpp's quantizer falls back to for a row length its
    blocks do not divide: Q8_0 for a K-quant (rows of 32), F16 otherwise."""
    import gguf

    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ggml_type]][0]
    if row % block == 0:
        return ggml_type
    return "Q8_0" if block == K_QUANT_ROW and row % 32 == 0 else "F16"


def write_gguf_dequantized(
    path: Path,
    architecture: str,
    metadata: Mapping[str, Any],
    tensors: Iterable[tuple[str, np.ndarray, str]],
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """:func:`write_gguf` with each matrix in its :func:`fitting_type` (Q4_K ones as
    :func:`q4_k_blocks` spread like the tensor); returns gguf's own dequantization
    (``gguf.quants.dequantize``, float32, the tensor's shape) of every tensor written,
    the values a package built from the file must compute with."""
    import gguf

    written, back = [], {}
    for name, array, ggml_type in tensors:
        if array.ndim > 1 and array.dtype != np.uint8:
            ggml_type = fitting_type(ggml_type, array.shape[-1])
            if ggml_type == "Q4_K":
                array = q4_k_blocks(array.shape, rng, float(np.abs(array).max()))
        data, kind = encode(array, ggml_type)
        values = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[kind])
        back[name] = values.astype(np.float32).reshape(*data.shape[:-1], -1)
        written.append((name, data if data.dtype == np.uint8 else array, kind))
    write_gguf(path, architecture, metadata, written)
    return back


def write_checkpoint(
    folder: Path, config: Mapping[str, Any], weights: Mapping[str, np.ndarray], like: Path
) -> Path:
    """A safetensors checkpoint folder: ``config``, ``weights`` and the tokenizer, chat
    template and generation config files of checkpoint ``like``."""
    import shutil

    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(dict(config), indent=1), encoding="utf-8")
    save_file(dict(weights), str(folder / "model.safetensors"))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                 "chat_template.jinja"):  # fmt: skip
        if (like / name).is_file():
            shutil.copy(like / name, folder / name)
    return folder


def gpt2_tokenizer_metadata(folder: Path, pre: str) -> dict[str, Any]:
    """The ``tokenizer.*`` metadata llama.cpp writes for an HF byte-level BPE tokenizer
    (``tokenizer.json`` with ``tokenizer_config.json`` / ``config.json`` beside it)."""
    tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    tcfg = _json(folder / "tokenizer_config.json")
    cfg = _json(folder / "config.json")
    vocab: dict[str, int] = dict(tok["model"]["vocab"])
    added = {t["id"]: t for t in tok.get("added_tokens", [])}
    for i, t in added.items():
        vocab[t["content"]] = i
    size = max(cfg.get("vocab_size", 0), max(vocab.values()) + 1)
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(USER_DEFINED)
        elif i in added:
            tokens.append(by_id[i])
            types.append(CONTROL if added[i].get("special") else USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
    }
    for role, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        token = tcfg.get(f"{role}_token")
        if isinstance(token, dict):
            token = token.get("content")
        # llama.cpp's SpecialVocab falls back on config.json's id
        ident = vocab.get(token) if isinstance(token, str) else cfg.get(f"{role}_token_id")
        if isinstance(ident, int):
            meta[f"tokenizer.ggml.{key}_token_id"] = ident
    for flag in ("add_bos_token", "add_eos_token"):
        if isinstance(tcfg.get(flag), bool):
            meta[f"tokenizer.ggml.{flag}"] = tcfg[flag]
    template = folder / "chat_template.jinja"
    if template.is_file():
        meta["tokenizer.chat_template"] = template.read_text(encoding="utf-8")
    elif isinstance(tcfg.get("chat_template"), str):
        meta["tokenizer.chat_template"] = tcfg["chat_template"]
    return meta


def gemma_style_tokenizer(like: Path, folder: Path) -> Path:
    """A copy of checkpoint folder ``like`` whose byte-level BPE ``tokenizer.json`` is
    rewritten into the shape of Gemma 4's (HF ``GemmaTokenizer``: UTF-8 pieces with ``▁``
    for spaces, ``<0xNN>`` byte-fallback tokens, spaces replaced by the normalizer), same
    ids and added tokens: a byte-level piece that is valid UTF-8 becomes that text, a
    lone byte of 0x80 and up its ``<0xNN>`` token, any other piece an unused
    placeholder, and the merges between surviving pieces are kept in order."""
    import shutil

    from tokenizers.pre_tokenizers import ByteLevel

    folder.mkdir(parents=True)
    for child in like.iterdir():
        if child.is_file() and child.suffix != ".safetensors":
            shutil.copy(child, folder / child.name)
    tok = json.loads((like / "tokenizer.json").read_text(encoding="utf-8"))
    char_byte = {c: b for b, c in enumerate_byte_level(ByteLevel.alphabet())}
    added = {t["content"] for t in tok.get("added_tokens", [])}
    pieces: dict[str, str] = {}
    for token in tok["model"]["vocab"]:
        if token in added:
            pieces[token] = token
            continue
        raw = bytes(char_byte[c] for c in token)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = f"<0x{raw[0]:02X}>" if len(raw) == 1 else f"<unused{len(pieces)}>"
        pieces[token] = text.replace(" ", "\u2581")
    vocab = {pieces[t]: i for t, i in tok["model"]["vocab"].items()}
    merges = []
    for merge in tok["model"]["merges"]:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        a, b = pieces[left], pieces[right]
        if not (a.startswith("<") or b.startswith("<")) and a + b in vocab:
            merges.append([a, b])
    tok["model"].update(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=True)
    tok["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    tok["pre_tokenizer"] = {"type": "Split", "pattern": {"String": " "},
                            "behavior": "MergedWithPrevious", "invert": False}  # fmt: skip
    tok["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}  # fmt: skip
    bos = _json(like / "tokenizer_config.json").get("bos_token")
    if isinstance(bos, str) and bos in vocab:  # Gemma's tokenizer.json adds <bos>
        tok["post_processor"] = _bos_template(bos, vocab[bos])
    (folder / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    return folder


def _bos_template(bos: str, ident: int) -> dict[str, Any]:
    first = {"SpecialToken": {"id": bos, "type_id": 0}}
    seq = [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}]
    return {"type": "TemplateProcessing", "single": [first, seq[0]],
            "pair": [first, seq[0], {"SpecialToken": {"id": bos, "type_id": 1}}, seq[1]],
            "special_tokens": {bos: {"id": bos, "ids": [ident], "tokens": [bos]}}}  # fmt: skip


def enumerate_byte_level(alphabet: Iterable[str]) -> list[tuple[int, str]]:
    """(byte, character) of GPT-2's byte-level map (``ByteLevel.alphabet()`` gives the
    characters unordered: printable bytes map to themselves, the rest to 256 + n in
    byte order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    out, extra = [], 0
    for b in range(256):
        if b in printable:
            out.append((b, chr(b)))
        else:
            out.append((b, chr(256 + extra)))
            extra += 1
    assert {c for _, c in out} == set(alphabet)
    return out


def gemma4_tokenizer_metadata(folder: Path) -> dict[str, Any]:
    """The ``tokenizer.*`` metadata llama.cpp's ``Gemma4Model.set_vocab`` writes for a
    Gemma-shaped HF tokenizer folder: ``gemma4`` model, the pieces by id with score
    -1000, types (byte tokens, control = the named special tokens, the chat markers
    user-defined, the rest normal), the ``tokenizer.json`` merges as ``"a b"`` (a space
    inside a piece written U+0120), the special ids, ``add_space_prefix`` false and
    ``add_bos_token`` true, and the chat template."""
    import re

    tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    tcfg = _json(folder / "tokenizer_config.json")
    vocab: dict[str, int] = dict(tok["model"]["vocab"])
    for t in tok.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    named = [tcfg.get(f"{r}_token") for r in ("bos", "eos", "unk", "pad", "mask")]
    extra = tcfg.get("extra_special_tokens") or tcfg.get("additional_special_tokens") or []
    named += list(extra.values()) if isinstance(extra, dict) else list(extra)
    special = {vocab[t] for t in named if isinstance(t, str) and t in vocab}
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(max(by_id) + 1):
        token = by_id.get(i, f"[PAD{i}]")
        tokens.append(token)
        if token in GEMMA4_VISIBLE:
            types.append(USER_DEFINED)
        elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", token):
            types.append(BYTE)
        else:
            types.append(CONTROL if i in special else NORMAL)
    space = chr(ord(" ") + 256)
    merges = [m if isinstance(m, str) else " ".join(p.replace(" ", space) for p in m)
              for m in tok["model"]["merges"]]  # fmt: skip
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gemma4",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [-1000.0] * len(tokens),
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.ggml.add_bos_token": True,
    }
    for role, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        token = tcfg.get(f"{role}_token")
        if isinstance(token, str) and token in vocab:
            meta[f"tokenizer.ggml.{key}_token_id"] = vocab[token]
    if isinstance(tcfg.get("add_eos_token"), bool):
        meta["tokenizer.ggml.add_eos_token"] = tcfg["add_eos_token"]
    template = folder / "chat_template.jinja"
    if template.is_file():
        meta["tokenizer.chat_template"] = template.read_text(encoding="utf-8")
    return meta


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def write_gguf(
    path: Path,
    architecture: str,
    metadata: Mapping[str, Any],
    tensors: Iterable[tuple[str, np.ndarray, str]],
) -> Path:
    """Write ``tensors`` ((GGUF name, HF float array, ggml type)) and ``metadata`` (key →
    str / int / float / bool / list) with ``gguf.GGUFWriter``. Integers are written as
    uint32 (llama.cpp's type for counts and ids), floats as float32."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    for key, value in metadata.items():
        if key == "general.architecture":
            continue
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, list) and value and isinstance(value[0], int):
            writer.add_array(key, value)
        else:
            writer.add_array(key, list(value))
    for name, array, ggml_type in tensors:
        data, kind = encode(array, ggml_type)
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
