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
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mobius_runtime.decoding import Decoding, FinishReason, TokenLogprob
from mobius_runtime.errors import RequestError
from mobius_runtime.executor import Executor
from mobius_runtime.feeds import last_position, to_numpy
from mobius_runtime.kvshare import KVLayout, SharePlan, kv_layout
from mobius_runtime.plan import Plan, compile_plan
from mobius_runtime.requests import check_ids, vocab_size
from mobius_runtime.sampling import Sampler, SamplingParams
from mobius_runtime.text import TOKENIZER_FILE, TextSide, as_ids, context_length

log = logging.getLogger("mobius_runtime")

NORMALIZE_SLACK = 3  # how many times Unicode normalization can shrink text's UTF-8 bytes
PREFIX_CHARS = 8  # a long prompt's prefix tokenized first: this many characters a position
PREFIX_SLACK = 16  # tokens a prefix may have more than the same span in the whole text


@dataclass
class GenerationResult:
    """What ``generate()`` returns: generated ids (no prompt), text and timings."""

    ids: list[int]
    text: str
    prompt_ids: list[int]
    prefill_ms: float
    decode_ms: float
    stop_reason: FinishReason  # a str: "stop_id", "stop_string", "max_new_tokens", …
    timings: dict[str, float] = field(default_factory=dict)
    logprobs: list[TokenLogprob] | None = None  # one per id, when SamplingParams.logprobs is set

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second over the decode steps (the first token comes from prefill)."""
        steps = len(self.ids) - 1
        return steps / (self.decode_ms / 1000.0) if steps > 0 and self.decode_ms > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "ids": list(self.ids),
            "text": self.text,
            "prompt_tokens": len(self.prompt_ids),
            "stop_reason": self.stop_reason,
            "timings": {
                "prefill_ms": round(self.prefill_ms, 3),
                "decode_ms": round(self.decode_ms, 3),
                "decode_tokens_per_s": round(self.decode_tokens_per_s, 3),
            },
        }


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
    ) -> None:
        self.root = root
        self.manifest = manifest
        self.contract = contract
        self.device = device
        self.threads = threads
        self.plan: Plan = compile_plan(contract)
        self._paths = component_paths
        self._sessions: dict[str, Any] = {}
        self._open_lock = threading.Lock()
        self._layouts: dict[str, KVLayout] = {}
        self.text = TextSide(root, manifest, host)
        self.context_length = context_length(root, manifest)
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
    ) -> Pipeline:
        """Read, verify and open a package.

        The package is checked first by :func:`mobius.package.checks.check_package`,
        the check ``mobius verify`` runs (files confined to the package, sizes,
        external data, contract, tokenizer/config), trusting the verification stamp
        written by build/verify for unchanged files instead of hashing them (see
        ``docs/internals.md``); one session per component is opened now, except
        presence-gated ones (vision, audio), opened on first use. ``host`` is a
        :class:`mobius.plugins.PluginHost` for the family's processors
        (default: the installed plugins). ``kv_share=False`` forces the concat
        KV path even where the graph allows shared buffers (for comparisons).

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
        from mobius_runtime.ort_sessions import check_threads

        check_threads(threads)
        # The one package check `mobius verify` runs, before anything is allocated (even
        # the CUDA probe session); a stamp from build/verify stands in for hashing
        # unchanged files.
        package = raise_for(check_package(Path(path), trust_stamp=True), path)
        resolved = resolve_device(device)
        pipeline = cls(
            Path(package.root),
            package.manifest,
            package.contract,
            {name: Path(p) for name, p in package.components.items()},
            resolved,
            threads,
            host,
            kv_share,
            graph_transform,
            optimize,
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
                        session = open_session(self._paths[component], self.device, self.threads)
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
        options = session_options(self.threads)
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
            with self._open_lock:
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
        """The prompt text ``messages`` make with the package's chat template.

        ``messages`` are HF-shaped (see :mod:`mobius_runtime.chat`); extra keyword
        arguments reach the template as variables (e.g. ``enable_thinking=False``).
        Without a template in the package, the family's built-in layout serves a
        single user message. Media parts become the template's placeholders; ids
        come from :meth:`encode_messages`.
        """
        from mobius_runtime.chat import parse_messages

        conversation = parse_messages(messages, self.modalities)
        if kwargs and self.text.chat is not None:
            return self.text.chat.render(conversation.messages, add_generation_prompt, **kwargs)
        return self.text.chat_prompt(conversation, add_generation_prompt)

    def encode_messages(
        self, messages: Any, literal_special: bool = False, tools: Any = None
    ) -> dict[str, Any]:
        """The caller inputs ``messages`` make: ``input_ids`` [1, S] and the media arrays.

        The same ids as ``generate(messages=..., literal_special=...)`` feeds (chat
        template with a generation prompt, media placeholders expanded), for callers
        that run the steps themselves (``mobius serve``'s batching engine). Media items
        are preprocessed here; their encoders run with the prompt step. ``tools``: HF's
        ``apply_chat_template(tools=...)`` list, rendered by the template.
        """
        text, images, audio, literal = self._chat_inputs(messages, literal_special, tools)
        ids, caller = self.prepare(text, None, images, audio, literal)
        return {**caller, "input_ids": ids}

    def _chat_inputs(
        self, messages: Any, literal_special: bool, tools: Any = None
    ) -> tuple[str, list[Any], list[Any], dict[str, str]]:
        """The prompt text ``messages`` render to (placeholders checked), their media, and
        the stand-ins of special markers typed in them (with ``literal_special``)."""
        from mobius_runtime.chat import parse_messages

        conversation = parse_messages(messages, self.modalities)
        literal: dict[str, str] = {}
        if literal_special:
            conversation, literal = self.text.hide_markers(conversation)
        text = self.text.chat_prompt(conversation, tools=tools)
        self.text.check_placeholders(text, conversation)
        return text, conversation.images, conversation.audio, literal

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
        if sum(x is not None for x in (prompt, input_ids, messages)) != 1:
            raise RequestError(
                "generate() needs exactly one of messages, prompt or input_ids",
                where="generate()",
                fix="pass messages=[…], prompt='…' or input_ids=[…]",
            )
        text, literal = None, None
        if messages is not None:
            if images or audio:
                raise RequestError(
                    "with messages, media go inside the messages, not in images=/audio=",
                    where="generate()",
                    fix='add {"type": "image", "image": …} parts to the user message',
                )
            text, images, audio, literal = self._chat_inputs(messages, literal_special)
        elif prompt is not None:
            text = prompt
        ids, caller = self.prepare(text, input_ids, images, audio, literal)
        prompt_len = int(ids.shape[1])
        # every position this request can hold: shared KV buffers are this long
        capacity = prompt_len + params.max_tokens
        if self.context_length is not None:
            capacity = min(capacity, self.context_length)
        result, _ = self.decode(caller, ids, None, 0, capacity, params, on_token)
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

    def prepare(
        self,
        text: str | None,
        input_ids: Any,
        images: Sequence[Any],
        audio: Sequence[Any],
        literal: dict[str, str] | None = None,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """(checked prompt ids [1, S], caller inputs with the media) for verbatim text or ids.

        ``literal``: stand-ins in ``text`` for markers to tokenize as plain text
        (:meth:`TextSide.hide_markers`).
        """
        caller: dict[str, Any] = {}
        image_inputs, image_tokens = self.text.media_inputs("image", images, self.modalities)
        audio_inputs, audio_tokens = self.text.media_inputs("audio", audio, self.modalities)
        caller.update(image_inputs)
        caller.update(audio_inputs)
        if text is not None:
            self.check_prompt_bytes(text)
            ids = as_ids(self.text.encode(text, image_tokens, audio_tokens, literal))
        else:
            ids = as_ids(input_ids)
        self.check_prompt_ids(ids, sum(image_tokens), sum(audio_tokens))
        return ids, caller

    def check_prompt_bytes(self, text: str) -> None:
        """Refuse, before tokenizing, a text that cannot fit the context whatever its tokens.

        ``n`` tokens cover at most ``n * max_token_bytes`` bytes of normalized text (see
        :attr:`TextSide.max_token_bytes`), and Unicode normalization (NFC, NFKC) shrinks
        text at most ``NORMALIZE_SLACK`` times (three decomposed jamo compose to one
        syllable), so a text longer than ``NORMALIZE_SLACK * max_token_bytes *
        context_length`` bytes certainly has too many tokens. (This assumes the
        tokenizer's normalizer does not delete text, as Gemma's and Qwen's do not.)
        Tokenizing megabytes costs far more memory than the text itself.
        """
        limit = self.context_length
        if limit is None or not isinstance(text, str):  # encode() names a wrong type
            return
        if not (self.root / TOKENIZER_FILE).is_file():
            return
        size = len(text.encode("utf-8", "surrogatepass"))
        if size <= limit:  # fewer bytes than positions: no need to read the vocabulary
            return
        most = NORMALIZE_SLACK * self.text.max_token_bytes * limit
        if size > most:
            raise RequestError(
                f"the prompt is {size} bytes, more than the {limit} positions of the model "
                f"can hold in any tokenization (at most {most} bytes)",
                where="prompt",
                fix=f"shorten the prompt below {limit} tokens",
            )
        # Below that bound a long text may still be far too long (a vocabulary with one
        # 30-byte token allows 90 bytes a position): tokenize a prefix of PREFIX_CHARS
        # characters a position first, whose cost is bounded by the context, not the body.
        # A prefix has at most a few tokens more than the same span inside the whole text
        # (only its last word can split differently), hence PREFIX_SLACK.
        chars = PREFIX_CHARS * limit
        if len(text) > chars:
            head = len(self.text.tokenizer.encode(text[:chars], add_special_tokens=False).ids)
            if head >= limit + PREFIX_SLACK:
                raise RequestError(
                    f"the prompt is {len(text)} characters, and its first {chars} alone are "
                    f"{head} tokens, more than the {limit} positions of the model",
                    where="prompt",
                    fix=f"shorten the prompt below {limit} tokens",
                )

    def check_prompt_ids(self, ids: np.ndarray, image_soft: int, audio_soft: int) -> None:
        """Ids in the vocabulary, placeholders matching the media, within the context."""
        text = self.text
        has_tokenizer = (self.root / TOKENIZER_FILE).is_file()
        placeholders = {}
        unsupported = {}
        if has_tokenizer:
            for kind, soft in (("image", image_soft), ("audio", audio_soft)):
                token = text.token_id(f"{kind}_token")
                if kind in self.modalities:
                    placeholders[kind] = (token, soft)
                else:
                    unsupported[kind] = token
            unsupported["video"] = text.token_id("video_token")
        check_ids(ids, self._vocab, placeholders, unsupported)
        limit = self.context_length
        if limit is not None and ids.shape[1] >= limit:
            raise RequestError(
                f"the prompt is {ids.shape[1]} tokens but the model has {limit} positions",
                where="prompt",
                fix=f"shorten the prompt below {limit} tokens",
            )

    def decode(
        self,
        caller: dict[str, Any],
        ids: np.ndarray,
        state: Any,
        past: int,
        capacity: int | None,
        params: SamplingParams,
        on_token: Callable[[int, str], None] | None,
        sampler: Sampler | None = None,
    ) -> tuple[GenerationResult, tuple[Any, int]]:
        """Prefill ``ids`` (after ``past`` cached positions in ``state``), then decode.

        The per-token logic (pick, stream, stop) is :class:`~mobius_runtime.decoding.Decoding`,
        the engine's too. ``sampler``: one whose random state continues (a conversation).
        Returns the result and (state, positions in it): every id fed to the model is in
        that state; the last generated id is not (it was never fed).
        """
        row = Decoding(
            params,
            self.text,
            self.text.processors.stop_token_ids,
            self.context_length,
            sampler,
            live=on_token is not None,
            prompt=ids[0].tolist(),
        )
        logits_key = self.plan.logits
        executor = self.executor
        caller = {**caller, "input_ids": ids}
        start = time.perf_counter()
        values = executor.step(caller, state, past, capacity)
        logits = last_position(values[logits_key])[0]
        state = executor.next_state(values)
        past += int(ids.shape[1])
        prefill_ms = (time.perf_counter() - start) * 1000.0
        decode_start = time.perf_counter()
        step_ids = np.zeros((1, 1), dtype=np.int64)
        while True:
            token, piece = row.take(logits, past)
            if on_token is not None:
                on_token(token, piece)
            if row.reason is not None:
                break
            step_ids[0, 0] = token
            values = executor.step({"input_ids": step_ids}, state, past, capacity)
            logits = last_position(values[logits_key])[0]
            state = executor.next_state(values)
            past += 1
        decode_ms = (time.perf_counter() - decode_start) * 1000.0
        result = GenerationResult(
            ids=list(row.ids),
            text=row.text,
            prompt_ids=[int(i) for i in ids[0]],
            prefill_ms=prefill_ms,
            decode_ms=decode_ms,
            stop_reason=row.reason,
            logprobs=None if params.logprobs is None else row.logprobs,
        )
        return result, (state, past)

    @property
    def _vocab(self) -> int | None:
        return vocab_size(self.manifest)


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
