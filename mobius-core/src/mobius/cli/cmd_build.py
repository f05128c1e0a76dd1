"""``mobius build SOURCE OUT``: progress on stderr, a summary on stdout."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from enum import Enum
from typing import Annotated, Any

import typer

from mobius.cli._common import DEBUG_HELP, get_host, user_errors


class Dtype(str, Enum):
    """Build dtypes (``mobius.records.DTYPES``)."""

    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"


class Target(str, Enum):
    """Build targets (``mobius.records.TARGETS``)."""

    default = "default"
    cpu = "cpu"
    cuda = "cuda"


class Quant(str, Enum):
    """Weight-only quantization formats (``mobius.records.QUANT_METHODS``)."""

    int4 = "int4"
    int8 = "int8"


class Logits(str, Enum):
    """``--logits`` values (``mobius.records.LOGITS``)."""

    all = "all"
    last = "last"


class LmHead(str, Enum):
    """``--quant-lm-head`` values."""

    int4 = "int4"
    int8 = "int8"
    float = "float"


class RichProgress:
    """A :class:`mobius.progress.BuildProgress` drawing rich bars on stderr."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("tensors"),
            TextColumn("{task.fields[size]}"),
            TimeElapsedColumn(),
            console=self.console,
        )
        self._tasks: dict[str, Any] = {}
        self._bytes: dict[str, int] = {}
        self._started = False

    def __enter__(self) -> RichProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started:
            self.progress.stop()

    def _start(self) -> None:
        # Started on first use, so a build refused up front prints only its error.
        if not self._started:
            self.progress.start()
            self._started = True

    def component_started(self, name: str, n_tensors: int) -> None:
        self._start()
        if n_tensors == 0:  # a bar would read "0/0 tensors 0 B"
            self.message(f"{name}: no tensor large enough for external data; all in model.onnx")
            return
        self._bytes[name] = 0
        self._tasks[name] = self.progress.add_task(name, total=n_tensors, size="0 B")

    def tensor_written(self, component: str, name: str, nbytes: int) -> None:
        task = self._tasks.get(component)
        if task is None:
            return
        self._bytes[component] += nbytes
        self.progress.update(task, advance=1, size=human_size(self._bytes[component]))

    def component_finished(self, name: str) -> None:
        task = self._tasks.get(name)
        if task is not None:
            self.progress.update(task, completed=self.progress.tasks[task].total)

    def message(self, text: str) -> None:
        self._start()
        # soft_wrap: a long path stays one line (the terminal wraps it, copy-paste works);
        # markup off: a message holding "[...]" prints as written
        self.progress.console.print(
            text, style="dim", highlight=False, markup=False, soft_wrap=True
        )


class Terminated(BaseException):
    """SIGTERM, raised in the main thread like KeyboardInterrupt so cleanup code runs.

    A BaseException so that plugin error handling (``except Exception``) does
    not turn it into a plugin bug.
    """


EXIT_SIGINT = 130
EXIT_SIGTERM = 143
"""Shell conventions: 128 + signal number."""


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Let SIGINT and SIGTERM stop a build cleanly: the package writer removes its
    temporary folder on the way out, then the command exits 130 / 143.

    Why: Python's default SIGTERM kills the process without unwinding, leaving a
    temporary sibling of OUT behind; click turns KeyboardInterrupt into exit 1.
    """
    import signal
    import threading

    previous: Any = None
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:

        def on_sigterm(signum: int, frame: object) -> None:
            raise Terminated

        previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except KeyboardInterrupt:
        typer.echo("interrupted (SIGINT): build stopped, temporary files removed", err=True)
        raise typer.Exit(code=EXIT_SIGINT) from None
    except Terminated:
        typer.echo("terminated (SIGTERM): build stopped, temporary files removed", err=True)
        raise typer.Exit(code=EXIT_SIGTERM) from None
    finally:
        if main_thread and previous is not None:
            signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def info_messages(progress: RichProgress, enabled: bool) -> Iterator[None]:
    """With ``enabled``, show INFO records of the ``mobius*`` loggers (core and plugins,
    e.g. ``mobius_gemma4``) above the progress bars while the block runs.

    Why: a family reports build decisions (the per-layer attention op split, unused
    tensors) at info level; ``--verbose`` makes them visible without ``--debug``.
    """
    if not enabled:
        yield
        return
    import logging

    class ToProgress(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.name.split(".")[0].startswith("mobius"):
                progress.message(f"{record.name}: {record.getMessage()}")

    root = logging.getLogger()
    handler, level = ToProgress(logging.INFO), root.level
    root.addHandler(handler)
    root.setLevel(min(level, logging.INFO) if level else logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def human_size(n: float) -> str:
    """Bytes in binary units, e.g. ``1.5 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def quant_options_of(
    method: str,
    block_size: int,
    level: int | None,
    asymmetric: bool,
    exclude: list[str],
    lm_head: str | None = None,
    search: bool = True,
) -> Any:
    """:class:`mobius.records.QuantOptions` from the CLI options (BuildError if invalid)."""
    from mobius.errors import BuildError
    from mobius.records import BLOCK_SIZES, QuantOptions

    try:
        return QuantOptions(
            method=method,
            block_size=block_size,
            symmetric=not asymmetric,
            accuracy_level=level,
            exclude=tuple(exclude),
            lm_head=lm_head,
            search=search,
        )
    except ValueError as exc:
        raise BuildError(
            str(exc),
            where="mobius build options",
            fix=f"use --block-size {'|'.join(map(str, BLOCK_SIZES))} and --accuracy-level 0..4",
        ) from exc


def register(app: typer.Typer) -> None:
    """Add the ``build`` command to ``app``."""

    @app.command("build")
    def build(
        ctx: typer.Context,
        source: Annotated[str, typer.Argument(help="Checkpoint folder or HuggingFace Hub id.")],
        out: Annotated[str, typer.Argument(help="Folder to write the package to.")],
        dtype: Annotated[
            Dtype | None,
            typer.Option(
                "--dtype",
                help="Float dtype of the package (default f32; a GGUF file then keeps its "
                "quantization, and any --dtype dequantizes it).",
            ),
        ] = None,
        target: Annotated[Target, typer.Option("--target", help="Execution target.")] = (
            Target.default
        ),
        revision: Annotated[
            str | None, typer.Option("--revision", help="Hub revision (branch, tag, sha).")
        ] = None,
        force: Annotated[
            bool,
            typer.Option(
                "--force",
                help="Replace a previous mobius package at OUT (never any other folder or file).",
            ),
        ] = False,
        verbose: Annotated[
            bool,
            typer.Option(
                "--verbose",
                "-v",
                help="Also print the build's info messages (e.g. which attention op each "
                "layer uses, checkpoint tensors left unused).",
            ),
        ] = False,
        quant: Annotated[
            Quant | None,
            typer.Option(
                "--quant",
                help="Weight-only block quantization: MatMul weights become MatMulNBits, "
                "embedding tables GatherBlockQuantized (--dtype stays the activation type: "
                "int4 + f32 = q4 for CPU, int4 + f16 = q4f16 for CUDA).",
            ),
        ] = None,
        block_size: Annotated[
            int,
            typer.Option(
                "--block-size", help="Values per quantization block: 16, 32, 64, 128 or 256."
            ),
        ] = 32,
        accuracy_level: Annotated[
            int | None,
            typer.Option(
                "--accuracy-level",
                help="MatMulNBits accuracy_level 0..4 (4: int8 activations, the fast CPU path). "
                "Default: 4 with --target cpu, else 0.",
            ),
        ] = None,
        asymmetric: Annotated[
            bool, typer.Option("--asymmetric", help="Store a zero point per block.")
        ] = False,
        quant_exclude: Annotated[
            list[str] | None,
            typer.Option(
                "--quant-exclude",
                help="Glob over initializer names kept float (repeatable), "
                "e.g. 'lm_head*' or '*.router.*'.",
            ),
        ] = None,
        quant_lm_head: Annotated[
            LmHead | None,
            typer.Option(
                "--quant-lm-head",
                help="Type of the output projection (a tied one includes the embedding), "
                "e.g. int8 on an int4 body for accuracy. Default: like the rest.",
            ),
        ] = None,
        scale_search: Annotated[
            bool,
            typer.Option(
                "--scale-search/--no-scale-search",
                help="Choose each block's scale by a search over clip ratios (default; lower "
                "error) or take round-to-nearest's (about 3x faster to quantize).",
            ),
        ] = True,
        logits: Annotated[
            Logits,
            typer.Option(
                "--logits",
                help="Positions the logits output covers: all (forward / perplexity) or the "
                "last only (generation: the output projection runs on one row per prompt, "
                "much faster prefill with a large vocabulary). Decoder-LM kit families.",
            ),
        ] = Logits.all,
        mmproj: Annotated[
            str | None,
            typer.Option(
                "--mmproj",
                help="A GGUF model's encoder file (llama.cpp's mmproj-*.gguf: vision / audio "
                "towers), read with the model. Default: the one mmproj*.gguf beside the "
                "model, when its family reads it; 'none': the model file alone.",
            ),
        ] = None,
        debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
    ) -> None:
        """Build SOURCE (a checkpoint) into a model package at OUT."""
        with user_errors(ctx, debug), interruptible():
            from mobius.builder import build as run_build

            quant_options = None
            if quant is not None:
                quant_options = quant_options_of(
                    quant.value, block_size, accuracy_level, asymmetric, quant_exclude or [],
                    None if quant_lm_head is None else quant_lm_head.value, scale_search,
                )  # fmt: skip
            elif (
                quant_exclude
                or asymmetric
                or accuracy_level is not None
                or block_size != 32
                or quant_lm_head is not None
                or not scale_search
            ):
                from mobius.errors import BuildError

                raise BuildError(
                    "--block-size, --accuracy-level, --asymmetric, --quant-exclude, "
                    "--quant-lm-head and --no-scale-search only apply to a quantized build",
                    where="mobius build options",
                    fix="add --quant int4 (or int8), or drop those options",
                )
            host = get_host(ctx)
            with RichProgress() as progress, info_messages(progress, verbose):
                result = run_build(
                    source,
                    out,
                    dtype=None if dtype is None else dtype.value,
                    target=target.value,
                    revision=revision,
                    force=force,
                    progress=progress,
                    host=host,
                    quant=quant_options,
                    logits=logits.value,
                    mmproj=mmproj,
                )
            total = sum(result.components.values())
            typer.echo(
                f"built {result.model_type} package at {result.out} "
                f"({result.n_tensors} tensors from the checkpoint, {human_size(total)}, {result.seconds:.1f} s)"
            )
            for name, size in result.components.items():
                typer.echo(f"  {name}: {human_size(size)}")
            if result.unused:
                typer.echo(f"  unused checkpoint tensors: {len(result.unused)}")
            for kind, (error, count) in result.weight_errors.items():
                typer.echo(
                    f"  {kind} approximated ({count} tensors as int8 blocks): largest weight "
                    f"error {error:.3g}"
                )
