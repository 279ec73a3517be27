"""The Hugging Face cache as untrusted input (issue 26): revisions, refs/
files, snapshot links and special files. Each refusal is a HubError (exit 2
from the CLI), at once: a FIFO never hangs a lookup, /dev/zero is never read."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hf2q import hub
from hf2q.testing import make_dflash_checkpoint

from test_hub import COMMIT_DEV, COMMIT_MAIN, add_snapshot, env_with

REPO = "o/n"


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    c = tmp_path / "hub"
    ck = make_dflash_checkpoint(tmp_path / "ck", "tiny", seed=1)
    add_snapshot(c, REPO, COMMIT_MAIN, ck, refs=("main",))
    add_snapshot(c, REPO, COMMIT_DEV, ck, refs=("dev", "refs/pr/1"))
    return c


def repo(cache: Path) -> Path:
    return cache / "models--o--n"


def cli(cache: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hf2q", *argv], capture_output=True, text=True, timeout=timeout,
                          env=env_with(HF_HUB_CACHE=str(cache)))


VALID = ["main", "dev", "v1.0", "refs/pr/1", "feature/x-y_z", "release-2024.06", COMMIT_MAIN, "ünïcode"]
INVALID = {
    "..": "contains '..'", "../../../x": "contains '..'", "a/../b": "contains '..'", "a..b": "contains '..'",
    "": "empty", "/main": "leading, trailing or doubled '/'", "main/": "leading, trailing or doubled '/'",
    "a//b": "doubled", ".hidden": "starts with '.'", "a/.b": "starts with '.'", "x.lock": "'.lock'",
    "a/x.lock/b": "'.lock'", "main.": "ends with '.'", "@": "'@' alone", "a@{1}": "'@{'", "a b": "' '",
    "a:b": "':'", "a~1": "'~'", "a^": "'^'", "a?": "'?'", "a*": "'*'", "a[": "'['", "a\\b": "'\\\\'",
    "a\x01b": "'\\x01'", "a\nb": "'\\n'", "a\x7fb": "'\\x7f'", "x" * 256: "256 characters",
    "a\udcffb": "not valid UTF-8", "-1%": "starts with '-'", "--help": "starts with '-'",
}


@pytest.mark.parametrize("rev", VALID)
def test_valid_revisions(rev: str) -> None:
    assert hub.check_revision(rev, REPO) == rev


@pytest.mark.parametrize("rev", list(INVALID))
def test_invalid_revisions_are_hub_errors(rev: str, cache: Path) -> None:
    with pytest.raises(hub.HubError, match=re.escape(INVALID[rev])) as ei:
        hub.check_revision(rev, REPO)
    assert ei.value.revision == rev and ei.value.repo_id == REPO
    for download in (False, True):  # refused before the cache or the network is touched
        with pytest.raises(hub.HubError, match="not a valid revision"):
            hub.resolve(REPO, rev, download=download, cache_dir=cache)


def test_revisions_resolve_in_the_cache(cache: Path) -> None:
    snaps = repo(cache) / "snapshots"
    assert hub.resolve(REPO, cache_dir=cache) == snaps / COMMIT_MAIN
    assert hub.resolve(REPO, "refs/pr/1", cache_dir=cache) == snaps / COMMIT_DEV  # refs/refs/pr/1, as hf_hub has it
    assert hub.resolve(REPO, COMMIT_DEV, cache_dir=cache) == snaps / COMMIT_DEV
    (repo(cache) / "refs" / "main").write_text(COMMIT_DEV + "\n")  # a newline (hand-edited) is fine
    assert hub.resolve(REPO, cache_dir=cache) == snaps / COMMIT_DEV


def test_revision_climbing_out_of_the_cache_is_refused(cache: Path, tmp_path: Path) -> None:
    """`--revision ../../../x` used to load a checkpoint from x (exit 0); `..` was an IsADirectoryError (exit 1)."""
    evil = tmp_path / "x"
    make_dflash_checkpoint(evil, "tiny", seed=3)
    for rev in ("../../../x", ".."):
        p = cli(cache, "inspect", REPO, "--revision", rev, "--json")
        assert p.returncode == 2, (p.stdout, p.stderr)
        err = json.loads(p.stdout)["error"]
        assert err["type"] == "HubError" and "not a valid revision" in err["message"] and p.stderr == ""
        p = cli(cache, "load", REPO, "--revision", rev, "--device", "host")
        assert p.returncode == 2 and p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
        assert "not a valid revision" in p.stderr


@pytest.mark.parametrize("content", ["../../../../x", "/etc", COMMIT_MAIN[:39], "main", "", "a" * 41, "\x00" * 40])
def test_a_ref_that_is_not_a_commit_hash(content: str, cache: Path, tmp_path: Path) -> None:
    make_dflash_checkpoint(tmp_path / "x", "tiny", seed=3)
    (repo(cache) / "refs" / "main").write_text(content)
    with pytest.raises(hub.HubError, match="refs/main holds .*, not a 40-hex commit hash") as ei:
        hub.resolve(REPO, cache_dir=cache)
    assert not isinstance(ei.value, hub.RepoNotCachedError)


def _special(kind: str, path: Path, tmp_path: Path) -> None:
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge":
        with open(path, "wb") as f:
            f.truncate(1 << 33)  # sparse 8 GiB
    else:  # pragma: no cover
        raise AssertionError(kind)


KINDS = ["fifo", "dev-zero", "directory", "huge"]


@pytest.mark.parametrize("kind", KINDS)
def test_special_ref_file(kind: str, cache: Path, tmp_path: Path) -> None:
    _special(kind, repo(cache) / "refs" / "main", tmp_path)
    with pytest.raises(hub.HubError, match="the Hugging Face cache is not usable: .*refs/main (is|is a)"):
        hub.resolve(REPO, cache_dir=cache)
    with pytest.raises(hub.HubError, match="refs/main"):  # checked before huggingface_hub opens it
        hub.resolve(REPO, download=True, cache_dir=cache)


@pytest.mark.parametrize("kind", KINDS)
def test_special_tree_listing(kind: str, cache: Path, tmp_path: Path) -> None:
    (repo(cache) / "trees").mkdir()
    _special(kind, repo(cache) / "trees" / f"{COMMIT_MAIN}.json", tmp_path)
    with pytest.raises(hub.HubError, match=f"trees/{COMMIT_MAIN}.json is"):
        hub.resolve(REPO, cache_dir=cache)
    with pytest.raises(hub.HubError, match=f"trees/{COMMIT_MAIN}.json is"):
        hub.resolve(REPO, download=True, cache_dir=cache)


@pytest.mark.parametrize("where", ["refs", "trees"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_cli_special_cache_files_exit_2_at_once(where: str, kind: str, cache: Path, tmp_path: Path) -> None:
    """A FIFO hung `hf2q inspect OWNER/NAME`; /dev/zero was read until memory ran out (MemoryError, no JSON)."""
    if where == "trees":
        (repo(cache) / "trees").mkdir()
    f = repo(cache) / where / ("main" if where == "refs" else f"{COMMIT_MAIN}.json")
    _special(kind, f, tmp_path)
    for argv in (("inspect", REPO, "--json"), ("load", REPO, "--device", "host", "--json"),
                 ("inspect", REPO, "--download", "--json")):
        p = cli(cache, *argv, timeout=60)  # (a hang is caught; the machine may be busy)
        assert p.returncode == 2, (argv, p.stdout, p.stderr)
        err = json.loads(p.stdout)["error"]
        assert err["type"] == "HubError" and f"{where}/" in err["message"] and p.stderr == "", (argv, err)


def test_snapshot_folder_linking_outside(cache: Path, tmp_path: Path) -> None:
    outside = make_dflash_checkpoint(tmp_path / "outside", "tiny", seed=3)
    snap = repo(cache) / "snapshots" / COMMIT_MAIN
    import shutil

    shutil.rmtree(snap)
    os.symlink(outside, snap)
    with pytest.raises(hub.HubError, match=r"the snapshot .* resolves to .*, outside .*snapshots"):
        hub.resolve(REPO, cache_dir=cache)
    # a snapshot linking to another snapshot of the cache stays inside: fine
    snap.unlink()
    os.symlink(COMMIT_DEV, snap)
    assert hub.resolve(REPO, cache_dir=cache) == snap


@pytest.mark.parametrize("target", ["outside-file", "/dev/zero", "other-repo-blob"])
def test_snapshot_entry_linking_outside(target: str, cache: Path, tmp_path: Path) -> None:
    entry = repo(cache) / "snapshots" / COMMIT_MAIN / "model.safetensors"
    if target == "outside-file":
        dest = tmp_path / "ck" / "model.safetensors"
    elif target == "other-repo-blob":
        other = add_snapshot(cache, "p/q", "b" * 40, tmp_path / "ck")
        dest = (other / "model.safetensors").resolve()
    else:
        dest = Path(target)
    entry.unlink()
    os.symlink(dest, entry)
    with pytest.raises(hub.HubError, match="model.safetensors links to .*, outside the repo's blobs/ and snapshot"):
        hub.resolve(REPO, cache_dir=cache)


def test_a_symlinked_cache_root_is_fine(cache: Path, tmp_path: Path) -> None:
    """HF_HOME on another disk through a link: everything is compared after resolving links."""
    link = tmp_path / "link-to-hub"
    os.symlink(cache, link)
    assert hub.resolve(REPO, cache_dir=link) == link / "models--o--n" / "snapshots" / COMMIT_MAIN


def test_download_checks_what_huggingface_hub_returns(cache: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    elsewhere = make_dflash_checkpoint(tmp_path / "elsewhere", "tiny", seed=3)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kw: str(elsewhere))
    with pytest.raises(hub.HubError, match="outside"):
        hub.resolve(REPO, download=True, cache_dir=cache)
    good = repo(cache) / "snapshots" / COMMIT_MAIN
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kw: str(good))
    assert hub.resolve(REPO, download=True, cache_dir=cache) == good


def test_unreadable_ref_is_a_hub_error(cache: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    ref = repo(cache) / "refs" / "main"
    ref.chmod(0)
    with pytest.raises(hub.HubError, match="refs/main cannot open"):
        hub.resolve(REPO, cache_dir=cache)


def test_an_unreadable_refs_folder_still_lists_the_cached_snapshots(cache: Path) -> None:
    """The "cached: ..." listing of a missing revision never raises: with
    ``refs/`` a file (its listing fails) the snapshots are named by commit."""
    import shutil

    shutil.rmtree(repo(cache) / "refs")
    (repo(cache) / "refs").write_text("not a folder\n")
    with pytest.raises(hub.RepoNotCachedError, match="holds this repo, but not at revision 'dev'") as ei:
        hub.resolve(REPO, "dev", cache_dir=cache)
    shown = re.search(r"\(cached: ([^)]*)\)", str(ei.value)).group(1)
    assert sorted(shown.split(", ")) == sorted([COMMIT_MAIN[:12], COMMIT_DEV[:12]]) and "->" not in shown
