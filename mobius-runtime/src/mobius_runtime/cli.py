"""``mobius run`` (one prompt) and ``mobius chat`` (a multi-turn session), streaming text.

Errors a user can cause (a missing or corrupted package, an unreadable image or
audio file, a prompt longer than the model's positions, a modality the package
lacks, sampling options that do not fit) are :class:`mobius.errors.MobiusError`;
they are printed to stderr without a traceback (``--debug`` shows it) and exit
with status 1. Sampling options are checked before the model is loaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from mobius.cli._common import is_debug
from mobius.errors import MobiusError

SAMPLING = "Sampling (only with --sample)"

Sample = Annotated[bool, typer.Option("--sample", help="Sample instead of greedy decoding.")]
Temperature = Annotated[
    float | None,
    typer.Option("--temperature", help="Softmax temperature (> 0).", rich_help_panel=SAMPLING),
]
TopK = Annotated[
    int | None,
    typer.Option("--top-k", help="Keep the K best ids (0: off).", rich_help_panel=SAMPLING),
]
TopP = Annotated[
    float | None,
    typer.Option("--top-p", help="Nucleus mass in (0, 1].", rich_help_panel=SAMPLING),
]
Seed = Annotated[
    int | None,
    typer.Option("--seed", help="Seed (>= 0) for reproducible sampling.", rich_help_panel=SAMPLING),
]
MinP = Annotated[
    float | None,
    typer.Option(
        "--min-p",
        help="Keep ids at least this share of the best one's probability (0: off).",
        rich_help_panel=SAMPLING,
    ),
]
RepetitionPenalty = Annotated[
    float,
    typer.Option(
        "--repetition-penalty",
        help="HF's penalty on ids already in the prompt or reply (> 1 discourages; greedy too).",
    ),
]
Device = Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")]
THREADS_HELP = (
    "onnxruntime intra-op threads (default: one for a package under 4 MiB, else one per "
    "physical core; mobius_runtime.ort_sessions.decide_threads)."
)
Threads = Annotated[int | None, typer.Option("--threads", help=THREADS_HELP)]
SPIN_HELP = (
    "auto, on or off: whether onnxruntime's worker threads spin between the nodes of a step "
    "(faster when the cores are free, slower when other jobs share them). auto: spin when "
    "the cores are free at load (mobius_runtime.ort_sessions.decide_spin)."
)
"""``--spin``'s help (generate, chat, serve)."""
Spin = Annotated[str, typer.Option("--spin", help=SPIN_HELP)]
Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks.")]
Images = Annotated[
    list[Path] | None, typer.Option("--image", help="Image file (repeatable).", metavar="FILE")
]
Audio = Annotated[
    list[Path] | None, typer.Option("--audio", help="Audio file (repeatable).", metavar="FILE")
]


def _readable(kind: str, files: list[Path]) -> list[Path]:
    """Checked before the model loads: each is a readable regular file (never a pipe that
    would block, or a device without end); mobius.media says why not."""
    from mobius.media import check_media_file

    return [check_media_file(path, kind) for path in files]


def _sampling(
    max_new_tokens: int,
    sample: bool,
    temperature,
    top_k,
    top_p,
    seed,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
) -> Any:
    """The :class:`SamplingParams` of the flags, checked before loading."""
    from mobius_runtime.errors import RequestError
    from mobius_runtime.requests import check_sampling
    from mobius_runtime.sampling import SamplingParams

    check_sampling(sample, temperature, top_k, top_p, seed, flags=True)
    if min_p is not None and not sample:
        raise RequestError(
            "--min-p given without --sample: greedy decoding would ignore it",
            where="sampling options",
            fix="add --sample to sample, or drop --min-p",
        )
    return SamplingParams.from_options(
        max_new_tokens,
        do_sample=sample,
        temperature=1.0 if temperature is None else temperature,
        top_k=top_k or 0,
        top_p=1.0 if top_p is None else top_p,
        seed=seed,
        min_p=0.0 if min_p is None else min_p,
        repetition_penalty=repetition_penalty,
    )


def require_package(package: Path) -> None:
    """A one-line error before anything loads when ``package`` is no package folder."""
    from mobius.errors import PackageError

    if not (package / "mobius.json").is_file():
        raise PackageError(
            f"{package} is not a model package (no mobius.json)"
            if package.is_dir()
            else f"package folder {package} does not exist",
            where=str(package),
            fix="build one with `mobius build SOURCE OUT`, then pass OUT",
        )


def _load(package: Path, device: str, threads: int | None, spin: str = "auto"):
    from mobius_runtime.pipeline import Pipeline

    require_package(package)
    pipeline = Pipeline.load(package, device=device, threads=threads, spin=spin)
    try:
        pipeline.check_generative()
    except MobiusError as exc:
        raise type(exc)(
            f"`mobius run` / `mobius chat` need a text-generation package: {exc.what}",
            where=exc.where,
            fix=exc.fix,
        ) from None
    return pipeline


def _echo(_token: int, piece: str) -> None:
    if piece:
        sys.stdout.write(piece)
        sys.stdout.flush()


def _fail(exc: MobiusError, debug: bool) -> None:
    if debug:
        raise exc
    typer.echo(f"error: {exc.render()}", err=True)
    raise typer.Exit(1) from None


def run(
    ctx: typer.Context,
    package: Annotated[Path, typer.Argument(help="Model package folder (has mobius.json).")],
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="The user message.")],
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="Send the prompt verbatim (no chat template); write <|image|> / <|audio|> "
            "where each --image / --audio goes.",
        ),
    ] = False,
    image: Images = None,
    audio: Audio = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 128,
    sample: Sample = False,
    temperature: Temperature = None,
    top_k: TopK = None,
    top_p: TopP = None,
    seed: Seed = None,
    min_p: MinP = None,
    repetition_penalty: RepetitionPenalty = 1.0,
    device: Device = "auto",
    threads: Threads = None,
    spin: Spin = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print ids, text, timings.")] = False,
    debug: Debug = False,
) -> None:
    """Generate from PACKAGE for one user message (through the package's chat template).

    Text streams to stdout as it is generated; --json prints one JSON line instead.
    """
    debug = is_debug(ctx, debug)
    try:
        sampling = _sampling(
            max_new_tokens, sample, temperature, top_k, top_p, seed, min_p, repetition_penalty
        )
        images, clips = _readable("image", image or []), _readable("audio", audio or [])
        pipeline = _load(package, device, threads, spin)
        if not raw and not pipeline.has_chat_layout:
            typer.echo(
                "note: the package has no chat template and its family no chat layout; "
                "the prompt is sent verbatim (as with --raw)",
                err=True,
            )
            raw = True
        if raw:
            request: dict[str, Any] = {"prompt": prompt, "images": images, "audio": clips}
        else:
            from mobius_runtime.chat import user_message

            message = user_message(prompt, [str(p) for p in images], [str(p) for p in clips])
            request = {"messages": [message]}
        result = pipeline.generate(
            **request, sampling=sampling, on_token=None if as_json else _echo
        )
    except MobiusError as exc:
        _fail(exc, debug)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()
        _say_if_cut(result, max_new_tokens, pipeline)


def _say_if_cut(result: Any, max_new_tokens: int, pipeline: Any) -> None:
    """A note on stderr when the reply ended at the model's context length.

    Why: plain output ended silently (128 tokens asked, 19 given); --json has stop_reason.
    """
    if result.stop_reason == "context_length":
        typer.echo(
            f"note: the reply was cut: {max_new_tokens} tokens asked, {len(result.ids)} given: "
            f"the context length {pipeline.context_length} was reached",
            err=True,
        )


CHAT_HELP = """Commands: /image FILE and /audio FILE attach media to your next message;
/reset starts the conversation over (keeps --system); /help shows this; Ctrl-D ends."""


def chat(
    ctx: typer.Context,
    package: Annotated[Path, typer.Argument(help="Model package folder (has mobius.json).")],
    system: Annotated[str | None, typer.Option("--system", help="System message.")] = None,
    image: Images = None,
    audio: Audio = None,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", min=1, help="Most tokens per reply.")
    ] = 256,
    sample: Sample = False,
    temperature: Temperature = None,
    top_k: TopK = None,
    top_p: TopP = None,
    seed: Seed = None,
    min_p: MinP = None,
    repetition_penalty: RepetitionPenalty = 1.0,
    device: Device = "auto",
    threads: Threads = None,
    spin: Spin = "auto",
    stats: Annotated[
        bool, typer.Option("--stats", help="After each reply, print token counts to stderr.")
    ] = False,
    debug: Debug = False,
) -> None:
    """Chat with PACKAGE: one line per user turn on stdin, replies stream to stdout.

    The model's KV state is kept between turns, so each turn prefills only its own
    tokens. --image / --audio attach to the first message. /image FILE and
    /audio FILE attach media to the next message, /reset starts over, Ctrl-D ends.
    """
    from mobius_runtime.chat_session import ChatSession

    debug = is_debug(ctx, debug)
    try:
        sampling = _sampling(
            max_new_tokens, sample, temperature, top_k, top_p, seed, min_p, repetition_penalty
        )
        pending = {
            "image": _readable("image", image or []),
            "audio": _readable("audio", audio or []),
        }
        pipeline = _load(package, device, threads, spin)
        session = ChatSession(pipeline, system, sampling=sampling)
    except MobiusError as exc:
        _fail(exc, debug)
    interactive = sys.stdin.isatty()
    if interactive:
        typer.echo(CHAT_HELP, err=True)
    while True:
        if interactive:
            sys.stderr.write("> ")
            sys.stderr.flush()
        try:
            line = sys.stdin.readline()
        except KeyboardInterrupt:
            line = ""
        if not line:
            break
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        if line.startswith("/"):
            _command(line, session, pending)
            continue
        try:
            reply = session.send(
                line,
                images=[str(p) for p in pending["image"]],
                audio=[str(p) for p in pending["audio"]],
                on_token=_echo,
            )
        except MobiusError as exc:  # the turn is dropped; the conversation goes on
            if debug:
                raise
            sys.stdout.write("\n")
            typer.echo(f"error: {exc.render()}", err=True)
            _drop_media(pending)
            continue
        except KeyboardInterrupt:
            typer.echo("\n(reply interrupted; the turn is dropped)", err=True)
            continue
        pending = {"image": [], "audio": []}
        sys.stdout.write("\n")
        sys.stdout.flush()
        _say_if_cut(reply, max_new_tokens, pipeline)
        if stats:
            typer.echo(
                f"[turn prefilled {session.prefilled} tokens; "
                f"{session.cached_tokens} in the KV cache]",
                err=True,
            )
    if interactive:
        sys.stderr.write("\n")


def _drop_media(pending: dict[str, list[Path]]) -> None:
    """Forget the media of a failed turn, saying so; the conversation is kept.

    Why: a file that passed the path check but failed to decode stayed pending, so
    every later turn failed the same way until /reset (which forgot the conversation).
    """
    dropped = [f"{kind} {path}" for kind, paths in pending.items() for path in paths]
    if not dropped:
        return
    pending["image"], pending["audio"] = [], []
    typer.echo(
        f"(dropped {', '.join(dropped)}; the conversation is kept: type your message "
        "again, with /image or /audio to attach another file)",
        err=True,
    )


def _command(line: str, session: Any, pending: dict[str, list[Path]]) -> None:
    name, _, arg = line.partition(" ")
    arg = arg.strip()
    if name == "/reset":
        session.reset()
        pending["image"], pending["audio"] = [], []
        typer.echo("(conversation reset)", err=True)
    elif name in ("/image", "/audio"):
        kind = name[1:]
        if not arg:
            typer.echo(f"error: {name} needs a file: {name} FILE", err=True)
            return
        try:
            pending[kind] += _readable(kind, [Path(arg)])
        except MobiusError as exc:
            typer.echo(f"error: {exc.render()}", err=True)
            return
        typer.echo(f"({kind} {arg} goes with your next message)", err=True)
    elif name == "/help":
        typer.echo(CHAT_HELP, err=True)
    else:
        typer.echo(f"error: unknown command {name}; {CHAT_HELP}", err=True)
