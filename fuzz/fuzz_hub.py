"""Fuzz target: the Hugging Face cache as untrusted input (hf2q.hub.resolve
without download, hf2q.hub.check_revision).

The input picks a revision string and a cache layout: what ``refs/<rev>`` is
(missing, a file of fuzzed bytes, a commit hash, a FIFO, ``/dev/zero``, a
directory, a link out of the cache), what ``trees/<commit>.json`` is, what
the snapshot folder is (a folder, a link to another snapshot, a link out of
the cache, missing) and what its entries are (links into ``blobs/``, links
out of the repo, plain files, dangling links). Oracle:

* only :class:`hf2q.HubError` (``RepoNotCachedError`` included) escapes, at
  once (a FIFO must never block: the run's timeout catches a hang);
* a revision ``check_revision`` accepts is a 40-hex commit or a name
  ``git check-ref-format --allow-onelevel`` accepts too (differential, where
  git is installed), and never contains ``..``;
* a resolved snapshot lies inside the repo's ``snapshots/`` after resolving
  links, and each of its entries inside the repo's ``blobs/`` or the snapshot.

Run: ``python fuzz/fuzz_hub.py [libFuzzer flags] CORPUS_DIR...``
(see scripts/run_fuzz.sh).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import OracleFailure, hf2q, run, scratch_dir  # noqa: E402

import atheris  # noqa: E402

import hf2q.hub as hub  # noqa: E402

_ROOT = scratch_dir("hub")
_OUTSIDE = _ROOT / "outside"
_OUTSIDE.mkdir()
(_OUTSIDE / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
_GIT = shutil.which("git")
REPO = "o/n"
COMMITS = ["a" * 40, "0123456789abcdef0123456789abcdef01234567"]
REVISIONS = ["main", "dev", "v1.0", "refs/pr/1", "..", "../../../x", "a/../b", ".hidden", "x.lock", "a//b", "/main",
             "main/", "@", "a@{1}", "a b", "a:b", "a\\b", "a\x00b", "", "ü", COMMITS[0], COMMITS[0].upper()]


def _git_accepts(rev: str) -> bool | None:
    if _GIT is None or "\x00" in rev:
        return None
    # Under a first component, so that a name starting with '-' is not read
    # as an option (git printed its usage for "-1%": exit 129, not a
    # refusal); the whole-name rules hf2q accepts names by are the same.
    p = subprocess.run([_GIT, "check-ref-format", "x/" + rev], capture_output=True)
    if p.returncode not in (0, 1):
        return None  # git did not decide (a usage error)
    return p.returncode == 0


def _special(fdp: atheris.FuzzedDataProvider, path: str, good: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    kind = fdp.ConsumeIntInRange(0, 7)
    if kind == 0:
        return  # missing
    if kind == 1:
        with open(path, "wb") as f:
            f.write(good)
    elif kind == 2:
        with open(path, "wb") as f:
            f.write(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 96)))
    elif kind == 3:
        os.mkfifo(path)
    elif kind == 4:
        os.symlink("/dev/zero", path)
    elif kind == 5:
        os.mkdir(path)
    elif kind == 6:
        os.symlink(str(_OUTSIDE / "model.safetensors"), path)
    else:
        with open(path, "wb") as f:
            f.truncate(1 << fdp.ConsumeIntInRange(10, 34))  # sparse, up to 16 GiB


def _layout(fdp: atheris.FuzzedDataProvider, cache: str, rev: str) -> None:
    repo = os.path.join(cache, "models--o--n")
    commit = COMMITS[fdp.ConsumeIntInRange(0, 1)]
    os.makedirs(os.path.join(repo, "blobs"))
    os.makedirs(os.path.join(repo, "snapshots"))
    blob = os.path.join(repo, "blobs", "b" * 64)
    with open(blob, "wb") as f:
        f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    if hub._COMMIT.match(rev) is None and "\x00" not in rev:
        ref = os.path.join(repo, "refs", *rev.split("/"))
        if os.path.normpath(ref).startswith(os.path.join(repo, "refs") + os.sep):  # never write outside the scratch
            try:
                _special(fdp, ref, commit.encode())
            except OSError:
                pass
    try:
        _special(fdp, os.path.join(repo, "trees", commit + ".json"), b'{"format_version": 1, "files": {}}')
    except OSError:
        pass
    snap = os.path.join(repo, "snapshots", commit)
    kind = fdp.ConsumeIntInRange(0, 3)
    if kind == 0:
        return
    if kind == 1:
        os.symlink(str(_OUTSIDE), snap)
        return
    if kind == 2:
        other = os.path.join(repo, "snapshots", "c" * 40)
        os.mkdir(other)
        os.symlink("c" * 40, snap)
        snap = other
    else:
        os.mkdir(snap)
    for i in range(fdp.ConsumeIntInRange(0, 4)):
        name = os.path.join(snap, ["model.safetensors", "config.json", f"x{i}.safetensors", "sub"][i % 4])
        k = fdp.ConsumeIntInRange(0, 4)
        if k == 0:
            os.symlink(os.path.join("..", "..", "blobs", "b" * 64), name)
        elif k == 1:
            os.symlink(str(_OUTSIDE / "model.safetensors"), name)
        elif k == 2:
            with open(name, "wb") as f:
                f.write(b"{}")
        elif k == 3:
            os.symlink(os.path.join("..", "..", "blobs", "missing"), name)
        else:
            os.symlink("/etc", name)


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    rev = REVISIONS[fdp.ConsumeIntInRange(0, len(REVISIONS) - 1)] if fdp.ConsumeBool() else fdp.ConsumeUnicode(40)
    try:
        ok = hub.check_revision(rev, REPO) == rev
    except hf2q.HubError:
        ok = False
    if ok:
        if ".." in rev:
            raise OracleFailure(f"accepted a revision with '..': {rev!r}")
        if hub._COMMIT.match(rev) is None and _git_accepts(rev) is False:
            raise OracleFailure(f"accepted a revision git refuses: {rev!r}")
    cache = os.path.join(str(_ROOT), "cache")
    shutil.rmtree(cache, ignore_errors=True)
    os.makedirs(cache)
    _layout(fdp, cache, rev if ok else "main")
    try:
        snap = hub.resolve(REPO, rev if ok else None, cache_dir=cache)
    except hf2q.HubError:
        return
    repo = os.path.realpath(os.path.join(cache, "models--o--n"))
    real = os.path.realpath(snap)
    if os.path.commonpath([real, os.path.join(repo, "snapshots")]) != os.path.join(repo, "snapshots"):
        raise OracleFailure(f"resolved to {real}, outside the repo's snapshots/")
    for entry in os.scandir(real):
        t = os.path.realpath(entry.path)
        if not (t.startswith(os.path.join(repo, "blobs") + os.sep) or t.startswith(real + os.sep)):
            raise OracleFailure(f"{entry.path} leads to {t}, outside blobs/ and the snapshot")


if __name__ == "__main__":
    run(test_one_input)
