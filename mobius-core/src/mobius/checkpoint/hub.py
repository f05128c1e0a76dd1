"""Open a checkpoint from the HuggingFace Hub through ``huggingface_hub``.

``snapshot_download`` with allow patterns fetches only what a build reads (config,
safetensors, tokenizer and processor files — never pickle weights) into the
shared HF cache, honours ``HF_HUB_OFFLINE`` and returns the snapshot folder, whose
name is the resolved commit. ``huggingface_hub`` is imported lazily so that
``mobius --help`` and local builds never pay for it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mobius.checkpoint.base import Checkpoint, SourceInfo
from mobius.checkpoint.local import INDEX_NAME, SIDE_FILES, open_folder
from mobius.errors import CheckpointError

ALLOW_PATTERNS = ("config.json", "*.safetensors", INDEX_NAME, *SIDE_FILES)
"""Files fetched from a Hub repository: what :func:`open_local` reads (config, safetensors
weights, the side files); everything else (pickles, ONNX, GGUF) is skipped."""

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REPO_ID = re.compile(rf"{_NAME}/{_NAME}")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def looks_like_repo_id(source: str) -> bool:
    """Whether ``source`` has the shape of a Hub id ``owner/name`` (no network call)."""
    return bool(_REPO_ID.fullmatch(source)) and ".." not in source and "--" not in source


def open_hub(
    repo_id: str, revision: str | None = None, *, require_weights: bool = False
) -> Checkpoint:
    """Download (or find in the HF cache) a Hub snapshot and open it as a checkpoint."""
    if not looks_like_repo_id(repo_id):
        raise CheckpointError(
            f"{repo_id!r} is not a HuggingFace Hub id",
            where=repo_id,
            fix="use owner/name (e.g. google/gemma-4-E2B-it) or a local folder path",
        )
    try:
        folder = _snapshot(repo_id, revision)
    except CheckpointError as exc:
        hint = _local_path_hint(repo_id)
        if hint is None:
            raise
        # the folder comes first and the Hub's own (multi-line) text is left to --debug
        summary = getattr(exc, "summary", exc.what)
        raise CheckpointError(
            f"{hint}; as a HuggingFace Hub id it failed too: {summary}",
            where=exc.where,
            fix=f"if you meant a local folder, correct the path; else {exc.fix}",
        ) from exc.__cause__
    commit = folder.name if _COMMIT.fullmatch(folder.name) else None
    info = SourceInfo(source=repo_id, kind="hub", revision=revision, commit=commit)
    # Snapshot files are symlinks into the repository's blob store: confine reads to the
    # repository folder (models--owner--name), not just the snapshot.
    confine = folder.parent.parent if folder.parent.name == "snapshots" else folder
    return open_folder(
        folder, info, require_weights=require_weights, trust_blob_names=True, confine=confine
    )


def _local_path_hint(source: str) -> str | None:
    """ "no such folder" when ``source`` (shaped like ``org/name``) may be a mistyped path.

    Why: ``models/tiny`` is a valid Hub id, so a local path with a typo is sent to
    the Hub; when its parent folder exists here, the user most likely meant a path.
    """
    path = Path(source).expanduser()
    if path.exists() or not path.parent.is_dir():
        return None
    return f"no such folder {source} (its parent {path.parent}/ exists)"


_NETWORK_MODULES = ("httpx", "httpcore", "requests", "urllib3", "socket", "ssl", "h11", "h2")


def network_problem(exc: BaseException) -> str | None:
    """What kind of network failure ``exc`` is ("proxy", "timeout", "connection"), or None.

    Decided from the exception's classes (httpx, requests, urllib3, socket, ssl
    and the built-in ConnectionError / TimeoutError) and, through ``__cause__`` /
    ``__context__``, what it wraps; no network library is imported for this.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        kinds = type(current).__mro__
        names = " ".join(k.__name__ for k in kinds).lower()
        from_network = any(k.__module__.split(".")[0] in _NETWORK_MODULES for k in kinds)
        if from_network or isinstance(current, (ConnectionError, TimeoutError)):
            if "proxy" in names or "proxy" in str(current).lower():
                return "proxy"
            if "timeout" in names:
                return "timeout"
            return "connection"
        current = current.__cause__ or current.__context__
    return None


_NETWORK_FIX = {
    "proxy": "check the proxy settings (HTTPS_PROXY, HTTP_PROXY, NO_PROXY) and the proxy's "
    "credentials, or pass a local checkpoint folder",
    "timeout": "check the network connection and retry (HF_HUB_DOWNLOAD_TIMEOUT raises the "
    "limit), or pass a local checkpoint folder",
    "connection": "check the network connection (and any proxy: HTTPS_PROXY, NO_PROXY), or "
    "pass a local checkpoint folder",
}


def _snapshot(repo_id: str, revision: str | None) -> Path:
    import huggingface_hub
    from huggingface_hub import errors

    where = f"{repo_id}@{revision}" if revision else repo_id
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    try:
        path = huggingface_hub.snapshot_download(
            repo_id, revision=revision, allow_patterns=list(ALLOW_PATTERNS)
        )
    except errors.GatedRepoError as exc:
        raise CheckpointError(
            "the Hub repository is gated: you must accept its terms and be logged in",
            where=where,
            fix=f"accept the license on https://huggingface.co/{repo_id}, then `hf auth login` "
            "(or set HF_TOKEN)",
        ) from exc
    except errors.RepositoryNotFoundError as exc:
        raise CheckpointError(
            "the Hub repository does not exist or is private",
            where=where,
            fix="check the id's spelling; for a private repository log in with `hf auth login` "
            "(or set HF_TOKEN)",
        ) from exc
    except errors.RevisionNotFoundError as exc:
        raise CheckpointError(
            f"revision {revision!r} does not exist in the Hub repository",
            where=where,
            fix="pass an existing branch, tag or commit with --revision",
        ) from exc
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled) as exc:
        if offline:
            what = "HF_HUB_OFFLINE is set and the checkpoint is not in the local HF cache"
            fix = "unset HF_HUB_OFFLINE to download it, or pass a local checkpoint folder"
        else:
            what = "cannot reach the HuggingFace Hub and the checkpoint is not in the local cache"
            fix = "check the network connection (or proxy settings), or pass a local folder"
        error = CheckpointError(f"{what} ({' '.join(str(exc).split())})", where=where, fix=fix)
        error.summary = what  # what open_hub shows after "no such folder"
        raise error from exc
    except errors.HfHubHTTPError as exc:
        raise CheckpointError(
            f"the HuggingFace Hub refused the download: {exc}",
            where=where,
            fix="retry later; if it persists check the id, the revision and your token",
        ) from exc
    except Exception as exc:
        # httpx / requests errors are not OSErrors; a proxy refusal used to surface as
        # "a bug in the plugin". Disk errors while writing the cache are OSErrors.
        kind = network_problem(exc)
        if kind is not None:
            raise CheckpointError(
                f"network problem ({kind}) while downloading from the HuggingFace Hub: "
                f"{type(exc).__name__}: {exc}",
                where=where,
                fix=_NETWORK_FIX[kind],
            ) from exc
        if isinstance(exc, OSError):
            raise CheckpointError(
                f"downloading from the HuggingFace Hub failed: {exc}",
                where=where,
                fix="check free disk space and permissions in the HF cache (HF_HOME), "
                "or pass a local checkpoint folder",
            ) from exc
        raise
    return Path(path)
