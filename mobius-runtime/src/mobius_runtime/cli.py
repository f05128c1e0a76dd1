"""``mobius run PACKAGE --prompt TEXT``: generate from a package, streaming text.

Errors a user can cause (a missing or corrupted package, an unreadable image or
audio file, a prompt longer than the model's positions, a modality the package
lacks) are :class:`mobius.errors.MobiusError`; they are printed to stderr
without a traceback (``--debug`` shows it) and exit with status 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from mobius.errors import MobiusError


def _readable(kind: str, files: list[Path]) -> list[Path]:
    from mobius_runtime.errors import RequestError

    for path in files:
        try:
            with path.open("rb") as f:
                f.read(1)
        except OSError as exc:
            raise RequestError(
                f"cannot read {kind} file {path}: {exc.strerror or exc}",
                where=str(path),
                fix=f"pass an existing, readable {kind} file",
            ) from exc
    return files


def run(
    package: Annotated[Path, typer.Argument(help="Model package folder (has mobius.json).")],
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="The user prompt.")],
    raw: Annotated[
        bool,
        typer.Option("--raw", help="Send the prompt verbatim, without the chat template."),
    ] = False,
    image: Annotated[list[Path] | None, typer.Option("--image", help="Image file.")] = None,
    audio: Annotated[list[Path] | None, typer.Option("--audio", help="Audio file.")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 128,
    sample: Annotated[bool, typer.Option("--sample", help="Sample instead of greedy.")] = False,
    temperature: Annotated[float, typer.Option("--temperature")] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k")] = 0,
    top_p: Annotated[float, typer.Option("--top-p")] = 1.0,
    seed: Annotated[int | None, typer.Option("--seed")] = None,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    threads: Annotated[int | None, typer.Option("--threads")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print ids, text, timings.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    """Generate from PACKAGE; text streams to stdout as it is generated."""
    try:
        result = _generate(
            package,
            prompt,
            raw,
            image or [],
            audio or [],
            max_new_tokens,
            sample,
            temperature,
            top_k,
            top_p,
            seed,
            device,
            threads,
            stream=not as_json,
        )
    except MobiusError as exc:
        if debug:
            raise
        typer.echo(f"error: {exc.render()}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()


def _generate(
    package: Path,
    prompt: str,
    raw: bool,
    images: list[Path],
    audio: list[Path],
    max_new_tokens: int,
    sample: bool,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int | None,
    device: str,
    threads: int | None,
    *,
    stream: bool,
):
    from mobius.errors import PackageError
    from mobius_runtime.pipeline import Pipeline

    if not (package / "mobius.json").is_file():
        raise PackageError(
            f"{package} is not a model package (no mobius.json)"
            if package.is_dir()
            else f"package folder {package} does not exist",
            where=str(package),
            fix="build one with `mobius build SOURCE OUT`, then pass OUT",
        )
    _readable("image", images)
    _readable("audio", audio)
    pipeline = Pipeline.load(package, device=device, threads=threads)

    def on_token(_token: int, piece: str) -> None:
        if piece:
            sys.stdout.write(piece)
            sys.stdout.flush()

    if not raw and not pipeline.has_chat_layout:
        typer.echo(
            "note: the package has no chat template and its family no chat layout; "
            "the prompt is sent verbatim (as with --raw)",
            err=True,
        )
        raw = True
    if raw:
        request: dict = {"prompt": prompt, "images": images, "audio": audio}
    else:
        parts = [
            *({"type": "image", "image": str(p)} for p in images),
            *({"type": "audio", "audio": str(p)} for p in audio),
            {"type": "text", "text": prompt},
        ]
        request = {"messages": [{"role": "user", "content": parts}]}
    return pipeline.generate(
        **request,
        max_new_tokens=max_new_tokens,
        do_sample=sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        on_token=on_token if stream else None,
    )
