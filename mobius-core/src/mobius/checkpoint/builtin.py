"""Core's built-in ``mobius_open_checkpoint`` implementations: a GGUF file, a local
folder, then the Hub.

This module is itself the plugin object :class:`mobius.plugins.PluginHost`
registers. All three implementations are ``trylast`` so that any external plugin
adding a source answers first; among them, pluggy calls the one registered
first first, and it registers them in ``dir()`` (alphabetical) order, which puts
``open_checkpoint_as_gguf`` before ``open_checkpoint_from_folder`` (a folder holding
a ``.gguf`` file and no ``config.json`` is a GGUF checkpoint) and that before
``open_checkpoint_from_hub``: an existing folder always wins over a Hub id of the
same spelling. The openers are imported inside the hooks: this module is imported
whenever plugins are discovered.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mobius.errors import CheckpointError
from mobius.hookspecs import hookimpl

if TYPE_CHECKING:
    from mobius.checkpoint.base import Checkpoint
    from mobius.plugins import PluginHost


@hookimpl(specname="mobius_open_checkpoint", trylast=True)
def open_checkpoint_as_gguf(
    source: str, revision: str | None, host: PluginHost | None, companion: str | None = None
):
    """Answer when ``source`` is a ``.gguf`` file or a folder of one without config.json
    (``companion``: the ``--mmproj`` file the user named, if any)."""
    from mobius.checkpoint.gguf import is_gguf_source, open_gguf

    if not is_gguf_source(source):
        return None
    if revision is not None:
        raise CheckpointError(
            f"--revision {revision!r} was given for a local GGUF file",
            where=source,
            fix="drop --revision (it selects a Hub commit)",
        )
    return open_gguf(source, host, companion=companion)


@hookimpl(specname="mobius_open_checkpoint", trylast=True)
def open_checkpoint_from_folder(source: str, revision: str | None) -> Checkpoint | None:
    """Answer when ``source`` is an existing folder; refuse an existing plain file."""
    path = Path(source).expanduser()
    if path.is_dir():
        if revision is not None:
            raise CheckpointError(
                f"--revision {revision!r} was given for a local folder",
                where=str(path),
                fix="drop --revision (it selects a Hub commit), or pass a Hub id",
            )
        from mobius.checkpoint.local import open_local  # numpy, ml_dtypes: only when used

        return open_local(path, source=source)
    if path.exists():
        raise CheckpointError(
            "checkpoint source is a file, not a folder",
            where=str(path),
            fix="pass the folder that holds config.json and the *.safetensors files, "
            "or a .gguf file",
        )
    return None


@hookimpl(specname="mobius_open_checkpoint", trylast=True)
def open_checkpoint_from_hub(source: str, revision: str | None) -> Checkpoint | None:
    """Answer when ``source`` looks like a Hub id ``owner/name`` and is no local path."""
    from mobius.checkpoint.hub import looks_like_repo_id, open_hub

    if Path(source).expanduser().exists() or not looks_like_repo_id(source):
        return None
    return open_hub(source, revision)
