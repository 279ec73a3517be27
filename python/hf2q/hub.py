"""Hugging Face repo ids: ``"Qwen/Qwen3.6-35B-A3B"`` resolved to a snapshot
folder of the local Hugging Face cache, through ``huggingface_hub``'s own API.

The cache is the one ``huggingface_hub`` uses (``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub``); a branch or tag is read
from the repo's ``refs/``, a commit hash names its snapshot directly (a
short one, 7 to 39 hex digits, the one cached snapshot it starts, where no
ref has that name), and the
snapshot's files are ``huggingface_hub``'s symlinks into ``blobs/``. Nothing is
downloaded unless ``download=True`` (then only ``*.json`` and
``*.safetensors``), so a load never touches the network by surprise.

A string is taken as a repo id only when it has the repo-id form
``owner/name`` and neither it nor its ``owner`` folder exists here; anything
else stays a local path.

A failed download is classified (:func:`resolve`): what the repo is (not
found, gated, disabled, no such revision, a file missing, no safetensors) is
a :class:`HubError`, bad input; the network or the server failing (no
connection, timeout, proxy, HTTP 5xx / 408 / 429) is a
:class:`HubNetworkError`, a system error that may pass (the CLI exits 1 for
it, 2 for bad input). An ``OSError`` of the machine itself (the cache cannot
be written, the disk is full) is raised as it is.

The cache is untrusted input, like a checkpoint (docs/RELIABILITY.md, "The
Hugging Face cache"): a revision must be a git branch/tag name or a 40-hex
commit (:func:`check_revision`), so it can never climb out of ``refs/`` or
``snapshots/``; without ``download`` the lookup is hf2q's own
(:func:`_lookup`: ``refs/<revision>`` read through the package's safe opener,
a regular file of at most ``REF_MAX_BYTES`` holding a commit hash, no
``huggingface_hub`` ``open()`` of a FIFO or ``/dev/zero``); with it, the
cache files huggingface_hub will read are checked first
(:func:`_precheck`); either way the snapshot must lie inside the repo's
``snapshots/`` once links are resolved, and its entries inside ``blobs/``
or the snapshot itself. Every refusal is a :class:`HubError` (exit 2).
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import re
import socket
import stat
from pathlib import Path
from typing import Any, Union

from .errors import Hf2qError

__all__ = ["HubError", "RepoNotCachedError", "HubNetworkError", "is_repo_id", "check_revision", "parse_url", "resolve",
           "fetch_command"]

PathLike = Union[str, "os.PathLike[str]"]

#: ``owner/name``: letters, digits, ``-``, ``_``, ``.`` (huggingface_hub's
#: rules, which it checks again); no ``--`` or ``..``, no leading/trailing
#: ``-``/``.`` in either part.
_PART = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"^{_PART}/{_PART}\Z")

#: What ``download=True`` fetches: configs, indexes and weights, nothing else.
DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model"]  # tokenizer files size Gemma 4's embedding

#: A commit hash as the Hub names snapshots: 40 lowercase hex digits (sha1).
_COMMIT = re.compile(r"[0-9a-f]{40}\Z")
#: Longest revision accepted (git allows more; real branch names are short).
REVISION_MAX_CHARS = 255
#: ``refs/<name>``: a commit hash (40 bytes, huggingface_hub writes no newline).
REF_MAX_BYTES = 4096
#: ``trees/<commit>.json`` (huggingface_hub's cached file listing, ~200 bytes per file).
TREE_MAX_BYTES = 64 << 20
#: Characters git refuses in a ref name (``git check-ref-format``), besides
#: control characters: space ``~ ^ : ? * [ \``.
_REF_FORBIDDEN = set(" ~^:?*[\\")


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


class HubNetworkError(HubError, ConnectionError):
    """A download failed on the network or the server (no connection, DNS,
    timeout, proxy, HTTP 5xx / 408 / 429): not a fault of the repo id or the
    checkpoint, and the same command (``hint``) may work later. Also a
    ``ConnectionError`` (an ``OSError``); the CLI exits 1 for it, a system
    error, where every other :class:`HubError` is bad input (2). The
    library's own exception is ``__cause__``."""

    system_failure = True


def is_repo_id(s: PathLike) -> bool:
    """Whether ``s`` is to be read as a Hub repo id: the ``owner/name`` form
    and no file or folder of that name exists here."""
    if not isinstance(s, str) or not _REPO_ID.match(s) or "--" in s or ".." in s:
        return False
    # an existing path, or a missing file in an existing folder, is local
    return not os.path.lexists(s) and not os.path.isdir(s.split("/", 1)[0])


def fetch_command(repo_id: str, revision: str | None = None, command: str = "load", api: str | None = None,
                  api_args: str = "") -> str:
    """What fetches the repo: the command line ``hf2q COMMAND REPO
    --download``, or, for a Python caller (``api``: the function it called;
    ``api_args``: its other positional arguments, written after the repo),
    that call with ``download=True``."""
    if api is not None:
        rev = f", revision={revision!r}" if revision else ""
        return f"{api}({repo_id!r}{api_args}{rev}, download=True)"
    rev = f" --revision {revision}" if revision else ""
    return f"hf2q {command} {repo_id}{rev} --download"


def check_revision(revision: str, repo_id: str) -> str:
    """``revision`` if it is a 40-hex commit hash or a name git allows for a
    branch or tag (the rules of ``git check-ref-format``, which also keep it
    from naming anything outside ``refs/``: no ``..``, no component starting
    with ``.``, no leading, trailing or doubled ``/``); else :class:`HubError`."""
    def bad(why: str) -> HubError:
        return HubError(f"{repo_id}@{revision!r}: not a valid revision ({why}); a revision is a branch or tag "
                        "name, or a 40-hex commit hash", repo_id=repo_id, revision=revision)

    if not isinstance(revision, str):
        raise HubError(f"{repo_id}: a revision must be a string, not {type(revision).__name__}",
                       repo_id=repo_id, revision=None)
    if _COMMIT.match(revision):
        return revision
    if not revision:
        raise bad("empty")
    if len(revision) > REVISION_MAX_CHARS:
        raise bad(f"{len(revision)} characters, at most {REVISION_MAX_CHARS}")
    bad_chars = sorted({c for c in revision if c in _REF_FORBIDDEN or ord(c) < 0x20 or ord(c) == 0x7F})
    if bad_chars:
        raise bad(f"contains {', '.join(repr(c) for c in bad_chars)}")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in revision):  # undecodable bytes from the command line
        raise bad("not valid UTF-8")
    if ".." in revision:
        raise bad("contains '..'")
    if "@{" in revision or revision == "@":
        raise bad("'@' alone or '@{' is git's revision syntax, not a name")
    if revision.startswith("-"):
        # git refuses it as a branch name, and a command line (the download
        # command this module suggests) would read it as an option.
        raise bad("starts with '-'")
    if revision.startswith("/") or revision.endswith("/") or "//" in revision:
        raise bad("a leading, trailing or doubled '/'")
    if revision.endswith("."):
        raise bad("ends with '.'")
    for part in revision.split("/"):
        if part.startswith("."):
            raise bad("a component starts with '.'")
        if part.endswith(".lock"):
            raise bad("a component ends with '.lock'")
    return revision


def _repo_folder(cache: str, repo_id: str) -> str:
    """huggingface_hub's folder of a model repo: ``models--OWNER--NAME``."""
    return os.path.join(cache, "models--" + repo_id.replace("/", "--"))


def _cache_error(where: str, what: str, ids: dict[str, Any]) -> HubError:
    return HubError(f"{where}: the Hugging Face cache is not usable: {what}", **ids)


def _read_small(path: str, cap: int, what: str, where: str, ids: dict[str, Any]) -> bytes | None:
    """The bytes of a small cache file through the package's safe opener
    (regular file, at most ``cap`` bytes, no blocking open), or None if it
    does not exist; anything else is a :class:`HubError`."""
    from ._files import read_capped

    def error(reason: str, e: OSError | None) -> BaseException:
        if isinstance(e, (FileNotFoundError, NotADirectoryError)):
            return _Missing()
        return _cache_error(where, f"{path} {reason}", ids)

    try:
        return read_capped(path, cap, what, error)
    except _Missing:
        return None


class _Missing(Exception):
    """(internal) a cache file that is not there."""


def _within(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or inside it (both already resolved)."""
    try:
        return os.path.commonpath([path, folder]) == folder
    except ValueError:  # different drives
        return False


def _commit_of(repo: str, revision: str, where: str, ids: dict[str, Any]) -> str | None:
    """The commit a revision names: itself if a hash, else what ``refs/<revision>``
    holds (None when there is no such ref)."""
    if _COMMIT.match(revision):
        return revision
    raw = _read_small(os.path.join(repo, "refs", *revision.split("/")), REF_MAX_BYTES, "refs/ file", where, ids)
    if raw is None:
        # A short commit hash, as git users type one: the one cached snapshot
        # whose name starts with it (a ref of that name came first, as in git).
        if _SHORT_COMMIT.match(revision):
            found = [c for c in _snapshot_commits(repo) if c.startswith(revision)]
            if len(found) > 1:
                raise HubError(f"{where}: the short commit hash {revision!r} matches {len(found)} cached snapshots "
                               f"({', '.join(c[:12] for c in found[:4])}{', ...' if len(found) > 4 else ''}); "
                               "give more of it", **ids)
            if found:
                return found[0]
        return None
    text = raw.decode("ascii", "replace").strip()
    if not _COMMIT.match(text):
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise _cache_error(where, f"refs/{revision} holds {shown!r}, not a 40-hex commit hash", ids)
    return text


#: A commit hash's prefix that resolves against the cached snapshots (git's shortest default: 7).
_SHORT_COMMIT = re.compile(r"[0-9a-f]{7,39}\Z")
#: At most this many cached snapshots / refs are listed (a message's, not a load's, cost).
_LIST_MAX = 10_000


def _snapshot_commits(repo: str) -> list[str]:
    """The commit hashes of the repo's cached snapshot folders (sorted)."""
    try:
        with os.scandir(os.path.join(repo, "snapshots")) as it:
            names = [e.name for _, e in zip(range(_LIST_MAX), it)]
    except OSError:
        return []
    return sorted(n for n in names if _COMMIT.match(n))


def _cached_refs(repo: str) -> list[tuple[str, str]]:
    """(branch or tag, commit) of the repo's ``refs/`` files that hold a
    commit hash, for a message only: never raises; the first 20 found, at
    most 1,000 entries of any kind looked at, 4 folders deep, no link
    followed, nothing read when ``refs/`` resolves outside the repo's folder;
    files read through the safe opener."""
    from ._files import read_capped

    def skip(reason: str, e: OSError | None) -> BaseException:
        return _Missing()

    out: list[tuple[str, str]] = []
    base = os.path.join(repo, "refs")
    try:
        if os.path.islink(base) or not _within(os.path.realpath(base), os.path.realpath(repo)):
            return out
        stack: list[tuple[str, int]] = [(base, 0)]
        seen = 0
        while stack and len(out) < 20:
            folder, depth = stack.pop()
            with os.scandir(folder) as it:
                entries = [e for _, e in zip(range(1000 - seen), it)]
            seen += len(entries)
            for e in sorted(entries, key=lambda e: e.name):
                if e.is_symlink():
                    continue
                if e.is_dir(follow_symlinks=False):
                    if depth < 4:
                        stack.append((e.path, depth + 1))
                    continue
                try:
                    text = read_capped(e.path, REF_MAX_BYTES, "refs/ file", skip).decode("ascii", "replace").strip()
                except _Missing:
                    continue
                if _COMMIT.match(text):
                    out.append((os.path.relpath(e.path, base).replace(os.sep, "/"), text))
            if seen >= 1000:
                break
    except (OSError, ValueError):
        pass
    return out[:20]


def _check_snapshot(repo: str, snap: str, where: str, ids: dict[str, Any]) -> None:
    """``snap`` resolves to a folder inside the repo's ``snapshots/``, and
    each of its entries to ``blobs/`` or the snapshot itself."""
    snaps_real = os.path.realpath(os.path.join(repo, "snapshots"))
    real = os.path.realpath(snap)
    if not _within(real, snaps_real) or real == snaps_real:
        raise _cache_error(where, f"the snapshot {snap} resolves to {real}, outside {snaps_real}", ids)
    blobs_real = os.path.realpath(os.path.join(repo, "blobs"))
    try:
        entries = list(os.scandir(real))
    except OSError as e:
        raise _cache_error(where, f"the snapshot {snap} cannot be listed: {e.strerror or e}", ids) from None
    for entry in entries:
        target = os.path.realpath(entry.path)
        if not (_within(target, blobs_real) or _within(target, real)):
            raise _cache_error(where, f"{entry.path} links to {target}, outside the repo's blobs/ and snapshot", ids)


def _missing_from_tree(repo: str, commit: str, snap: str, where: str, ids: dict[str, Any]) -> list[str]:
    """Files huggingface_hub's cached listing (``trees/<commit>.json``, newer
    versions) has at this commit, of the kinds hf2q downloads, that the
    snapshot lacks; [] when there is no listing or it is not one we know."""
    raw = _read_small(os.path.join(repo, "trees", commit + ".json"), TREE_MAX_BYTES, "cached file listing", where, ids)
    if raw is None:
        return []
    try:
        files = json.loads(raw.decode("utf-8")).get("files")
    except (ValueError, AttributeError, RecursionError):
        return []  # huggingface_hub ignores a listing it cannot read; so do we
    if not isinstance(files, dict):
        return []
    return [f for f in files if isinstance(f, str) and "/" not in f
            and any(fnmatch.fnmatchcase(f, pat) for pat in DOWNLOAD_PATTERNS)
            and not os.path.isfile(os.path.join(snap, f))]


def _lookup(cache: str, repo_id: str, revision: str, where: str, hint: str, ids: dict[str, Any]) -> Path:
    """The snapshot folder of ``repo_id`` at ``revision`` in ``cache``, read
    by hf2q itself (no download, no ``huggingface_hub`` file access)."""
    repo = _repo_folder(cache, repo_id)
    commit = _commit_of(repo, revision, where, ids)
    snap = os.path.join(repo, "snapshots", commit) if commit else None
    if snap is None or not os.path.isdir(snap):
        held = _snapshot_commits(repo)
        if held:  # the repo is cached, at other revisions: say which
            refs = _cached_refs(repo)
            shown = ", ".join([f"{r} -> {c[:12]}" for r, c in refs if c in held]
                              + [c[:12] for c in held if c not in {c for _, c in refs}][:5])
            raise RepoNotCachedError(
                f"{where}: the Hugging Face cache ({cache}) holds this repo, but not at revision {revision!r} "
                f"(cached: {shown}); fetch it with: {hint}", **ids, hint=hint)
        raise RepoNotCachedError(
            f"{where}: not a local path, and not in the Hugging Face cache ({cache}); fetch it with: {hint}",
            **ids, hint=hint)
    _check_snapshot(repo, snap, where, ids)
    missing = _missing_from_tree(repo, commit, snap, where, ids)
    if missing:
        shown = ", ".join(missing[:3]) + (f", ... ({len(missing) - 3} more)" if len(missing) > 3 else "")
        raise RepoNotCachedError(f"{where}: the cached snapshot is incomplete (an interrupted download?): "
                                 f"{len(missing)} file(s) missing ({shown}); fetch the rest with: {hint}",
                                 **ids, hint=hint)
    return Path(snap)


def _precheck(cache: str, repo_id: str, revision: str, where: str, ids: dict[str, Any]) -> None:
    """Before ``snapshot_download`` runs: the cache files it opens with a
    plain ``open()`` (``refs/<revision>``, ``trees/*.json``) must be regular
    files of a sane size, so that a FIFO cannot hang it nor ``/dev/zero``
    exhaust memory."""
    repo = _repo_folder(cache, repo_id)
    if not _COMMIT.match(revision):
        _commit_of(repo, revision, where, ids)
    trees = os.path.join(repo, "trees")
    try:
        names = sorted(os.listdir(trees))
    except OSError:
        return  # none yet (or not a folder: huggingface_hub fails on writing it, not by hanging)
    for name in names:
        p = os.path.join(trees, name)
        try:
            st = os.stat(p)  # stat of a FIFO does not block
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size > TREE_MAX_BYTES:
            from ._files import file_kind

            what = (f"is {file_kind(st.st_mode)}, not a regular file" if not stat.S_ISREG(st.st_mode)
                    else f"is {st.st_size} bytes, more than {TREE_MAX_BYTES}")
            raise _cache_error(where, f"{p} {what}", ids)


# A model's page on the Hub, as a browser shows it (a revision's file tree
# too; the scheme and host in any case, a clone URL's ".git" dropped).
_HUB_URL = re.compile(r"(?i:(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co))/(?!datasets/|spaces/)"
                      r"([^/?#]+/[^/?#]+?)(?:\.git)?(?:/tree/([^?#]+?))?/?\Z")


def _looks_like_url(path: object) -> bool:
    return isinstance(path, str) and ("://" in path or path.lower().startswith(("huggingface.co/", "hf.co/")))


def parse_url(path: PathLike, revision: str | None) -> tuple[PathLike, str | None, bool]:
    """``(repo id, revision, True)`` of a Hub model URL
    (``https://huggingface.co/OWNER/NAME``, with ``/tree/REV``, percent
    escapes decoded); ``(path, revision, False)`` for anything else that is
    no URL (a local folder named like one included); any other URL a
    :class:`HubError` (a path would mangle it: ``https:/...``)."""
    from urllib.parse import unquote

    if not _looks_like_url(path):
        return path, revision, False
    assert isinstance(path, str)
    if "://" not in path and os.path.lexists(path):  # a local folder named so: a path, as always
        return path, revision, False
    m = _HUB_URL.match(path)
    repo_id = m.group(1) if m else ""
    if m is None or not _REPO_ID.match(repo_id) or "--" in repo_id or ".." in repo_id:
        raise HubError(f"{path}: not a Hugging Face model page; hf2q loads a local path or a Hub repo id "
                       "(OWNER/NAME, e.g. Qwen/Qwen3.6-35B-A3B)", repo_id=path, revision=revision)
    rev = unquote(m.group(2)) if m.group(2) is not None else None
    if rev is not None and revision is not None and rev != revision:
        raise HubError(f"{path}: the URL names revision {rev!r}, and {revision!r} was given too",
                       repo_id=repo_id, revision=revision)
    return repo_id, revision if rev is None else rev, True


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
    api: str | None = None,
    api_args: str = "",
) -> Path:
    """A local checkpoint path for ``path``: the path itself, or, for a repo
    id, its snapshot folder in the Hugging Face cache at ``revision`` (a
    branch, tag or commit hash; default ``main``).

    Offline unless ``download``: the cache is then read by hf2q itself
    (``refs/``, ``snapshots/``; see the module's docstring for the checks).
    With ``download``, ``huggingface_hub.snapshot_download`` fetches the repo's ``*.json``, ``*.safetensors`` and ``tokenizer.model``
    files (its own progress bars, token and endpoint settings apply). Raises
    :class:`RepoNotCachedError` (with the command that fetches it),
    :class:`HubError` (the repo, revision or a file is not there, or not
    allowed: bad input) or :class:`HubNetworkError` (the network or the
    server failed: try again); ``revision`` or ``download`` with a local path
    is a ``ValueError``. ``command`` is the CLI subcommand named in ``hint``;
    ``api``, where given, the Python function named there instead (its call
    with ``download=True``)."""
    path, revision, from_url = parse_url(path, revision)
    if not from_url and not is_repo_id(path):
        if revision is not None:
            raise ValueError(f"{os.fspath(path)}: a revision applies to Hugging Face repo ids only, not to a local path")
        if download:
            raise ValueError(f"{os.fspath(path)}: --download applies to Hugging Face repo ids only, not to a local path")
        return Path(os.fspath(path))
    repo_id = str(path)
    if revision is not None:
        check_revision(revision, repo_id)
    rev = revision or "main"
    where = f"{repo_id}@{revision}" if revision else repo_id
    hint = fetch_command(repo_id, revision, command, api, api_args)
    cache = os.fspath(cache_dir) if cache_dir is not None else None
    root = cache if cache is not None else _cache_dir_safe()
    ids: dict[str, Any] = {"repo_id": repo_id, "revision": revision}
    if not download:
        snap = _lookup(root, repo_id, rev, where, hint, ids)
    else:
        from huggingface_hub import snapshot_download

        _precheck(root, repo_id, rev, where, ids)
        try:
            snapshot = snapshot_download(repo_id, revision=revision, cache_dir=cache, allow_patterns=DOWNLOAD_PATTERNS)
        except Exception as e:
            err = _classify(e, repo_id=repo_id, revision=revision, where=where, hint=hint, download=download,
                            cache=cache)
            if err is None:  # the machine's own OSError (cache not writable, disk full), or not a Hub failure
                raise
            raise err from (e if isinstance(err, HubNetworkError) else None)
        snap = Path(snapshot)
        if snap.is_dir():
            _check_snapshot(_repo_folder(root, repo_id), str(snap), where, ids)
    if not snap.is_dir() or not any(p.name.endswith(".safetensors") for p in snap.iterdir()):
        if download:  # fetched (or found) at this revision: the repo itself has none
            raise HubError(f"{where}: the repo has no .safetensors files at this revision (hf2q loads "
                           "safetensors checkpoints)", repo_id=repo_id, revision=revision)
        raise RepoNotCachedError(
            f"{where}: the cached snapshot {snap} holds no .safetensors files; fetch them with: {hint}",
            repo_id=repo_id, revision=revision, hint=hint)
    return snap


# --------------------------------------------------------------------------- classifying a failed download

#: Top-level packages whose exceptions are transport failures (huggingface_hub's HTTP clients, any version).
_TRANSPORT_PACKAGES = frozenset({"httpx", "httpx2", "httpcore", "httpcore2", "requests", "urllib3", "hf_xet"})
#: HTTP statuses that are the server's or the network's state, not the request's: retry later.
_RETRY_STATUSES = frozenset({408, 429})
#: errno values of a network that is down (beyond ConnectionError's, which are caught by class).
_NETWORK_ERRNOS = frozenset(getattr(errno, n) for n in ("ENETUNREACH", "ENETDOWN", "EHOSTUNREACH", "EHOSTDOWN",
                                                         "ETIMEDOUT", "ENETRESET") if hasattr(errno, n))


def _hub_class(name: str) -> Any:
    """huggingface_hub's exception class ``name`` wherever this version keeps
    it (``huggingface_hub.errors`` since 0.24, ``huggingface_hub.utils``
    before; ``EntryNotFoundError`` is named ``RemoteEntryNotFoundError`` in
    newer ones), or ``()``, which ``isinstance`` never matches, when this
    version has no such class."""
    import importlib

    names = {"EntryNotFoundError": ("EntryNotFoundError", "RemoteEntryNotFoundError"),
             "RemoteEntryNotFoundError": ("RemoteEntryNotFoundError", "EntryNotFoundError")}.get(name, (name,))
    found = []
    for module in ("huggingface_hub.errors", "huggingface_hub.utils", "huggingface_hub"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        for n in names:
            cls = getattr(mod, n, None)
            if isinstance(cls, type) and issubclass(cls, BaseException) and cls not in found:
                found.append(cls)
        if found:
            break
    return tuple(found) if found else ()


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and what caused it (``__cause__``, else ``__context__``), without cycles."""
    out: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and all(cur is not x for x in out):
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _status(e: BaseException) -> int | None:
    """The HTTP status of an error carrying a response (huggingface_hub's, or its client's)."""
    status = getattr(getattr(e, "response", None), "status_code", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def _first_line(e: BaseException, limit: int = 200) -> str:
    text = (str(e).strip().splitlines() or [""])[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _network_cause(e: BaseException) -> BaseException | None:
    """The exception in ``e``'s chain that is the network or the server
    failing, or None. An HTTP error with a status decides by its status (a
    4xx other than 408/429 is the request's fault); a transport error (no
    connection, timeout, DNS, TLS, proxy, a dropped stream) is the network's.
    huggingface_hub's offline switch is not a failure of the network."""
    offline = _hub_class("OfflineModeIsEnabled")
    xet = _hub_class("XetDownloadError")
    for x in _chain(e):
        if offline and isinstance(x, offline):
            return None
        status = _status(x)
        if status is not None:
            return x if status >= 500 or status in _RETRY_STATUSES else None
        if isinstance(x, _hub_class("LocalEntryNotFoundError")):
            continue  # "not cached": its cause says why (before 0.24 it was also a requests HTTPError)
        if isinstance(x, _hub_class("HfHubHTTPError")):  # an HTTP error without a status: no answer came
            return x
        if isinstance(x, (ConnectionError, TimeoutError, socket.gaierror)) or (xet and isinstance(x, xet)):
            return x
        if isinstance(x, OSError) and x.errno in _NETWORK_ERRNOS:  # "Network is unreachable" is no ConnectionError
            return x
        if any(c.__module__.split(".", 1)[0] in _TRANSPORT_PACKAGES for c in type(x).__mro__):
            return x
    return None


def _offline(e: BaseException) -> bool:
    from huggingface_hub import constants
    offline = _hub_class("OfflineModeIsEnabled")
    return bool(getattr(constants, "HF_HUB_OFFLINE", False)) or any(offline and isinstance(x, offline)
                                                                   for x in _chain(e))


def _classify(e: Exception, *, repo_id: str, revision: str | None, where: str, hint: str, download: bool,
              cache: str | None) -> HubError | None:
    """The :class:`HubError` that says why ``snapshot_download`` failed, or
    None to let ``e`` through (an ``OSError`` of this machine, or anything
    that is not a Hub failure)."""
    ids: dict[str, Any] = {"repo_id": repo_id, "revision": revision}
    local_missing = _hub_class("LocalEntryNotFoundError")
    # What the repo is: bad input, whatever the transport said on the way.
    if isinstance(e, _hub_class("GatedRepoError")):
        return HubError(f"{repo_id}: a gated repo: request access on its Hugging Face page, then log in with "
                        "`hf auth login` (or set HF_TOKEN) as an account that has it", **ids)
    if isinstance(e, _hub_class("RepositoryNotFoundError")):
        return HubError(f"{repo_id}: no such repo on the Hub (or it is private/gated: log in with `hf auth login`)",
                        **ids)
    if isinstance(e, _hub_class("RevisionNotFoundError")):
        return HubError(f"{where}: the Hub has no revision {revision!r} of this repo", **ids)
    if isinstance(e, _hub_class("DisabledRepoError")):
        return HubError(f"{repo_id}: the repo is disabled on the Hub", **ids)
    if isinstance(e, _hub_class("EntryNotFoundError")) and not isinstance(e, local_missing):
        return HubError(f"{where}: a file the repo lists is missing on the Hub: {_first_line(e)}", **ids)
    if isinstance(e, local_missing):
        if not download:
            if isinstance(e, _hub_class("IncompleteSnapshotError")):
                return RepoNotCachedError(f"{where}: the cached snapshot is incomplete (an interrupted download?); "
                                          f"fetch the rest with: {hint}", **ids, hint=hint)
            return RepoNotCachedError(
                f"{where}: not a local path, and not in the Hugging Face cache ({cache or _cache_dir_safe()}); "
                f"fetch it with: {hint}", **ids, hint=hint)
        if _offline(e):
            return HubError(f"{where}: cannot download: not in the Hugging Face cache, and huggingface_hub's "
                            "offline mode is on (HF_HUB_OFFLINE is set)", **ids)
    # The network or the server: a system error (the same command may work later).
    cause = _network_cause(e)
    if (cause is None and download and isinstance(e, local_missing)
            and all(_status(x) is None for x in _chain(e))):  # (an answer with a 4xx is the request's fault)
        cause = e  # snapshot_download's "cannot find it ... check your internet connection": no answer
    if cause is not None:
        status, line = _status(cause), _first_line(cause)
        if status is None:
            detail = f"{type(cause).__name__}: {line}"
        else:  # "HTTP 503: Server Error: ...", not "HTTP 503: 503 Server Error: ..."
            detail = f"HTTP {status}: {line[len(str(status)):].lstrip() if line.startswith(str(status)) else line}"
        return HubNetworkError(f"{where}: download failed on the network: the Hugging Face Hub could not be "
                               f"reached or failed to answer ({detail}); check the connection (proxy, HF_ENDPOINT) "
                               f"and try again: {hint}", **ids, hint=hint)
    status = next((_status(x) for x in _chain(e) if _status(x) is not None), None)
    if status is not None:  # a 4xx for this request: what was asked is wrong (or not allowed)
        login = " (log in with `hf auth login`)" if status in (401, 403) else ""
        return HubError(f"{where}: the Hub refused the download (HTTP {status}{login}): "
                        f"{_first_line(e)}", **ids)
    if isinstance(e, ValueError):  # huggingface_hub's validation (a repo id or revision it refuses)
        return HubError(f"{where}: {_first_line(e)}", **ids)
    return None


def _cache_dir_safe() -> str:
    try:
        return cache_dir()
    except Exception:  # pragma: no cover - huggingface_hub is a dependency
        return "the Hugging Face cache"
