"""A GGUF file's tokenizer, chat template and stop ids, as the files of an HF checkpoint.

llama.cpp stores the tokenizer in the metadata (``tokenizer.ggml.*``); a package needs
``tokenizer.json`` (written here with the ``tokenizers`` library),
``tokenizer_config.json`` (the named special tokens, ``add_bos_token`` …),
``chat_template.jinja`` (``tokenizer.chat_template``) and ``generation_config.json``
(the eos and end-of-turn ids the runtime stops on). Core's runtime-file path
(:mod:`mobius.chat_files`) then copies them like any checkpoint's.

Three tokenizer models:

- ``gpt2``: byte-level BPE; ``tokenizer.ggml.tokens`` are the byte-level strings of the
  vocabulary, ``tokenizer.ggml.merges`` the ``"a b"`` merges, and ``tokenizer.ggml.pre``
  names the pre-tokenizer split (:data:`PRE_TOKENIZERS`);
- ``llama``: SentencePiece-style BPE: tokens with ``tokenizer.ggml.scores`` (merge
  priority) and byte fallback (``<0x41>`` tokens), ``▁`` for spaces;
- ``gemma4``: what llama.cpp's converter writes for Gemma 4 (``Gemma4Model.set_vocab``):
  the HF tokenizer's pieces (raw UTF-8 with ``▁`` for spaces, ``<0x41>`` byte tokens, the
  added tokens after the base vocabulary), its ``tokenizer.json`` merges in
  ``tokenizer.ggml.merges`` (ranked by order; a space inside a piece written as ``Ġ``,
  U+0120), placeholder scores, ``add_space_prefix`` false and ``add_bos_token`` true.
  llama.cpp reads it as a BPE over UTF-8 characters (no byte-level remap) with byte
  fallback; the ``tokenizer.json`` written here is HF's ``GemmaTokenizer``: spaces
  replaced by ``▁``, no prefix space, BPE with byte fallback and those merges.

Token types (``tokenizer.ggml.token_type``): 1 normal, 2 unknown, 3 control, 4
user-defined, 5 unused, 6 byte; control tokens become special added tokens,
user-defined ones plain added tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mobius.checkpoint.gguf import _short as _brief
from mobius.errors import CheckpointError

CONTROL, USER_DEFINED, UNUSED, BYTE = 3, 4, 5, 6
MODELS = ("gpt2", "llama", "gemma4")
"""The ``tokenizer.ggml.model`` values read here."""
SPACE_IN_MERGE = chr(ord(" ") + 256)
"""How gguf's ``SpecialVocab`` writes a space inside a merge's piece (``Ġ``)."""

_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DIGITS = "digits"
PRE_TOKENIZERS: dict[str, str | None] = {
    "default": None,
    "gpt-2": None,
    "gpt2": None,
    "qwen2": _QWEN2,
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "smollm": DIGITS,
}
"""``tokenizer.ggml.pre`` → the split before byte-level encoding: a regex, None for GPT-2's
own (``ByteLevel(use_regex=True)``), or :data:`DIGITS` for GPT-2's after every digit is
split off alone (llama.cpp's ``smollm``: ``\\p{N}`` first, then GPT-2's regex; SmolLM2's
own tokenizer.json says ``Digits(individual_digits=True)`` then ``ByteLevel``)."""

_IDS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
}


def _fail(what: str, where: str, fix: str | None = None) -> CheckpointError:
    return CheckpointError(
        what,
        where=where,
        fix=fix or "convert the model again with llama.cpp's convert_hf_to_gguf.py",
    )


def _id(metadata: Mapping[str, Any], role: str, size: int | None = None) -> int | None:
    value = metadata.get(_IDS[role])
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    if size is not None and value >= size:
        return None
    return value


def special_ids(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``bos_token_id`` / ``eos_token_id`` / ``pad_token_id`` for config.json, when the file
    gives them (core adds them to the family's config where it has none)."""
    out: dict[str, Any] = {}
    for role in ("bos", "eos", "pad"):
        value = _id(metadata, role)
        if value is not None:
            out[f"{role}_token_id"] = value
    return out


def side_files(metadata: Mapping[str, Any], *, where: str) -> dict[str, bytes]:
    """File name → bytes of every side file the metadata describes (none when it holds
    no tokenizer)."""
    model = metadata.get("tokenizer.ggml.model")
    if model is None:
        return {}
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise _fail("tokenizer.ggml.tokens is not a non-empty list of strings", where)
    types = _list(metadata, "tokenizer.ggml.token_type", len(tokens), int, where)
    if model == "gpt2":
        tokenizer = _byte_level_bpe(metadata, tokens, types, where)
    elif model == "llama":
        tokenizer = _sentencepiece_bpe(metadata, tokens, types, where)
    elif model == "gemma4":
        tokenizer = _gemma4_bpe(metadata, tokens, where)
    else:
        raise _fail(
            f"tokenizer.ggml.model {_brief(model)} is not one mobius reads ({', '.join(MODELS)})",
            where,
            "use a GGUF file with a gpt2 (byte-level BPE), llama (SentencePiece) or gemma4 "
            "tokenizer",
        )
    _add_tokens(tokenizer, tokens, types)
    names = {
        role: tokens[i] for role in _IDS if (i := _id(metadata, role, len(tokens))) is not None
    }
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", model in ("llama", "gemma4")))
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    _post_processor(tokenizer, names, add_bos and "bos" in names, add_eos and "eos" in names)
    files = {"tokenizer.json": tokenizer.to_str().encode("utf-8")}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": names.get("bos"),
        "eos_token": names.get("eos"),
        "unk_token": names.get("unk"),
        "pad_token": names.get("pad"),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
    }
    files["tokenizer_config.json"] = json.dumps(config, indent=2, ensure_ascii=False).encode()
    template = metadata.get("tokenizer.chat_template")
    if isinstance(template, str) and template.strip():
        files["chat_template.jinja"] = template.encode("utf-8")
    stops = list(dict.fromkeys(
        i for role in ("eos", "eot", "eom") if (i := _id(metadata, role, len(tokens))) is not None
    ))  # fmt: skip
    generation: dict[str, Any] = {}
    if (bos := _id(metadata, "bos", len(tokens))) is not None:
        generation["bos_token_id"] = bos
    if stops:
        generation["eos_token_id"] = stops
    if (pad := _id(metadata, "pad", len(tokens))) is not None:
        generation["pad_token_id"] = pad
    if generation:
        files["generation_config.json"] = json.dumps(generation, indent=2).encode()
    return files


def _list(metadata: Mapping[str, Any], key: str, size: int, kind: type, where: str) -> list[Any]:
    value = metadata.get(key)
    if value is None:
        return [1 if kind is int else 0.0] * size
    if (
        not isinstance(value, list)
        or len(value) != size
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    ):
        raise _fail(f"{key} is not a list of {size} numbers (one per token)", where)
    return value


def _byte_level_bpe(metadata: Mapping[str, Any], tokens: list[str], types: list[int], where: str):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise _fail(
            f"tokenizer.ggml.pre {_brief(pre)} is a pre-tokenizer mobius does not know "
            f"(known: {', '.join(PRE_TOKENIZERS)})",
            where,
            "use a GGUF file whose tokenizer uses one of these, or report the name",
        )
    raw_merges = metadata.get("tokenizer.ggml.merges", [])
    if not isinstance(raw_merges, list) or not all(
        isinstance(m, str) and m.count(" ") == 1 for m in raw_merges
    ):
        raise _fail("tokenizer.ggml.merges is not a list of 'left right' strings", where)
    vocab = _vocab(tokens)
    merges = [tuple(m.split(" ")) for m in raw_merges]
    for left, right in merges:
        if left not in vocab or right not in vocab or left + right not in vocab:
            raise _fail(f"merge {_brief(left + ' ' + right)} uses a token outside the vocabulary",
                        where)  # fmt: skip
    unk = _id(metadata, "unk", len(tokens))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges,
                                     unk_token=tokens[unk] if unk is not None else None))  # fmt: skip
    regex = PRE_TOKENIZERS[pre]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=regex in (None, DIGITS))
    if regex is None:
        tokenizer.pre_tokenizer = byte_level
    elif regex == DIGITS:
        digits = pre_tokenizers.Digits(individual_digits=True)
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([digits, byte_level])
    else:
        split = pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _vocab(tokens: list[str]) -> dict[str, int]:
    """token → id; a token spelled twice keeps its first id (later ones stay reachable as
    added tokens only if typed so)."""
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    return vocab


def _sentencepiece_bpe(
    metadata: Mapping[str, Any], tokens: list[str], types: list[int], where: str
):
    """SentencePiece BPE: merges ranked by the score of the merged piece."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores = _list(metadata, "tokenizer.ggml.scores", len(tokens), float, where)
    vocab = _vocab(tokens)
    mergeable = {
        t: i for t, i in vocab.items() if types[i] not in (CONTROL, USER_DEFINED, UNUSED, BYTE)
    }
    ranked = []
    for piece, i in mergeable.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in mergeable and right in mergeable:
                ranked.append((-float(scores[i]), vocab[left], vocab[right], left, right))
    ranked.sort()
    merges = [(left, right) for *_, left, right in ranked]
    unk = _id(metadata, "unk", len(tokens))
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            unk_token=tokens[unk] if unk is not None else None,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    steps = [normalizers.Replace(" ", "▁")]
    if metadata.get("tokenizer.ggml.add_space_prefix", True):
        steps.insert(0, normalizers.Prepend("▁"))
    tokenizer.normalizer = normalizers.Sequence(steps)
    strip = (
        [decoders.Strip(" ", 1, 0)] if metadata.get("tokenizer.ggml.add_space_prefix", True) else []
    )
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    return tokenizer


def _gemma4_bpe(metadata: Mapping[str, Any], tokens: list[str], where: str):
    """Gemma 4's BPE over UTF-8 characters: merges in rank order, byte fallback, spaces as
    ``▁`` (HF ``GemmaTokenizer``'s normalizer, pre-tokenizer and decoder)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    raw_merges = metadata.get("tokenizer.ggml.merges")
    if (
        not isinstance(raw_merges, list)
        or not raw_merges
        or not all(isinstance(m, str) for m in raw_merges)
    ):
        raise _fail("the gemma4 tokenizer has no tokenizer.ggml.merges (a list of strings)",
                    where)  # fmt: skip
    vocab = _vocab(tokens)
    merges = [_gemma4_merge(m, vocab, where) for m in raw_merges]
    unk = _id(metadata, "unk", len(tokens))
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            unk_token=tokens[unk] if unk is not None else None,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return tokenizer


def _gemma4_merge(merge: str, vocab: Mapping[str, int], where: str) -> tuple[str, str]:
    """``"left right"`` split as llama.cpp does (at the first space after the first
    character); a piece outside the vocabulary is tried with ``Ġ`` read back as a space."""
    cut = merge.find(" ", 1)
    if cut < 0:
        raise _fail(f"merge {_brief(merge)} of the gemma4 tokenizer has no space", where)
    pair = []
    for piece in (merge[:cut], merge[cut + 1 :]):
        if piece not in vocab and piece.replace(SPACE_IN_MERGE, " ") in vocab:
            piece = piece.replace(SPACE_IN_MERGE, " ")
        pair.append(piece)
    left, right = pair
    if left not in vocab or right not in vocab or left + right not in vocab:
        raise _fail(f"merge {_brief(merge)} uses a token outside the vocabulary", where)
    return left, right


def _add_tokens(tokenizer: Any, tokens: list[str], types: list[int]) -> None:
    from tokenizers import AddedToken

    special = [AddedToken(t, special=True, normalized=False)
               for t, k in zip(tokens, types) if k == CONTROL]  # fmt: skip
    plain = [AddedToken(t, special=False, normalized=False)
             for t, k in zip(tokens, types) if k == USER_DEFINED]  # fmt: skip
    if special:
        tokenizer.add_special_tokens(special)
    if plain:
        tokenizer.add_tokens(plain)


def _post_processor(tokenizer: Any, names: dict[str, str], bos: bool, eos: bool) -> None:
    if not (bos or eos):
        return
    from tokenizers import processors

    before = [names["bos"]] if bos else []
    after = [names["eos"]] if eos else []
    single = " ".join([*before, "$A", *after])
    pair = " ".join([*before, "$A", *after, *before, "$B", *after])
    special = [(t, tokenizer.token_to_id(t)) for t in dict.fromkeys([*before, *after])]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=special
    )
