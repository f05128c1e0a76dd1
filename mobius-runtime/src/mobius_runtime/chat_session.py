"""``ChatSession``: a multi-turn conversation that keeps the model's KV state between turns.

Each turn renders the whole conversation with the package's chat template (so the
ids are exactly what a fresh ``generate(messages=...)`` would feed) and compares
them with the ids already in the KV state. The state is kept up to their longest
common prefix and only the rest is prefilled, with only the new turn's media: a
reply re-rendered by the template usually differs from the generated ids only at
its edges (a template that trims it, the stop id), so that is a few tokens. The
state is cut along its seq axis when every value holds one row per fed position
(the concat KV path does); otherwise, or when the difference starts before the
last media placeholder (their encoder features are in the cache only), the whole
conversation is prefilled again with all its media. No capacity is known for a
conversation, so the state uses the concat KV path and grows with it, bounded by
the model's context length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from mobius_runtime.chat import parse_messages, user_message
from mobius_runtime.generation import GenerationResult, run
from mobius_runtime.sampling import Sampler, SamplingParams
from mobius_runtime.text import as_ids

if TYPE_CHECKING:
    from mobius_runtime.pipeline import Pipeline


class ChatSession:
    """Send user turns with :meth:`send`; :meth:`reset` starts over (keeping the system text)."""

    def __init__(
        self,
        pipeline: Pipeline,
        system: str | None = None,
        *,
        max_new_tokens: int = 256,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_ids: Iterable[int] | None = None,
        sampling: SamplingParams | None = None,
    ) -> None:
        """The sampling keywords build a :class:`SamplingParams` (as ``generate()``'s do);
        or pass one as ``sampling=`` (its ``max_tokens`` is each reply's limit). The random
        state of a seeded conversation runs on across turns."""
        pipeline.check_generative()
        self.pipeline = pipeline
        self.system = system
        self.sampling = sampling or SamplingParams.from_options(
            max_new_tokens, do_sample, temperature, top_k, top_p, seed, stop_ids
        )
        self._sampler = Sampler(self.sampling)
        self.reset()

    def reset(self) -> None:
        """Forget every turn and the KV state (the system text stays)."""
        self.messages: list[dict[str, Any]] = []
        if self.system:
            self.messages.append({"role": "system", "content": self.system})
        self._state: Any = None
        self._fed: list[int] = []
        self._last_media_end = 0
        self._media: dict[str, list[Any]] = {"image": [], "audio": []}
        self._counts: dict[str, list[int]] = {"image": [], "audio": []}
        self.prefilled = 0
        """Ids prefilled by the last turn (the rest came from the kept KV state)."""

    def _truncated(self, keep: int) -> dict[str, Any] | None:
        """The KV state cut to its first ``keep`` positions, or None if it cannot be.

        Only a state whose every value holds one row per fed position along the
        seq axis of its initial shape (``0`` or a ``*seq*`` / ``*past*`` / ``*len*``
        dim) is cut; a graph keeping a rolling window would not, and the turn then
        prefills everything.
        """
        import numpy as np

        from mobius_runtime.feeds import to_numpy, to_ortvalue

        if keep == 0:
            return None
        fed = len(self._fed)
        out: dict[str, Any] = {}
        for key, value in self._state.items():
            axis = _seq_axis(self.pipeline.plan.sources[key].initial_shape)
            shape = tuple(value.shape())
            if axis is None or axis >= len(shape) or shape[axis] != fed:
                return None
            if keep == fed:
                out[key] = value
                continue
            cut = np.take(to_numpy(value), np.arange(keep), axis=axis)
            out[key] = to_ortvalue(cut, value.data_type(), self.pipeline.device)
        return out

    @property
    def cached_tokens(self) -> int:
        """Positions held in the KV state."""
        return len(self._fed)

    def send(
        self,
        text: str,
        images: Sequence[Any] = (),
        audio: Sequence[Any] = (),
        on_token: Callable[[int, str], None] | None = None,
    ) -> GenerationResult:
        """One user turn (media first, then the text); returns the reply.

        The result's ``prompt_ids`` are the whole conversation's ids as the model
        sees them; :attr:`prefilled` says how many of them this turn computed.
        """
        p = self.pipeline
        messages = [*self.messages, user_message(text, images, audio)]
        conversation = parse_messages(messages, p.modalities)
        rendered = p.text.chat_prompt(conversation)
        p.text.check_placeholders(rendered, conversation)
        new_inputs: dict[str, Any] = {}
        counts = {kind: list(done) for kind, done in self._counts.items()}
        for kind, items in (("image", images), ("audio", audio)):
            inputs, soft = p.text.media_inputs(kind, items, p.modalities)
            new_inputs.update(inputs)
            counts[kind] += soft
        ids = as_ids(p.text.encode(rendered, counts["image"], counts["audio"]))
        p.prompts.check_prompt_ids(ids, sum(counts["image"]), sum(counts["audio"]))
        full = [int(i) for i in ids[0]]
        kept = _common_prefix(self._fed, full)
        state = None if self._state is None else self._truncated(kept)
        if state is not None and kept > self._last_media_end:
            chunk, caller, past = ids[:, kept:], new_inputs, kept
        else:  # first turn, or the re-rendered history differs before the last media
            caller = {}
            for kind in ("image", "audio"):
                inputs, _ = p.text.media_inputs(
                    kind,
                    [*self._media[kind], *(images if kind == "image" else audio)],
                    p.modalities,
                )
                caller.update(inputs)
            chunk, state, past = ids, None, 0
        result, (state, past) = run(
            p, caller, chunk, state, past, None, self.sampling, on_token, self._sampler
        )
        self.prefilled = int(chunk.shape[1])
        self._state = state
        self._fed = full + result.ids[:-1]  # the last id was chosen, never fed
        self._last_media_end = _last_media_end(p, full)
        self._media["image"] += list(images)
        self._media["audio"] += list(audio)
        self._counts = counts
        self.messages = [*messages, {"role": "assistant", "content": result.text}]
        result.prompt_ids = full
        return result


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _seq_axis(shape: tuple[int | str, ...]) -> int | None:
    for axis, dim in enumerate(shape):
        if dim == 0 or (isinstance(dim, str) and any(k in dim for k in ("seq", "past", "len"))):
            return axis
    return None


def _last_media_end(pipeline: Pipeline, ids: list[int]) -> int:
    """One past the last media placeholder id in ``ids`` (0 if none).

    A cut KV state must keep every media position: their features came from
    encoders run on earlier turns, which a partial prefill does not rerun.
    """
    tokens = {pipeline.text.token_id(f"{kind}_token") for kind in ("image", "audio")}
    tokens.discard(None)
    last = 0
    for i, token in enumerate(ids):
        if token in tokens:
            last = i + 1
    return last
