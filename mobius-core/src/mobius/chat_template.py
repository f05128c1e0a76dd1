"""Rendering a checkpoint's chat template: jinja2's sandbox, in a worker process, in budget.

A package is untrusted input and its chat template runs on every chat request, so a
template must never hang, exhaust or crash the process that renders it. jinja2's
sandbox stops attribute tricks but not cost: a loop of 10^10 steps, ``10 ** (10 ** 8)``
(which jinja2 would even fold at compile time, holding the GIL), ``'a' * 10**9`` or
``'{:>999999999}'.format(1)``. Hence:

- **A worker process** renders (one compiled template per worker, a small pool per
  template, spawned on first use with ``python -c``). The caller's process never runs
  template code: its GIL, memory and threads stay its own (a server keeps answering
  ``/health``). A worker that misbehaves is killed and a fresh one takes the next render.
- **Time**: a soft budget (:data:`RENDER_SECONDS`) raised inside the worker by a timer
  signal, so the error names the template line; a hard one a moment later, when the
  worker is killed (a single C-level operation can outlast the signal).
- **Memory**: the worker's address space is capped (:data:`WORKER_MEMORY`, ``RLIMIT_AS``):
  a huge string or list fails at once with MemoryError instead of growing to GBs.
- **Output**: the rendered text is counted while it streams (:data:`MAX_OUTPUT` chars).
- **Bounded operations**, so that the usual traps end with a clear error and a line:
  ``**`` and ``*`` are intercepted (never folded at compile time; a power of more than
  :data:`MAX_INT_BITS` bits or a repetition longer than :data:`MAX_OUTPUT` is refused),
  ``range`` is bounded by the sandbox (10^5), ``tojson``'s indent and ``lipsum`` are
  bounded, recursion by Python's limit, ints printed by Python's digit limit.
- **Values** reach the worker as JSON: plain data, nested at most :data:`MAX_DEPTH`.

The environment is the one transformers renders with: ``ImmutableSandboxedEnvironment``
with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a
``{% generation %}`` block tag (rendered as its body), ``raise_exception``,
``strftime_now``, a JSON ``tojson`` filter (``ensure_ascii=False``, ``indent``,
``separators``, ``sort_keys``), a call-only ``dict`` and a ``namespace`` that refuses
underscore names.

Every failure is a :class:`TemplateFailure` with a ``kind``: ``"syntax"`` (does not
compile), ``"render"`` (the template refused the values: ``raise_exception``, a type
error …) or ``"budget"`` (time, memory, output, a bounded operation, a dead worker).
The build renders the template once on :data:`SMALL_CONVERSATION` and refuses a
template that does not compile or does not render it in budget.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

TEMPLATE_FILE = "chat_template.jinja"
RENDER_SECONDS = 2.0
"""Soft budget of one render (and of one compile) in the worker."""
KILL_AFTER = 1.0
"""The worker is killed this long after the soft budget, whatever it is doing."""
WORKER_MEMORY = 512 * 2**20
"""Address-space cap of a worker process (bytes)."""
MAX_OUTPUT = 16 * 2**20
"""Most characters one render may produce (and the longest ``*`` repetition)."""
MAX_INT_BITS = 1 << 16
"""Largest result of ``**`` on ints, in bits."""
MAX_DEPTH = 64
"""Deepest nesting of the values (messages, keyword arguments) a template receives."""
MAX_INDENT = 64
SMALL_CONVERSATION = [{"role": "user", "content": "Hello"}]
"""What the build renders once (with ``add_generation_prompt=True``) to check a template."""
NAMED_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class TemplateFailure(Exception):
    """A template that did not compile or render; ``line`` is its line when known."""

    def __init__(self, kind: str, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.kind, self.message, self.line = kind, message, line

    def describe(self) -> str:
        return self.message + (f" (template line {self.line})" if self.line else "")


def named_tokens(raw: Any) -> dict[str, str]:
    """The named special tokens of a parsed ``tokenizer_config.json`` (may be empty)."""
    if not isinstance(raw, dict):
        return {}
    names = {k: raw.get(k) for k in NAMED_TOKENS}
    extra = raw.get("extra_special_tokens")
    if isinstance(extra, dict):
        names.update(extra)
    out: dict[str, str] = {}
    for name, value in names.items():
        if isinstance(value, dict):  # a serialized AddedToken
            value = value.get("content")
        if isinstance(value, str):
            out[str(name)] = value
    return out


def first_render(renderer: Renderer, tokens: Mapping[str, str]) -> TemplateFailure | None:
    """Compile, then render :data:`SMALL_CONVERSATION` once (what build and load check).

    Raises :class:`TemplateFailure` for a template that does not compile or breaks its
    budget, with :func:`refusal` as its message; returns the template's own refusal of
    that conversation (kind ``"render"``: some templates require a system turn), or None.
    """
    try:
        renderer.check()
        values = {"tools": None, "documents": None, **tokens}
        renderer.render({**values, "messages": SMALL_CONVERSATION, "add_generation_prompt": True})
    except TemplateFailure as exc:
        if exc.kind == "render":
            return exc
        raise TemplateFailure(exc.kind, refusal(exc), exc.line) from None
    return None


def refusal(exc: TemplateFailure) -> str:
    """Why a template is refused, in one line (for :func:`first_render`'s failures)."""
    if exc.kind == "syntax":
        return f"the chat template {exc.describe()}"
    return f"the chat template cannot render one user message within its budget: {exc.describe()}"


def check_depth(value: Any, where: str, depth: int = 0) -> None:
    """Refuse values nested deeper than :data:`MAX_DEPTH` (iteratively: any depth is safe)."""
    stack = [(value, depth)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, Mapping):
            children = list(item.values())
        elif isinstance(item, (list, tuple)):
            children = list(item)
        else:
            continue
        if level >= MAX_DEPTH:
            raise TemplateFailure("render", f"{where} is nested more than {MAX_DEPTH} levels deep")
        stack.extend((child, level + 1) for child in children)


# ---------------------------------------------------------------- the parent side


class Renderer:
    """Compiles and renders one template ``source`` in worker processes.

    ``workers``: at most this many renders run at once (each in its own process);
    more callers wait for a free worker. Thread-safe. Workers start on first use and
    end with :meth:`close` (or when this process exits: they stop at end of input).
    """

    def __init__(self, source: str, *, workers: int = 2, seconds: float = RENDER_SECONDS) -> None:
        self.source = source
        self.seconds = seconds
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(workers)
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        # a renderer dropped without close() stops its workers when it is collected
        weakref.finalize(self, _kill_all, self._all)

    def check(self) -> None:
        """Compile the template (in a worker): :class:`TemplateFailure` ``syntax`` if not."""
        self._call(None)

    def render(self, values: Mapping[str, Any]) -> str:
        """The template's text for ``values`` (plain JSON data)."""
        check_depth(values, "the template's values")
        return self._call(dict(values))

    def close(self) -> None:
        with self._lock:
            _kill_all(self._all)

    def _call(self, values: dict[str, Any] | None) -> str:
        try:
            payload = json.dumps({"values": values}) + "\n"  # ASCII: lone surrogates too
        except (TypeError, ValueError) as exc:
            raise TemplateFailure(
                "render", f"the template's values are not plain data: {exc}"
            ) from None
        with self._slots:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                worker = _Worker(self.source, self.seconds)
                with self._lock:
                    self._all.add(worker)
            try:
                answer = worker.ask(payload.encode("utf-8"))
            except BaseException:
                worker.kill()
                with self._lock:
                    self._all.discard(worker)
                raise
            self._idle.put(worker)
        if "error" in answer:
            raise TemplateFailure(answer["kind"], answer["error"], answer.get("line"))
        return answer["text"]


def _kill_all(workers: set[_Worker]) -> None:
    for worker in list(workers):
        worker.kill()
    workers.clear()


class _Worker:
    """One worker process: sends a request line, reads the answer line within budget."""

    def __init__(self, source: str, seconds: float) -> None:
        self.seconds = seconds
        code = "from mobius.chat_template import _serve; _serve()"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, json.dumps({"seconds": seconds})],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C of the terminal is the caller's, not ours
        )
        self._buffer = b""
        answer = self.ask(json.dumps({"source": source}).encode("ascii"))
        if "error" in answer:
            self.kill()
            raise TemplateFailure(answer["kind"], answer["error"], answer.get("line"))

    def ask(self, line: bytes) -> dict[str, Any]:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line if line.endswith(b"\n") else line + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._dead() from None
        deadline = time.monotonic() + self.seconds + KILL_AFTER
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.kill()
                raise TemplateFailure(
                    "budget",
                    f"the chat template did not finish within {self.seconds:g} s "
                    "(its worker was stopped)",
                )
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise self._dead()
            self._buffer += chunk
        head, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(head)

    def _dead(self) -> TemplateFailure:
        self.kill()
        code = self.proc.returncode
        return TemplateFailure(
            "budget",
            f"the chat template's worker process ended while rendering (exit status {code}: "
            f"over its {WORKER_MEMORY >> 20} MiB memory budget, or a crash)",
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]


# ---------------------------------------------------------------- the worker side


_SECONDS = RENDER_SECONDS  # the worker's budget, set by _serve


class _OverBudget(BaseException):
    """Raised by the timer inside template code (BaseException: templates cannot catch it)."""


def _serve() -> None:
    """The worker's loop: one JSON request a line on stdin, one JSON answer a line on stdout."""
    import resource
    import signal

    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
    sys.set_int_max_str_digits(4300)
    seconds = float(json.loads(sys.argv[1])["seconds"])
    global _SECONDS
    _SECONDS = seconds

    def over(*_: Any) -> None:
        raise _OverBudget

    signal.signal(signal.SIGALRM, over)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    env = _environment()
    template = None
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            request = json.loads(line)
            if "source" in request:
                template = _compile(env, request["source"])
                answer: dict[str, Any] = {"text": ""}
            elif request["values"] is None:
                answer = {"text": ""}
            else:
                answer = {"text": _render(template, request["values"])}
        except TemplateFailure as exc:
            answer = {"error": exc.message, "kind": exc.kind, "line": exc.line}
        except BaseException as exc:  # every failure is the template's
            answer = _failure(exc, template)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            out.write(json.dumps(answer).encode("ascii") + b"\n")
            out.flush()
        except MemoryError:
            out.write(b'{"error": "the rendered text is too large", "kind": "budget"}\n')
            out.flush()


def _compile(env: Any, source: str) -> Any:
    import jinja2

    try:
        code = env.compile(source, filename=TEMPLATE_FILE)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateFailure("syntax", f"does not compile: {exc.message}", exc.lineno) from exc
    return env.template_class.from_code(env, code, env.make_globals(None))


def _render(template: Any, values: dict[str, Any]) -> str:
    if template is None:
        raise TemplateFailure("render", "no template was compiled")
    parts: list[str] = []
    size = 0
    chunks = template.generate(**values)
    for chunk in chunks:
        size += len(chunk)
        if size > MAX_OUTPUT:
            raise TemplateFailure(
                "budget",
                f"the rendered text passed {MAX_OUTPUT} characters",
                _suspended_line(chunks, template),
            )
        parts.append(chunk)
    return "".join(parts)


def _suspended_line(generator: Any, template: Any) -> int | None:
    """The template line a paused render generator stands at (its innermost frame)."""
    while getattr(generator, "gi_yieldfrom", None) is not None:
        generator = generator.gi_yieldfrom
    frame = getattr(generator, "gi_frame", None)
    if frame is None or frame.f_code.co_filename != TEMPLATE_FILE:
        return None
    return template.get_corresponding_lineno(frame.f_lineno)


class _Refused(Exception):
    """A bounded operation refused (over the budget), raised inside template code."""


def _failure(exc: BaseException, template: Any) -> dict[str, Any]:
    """The answer for an exception out of template code: its kind, message and line."""
    import jinja2

    line = _template_line(exc.__traceback__)
    if not isinstance(exc, Exception) and line is not None and template is not None:
        # jinja2 maps its frames back to template lines for an Exception only
        line = template.get_corresponding_lineno(line)
    if isinstance(exc, _OverBudget):
        kind, message = "budget", f"did not finish within {_SECONDS:g} s"
    elif isinstance(exc, MemoryError):
        kind, message = "budget", f"needed more than its {WORKER_MEMORY >> 20} MiB memory budget"
    elif isinstance(exc, RecursionError):
        kind, message = "budget", "recursed too deeply"
    elif isinstance(exc, (_Refused, OverflowError)):
        kind, message = "budget", str(exc)
    elif isinstance(exc, jinja2.TemplateError):
        kind, message = "render", getattr(exc, "message", None) or str(exc)
    else:
        kind, message = "render", f"{type(exc).__name__}: {exc}"
    return {"error": message[:500], "kind": kind, "line": line}


def _template_line(tb: Any) -> int | None:
    """The template's line in a traceback (jinja2 maps template frames back to it)."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == TEMPLATE_FILE:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _environment() -> Any:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Sandbox(ImmutableSandboxedEnvironment):
        # intercepted: evaluated through call_binop at render time (jinja2 never folds an
        # intercepted operator at compile time, where no budget applies)
        intercepted_binops = frozenset({"**", "*"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            ints = _is_int(left) and _is_int(right)
            if (
                operator == "**"
                and ints
                and abs(left) > 1
                and right * abs(left).bit_length() > MAX_INT_BITS
            ):
                raise _Refused(f"{left} ** {right} is larger than {MAX_INT_BITS} bits")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    sized = isinstance(seq, (str, list, tuple)) and _is_int(n)
                    if sized and len(seq) * n > MAX_OUTPUT:
                        raise _Refused(
                            f"a repetition of {len(seq) * n} items is longer than {MAX_OUTPUT}"
                        )
            return super().call_binop(context, operator, left, right)

    class GenerationBlock(Extension):
        """``{% generation %}…{% endgeneration %}`` renders its body (HF marks assistant text)."""

        tags = frozenset({"generation"})

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: Any) -> None:
        raise jinja2.exceptions.TemplateError(str(message))

    def tojson(x: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
        width = indent if _is_int(indent) else len(indent) if isinstance(indent, str) else 0
        if width > MAX_INDENT:
            raise _Refused(f"tojson's indent is over {MAX_INDENT}")
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        from datetime import datetime

        return datetime.now().strftime(fmt)

    default_lipsum = jinja2.utils.generate_lorem_ipsum

    def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
        if not (_is_int(n) and _is_int(max)) or n > 100 or max > 1000:
            raise _Refused("lipsum is bounded to 100 paragraphs of 1000 words")
        return default_lipsum(n, html, min, max)

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                TemplateNamespace.check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"a chat template may not set underscore attributes ({name!r})"
                )

    env = Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationBlock, "jinja2.ext.loopcontrols"],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["lipsum"] = lipsum
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env
