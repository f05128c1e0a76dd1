"""L3: Gemma 4's routed MoE (core ``RoutedExperts``) against HF 5.24, and what a decode reads.

Fixtures (reference/specs.py): ``moe-text`` (4 experts top-2, k_eq_v) and the pair
``moe8-text`` / ``moe64-text``, identical but for ``num_experts`` (8 vs 64, top-2, H 128).
Each is built for ``default`` (Attention) and ``cpu`` (GroupQueryAttention) and checked
against HF float32: 24-token prefill + 16 cached decode steps through
``mobius_runtime.Pipeline`` (max|Δ logits| ≤ 1e-4, top-1 100 %), greedy ids from
``Pipeline.generate`` equal to HF's greedy ids, and a batch of 2 with left padding. The
MoE + vision fixture (``bidir-moe-mm``) is covered in test_l3_multimodal.py.

What a decode step reads is asserted from the graph (``expert_tables``: every expert table
is read only through a Gather of the hit experts; ``decode_weight_bytes``: bytes per
decode token routed vs dense). Speed is printed, never asserted (run with ``-s``): decode
tokens/s of the 8- and 64-expert packages, routed and in the dense formulation
(``dense_formulation()``), measured in the same run with the load average.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np
import pytest
from conftest import PREFILL

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from reference.metrics import top1
from reference.run import load_pipeline, step_logits
from reference.specs import SPECS

from mobius.components.experts import decode_weight_bytes, dense_formulation, expert_tables

pytestmark = [pytest.mark.reference, pytest.mark.l3]

MOE_TEXT = ["moe-text", "moe8-text", "moe64-text"]
F32_ATOL = 1e-4
GREEDY = 16
PAD = 5  # left padding of row 1 in the batch test


def _text_graph(package):
    import onnx_ir as ir

    manifest = json.loads((package / "mobius.json").read_text())
    return ir.load(str(package / manifest["components"]["model"]["path"])).graph


def _hf_model(reference_cache, name):
    from reference.hf_runner import load_model

    pair = reference_cache.checkpoint(name)
    return load_model(pair.saved, pair.spec.model_type)


def _hf_greedy(model, prompt: np.ndarray, steps: int) -> list[int]:
    """HF greedy ids: argmax of a no-cache f32 forward over the growing sequence."""
    from reference.hf_runner import hf_logits

    ids = prompt.copy()
    out = []
    for _ in range(steps):
        nxt = int(hf_logits(model, ids)[0, -1].argmax())
        out.append(nxt)
        ids = np.concatenate([ids, [[nxt]]], axis=1)
    return out


@pytest.mark.parametrize("target", ["default", "cpu"])
@pytest.mark.parametrize("name", MOE_TEXT)
def test_f32_parity_and_greedy_ids(reference_cache, parity_ids, name, target):
    ref = reference_cache.hf_logits(name, parity_ids)
    package = reference_cache.build(name, target=target).out
    pipe = load_pipeline(package)
    got = step_logits(pipe, parity_ids, PREFILL)[0]
    delta = float(np.abs(ref - got).max())
    strict, _ = top1(ref, got, 0.0)
    print(f"\n[L3-moe] {name} f32 target={target}: max|Δ logits| {delta:.3e}, top-1 {strict:.1%}")
    assert delta <= F32_ATOL, f"{name} {target}: max|Δ logits| {delta:.3e} > {F32_ATOL}"
    assert strict == 1.0, f"{name} {target}: top-1 {strict:.1%}"

    graph = _text_graph(package)
    layers = SPECS[name].text_config()["num_hidden_layers"]
    attn = {"default": "Attention", "cpu": "GroupQueryAttention"}[target]
    assert sum(n.op_type == attn for n in graph) == layers
    assert len(expert_tables(graph)) == 2 * layers  # gate_up and down of every layer

    prompt = parity_ids[:, :PREFILL]
    result = pipe.generate(input_ids=prompt[0].tolist(), max_new_tokens=GREEDY, stop_ids=())
    want = _hf_greedy(_hf_model(reference_cache, name), prompt, GREEDY)
    assert result.ids == want, f"{name} {target}: greedy ids {result.ids} != HF {want}"


def _padded_ids(parity_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Batch 2: row 0 the parity ids, row 1 other ids with PAD leading pad tokens (id 0)."""
    rng = np.random.default_rng(99)
    row1 = rng.integers(3, 1000, size=parity_ids.shape[1])
    row1[:PAD] = 0
    ids = np.stack([parity_ids[0], row1]).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, :PAD] = 0
    return ids, mask


def _positions(mask: np.ndarray) -> np.ndarray:
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0)


def _ort_padded(package, ids, mask, prefill: int) -> np.ndarray:
    """The package's ``model`` graph on ORT CPU with an explicit padded attention_mask
    (the runtime generates all-ones masks, so padding is driven at the graph's ports)."""
    import onnxruntime as ort

    manifest = json.loads((package / "mobius.json").read_text())
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(
        str(package / manifest["components"]["model"]["path"]),
        opts,
        providers=["CPUExecutionProvider"],
    )
    names = [o.name for o in sess.get_outputs()]
    pos = _positions(mask)
    past = {  # [B, kv heads, 0, head dim]
        i.name: np.zeros((ids.shape[0], i.shape[1], 0, i.shape[3]), np.float32)
        for i in sess.get_inputs()
        if i.name.startswith("past_key_values.")
    }
    chunks, start = [], 0
    for end in [prefill, *range(prefill + 1, ids.shape[1] + 1)]:
        feeds = {
            "input_ids": ids[:, start:end],
            "attention_mask": mask[:, :end],
            "position_ids": pos[:, start:end],
            **past,
        }
        out = dict(zip(names, sess.run(None, feeds)))
        chunks.append(out["logits"])
        past = {
            k.replace("present.", "past_key_values."): v
            for k, v in out.items()
            if k.startswith("present.")
        }
        start = end
    return np.concatenate(chunks, axis=1)


@pytest.mark.parametrize("name", ["moe-text", "moe64-text"])
def test_batch_of_two_with_left_padding(reference_cache, parity_ids, name):
    import torch

    ids, mask = _padded_ids(parity_ids)
    model = _hf_model(reference_cache, name)
    with torch.no_grad():
        ref = (
            model(
                input_ids=torch.from_numpy(ids),
                attention_mask=torch.from_numpy(mask),
                position_ids=torch.from_numpy(_positions(mask)),
                use_cache=False,
            )
            .logits.float()
            .numpy()
        )
    got = _ort_padded(reference_cache.build(name).out, ids, mask, PREFILL)
    valid = mask.astype(bool)
    delta = float(np.abs(ref - got)[valid].max())
    agree = float((ref.argmax(-1) == got.argmax(-1))[valid].mean())
    print(
        f"\n[L3-moe] {name} batch 2, row 1 left-padded by {PAD}: max|Δ| {delta:.3e}, "
        f"top-1 {agree:.1%}"
    )
    assert delta <= F32_ATOL
    assert agree == 1.0


def _decode_tok_s(package, prompt: np.ndarray, steps: int = 32, repeats: int = 3) -> float:
    """Median decode tokens/s of single-token cached steps after a prefill of ``prompt``."""
    pipe = load_pipeline(package)
    rates = []
    for _ in range(repeats):
        _, state = pipe.step(input_ids=prompt)
        tok = prompt[:, -1:]
        t0 = time.perf_counter()
        for _ in range(steps):
            _, state = pipe.step(state, input_ids=tok)
        rates.append(steps / (time.perf_counter() - t0))
    return statistics.median(rates)


def test_decode_reads_top_k_experts_not_all(reference_cache, parity_ids, tmp_path):
    """moe8 and moe64 read the same expert bytes per decode token (2 experts per layer);
    both are exact vs HF (test above). Prints routed vs dense decode tokens/s."""
    import mobius

    rows, expert_read = [], {}
    for name in ("moe8-text", "moe64-text"):
        text = SPECS[name].text_config()
        E, k = text["num_experts"], text["top_k_experts"]
        routed_pkg = reference_cache.build(name).out
        graph = _text_graph(routed_pkg)
        tables = expert_tables(graph)
        routed, dense = decode_weight_bytes(graph, E, k)
        per_table = {v.name: int(np.prod(v.shape)) * 4 for v in tables}
        expert_read[name] = sum(per_table.values()) * k // E
        with dense_formulation():
            dense_pkg = mobius.build(
                str(reference_cache.checkpoint(name).saved), str(tmp_path / f"{name}-dense")
            ).out
        dense_logits = step_logits(load_pipeline(dense_pkg), parity_ids, PREFILL)[0]
        ref = reference_cache.hf_logits(name, parity_ids)
        assert float(np.abs(dense_logits - ref).max()) <= F32_ATOL  # the baseline is exact too
        assert expert_tables(_text_graph(dense_pkg)) == []
        prompt = parity_ids[:, :PREFILL]
        rows.append(
            (
                name,
                routed,
                dense,
                _decode_tok_s(routed_pkg, prompt),
                _decode_tok_s(dense_pkg, prompt),
            )
        )
    assert expert_read["moe8-text"] == expert_read["moe64-text"]
    print(f"\n[L3-moe] decode, batch 1, ORT CPU 1 thread, load average {os.getloadavg()[0]:.2f}")
    for name, routed, dense, r_tps, d_tps in rows:
        print(
            f"[L3-moe] {name}: weight bytes/decode token routed {routed / 2**20:.2f} MiB, "
            f"dense {dense / 2**20:.2f} MiB; decode routed {r_tps:.0f} tok/s, "
            f"dense {d_tps:.0f} tok/s"
        )
    (_, _, _, r8, d8), (_, _, _, r64, d64) = rows
    print(
        f"[L3-moe] 64 vs 8 experts: routed {r64 / r8:.2f}x, dense {d64 / d8:.2f}x "
        f"(issue bar for routed: >= 0.7x)"
    )


def _dequantized_experts_model(reference_cache, name: str, block: int):
    """The HF f32 model of ``name`` with every expert tensor replaced by what its int4
    blocks read back as (each expert quantized as a MatMulNBits weight, as the build does)."""
    import torch

    from mobius.weights.quantize import QuantizedRows, dequantize_rows, quantize_experts

    model = _hf_model(reference_cache, name)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if not pname.endswith(("experts.gate_up_proj", "experts.down_proj")):
                continue
            w = p.detach().numpy()
            q = quantize_experts(w, bits=4, block_size=block)
            back = [
                dequantize_rows(
                    QuantizedRows(q.packed[e], q.scales[e], None),
                    w.shape[2],
                    bits=4,
                    block_size=block,
                )
                for e in range(w.shape[0])
            ]
            p.copy_(torch.from_numpy(np.stack(back)))
    return model


def test_int4_decode_reads_only_picked_expert_blocks(reference_cache, parity_ids, tmp_path):
    """``--quant int4`` (experts only, the rest kept float): every expert table is read by a
    GatherBlockQuantized of the hit experts' rows, so a decode token reads top_k experts'
    int4 blocks; the package equals HF run on the dequantized expert weights (f32 bar)."""
    from reference.hf_runner import hf_logits

    import mobius
    from mobius.records import QuantOptions

    name = "moe64-text"
    text = SPECS[name].text_config()
    E, k, L = text["num_experts"], text["top_k_experts"], text["num_hidden_layers"]
    keep_float = ("embed_tokens*", "*self_attn*", "*.mlp.*", "*router*")
    quant = QuantOptions("int4", block_size=32, exclude=keep_float)
    package = mobius.build(
        str(reference_cache.checkpoint(name).saved), str(tmp_path / "int4"), quant=quant
    ).out
    manifest = json.loads((package / "mobius.json").read_text())
    tensors = manifest["quantization"]["components"]["model"]["tensors"]
    assert set(tensors) == {
        f"layers.{i}.experts.{t}" for i in range(L) for t in ("gate_up_proj", "down_proj")
    }
    assert {tuple(t["ops"]) for t in tensors.values()} == {("GatherBlockQuantized",)}
    graph = _text_graph(package)
    assert {v.name for v in expert_tables(graph)} == {
        f"{t}.{part}" for t in tensors for part in ("quant", "scales")
    }
    routed, dense = decode_weight_bytes(graph, E, k)
    f32_routed, _ = decode_weight_bytes(_text_graph(reference_cache.build(name).out), E, k)
    assert routed < f32_routed

    ref = hf_logits(_dequantized_experts_model(reference_cache, name, 32), parity_ids)
    got = step_logits(load_pipeline(package), parity_ids, PREFILL)[0]
    delta = float(np.abs(got - ref).max())
    strict, _ = top1(ref, got, 0.0)
    print(
        f"\n[L3-moe] {name} int4 experts: weight bytes/decode token routed "
        f"{routed / 2**20:.2f} MiB (f32 package {f32_routed / 2**20:.2f}), every expert would "
        f"be {dense / 2**20:.2f} MiB; vs HF on the dequantized experts: max|Δ| {delta:.3e}, "
        f"top-1 {strict:.1%}"
    )
    assert delta <= F32_ATOL
    assert strict == 1.0


@pytest.mark.parametrize(("dtype", "target"), [("f32", "cpu"), ("f16", "cpu"), ("f16", "cuda")])
def test_moe_keeps_group_query_attention(dtype, target):
    """``--target cpu|cuda`` MoE graphs (built graph-only, no device needed) run
    GroupQueryAttention on every layer, and their experts stay routed."""
    from mobius.records import BuildOptions
    from mobius_gemma4.build import build_component
    from mobius_gemma4.config import read_config

    text = SPECS["moe64-text"].text_config()
    model = build_component(
        read_config("gemma4_text", text), "model", BuildOptions(dtype=dtype, target=target)
    )
    layers = text["num_hidden_layers"]
    ops = [n.op_type for n in model.graph]
    assert ops.count("GroupQueryAttention") == layers
    assert "Attention" not in ops
    assert len(expert_tables(model.graph)) == 2 * layers
