"""Hugging Face repo ids: ``"Qwen/Qwen3.6-35B-A3B"`` resolved to a snapshot
folder of the local Hugging Face cache, through ``huggingface_hub``'s own API.

The cache is the one ``huggingface_hub`` uses (``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub``); a branch or tag is read
from the repo's ``refs/``, a commit hash names its snapshot directly, and the
snapshot's files are ``huggingface_hub``'s symlinks into ``blobs/``. Nothing is
downloaded unless ``download=True`` (then only ``*.json`` and
``*.safetensors``), so a load never touches the network by surprise.

A string is taken as a repo id only when it has the repo-id form
``owner/name`` and neither it nor its ``owner`` folder exists here; anything
else stays a local path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Union

from .errors import Hf2qError

__all__ = ["HubError", "RepoNotCachedError", "is_repo_id", "resolve", "fetch_command"]

PathLike = Union[str, "os.PathLike[str]"]

#: ``owner/name``: letters, digits, ``-``, ``_``, ``.`` (huggingface_hub's
#: rules, which it checks again); no ``--`` or ``..``, no leading/trailing
#: ``-``/``.`` in either part.
_PART = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"^{_PART}/{_PART}$")

#: What ``download=True`` fetches: configs, indexes and weights, nothing else.
DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model"]  # tokenizer files size Gemma 4's embedding


class HubError(Hf2qError):
    """A Hugging Face repo id could not be resolved (not cached, unknown
    revision, download failed). ``repo_id`` and ``revision`` say which."""

    def __init__(self, message: str, *, repo_id: str, revision: str | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.repo_id = repo_id
        self.revision = revision
        self.hint = hint


class RepoNotCachedError(HubError):
    """The repo (or that revision of it) is not in the local cache; ``hint``
    is the command that fetches it."""


def is_repo_id(s: PathLike) -> bool:
    """Whether ``s`` is to be read as a Hub repo id: the ``owner/name`` form
    and no file or folder of that name exists here."""
    if not isinstance(s, str) or not _REPO_ID.match(s) or "--" in s or ".." in s:
        return False
    # an existing path, or a missing file in an existing folder, is local
    return not os.path.lexists(s) and not os.path.isdir(s.split("/", 1)[0])


def fetch_command(repo_id: str, revision: str | None = None, command: str = "load") -> str:
    rev = f" --revision {revision}" if revision else ""
    return f"hf2q {command} {repo_id}{rev} --download"


def cache_dir() -> str:
    """The Hugging Face hub cache this process uses (``huggingface_hub``'s)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def resolve(
    path: PathLike,
    revision: str | None = None,
    *,
    download: bool = False,
    cache_dir: PathLike | None = None,
    command: str = "load",
) -> Path:
    """A local checkpoint path for ``path``: the path itself, or, for a repo
    id, its snapshot folder in the Hugging Face cache at ``revision`` (a
    branch, tag or commit hash; default ``main``).

    Offline unless ``download``; then ``huggingface_hub.snapshot_download``
    fetches the repo's ``*.json`` and ``*.safetensors`` files (its own
    progress bars, token and endpoint settings apply). Raises
    :class:`RepoNotCachedError` (with the command that fetches it) or
    :class:`HubError`; ``revision`` with a local path is a ``ValueError``.
    ``command`` is the CLI subcommand named in that hint."""
    if not is_repo_id(path):
        if revision is not None:
            raise ValueError(f"{os.fspath(path)}: a revision applies to Hugging Face repo ids only, not to a local path")
        if download:
            raise ValueError(f"{os.fspath(path)}: --download applies to Hugging Face repo ids only, not to a local path")
        return Path(os.fspath(path))
    repo_id = str(path)
    from huggingface_hub import snapshot_download
    from huggingface_hub import errors as hub_errors

    where = f"{repo_id}@{revision}" if revision else repo_id
    hint = fetch_command(repo_id, revision, command)
    cache = os.fspath(cache_dir) if cache_dir is not None else None
    try:
        if download:
            snapshot = snapshot_download(repo_id, revision=revision, cache_dir=cache, allow_patterns=DOWNLOAD_PATTERNS)
        else:
            snapshot = snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True)
    except hub_errors.LocalEntryNotFoundError:
        if download:  # offline mode (HF_HUB_OFFLINE) or no connection
            raise HubError(
                f"{where}: cannot download: not in the Hugging Face cache and the Hub cannot be reached "
                "(is HF_HUB_OFFLINE set?)", repo_id=repo_id, revision=revision) from None
        cache_text = cache or _cache_dir_safe()
        raise RepoNotCachedError(
            f"{where}: not a local path, and not in the Hugging Face cache ({cache_text}); fetch it with: {hint}",
            repo_id=repo_id, revision=revision, hint=hint) from None
    except hub_errors.RevisionNotFoundError:
        raise HubError(f"{where}: the Hub has no revision {revision!r} of this repo", repo_id=repo_id,
                       revision=revision) from None
    except hub_errors.RepositoryNotFoundError:
        raise HubError(f"{repo_id}: no such repo on the Hub (or it is private/gated: log in with `hf auth login`)",
                       repo_id=repo_id, revision=revision) from None
    except hub_errors.HfHubHTTPError as e:
        raise HubError(f"{where}: download failed: {str(e).splitlines()[0]}", repo_id=repo_id,
                       revision=revision) from None
    except (OSError, ValueError) as e:
        raise HubError(f"{where}: {e}", repo_id=repo_id, revision=revision) from None
    snap = Path(snapshot)
    if not any(p.name.endswith(".safetensors") for p in snap.iterdir()):
        raise RepoNotCachedError(
            f"{where}: the cached snapshot {snap} holds no .safetensors files; fetch them with: {hint}",
            repo_id=repo_id, revision=revision, hint=hint)
    return snap


def _cache_dir_safe() -> str:
    try:
        return cache_dir()
    except Exception:  # pragma: no cover - huggingface_hub is a dependency
        return "the Hugging Face cache"
