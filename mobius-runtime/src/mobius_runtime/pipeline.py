"""``Pipeline``: a loaded package, its sessions, ``forward()`` and ``generate()``.

This is the only place where sub-models are wired together, and the wiring is
read from the package's contract, never written by hand: adding an input to a
family's graphs changes its contract, and the runtime follows.

One Pipeline serves concurrent requests: sessions are shared (onnxruntime's
``run`` is thread-safe), everything a request owns (its KV state, IO bindings,
sampler, stream) lives in the ``generate()`` call, and sessions are opened
under a lock.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mobius_runtime.batching import Batcher
from mobius_runtime.errors import RequestError
from mobius_runtime.executor import Executor
from mobius_runtime.feeds import to_numpy
from mobius_runtime.generation import GenerationResult, run
from mobius_runtime.kvshare import KVLayout, SharePlan, kv_layout
from mobius_runtime.plan import Plan, compile_plan
from mobius_runtime.prompts import Prompts
from mobius_runtime.sampling import SamplingParams
from mobius_runtime.text import TextSide, context_length

log = logging.getLogger("mobius_runtime")


@dataclass
class StepState:
    """What one :meth:`Pipeline.step` hands to the next: the request's KV state.

    ``values`` are the state OrtValues keyed by consumer port (never copied to
    numpy), ``past`` the number of positions already in the cache, ``capacity``
    the shared-buffer length the request was started with (None: concat KV path).
    """

    values: dict[str, Any]
    past: int
    capacity: int | None = None


class Pipeline:
    """A model package loaded into onnxruntime sessions. Build with :meth:`load`."""

    def __init__(
        self,
        root: Path,
        manifest: dict,
        contract: Any,
        component_paths: dict[str, Path],
        device: str,
        threads: int | None,
        host: Any | None = None,
        kv_share: bool = True,
        graph_transform: Callable[[Any], Any] | None = None,
        optimize: bool = True,
        spin: bool = False,
    ) -> None:
        self.root = root
        self.manifest = manifest
        self.contract = contract
        self.device = device
        self.threads = threads
        self.spin = spin
        """Whether onnxruntime's intra-op workers spin inside a run (decided at load)."""
        self.plan: Plan = compile_plan(contract)
        self._paths = component_paths
        self._sessions: dict[str, Any] = {}
        self._open_lock = threading.Lock()
        self._layouts: dict[str, KVLayout] = {}
        self._batcher: Batcher | None = None
        self._made_lock = threading.Lock()  # the layouts and the batcher, made once
        self.text = TextSide(root, manifest, host)
        self.context_length = context_length(root, manifest)
        self.prompts = Prompts(root, manifest, self.text, self.plan.modalities, self.context_length)
        self.kv_share = kv_share
        self._transform = graph_transform
        self._optimize = optimize
        self.executor = Executor(
            self.plan, self.session, device, self._share_plan if kv_share else None
        )

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(
        cls,
        path: str | Path,
        device: str = "auto",
        threads: int | None = None,
        *,
        host: Any | None = None,
        kv_share: bool = True,
        graph_transform: Callable[[Any], Any] | None = None,
        optimize: bool = True,
        spin: str = "auto",
    ) -> Pipeline:
        """Read, verify and open a package.

        The package is checked first by :func:`mobius.package.checks.check_package`,
        the check ``mobius verify`` runs (files confined to the package, sizes,
        external data, contract, tokenizer/config), trusting the verification stamp
        written by build/verify for unchanged files instead of hashing them (see
        ``docs/internals.md``); one session per component is opened now, except
        presence-gated ones (vision, audio), opened on first use. ``host`` is a
        :class:`mobius.plugins.PluginHost` for the family's processors
        (default: the installed plugins). ``threads``: onnxruntime's intra-op threads
        (unset: :func:`mobius_runtime.ort_sessions.decide_threads` chooses, one for a
        package under 4 MiB, else onnxruntime's default; kept as ``pipeline.threads``).
        ``kv_share=False`` forces the concat
        KV path even where the graph allows shared buffers (for comparisons).
        ``spin``: ``auto`` (default), ``on`` or ``off``: whether onnxruntime's intra-op
        workers spin between the nodes of a run
        (:func:`mobius_runtime.ort_sessions.decide_spin`: ``auto`` spins when the cores
        are free at load; the choice is logged and kept as ``pipeline.spin``).

        Test / diagnostic hooks (production loads leave them alone):
        ``graph_transform(onnx.ModelProto) -> onnx.ModelProto`` rewrites each
        component's graph (weights loaded) before its session is created, e.g.
        ``mobius_testing.bf16_emulation.emulate_bf16`` to measure a bf16 package
        on CPU. Ports are checked against the contract on the *untransformed*
        graph; feeds follow the transformed session's input types (an emulated
        bf16 graph takes float32). ``optimize=False`` opens every session with
        onnxruntime's graph optimizations off (ORT_DISABLE_ALL), which such an
        emulation needs so that no fusion swallows its rounding.
        """
        from mobius.package.checks import check_package, raise_for
        from mobius_runtime.device import resolve_device
        from mobius_runtime.ort_sessions import (
            check_threads,
            decide_spin,
            decide_threads,
            package_bytes,
        )

        check_threads(threads)
        # The one package check `mobius verify` runs, before anything is allocated (even
        # the CUDA probe session); a stamp from build/verify stands in for hashing
        # unchanged files.
        package = raise_for(check_package(Path(path), trust_stamp=True), path)
        resolved = resolve_device(device)
        paths = {name: Path(p) for name, p in package.components.items()}
        threads, count = decide_threads(threads, resolved, package_bytes(paths.values()))
        log.info("%s: onnxruntime intra-op threads: %s", path, count)
        spins, why = decide_spin(spin, threads, resolved)
        log.info("%s: onnxruntime workers %s (%s)", path, "spin" if spins else "do not spin", why)
        pipeline = cls(
            Path(package.root),
            package.manifest,
            package.contract,
            paths,
            resolved,
            threads,
            host,
            kv_share,
            graph_transform,
            optimize,
            spins,
        )
        for name in pipeline.plan.order:
            if pipeline.plan.presence[name] is None:
                pipeline.session(name)
                pipeline.executor.shared(name)
        pipeline._note_chat_layout()
        return pipeline

    def _note_chat_layout(self) -> None:
        """Say once, at load, when chat messages will use the family's built-in layout."""
        from mobius_runtime.chat import TEMPLATE_FILE

        if self.plan.logits is None or "input_ids" not in self.plan.caller_names:
            return
        if (self.root / TEMPLATE_FILE).is_file():
            return
        if self.text.processors.format_prompt is not None:
            log.warning(
                "%s has no %s: chat messages use the %s family's built-in layout "
                "(one user message); rebuild from a checkpoint with a chat template for more",
                self.root,
                TEMPLATE_FILE,
                self.manifest.get("model_type"),
            )

    def session(self, component: str) -> Any:
        """The (checked) session of ``component``, opened on first use."""
        session = self._sessions.get(component)
        if session is None:
            from mobius_runtime.ort_sessions import check_ports, open_session

            with self._open_lock:  # two threads never open the same component twice
                session = self._sessions.get(component)
                if session is None:
                    if self._transform is None and self._optimize:
                        session = open_session(
                            self._paths[component], self.device, self.threads, self.spin
                        )
                        check_ports(session, self.contract.component(component))
                    else:
                        session = self._open_rewritten(component)
                    self._sessions[component] = session
        return session

    def _open_rewritten(self, component: str) -> Any:
        """A session over ``graph_transform`` of the component's graph, optimizations as asked."""
        import onnxruntime as ort

        from mobius_runtime.device import providers_for
        from mobius_runtime.ort_sessions import check_ports, load_with_weights, session_options

        model = load_with_weights(self._paths[component])
        check_ports(_GraphPorts(model.graph), self.contract.component(component))
        if self._transform is not None:
            model = self._transform(model)
        options = session_options(self.threads, self.spin)
        if not self._optimize:
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        return ort.InferenceSession(
            model.SerializeToString(), sess_options=options, providers=providers_for(self.device)
        )

    def kv_layout(self, component: str) -> KVLayout:
        """The KV-state layout of ``component`` (share plan, padding side), read from its
        graph once and shared by the executor and the batcher."""
        layout = self._layouts.get(component)
        if layout is None:
            with self._made_lock:
                layout = self._layouts.get(component)
                if layout is None:
                    layout = kv_layout(component, self._paths[component], self.plan.states)
                    self._layouts[component] = layout
        return layout

    def _share_plan(self, component: str) -> SharePlan | None:
        return self.kv_layout(component).share

    @property
    def kv_sharing(self) -> dict[str, bool]:
        """Per stateful component: True when its KV state uses shared, preallocated buffers."""
        stateful = {key.split(".", 1)[0] for key in self.plan.states}
        return {name: self.executor.shared(name) is not None for name in sorted(stateful)}

    @property
    def providers(self) -> dict[str, list[str]]:
        """Execution providers of each opened session."""
        return {name: s.get_providers() for name, s in self._sessions.items()}

    @property
    def modalities(self) -> set[str]:
        return self.plan.modalities

    # ------------------------------------------------------------------ forward

    def forward(self, **inputs: Any) -> dict[str, np.ndarray]:
        """One prefill over the caller inputs given by name.

        Returns ``"logits"`` and every component output keyed ``component.port``.
        """
        values = self.executor.step(inputs, None, 0)
        out = {key: to_numpy(value) for key, value in values.items()}
        if self.plan.logits is not None:
            out["logits"] = out[self.plan.logits]
        return out

    def step(
        self, state: StepState | None = None, *, capacity: int | None = None, **inputs: Any
    ) -> tuple[dict[str, np.ndarray], StepState]:
        """One step of a request the caller drives: a prefill (``state=None``) or the next one.

        ``inputs`` are caller inputs by name, as for :meth:`forward` (the media only
        on the prompt step; later steps give ``input_ids`` of the new tokens). Returns
        the step's outputs as numpy (``"logits"`` and every ``component.port`` except
        KV state) and the :class:`StepState` to pass to the next step. ``capacity``
        (prompt + every token to come) on the first step selects shared KV buffers
        where the graph allows them; the request keeps that mode. This is what
        :meth:`generate` does internally, for callers that pick tokens themselves or
        compare every step's logits (parity tests).
        """
        past = 0 if state is None else state.past
        if state is not None:
            capacity = state.capacity
        values = self.executor.step(inputs, None if state is None else state.values, past, capacity)
        produced = set(self.plan.states.values())
        out = {k: to_numpy(v) for k, v in values.items() if k not in produced}
        if self.plan.logits is not None:
            out["logits"] = out[self.plan.logits]
        seq = int(np.shape(inputs["input_ids"])[1]) if "input_ids" in inputs else 0
        return out, StepState(self.executor.next_state(values), past + seq, capacity)

    # ------------------------------------------------------------------ generate

    @property
    def has_chat_layout(self) -> bool:
        """True when ``messages`` can be rendered: a chat template, or the family's layout."""
        return self.text.chat is not None or self.text.processors.format_prompt is not None

    def apply_chat_template(
        self, messages: Any, add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """The prompt text ``messages`` make (:meth:`Prompts.apply_chat_template`)."""
        return self.prompts.apply_chat_template(messages, add_generation_prompt, **kwargs)

    def encode_messages(
        self, messages: Any, literal_special: bool = False, tools: Any = None
    ) -> dict[str, Any]:
        """The caller inputs ``messages`` make (:meth:`Prompts.encode_messages`)."""
        return self.prompts.encode_messages(messages, literal_special, tools)

    def generate(
        self,
        prompt: str | None = None,
        input_ids: Any = None,
        images: Sequence[Any] = (),
        audio: Sequence[Any] = (),
        *,
        messages: Any = None,
        max_new_tokens: int = 64,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_ids: Iterable[int] | None = None,
        on_token: Callable[[int, str], None] | None = None,
        literal_special: bool = False,
        stop: Sequence[str] = (),
        sampling: SamplingParams | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` ids after ``messages``, a ``prompt`` or ``input_ids``.

        ``messages`` (HF-shaped, media inside as parts) go through the package's chat
        template with a generation prompt. ``prompt`` is used verbatim, as
        onnxruntime-genai and HF processors use it: no chat wrapping; each media
        placeholder it holds (``<|image|>`` / ``<|audio|>`` for Gemma 4) takes the next
        of ``images`` / ``audio`` in order; BOS is added only when the text has none.
        ``input_ids`` are the model's ids, placeholders already expanded.
        ``on_token(id, text_piece)`` is called as each token is chosen;
        ``text_piece`` is the newly decodable text (possibly empty while a
        multi-byte character is incomplete, or while it may begin a stop string).
        Generation stops at a stop id (``stop_ids``, default: the family's), at a
        ``stop`` string (the text cut where the earliest begins), after
        ``max_new_tokens``, or at the model's context length (``stop_reason``:
        :class:`~mobius_runtime.decoding.FinishReason`). The sampling and stopping
        keywords build a :class:`~mobius_runtime.sampling.SamplingParams`; or pass one
        as ``sampling=`` (then leave those keywords at their defaults).
        ``literal_special=True`` tokenizes special markers typed inside ``messages``
        (``<|turn>``, ``<start_of_turn>``, ``<|im_start|>`` …) as plain text, so only the
        chat template makes control tokens (the default tokenizes them as the control
        tokens, as HF's ``apply_chat_template`` does).
        """
        self.check_generative()
        options = {
            "max_new_tokens": max_new_tokens,
            "do_sample": do_sample,
            "temperature": temperature,
            "top_k": top_k,
            "top_p": top_p,
            "seed": seed,
            "stop_ids": stop_ids,
            "stop": stop,
        }
        params = _params(options, sampling)
        ids, caller = self.prompts.request(
            prompt, input_ids, images, audio, messages, literal_special
        )
        prompt_len = int(ids.shape[1])
        # every position this request can hold: shared KV buffers are this long
        capacity = prompt_len + params.max_tokens
        if self.context_length is not None:
            capacity = min(capacity, self.context_length)
        result, _ = run(self, caller, ids, None, 0, capacity, params, on_token)
        return result

    def check_generative(self) -> None:
        """Packages without ``input_ids`` in and logits out cannot generate: say what to use."""
        if self.plan.logits is None or "input_ids" not in self.plan.caller_names:
            takes = ", ".join(sorted(self.plan.caller_names)) or "nothing"
            raise RequestError(
                f"this package (model type {self.manifest.get('model_type')!r}, inputs: "
                f"{takes}) is not a text-generation package, so it cannot generate",
                where="mobius.json: contract",
                fix="call Pipeline.forward(**inputs) on it (see the mobius-runtime README), "
                "or build a text-generation model",
            )

    @property
    def batcher(self) -> Batcher:
        """The batcher of this package's cohorts (``generate()``'s cohort of one, the
        engine's many), made on first use."""
        if self._batcher is None:
            batcher = Batcher(self)  # outside the lock: it reads the layouts, which take it
            with self._made_lock:
                if self._batcher is None:
                    self._batcher = batcher
        return self._batcher


def _params(options: dict[str, Any], sampling: SamplingParams | None) -> SamplingParams:
    """``generate()``'s sampling keywords (by name) as :class:`SamplingParams`, or its
    ``sampling=`` when those keywords are left at their defaults."""
    if sampling is None:
        return SamplingParams.from_options(options.pop("max_new_tokens"), **options)
    defaults = inspect.signature(Pipeline.generate).parameters
    given = [k for k, v in options.items() if v != defaults[k].default]
    if given:
        raise RequestError(
            f"generate() got sampling= and {', '.join(given)}",
            where="generate()",
            fix="put every setting in the SamplingParams, or pass only the keywords",
        )
    return sampling


class _GraphPorts:
    """The inputs / outputs of a ``GraphProto`` in the shape of a session's ``get_inputs()``
    (name, ``tensor(...)`` type, dims), so ports can be checked before a graph is rewritten."""

    def __init__(self, graph: Any) -> None:
        self._inputs = [_Port(v) for v in graph.input]
        self._outputs = [_Port(v) for v in graph.output]

    def get_inputs(self) -> list[Any]:
        return self._inputs

    def get_outputs(self) -> list[Any]:
        return self._outputs


class _Port:
    def __init__(self, value: Any) -> None:
        import onnx

        tensor = value.type.tensor_type
        self.name = value.name
        self.type = f"tensor({onnx.TensorProto.DataType.Name(tensor.elem_type).lower()})"
        self.shape = [d.dim_param or d.dim_value for d in tensor.shape.dim]
