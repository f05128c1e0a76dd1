"""HF transformers reference runs (the ``[reference]`` extra: torch + transformers).

A GGUF file as source is loaded by HF's own GGUF loader (``from_pretrained(folder,
gguf_file=NAME)``, which needs ``gguf`` and ``accelerate`` and dequantizes to the asked
dtype) with ``AutoModelForCausalLM``.

torch and transformers are imported inside :meth:`HFReference.load` only, so the
rest of the harness (and every build or run) never imports them. The model class
comes from the checkpoint's ``config.json`` ``architectures`` entry, so this
module knows no family.

Greedy generation is an explicit argmax loop over the model's forward with its
KV cache, not ``model.generate``: ``generate`` applies whatever processors the
checkpoint's generation config asks for (repetition penalty, forced tokens, …),
which a plain greedy runtime does not, and the golden would test that difference
instead of the model. The stop ids used are stored with the golden.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mobius.errors import MobiusError
from mobius_testing.cases import Case
from mobius_testing.golden import Inputs

REFERENCE_HINT = "pip install 'mobius-testing[reference]' (torch==2.13.0, transformers)"
_NOT_MEDIA = {"input_ids", "attention_mask", "token_type_ids"}


class ReferenceError(MobiusError):
    """The HF reference cannot run (extra missing, unknown architecture, no weights)."""


def missing_reference() -> str | None:
    """Why the ``[reference]`` extra cannot be used here, or None when it can."""
    import importlib.util

    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        return f"needs the [reference] extra ({', '.join(missing)} not installed): {REFERENCE_HINT}"
    return None


def version_of(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass
class HFReference:
    """A loaded HF model (float32 unless asked otherwise) with its tokenizer/processor."""

    source: str
    revision: str | None
    model: Any
    processor: Any
    tokenizer: Any
    device: str
    torch_dtype: str
    config: Mapping[str, Any]

    @classmethod
    def load(
        cls,
        source: str,
        *,
        revision: str | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        media: bool = False,
    ) -> HFReference:
        reason = missing_reference()
        if reason:
            raise ReferenceError(reason, where="python environment", fix=REFERENCE_HINT)
        import torch
        import transformers

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise ReferenceError(
                "device cuda was asked for the reference but torch sees no GPU",
                where="torch.cuda",
                fix="install a CUDA torch build or use --device cpu",
            )
        if _is_gguf(source):
            # HF's GGUF loader (it dequantizes to ``dtype``): folder + file name
            folder, name = str(Path(source).parent), Path(source).name
            config = transformers.AutoConfig.from_pretrained(folder, gguf_file=name)
            model = transformers.AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=name, dtype=getattr(torch, dtype)
            )
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
            processor = None
        else:
            config = transformers.AutoConfig.from_pretrained(source, revision=revision)
            arch = (getattr(config, "architectures", None) or [None])[0]
            model_cls = getattr(transformers, arch, None) if arch else None
            if model_cls is None:
                raise ReferenceError(
                    f"config.json names architecture {arch!r}, which this transformers "
                    f"({transformers.__version__}) does not have",
                    where=f"{source}/config.json: architectures",
                    fix="install the transformers version the family documents",
                )
            model = model_cls.from_pretrained(
                source, revision=revision, dtype=getattr(torch, dtype), use_safetensors=True
            )
            tokenizer = transformers.AutoTokenizer.from_pretrained(source, revision=revision)
            processor = (
                transformers.AutoProcessor.from_pretrained(source, revision=revision)
                if media
                else None
            )
        model.to(device).eval()
        return cls(source, revision, model, processor, tokenizer, device, dtype, config.to_dict())

    # ------------------------------------------------------------------ inputs

    def inputs(self, case: Case) -> Inputs:
        """Token ids and preprocessed media arrays of the case's prompt, as HF makes them."""
        media = bool(case.images or case.audio)
        if media:
            content: list[dict[str, Any]] = [
                *({"type": "image", "path": str(p)} for p in case.images),
                *({"type": "audio", "path": str(p)} for p in case.audio),
                {"type": "text", "text": case.prompt},
            ]
            messages = [{"role": "user", "content": content}]
            encoded = self.processor.apply_chat_template(
                messages,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
                return_tensors="np",
            )
        elif case.chat:
            messages = [{"role": "user", "content": case.prompt}]
            encoded = self.tokenizer.apply_chat_template(
                messages,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
                return_tensors="np",
            )
        else:
            encoded = self.tokenizer(case.prompt, return_tensors="np")
        ids = np.asarray(encoded["input_ids"]).reshape(-1)
        arrays = {
            k: np.asarray(_to_numpy(v)) for k, v in dict(encoded).items() if k not in _NOT_MEDIA
        }
        return Inputs(tuple(int(i) for i in ids), arrays)

    def _feeds(self, inputs: Inputs, ids: Sequence[int]) -> dict[str, Any]:
        import torch

        feeds: dict[str, Any] = {
            "input_ids": torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        }
        for name, arr in inputs.media.items():
            t = torch.from_numpy(np.ascontiguousarray(arr)).to(self.device)
            if t.is_floating_point():
                t = t.to(getattr(torch, self.torch_dtype))
            feeds[name] = t
        return feeds

    # ------------------------------------------------------------------ runs

    def prefill_logits(self, inputs: Inputs) -> np.ndarray:
        """Logits ``[S, V]`` (float64) of one forward over the whole prompt."""
        import torch

        with torch.inference_mode():
            out = self.model(**self._feeds(inputs, inputs.input_ids), use_cache=False)
        return out.logits[0].to(torch.float64).cpu().numpy()

    def stop_ids(self) -> tuple[int, ...]:
        """End-of-sequence ids from generation_config.json, else config.json."""
        gen = getattr(self.model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        if eos is None:
            eos = self.config.get("eos_token_id")
            if eos is None and isinstance(self.config.get("text_config"), Mapping):
                eos = self.config["text_config"].get("eos_token_id")
        if eos is None:
            return ()
        return tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))

    def greedy(
        self, inputs: Inputs, max_new_tokens: int, stop_ids: Sequence[int]
    ) -> tuple[list[int], list[float], str]:
        """(ids, top-1/top-2 margin per step, stop reason) of a plain argmax loop."""
        import torch

        stops = set(int(s) for s in stop_ids)
        ids: list[int] = []
        margins: list[float] = []
        with torch.inference_mode():
            out = self.model(**self._feeds(inputs, inputs.input_ids), use_cache=True)
            for _ in range(max_new_tokens):
                last = out.logits[0, -1].to(torch.float64)
                top = torch.topk(last, 2)
                token = int(top.indices[0])
                ids.append(token)
                margins.append(float(top.values[0] - top.values[1]))
                if token in stops:
                    return ids, margins, "stop_id"
                if len(ids) == max_new_tokens:
                    break
                step = torch.tensor([[token]], dtype=torch.long, device=self.device)
                out = self.model(input_ids=step, use_cache=True, **self._cache_kwargs(out))
        return ids, margins, "max_new_tokens"

    def _cache_kwargs(self, out: Any) -> dict[str, Any]:
        """The previous step's cache under the name this transformers uses (cache / past_key_values)."""
        import inspect

        params = inspect.signature(self.model.forward).parameters
        if "cache" in params and getattr(out, "cache", None) is not None:
            return {"cache": out.cache}
        return {"past_key_values": out.past_key_values}

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # ------------------------------------------------------------------ provenance

    def provenance(self, case: Case) -> dict[str, Any]:
        import torch

        prov: dict[str, Any] = {
            "reference": "transformers",
            "transformers": version_of("transformers"),
            "torch": version_of("torch"),
            "tokenizers": version_of("tokenizers"),
            "numpy": np.__version__,
            "python": platform.python_version(),
            "mobius_testing": version_of("mobius-testing"),
            "device": self.device,
            "device_name": torch.cuda.get_device_name()
            if self.device == "cuda"
            else platform.machine(),
            # the vector ISA torch's CPU kernels dispatch to (AVX2, AVX512, ...): it moves
            # float32 logits in their last bits, see mobius_testing.regen
            "cpu_capability": torch.backends.cpu.get_cpu_capability()
            if self.device == "cpu"
            else None,
            "reference_dtype": self.torch_dtype,
            "case_dtype": case.dtype,
            "source": case.source if not case.local else _relative(case.source, case.file),
            "revision": case.revision,
            "commit": self.config.get("_commit_hash"),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "architecture": (self.config.get("architectures") or [None])[0],
        }
        if case.local:
            prov["files"] = _local_fingerprint(Path(case.source))
        if case.gguf:
            prov["sha256"] = case.gguf_sha256
            prov["architecture"] = prov["architecture"] or self.config.get("model_type")
        return prov


def hf_gguf_model(path: str | Path, config: str | Path | None = None, dtype: str = "float32"):
    """HF's model from HF transformers' own GGUF loader on the file ``path`` (its tensor
    mapping, gguf's dequantization to ``dtype``), in eval mode. ``config``: a checkpoint
    folder whose ``config.json`` is used instead of the config HF reads from the file's
    metadata (for architectures whose metadata HF 5.24 misreads; the tests that pass it
    say why). Raises :class:`ReferenceError` without torch + transformers."""
    reason = missing_reference()
    if reason:
        raise ReferenceError(reason, where="python environment", fix=REFERENCE_HINT)
    import torch
    import transformers

    path = Path(path)
    extra = (
        {} if config is None else {"config": transformers.AutoConfig.from_pretrained(str(config))}
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=getattr(torch, dtype), **extra
    )
    return model.eval()


def _is_gguf(source: str) -> bool:
    return source.endswith(".gguf") and Path(source).is_file()


def _to_numpy(value: Any) -> Any:
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return value


def _relative(source: str, case_file: Path) -> str:
    try:
        import os

        return os.path.relpath(source, case_file.parent)
    except ValueError:
        return source


def _local_fingerprint(root: Path) -> dict[str, str]:
    """sha256 of the small files of a local checkpoint, size of the big ones (docs skipped)."""
    out: dict[str, str] = {}
    for f in sorted(root.iterdir()):
        if not f.is_file() or f.suffix in (".md", ".txt"):
            continue
        size = f.stat().st_size
        if size <= 64 * 1024 * 1024:
            out[f.name] = "sha256:" + hashlib.sha256(f.read_bytes()).hexdigest()
        else:
            out[f.name] = f"size:{size}"
    return out
