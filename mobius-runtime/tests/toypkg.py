"""Hand-made model packages for the runtime tests.

Tiny ONNX graphs shaped like a decoder (ids, mask, positions, past → logits,
present) and a split variant (vision encoder → embedding → decoder) let the
tests check contract execution exactly: :func:`reference_logits` computes what
the graphs must output in numpy, so a wrong edge, state, mask length or
position offset changes the numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mobius.contract import (
    Component,
    Contract,
    Edge,
    ExternalInput,
    OptionalInput,
    Port,
    StateEdge,
)
from mobius.onnx_versions import IR_VERSION, OPSET

V, D = 24, 8
ELEM = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "bool": TensorProto.BOOL,
    "int64": TensorProto.INT64,
}
NP = {"float32": np.float32, "float16": np.float16}


def weights(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((V, D)).astype(np.float32),
        rng.standard_normal((D, V)).astype(np.float32),
    )


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    # Constant nodes, not initializers: the package writer stores every initializer
    # as external data, and ORT's shape inference cannot read axes from there.
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    consts = [_const(i.name, numpy_helper.to_array(i)) for i in inits if i.name not in ("E", "W")]
    inits = [i for i in inits if i.name in ("E", "W")]
    graph = helper.make_graph(consts + list(nodes), "toy", inputs, outputs, inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model)
    return model


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, ELEM[dtype], list(shape))


def decoder_graph(*, kv_dtype: str, mask_dtype: str, embeds_input: bool, seed: int = 0):
    """Decoder: h = emb + 0.01*pos; present = concat(past, h); h += sum(present) + 0.001*sum(mask)."""
    E, W = weights(seed)
    inits = [
        numpy_helper.from_array(W, "W"),
        numpy_helper.from_array(np.array([2], np.int64), "ax2"),
        numpy_helper.from_array(np.array([1], np.int64), "ax1"),
        numpy_helper.from_array(np.array(0.01, np.float32), "pscale"),
        numpy_helper.from_array(np.array(0.001, np.float32), "mscale"),
    ]
    nodes = []
    if embeds_input:
        first = _vi("inputs_embeds", "float32", ("batch", "seq", D))
        emb = "inputs_embeds"
    else:
        inits.append(numpy_helper.from_array(E, "E"))
        first = _vi("input_ids", "int64", ("batch", "seq"))
        nodes.append(helper.make_node("Gather", ["E", "input_ids"], ["emb"]))
        emb = "emb"
    nodes += [
        helper.make_node("Cast", ["position_ids"], ["posf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["posf", "pscale"], ["poss"]),
        helper.make_node("Unsqueeze", ["poss", "ax2"], ["pos3"]),
        helper.make_node("Add", [emb, "pos3"], ["h"]),
        helper.make_node("Unsqueeze", ["h", "ax1"], ["h4"]),
        helper.make_node("Cast", ["h4"], ["h4c"], to=ELEM[kv_dtype]),
        helper.make_node("Concat", ["past.0.key", "h4c"], ["present.0.key"], axis=2),
        helper.make_node("Cast", ["present.0.key"], ["presf"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["presf", "ax2"], ["ctx4"], keepdims=0),
        helper.make_node("Add", ["h", "ctx4"], ["h2"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["maskf", "ax1"], ["msum"], keepdims=1),
        helper.make_node("Mul", ["msum", "mscale"], ["mterm"]),
        helper.make_node("Unsqueeze", ["mterm", "ax2"], ["m3"]),
        helper.make_node("Add", ["h2", "m3"], ["h3"]),
        helper.make_node("MatMul", ["h3", "W"], ["logits"]),
    ]
    inputs = [
        first,
        _vi("attention_mask", mask_dtype, ("batch", "total")),
        _vi("position_ids", "int64", ("batch", "seq")),
        _vi("past.0.key", kv_dtype, ("batch", 1, "past", D)),
    ]
    outputs = [
        _vi("logits", "float32", ("batch", "seq", V)),
        _vi("present.0.key", kv_dtype, ("batch", 1, "total", D)),
    ]
    return _model(nodes, inputs, outputs, inits)


def embedding_graph(seed: int = 0):
    """inputs_embeds = E[ids] + sum(image_features) (zero when no image)."""
    E, _ = weights(seed)
    inits = [numpy_helper.from_array(E, "E")]
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["emb"]),
        helper.make_node("ReduceSum", ["image_features"], ["isum"], keepdims=0),
        helper.make_node("Add", ["emb", "isum"], ["inputs_embeds"]),
    ]
    return _model(
        nodes,
        [
            _vi("input_ids", "int64", ("batch", "seq")),
            _vi("image_features", "float32", ("num_image_tokens", D)),
        ],
        [_vi("inputs_embeds", "float32", ("batch", "seq", D))],
        inits,
    )


def vision_graph():
    """image_features = 2 * pixel_values."""
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    nodes = [helper.make_node("Mul", ["pixel_values", "two"], ["image_features"])]
    return _model(
        nodes,
        [_vi("pixel_values", "float32", ("n", D))],
        [_vi("image_features", "float32", ("n", D))],
        inits,
    )


def _ports(model: onnx.ModelProto, which: str) -> tuple[Port, ...]:
    names = {v: k for k, v in ELEM.items()}
    out = []
    for vi in getattr(model.graph, which):
        t = vi.type.tensor_type
        dims = tuple(d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim)
        out.append(Port(vi.name, names[t.elem_type], dims))
    return tuple(out)


def component(name: str, model: onnx.ModelProto, presence: str | None = None) -> Component:
    return Component(name, _ports(model, "input"), _ports(model, "output"), presence)


def single_contract(decoder: onnx.ModelProto) -> Contract:
    return Contract(
        components=(component("model", decoder),),
        states=(StateEdge("model.present.0.key", "model.past.0.key", ("batch", 1, 0, D)),),
        externals=(
            ExternalInput("model.input_ids", "input_ids"),
            ExternalInput("model.attention_mask", "attention_mask", "generated"),
            ExternalInput("model.position_ids", "position_ids", "generated"),
        ),
        outputs=("model.logits",),
    )


def split_contract(vision, embedding, decoder) -> Contract:
    return Contract(
        components=(
            component("vision_encoder", vision, "image"),
            component("embedding", embedding),
            component("decoder", decoder),
        ),
        edges=(
            Edge("vision_encoder.image_features", "embedding.image_features"),
            Edge("embedding.inputs_embeds", "decoder.inputs_embeds"),
        ),
        states=(StateEdge("decoder.present.0.key", "decoder.past.0.key", ("batch", 1, 0, D)),),
        externals=(
            ExternalInput("vision_encoder.pixel_values", "pixel_values"),
            ExternalInput("embedding.input_ids", "input_ids"),
            ExternalInput("decoder.attention_mask", "attention_mask", "generated"),
            ExternalInput("decoder.position_ids", "position_ids", "generated"),
        ),
        optionals=(OptionalInput("embedding.image_features", "image", (0, D)),),
        outputs=("decoder.logits",),
    )


def write(
    out: Path,
    graphs: dict[str, onnx.ModelProto],
    contract: Contract,
    *,
    model_type: str = "toy",
    extra: dict | None = None,
    runtime_files: tuple = (),
) -> Path:
    """Write graphs + manifest with :func:`mobius.package.write_package`."""
    import onnx_ir as ir

    from mobius.package import write_package

    manifest = {
        "model_type": model_type,
        "task": "text-generation",
        "dtype": "f32",
        "target": "default",
        "contract": contract.to_dict(),
        **(extra or {}),
    }
    components = {name: ir.from_proto(model) for name, model in graphs.items()}
    # inline_limit=0: the toy weights are tiny; keep them in external data so the
    # tests exercise the external-data path the real packages use.
    return write_package(
        out,
        components=components,
        manifest=manifest,
        runtime_files=runtime_files,
        force=True,
        inline_limit=0,
    )


def single_package(
    out: Path, *, kv_dtype: str = "float32", mask_dtype: str = "int64", **kw
) -> Path:
    dec = decoder_graph(kv_dtype=kv_dtype, mask_dtype=mask_dtype, embeds_input=False)
    return write(out, {"model": dec}, single_contract(dec), **kw)


def split_package(out: Path, **kw) -> Path:
    vis, emb = vision_graph(), embedding_graph()
    dec = decoder_graph(kv_dtype="float32", mask_dtype="bool", embeds_input=True)
    return write(
        out,
        {"vision_encoder": vis, "embedding": emb, "decoder": dec},
        split_contract(vis, emb, dec),
        **kw,
    )


def reference_logits(
    chunks: list[np.ndarray], *, kv_dtype="float32", image=None
) -> list[np.ndarray]:
    """Numpy truth for feeding ``chunks`` of ids [B, s] one step after another."""
    E, W = weights()
    past = None
    out = []
    p = 0
    for ids in chunks:
        _, s = ids.shape
        h = E[ids]
        if image is not None and p == 0:
            h = h + (2.0 * image).sum()
        h = h + (np.arange(p, p + s, dtype=np.float32) * np.float32(0.01))[None, :, None]
        kv = h[:, None].astype(NP[kv_dtype])
        past = kv if past is None else np.concatenate([past, kv], axis=2)
        h2 = h + past.astype(np.float32).sum(axis=2)
        h3 = h2 + np.float32(0.001) * (p + s)
        out.append(h3 @ W)
        p += s
    return out


def tokenizer_file(out: Path) -> Path:
    """A word-level tokenizer over <pad> <bos> <eos> and the letters a..u."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2}
    for i, ch in enumerate("abcdefghijklmnopqrstu"):
        vocab[ch] = 3 + i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens(["<pad>", "<bos>", "<eos>"])
    tok.save(str(out / "tokenizer.json"))
    return out / "tokenizer.json"
