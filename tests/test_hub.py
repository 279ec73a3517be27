"""Hugging Face repo ids (hf2q.hub, `hf2q load/inspect REPO`, the Python
loaders): resolved offline through a local cache laid out exactly as
huggingface_hub lays it out (models--owner--name/{blobs,refs,snapshots}, files
in snapshots as relative symlinks into blobs/), never downloading unless asked.
No test touches the network: HF_ENDPOINT points at a closed local port."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import hf2q
from hf2q import hub
from hf2q.cli import main
from hf2q.dflash import TINY_DRAFTER_CONFIG, DFlashConfig, expected_resident_bytes
from hf2q.testing import make_dflash_checkpoint

RESIDENT = expected_resident_bytes(DFlashConfig.from_dict(TINY_DRAFTER_CONFIG))
REPO = "z-lab/tiny-DFlash"
COMMIT_MAIN = "a" * 40
COMMIT_DEV = "0123456789abcdef0123456789abcdef01234567"
NO_NET = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_DISABLE_TELEMETRY": "1"}
GEMMA_REPO = "google/tiny-gemma-4"
GEMMA_DATA = Path(__file__).parent / "data" / "gemma4"


def add_snapshot(cache: Path, repo_id: str, commit: str, files: Path, refs: tuple[str, ...] = ("main",)) -> Path:
    """Put ``files``' contents into ``cache`` as huggingface_hub does: each
    file's bytes once in blobs/<hash>, a relative symlink to it in
    snapshots/<commit>/, and refs/<name> holding the commit hash."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(files.iterdir()):
        if not f.is_file() or f.name.startswith("."):
            continue
        data = f.read_bytes()
        # huggingface_hub names a blob by its git oid (sha1) or, for LFS files, its sha256
        oid = hashlib.sha256(data).hexdigest() if f.suffix == ".safetensors" else hashlib.sha1(data).hexdigest()
        (repo / "blobs" / oid).write_bytes(data)
        link = snap / f.name
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(os.path.join("..", "..", "blobs", oid), link)
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # huggingface_hub writes it without a newline
    return snap


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    c = root / "hub"
    single = make_dflash_checkpoint(root / "single", "tiny", seed=1)
    sharded = make_dflash_checkpoint(root / "sharded", "tiny", seed=2, sharded=True)
    add_snapshot(c, REPO, COMMIT_MAIN, single, refs=("main",))
    add_snapshot(c, REPO, COMMIT_DEV, sharded, refs=("dev", "v1.0"))
    # a repo whose snapshot holds only its config (weights never fetched)
    cfg_only = root / "cfg_only"
    cfg_only.mkdir()
    shutil.copy(single / "config.json", cfg_only / "config.json")
    add_snapshot(c, "z-lab/config-only", "c" * 40, cfg_only)
    # Gemma 4: a tied MoE model at main, an untied dense one at dev (tokenizer.json beside both)
    add_snapshot(c, GEMMA_REPO, "e" * 40, GEMMA_DATA / "gemma4_moe_causal_lm" / "hf", refs=("main",))
    add_snapshot(c, GEMMA_REPO, "f" * 40, GEMMA_DATA / "gemma4_dense_ple" / "hf", refs=("dev",))
    return c


def env_with(**kw: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(NO_NET, HF2Q_NUM_THREADS="2")
    env.update(kw)
    return env


def hf2q_cli(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hf2q", *argv], capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture
def hub_cache(cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's huggingface_hub pointed at the test cache (it reads
    HF_HUB_CACHE once, at import; subprocesses get the variable instead)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    for k, v in NO_NET.items():
        monkeypatch.setenv(k, v)
    return cache


# --------------------------------------------------------------------------- which strings are repo ids


def test_is_repo_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert hub.is_repo_id("Qwen/Qwen3.6-35B-A3B") and hub.is_repo_id("z-lab/gemma-4-26B-A4B-it-DFlash")
    for s in ("./a/b", "/abs/path", "a/b/c", "gpt2", "a--b/c", "a/b..c", "-a/b", "a/", "", "a\\b", "a/b\n"):
        assert not hub.is_repo_id(s), s
    monkeypatch.chdir(tmp_path)
    (tmp_path / "owner" / "name").mkdir(parents=True)
    assert not hub.is_repo_id("owner/name")  # an existing local path wins
    assert not hub.is_repo_id("owner/other")  # a missing file in a local folder is a path, not a repo
    assert hub.is_repo_id("elsewhere/other")


def test_local_paths_pass_through(tmp_path: Path) -> None:
    assert hub.resolve(tmp_path) == tmp_path
    with pytest.raises(ValueError, match="revision applies to Hugging Face repo ids only"):
        hub.resolve(tmp_path, "main")
    with pytest.raises(ValueError, match="--download applies"):
        hub.resolve(tmp_path, download=True)


# --------------------------------------------------------------------------- resolving in the cache


def test_resolve_refs_commit_and_tag(hub_cache: Path) -> None:
    snaps = hub_cache / "models--z-lab--tiny-DFlash" / "snapshots"
    assert hub.resolve(REPO) == snaps / COMMIT_MAIN  # refs/main
    assert hub.resolve(REPO, "dev") == snaps / COMMIT_DEV  # refs/dev
    assert hub.resolve(REPO, "v1.0") == snaps / COMMIT_DEV  # a tag is a ref too
    assert hub.resolve(REPO, COMMIT_MAIN) == snaps / COMMIT_MAIN  # a commit hash names its snapshot
    f = hub.resolve(REPO) / "model.safetensors"
    assert f.is_symlink() and Path(os.readlink(f)).parts[:3] == ("..", "..", "blobs")


def test_python_callers_are_told_the_call_that_fetches(hub_cache: Path) -> None:
    """From Python, the hint is the call with ``download=True``, not a command line."""
    with pytest.raises(hub.RepoNotCachedError) as ei:
        hf2q.load("z-lab/never-fetched", device="host")
    assert str(ei.value).endswith("fetch it with: hf2q.load('z-lab/never-fetched', download=True)")
    with pytest.raises(hub.RepoNotCachedError) as ei:
        hf2q.convert("z-lab/never-fetched", hub_cache / "x.gguf", revision="dev")
    assert ei.value.hint == f"hf2q.convert('z-lab/never-fetched', {str(hub_cache / 'x.gguf')!r}, revision='dev', download=True)"
    for fn, name in ((hf2q.qwen35.load, "hf2q.qwen35.load"), (hf2q.gemma4.load, "hf2q.gemma4.load"),
                     (hf2q.dflash.load, "hf2q.dflash.load"), (hf2q.qwen35.inspect, "hf2q.qwen35.inspect"),
                     (hf2q.gemma4.inspect, "hf2q.gemma4.inspect")):
        with pytest.raises(hub.RepoNotCachedError) as ei:
            fn("z-lab/never-fetched")
        assert ei.value.hint == f"{name}('z-lab/never-fetched', download=True)"


def test_short_commit_hashes_and_other_cached_revisions(hub_cache: Path) -> None:
    """A short commit hash (7+ hex digits) names the one cached snapshot it
    starts; several: refused, listing them; a revision the cache lacks while
    it holds the repo: the message says which revisions it holds."""
    snaps = hub_cache / "models--z-lab--tiny-DFlash" / "snapshots"
    assert hub.resolve(REPO, COMMIT_DEV[:7]) == snaps / COMMIT_DEV
    assert hub.resolve(REPO, "aaaaaaaa") == snaps / COMMIT_MAIN
    with pytest.raises(hub.RepoNotCachedError, match="holds this repo, but not at revision '012345f'") as ei:
        hub.resolve(REPO, "012345f")
    assert "main -> aaaaaaaaaaaa" in str(ei.value) and "dev -> 0123456789ab" in str(ei.value)
    assert ei.value.hint == f"hf2q load {REPO} --revision 012345f --download"
    other = "0123456" + "f" * 33  # a second snapshot that "0123456" starts
    (snaps / other).mkdir()
    try:
        with pytest.raises(hub.HubError, match="'0123456' matches 2 cached snapshots"):
            hub.resolve(REPO, "0123456")
        assert hub.resolve(REPO, "01234567") == snaps / COMMIT_DEV
    finally:
        (snaps / other).rmdir()  # (the cache is the module's)
    with pytest.raises(hub.RepoNotCachedError, match="holds this repo, but not at revision '012345'"):
        hub.resolve(REPO, "012345")  # (too short for a hash: a branch name)


def test_a_model_pages_url_is_its_repo_id(hub_cache: Path) -> None:
    """A Hub model URL as a browser shows it loads the repo (its /tree/REV
    the revision); any other URL is refused, echoed as typed."""
    snaps = hub_cache / "models--z-lab--tiny-DFlash" / "snapshots"
    for url in (f"https://huggingface.co/{REPO}", f"https://huggingface.co/{REPO}/", f"hf.co/{REPO}",
                f"http://www.huggingface.co/{REPO}"):
        assert hub.resolve(url) == snaps / COMMIT_MAIN, url
    assert hub.resolve(f"https://huggingface.co/{REPO}/tree/dev") == snaps / COMMIT_DEV
    assert hub.resolve(f"https://huggingface.co/{REPO}/tree/dev", "dev") == snaps / COMMIT_DEV
    with pytest.raises(hub.HubError, match="names revision 'dev', and 'main' was given too"):
        hub.resolve(f"https://huggingface.co/{REPO}/tree/dev", "main")
    for bad in ("https://example.com/a/b", f"https://huggingface.co/{REPO}/resolve/main/model.safetensors",
                "https://huggingface.co/datasets/a/b", "https://huggingface.co/Qwen"):
        with pytest.raises(hub.HubError, match="not a Hugging Face model page") as ei:
            hub.resolve(bad)
        assert str(ei.value).startswith(bad + ": ")
    with pytest.raises(hub.RepoNotCachedError) as ei:
        hub.resolve("https://huggingface.co/z-lab/never-fetched", command="load")
    assert ei.value.hint == "hf2q load z-lab/never-fetched --download"
    # the host in any case, a clone URL's .git, a revision's percent escapes
    assert hub.parse_url(f"HTTPS://HuggingFace.co/{REPO}.git", None) == (REPO, None, True)
    assert hub.parse_url(f"https://huggingface.co/{REPO}/tree/refs%2Fpr%2F1", None) == (REPO, "refs/pr/1", True)
    for bad in ("https://huggingface.co/a--b/c", "https://huggingface.co/a/../b"):
        with pytest.raises(hub.HubError, match="not a Hugging Face model page"):
            hub.resolve(bad)


def test_a_urls_repo_is_a_repo_even_beside_a_folder_of_its_owner(hub_cache: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``owner/`` folder in the working directory makes a bare ``owner/name``
    a local path; a URL names the repo whatever is here."""
    snaps = hub_cache / "models--z-lab--tiny-DFlash" / "snapshots"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "z-lab").mkdir()
    assert hub.resolve(f"https://huggingface.co/{REPO}") == snaps / COMMIT_MAIN
    assert hub.resolve(f"https://huggingface.co/{REPO}/tree/dev") == snaps / COMMIT_DEV


def test_the_cli_reports_a_urls_repo_and_revision(hub_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hf2q import cli

    assert cli.main(["inspect", f"https://huggingface.co/{REPO}/tree/dev", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["repo_id"] == REPO and r["revision"] == "dev"


def test_the_cached_revisions_listing_is_bounded_and_stays_in_the_cache(hub_cache: Path, tmp_path: Path) -> None:
    """The "cached: ..." list of a revision the cache lacks: refs/ nested
    deeply, wide, or linked outside the repo neither crash (RecursionError),
    nor take unbounded work, nor name files outside."""
    # a repo of this test's own in the shared cache: its refs/ is made strange below
    repo = hub_cache / "models--z-lab--refs-listing"
    shutil.copytree(hub_cache / "models--z-lab--tiny-DFlash", repo, symlinks=True)
    refs = repo / "refs"
    deep = refs / "deep"
    p = deep
    deep.mkdir()
    for _ in range(40):  # (deeper than the listing looks: its file is not named)
        p = p / "a"
        p.mkdir()
    (p / "x").write_text("b" * 40)
    for i in range(3000):
        (refs / "wide" / f"d{i}").mkdir(parents=True)
    with pytest.raises(hub.RepoNotCachedError, match="cached: ") as ei:
        hub.resolve("z-lab/refs-listing", "no-such")
    assert "dev -> 0123456789ab" in str(ei.value) and "bbbbbbbbbbbb" not in str(ei.value)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret_branch").write_text("1" * 40)
    moved = tmp_path / "refs.real"
    refs.rename(moved)
    refs.symlink_to(outside)
    with pytest.raises(hub.RepoNotCachedError) as ei:
        hub.resolve("z-lab/refs-listing", "no-such")
    assert "secret_branch" not in str(ei.value) and "1111" not in str(ei.value)


def test_not_cached_one_line(hub_cache: Path) -> None:
    with pytest.raises(hub.RepoNotCachedError) as ei:
        hub.resolve("z-lab/never-fetched")
    msg = str(ei.value)
    assert "\n" not in msg and "not in the Hugging Face cache" in msg and str(hub_cache) in msg
    assert msg.endswith("fetch it with: hf2q load z-lab/never-fetched --download")
    assert ei.value.hint == "hf2q load z-lab/never-fetched --download" and isinstance(ei.value, hf2q.Hf2qError)
    with pytest.raises(hub.RepoNotCachedError) as ei:
        hub.resolve(REPO, "no-such-branch", command="inspect")
    assert ei.value.hint == f"hf2q inspect {REPO} --revision no-such-branch --download"
    assert str(ei.value).startswith(f"{REPO}@no-such-branch: ")
    with pytest.raises(hub.RepoNotCachedError, match="holds no .safetensors files"):
        hub.resolve("z-lab/config-only")


def test_download_goes_through_huggingface_hub(hub_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    import huggingface_hub

    calls: list[dict[str, Any]] = []

    def fake(repo_id: str, **kw: Any) -> str:
        calls.append({"repo_id": repo_id, **kw})
        return str(hub_cache / "models--z-lab--tiny-DFlash" / "snapshots" / COMMIT_MAIN)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    hub.resolve(REPO, "dev", download=True)
    assert calls == [{"repo_id": REPO, "revision": "dev", "cache_dir": None,
                      "allow_patterns": ["*.json", "*.safetensors", "tokenizer.model"]}]
    calls.clear()
    with pytest.raises(hub.RepoNotCachedError):
        hub.resolve("z-lab/new")
    assert hub.resolve(REPO).name == COMMIT_MAIN
    assert calls == []  # offline unless asked: the cache is read by hf2q itself


def test_download_offline_says_so(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(hub.HubError, match="cannot download.*HF_HUB_OFFLINE"):
        hub.resolve("z-lab/never-fetched", download=True)


def test_python_loaders_take_repo_ids(hub_cache: Path) -> None:
    dev = hf2q.Device("host")
    m = hf2q.dflash.load(REPO, dev, progress=False)
    assert m.gpu_resident_bytes() == RESIDENT
    m2 = hf2q.dflash.load(REPO, dev, progress=False, revision="dev")
    assert m2.gpu_resident_bytes() == RESIDENT
    assert not (m.fc.numpy() == m2.fc.numpy()).all()  # seed 1 vs seed 2: the revision was honoured
    with pytest.raises(hub.RepoNotCachedError):
        hf2q.dflash.load("z-lab/never-fetched", dev)
    with pytest.raises(hub.RepoNotCachedError):
        hf2q.qwen35.load("Qwen/Qwen3.6-35B-A3B", dev)
    with pytest.raises(hub.RepoNotCachedError):
        hf2q.qwen35.inspect("Qwen/Qwen3.6-35B-A3B")


# --------------------------------------------------------------------------- the CLI, as a user runs it


def test_cli_hf_hub_cache(cache: Path) -> None:
    env = env_with(HF_HUB_CACHE=str(cache))
    p = hf2q_cli("load", REPO, "--device", "host", "--json", env=env)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["resident_bytes"] == RESIDENT and (d["repo_id"], d["revision"]) == (REPO, "main")
    assert d["checkpoint"] == str(cache / "models--z-lab--tiny-DFlash" / "snapshots" / COMMIT_MAIN)
    p = hf2q_cli("inspect", REPO, "--revision", "dev", "--json", env=env)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["repo_id"] == REPO and d["revision"] == "dev" and len(d["files"]) == 2
    assert d["path"] == str(cache / "models--z-lab--tiny-DFlash" / "snapshots" / COMMIT_DEV)
    p = hf2q_cli("inspect", REPO, env=env)
    assert p.returncode == 0 and p.stdout.startswith(
        f"{REPO}@main ({cache / 'models--z-lab--tiny-DFlash' / 'snapshots' / COMMIT_MAIN}): dflash, 25 tensors")


def test_cli_hf_home(cache: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    shutil.copytree(cache, home / "hub", symlinks=True)  # HF_HOME/hub is the cache when HF_HUB_CACHE is unset
    p = hf2q_cli("inspect", REPO, "--json", env=env_with(HF_HOME=str(home)))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["path"].startswith(str(home / "hub"))


def test_cli_not_cached(cache: Path) -> None:
    env = env_with(HF_HUB_CACHE=str(cache))
    for cmd in ("load", "inspect"):
        p = hf2q_cli(cmd, "Qwen/Qwen3.6-35B-A3B", env=env)
        assert p.returncode == 2 and p.stdout == ""
        assert p.stderr.count("\n") == 1, p.stderr  # one line
        assert p.stderr == (f"hf2q {cmd}: error: Qwen/Qwen3.6-35B-A3B: not a local path, and not in the Hugging "
                            f"Face cache ({cache}); fetch it with: hf2q {cmd} Qwen/Qwen3.6-35B-A3B --download\n")
    p = hf2q_cli("load", "Qwen/Qwen3.6-35B-A3B", "--json", env=env)
    e = json.loads(p.stdout)["error"]
    assert p.returncode == 2 and p.stderr == ""
    assert e["type"] == "RepoNotCachedError" and e["hint"] == "hf2q load Qwen/Qwen3.6-35B-A3B --download"


def test_cli_revision_with_local_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["inspect", str(tmp_path), "--revision", "main"]) == 2
    assert "a revision applies to Hugging Face repo ids only" in capsys.readouterr().err


# --------------------------------------------------------------------------- every family, one resolver

def test_gemma4_takes_repo_ids(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    dev = hf2q.Device("host")
    m = hf2q.gemma4.load(GEMMA_REPO, dev, progress=False)
    assert m.tied and m.summary.as_dict()["model"] == "gemma4"
    m2 = hf2q.gemma4.load(GEMMA_REPO, dev, progress=False, revision="dev")
    assert not m2.tied  # the dev snapshot is the untied dense model: the revision was honoured
    snaps = hub_cache / "models--google--tiny-gemma-4" / "snapshots"
    assert hf2q.gemma4.inspect(GEMMA_REPO)["planned_tensors"] == len(m)
    assert hf2q.gemma4.inspect(GEMMA_REPO, revision="dev") == hf2q.gemma4.inspect(snaps / ("f" * 40))
    with pytest.raises(hub.RepoNotCachedError,
                       match=r"fetch it with: hf2q\.gemma4\.load\('google/gemma-4-26B-A4B-it', download=True\)"):
        hf2q.gemma4.load("google/gemma-4-26B-A4B-it", dev)
    with pytest.raises(hub.RepoNotCachedError):
        hf2q.gemma4.inspect("google/gemma-4-26B-A4B-it", revision="main")
    with pytest.raises(ValueError, match="a revision applies to Hugging Face repo ids only"):
        hf2q.gemma4.load(GEMMA_DATA / "gemma4_moe_causal_lm" / "hf", dev, revision="main")
    with pytest.raises(ValueError, match="--download applies to Hugging Face repo ids only"):
        hf2q.gemma4.inspect(GEMMA_DATA / "gemma4_moe_causal_lm" / "hf", download=True)
    calls: list[dict[str, Any]] = []

    def fake(repo_id: str, **kw: Any) -> str:
        calls.append({"repo_id": repo_id, **kw})
        return str(snaps / ("e" * 40))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    hf2q.gemma4.load(GEMMA_REPO, dev, progress=False, revision="v1", download=True)
    hf2q.gemma4.inspect(GEMMA_REPO, download=True)
    assert [(c["repo_id"], c["revision"], c["allow_patterns"]) for c in calls] == [
        (GEMMA_REPO, "v1", hub.DOWNLOAD_PATTERNS), (GEMMA_REPO, None, hub.DOWNLOAD_PATTERNS)]


@pytest.mark.parametrize("loader", ["hf2q.load", "dflash.load", "qwen35.load", "qwen35.inspect", "gemma4.load",
                                    "gemma4.inspect"])
def test_every_loader_resolves_through_hub_resolve(loader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One code path: each public loader hands path, revision and download to hf2q.hub.resolve."""
    seen: list[tuple[Any, ...]] = []

    class Stop(Exception):
        pass

    def spy(path: Any, revision: Any = None, *, download: bool = False, **kw: Any) -> Path:
        seen.append((path, revision, download))
        raise Stop

    monkeypatch.setattr(hub, "resolve", spy)
    fn = {"hf2q.load": hf2q.load, "dflash.load": hf2q.dflash.load, "qwen35.load": hf2q.qwen35.load,
          "qwen35.inspect": hf2q.qwen35.inspect, "gemma4.load": hf2q.gemma4.load,
          "gemma4.inspect": hf2q.gemma4.inspect}[loader]
    kwargs: dict[str, Any] = {"revision": "r1", "download": True}  # (qwen35.inspect took no download before)
    with pytest.raises(Stop):
        fn("o/n", **kwargs)
    assert seen == [("o/n", "r1", True)]


# --------------------------------------------------------------------------- a failed download, classified
# Bad input (the repo, revision or file is not there, or not allowed) is a HubError and exit 2; the network
# or the server failing is a HubNetworkError (also a ConnectionError) and exit 1. huggingface_hub's own
# exception classes, raised by a mocked snapshot_download: no test reaches a network.

def _response(status: int) -> Any:
    """What huggingface_hub's HTTP errors read from a response (any version)."""
    from types import SimpleNamespace

    return SimpleNamespace(status_code=status, headers={}, request=None, url="https://huggingface.co/api/x",
                           json=lambda: {}, text="", content=b"")


def _http_error(name: str, status: int, message: str | None = None) -> BaseException:
    found = hub._hub_class(name)  # (huggingface_hub.errors, or .utils before 0.24)
    if not found:
        pytest.skip(f"this huggingface_hub has no {name}")
    cls = found[0]
    return cls(message or f"{status} Client Error for url: https://huggingface.co/api/models/o/n", response=_response(status))


def _transport_error(kind: str) -> BaseException:
    """A connection or timeout error of the HTTP client this huggingface_hub uses."""
    import importlib

    for module, names in (("httpx2", ("ConnectError", "ReadTimeout")), ("httpx", ("ConnectError", "ReadTimeout")),
                          ("requests", ("ConnectionError", "ReadTimeout"))):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        return getattr(mod, names[0] if kind == "connect" else names[1])("[Errno 111] Connection refused")
    pytest.skip("no HTTP client library")


def _local_missing_from(cause: BaseException) -> BaseException:
    """What snapshot_download raises when the Hub did not answer and nothing is cached."""
    try:
        try:
            raise cause
        except BaseException as c:
            raise hub._hub_class("LocalEntryNotFoundError")[0](
                f"Got: {type(c).__name__}: {c}\nAn error happened while trying to locate the files on the Hub, "
                "and we cannot find the appropriate snapshot folder for the specified revision on the local "
                "disk. Please check your internet connection and try again.") from c
    except BaseException as e:
        return e


def _failing(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    import huggingface_hub

    def fake(repo_id: str, **kw: Any) -> str:
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)


BAD_INPUT = {
    "repo not found": (lambda: _http_error("RepositoryNotFoundError", 401), "o/n: no such repo on the Hub"),
    "gated": (lambda: _http_error("GatedRepoError", 403), "o/n: a gated repo: request access"),
    "revision not found": (lambda: _http_error("RevisionNotFoundError", 404), "o/n@v9: the Hub has no revision 'v9'"),
    "file missing": (lambda: _http_error("RemoteEntryNotFoundError", 404),
        "o/n@v9: a file the repo lists is missing on the Hub"),
    "disabled": (lambda: _http_error("DisabledRepoError", 403), "o/n: the repo is disabled on the Hub"),
    "forbidden": (lambda: _http_error("HfHubHTTPError", 403), "o/n@v9: the Hub refused the download (HTTP 403"),
    "answered 4xx, then not cached": (lambda: _local_missing_from(_http_error("HfHubHTTPError", 400)),
                                      "o/n@v9: the Hub refused the download (HTTP 400)"),
    "invalid repo id": (lambda: hub._hub_class("HFValidationError")[0]("Repo id must be ..."),
                        "o/n@v9: Repo id must be"),
}

NETWORK = {
    "HTTP 500": (lambda: _http_error("HfHubHTTPError", 500, "500 Server Error: Internal Server Error"), "HTTP 500"),
    "HTTP 503": (lambda: _http_error("HfHubHTTPError", 503, "503 Server Error: Service Unavailable"), "HTTP 503"),
    "HTTP 504 on a repo call": (lambda: _http_error("HfHubHTTPError", 504), "HTTP 504"),
    "HTTP 429": (lambda: _http_error("HfHubHTTPError", 429, "429 Too Many Requests"), "HTTP 429"),
    "no connection, not cached": (lambda: _local_missing_from(_transport_error("connect")), "Connect"),
    "timeout, not cached": (lambda: _local_missing_from(_transport_error("timeout")), "ReadTimeout"),
    "5xx, not cached": (lambda: _local_missing_from(_http_error("HfHubHTTPError", 502)), "HTTP 502"),
    "connection lost mid-download": (lambda: _transport_error("connect"), "Connect"),
    "timeout mid-download": (lambda: _transport_error("timeout"), "ReadTimeout"),
    "socket timeout": (lambda: TimeoutError("timed out"), "TimeoutError: timed out"),
    "network unreachable": (lambda: OSError(101, "Network is unreachable"), "Network is unreachable"),
    "no answer, cause unknown": (lambda: _local_missing_from(RuntimeError("?")), "LocalEntryNotFoundError"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_a_hub_error(case: str, hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make, message = BAD_INPUT[case]
    _failing(monkeypatch, make())
    with pytest.raises(hub.HubError) as ei:
        hub.resolve("o/n", "v9", download=True)
    e = ei.value
    assert not isinstance(e, hub.HubNetworkError) and not isinstance(e, OSError)
    assert str(e).startswith(message) and "\n" not in str(e), str(e)
    assert (e.repo_id, e.revision) == ("o/n", "v9") and e.__cause__ is None


@pytest.mark.parametrize("case", list(NETWORK))
def test_network_failure_is_a_hub_network_error(case: str, hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make, detail = NETWORK[case]
    error = make()
    _failing(monkeypatch, error)
    with pytest.raises(hub.HubNetworkError) as ei:
        hub.resolve("o/n", "v9", download=True)
    e = ei.value
    msg = str(e)
    assert isinstance(e, hub.HubError) and isinstance(e, ConnectionError) and isinstance(e, hf2q.Hf2qError)
    assert msg.startswith("o/n@v9: download failed on the network: the Hugging Face Hub could not be reached")
    assert detail in msg and "\n" not in msg, msg
    assert msg.endswith("try again: hf2q load o/n --revision v9 --download") and e.hint == "hf2q load o/n --revision v9 --download"
    assert e.__cause__ is error  # the library's exception, kept for whoever debugs it


def test_the_machines_own_os_errors_pass_through(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    for error in (OSError(errno.ENOSPC, "No space left on device"), PermissionError(errno.EACCES, "denied")):
        _failing(monkeypatch, error)
        with pytest.raises(OSError) as ei:
            hub.resolve("o/n", download=True)
        assert ei.value is error and not isinstance(ei.value, hub.HubError)


def test_offline_mode_is_not_a_network_failure(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _failing(monkeypatch, _local_missing_from(hub._hub_class("OfflineModeIsEnabled")[0]("offline")))
    with pytest.raises(hub.HubError, match="offline mode is on .HF_HUB_OFFLINE is set.") as ei:
        hub.resolve("o/n", download=True)
    assert not isinstance(ei.value, hub.HubNetworkError)


def test_a_repo_without_safetensors(hub_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub

    only_config = hub_cache / "models--o--n" / "snapshots" / ("d" * 40)
    only_config.mkdir(parents=True)
    (only_config / "config.json").write_text("{}")
    never = hub_cache / "models--o--n" / "snapshots" / ("9" * 40)
    for folder in (only_config, never):  # (no file matched: huggingface_hub makes no folder)
        monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kw: str(folder))
        with pytest.raises(hub.HubError, match=r"^o/n: the repo has no .safetensors files at this revision") as ei:
            hub.resolve("o/n", download=True)
        assert not isinstance(ei.value, (hub.HubNetworkError, hub.RepoNotCachedError))
    shutil.rmtree(hub_cache / "models--o--n")


def test_an_incomplete_cached_snapshot(tmp_path: Path) -> None:
    """huggingface_hub (newer versions) caches a commit's file listing in trees/<commit>.json; a snapshot
    that lacks a file of the kinds hf2q downloads is incomplete (a README it lacks is not)."""
    c = tmp_path / "hub"
    add_snapshot(c, "o/n", COMMIT_MAIN, make_dflash_checkpoint(tmp_path / "ck", "tiny", seed=1))
    trees = c / "models--o--n" / "trees"
    trees.mkdir()
    listing = {"format_version": 1, "files": {"config.json": {}, "model.safetensors": {}, "README.md": {}}}
    (trees / f"{COMMIT_MAIN}.json").write_text(json.dumps(listing))
    assert hub.resolve("o/n", cache_dir=c).name == COMMIT_MAIN
    listing["files"]["model-00002-of-00002.safetensors"] = {}
    (trees / f"{COMMIT_MAIN}.json").write_text(json.dumps(listing))
    with pytest.raises(hub.RepoNotCachedError, match="the cached snapshot is incomplete.*"
                       r"1 file\(s\) missing \(model-00002-of-00002.safetensors\); "
                       "fetch the rest with: hf2q load o/n --download$"):
        hub.resolve("o/n", cache_dir=c)


@pytest.mark.parametrize(("error", "status", "kind"), [
    (lambda: _local_missing_from(_transport_error("connect")), 1, "HubNetworkError"),
    (lambda: _http_error("HfHubHTTPError", 503, "503 Server Error: Service Unavailable"), 1, "HubNetworkError"),
    (lambda: _http_error("RepositoryNotFoundError", 404), 2, "HubError"),
    (lambda: _http_error("GatedRepoError", 403), 2, "HubError"),
    (lambda: _http_error("RevisionNotFoundError", 404), 2, "HubError"),
])
@pytest.mark.parametrize("command", ["inspect", "load"])
def test_cli_exit_status_of_a_failed_download(error: Any, status: int, kind: str, command: str, hub_cache: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    _failing(monkeypatch, error())
    assert main([command, "o/n", "--download"]) == status
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(f"hf2q {command}: error: o/n")
    assert ("download failed on the network" in err) == (status == 1)
    assert main([command, "o/n", "--download", "--json"]) == status
    e = json.loads(capsys.readouterr().out)["error"]
    assert e["type"] == kind and e["repo_id"] == "o/n"


def test_cli_download_with_the_hub_unreachable(cache: Path, tmp_path: Path) -> None:
    """The real huggingface_hub against HF_ENDPOINT on a closed local port (refused at once): not cached is
    a network failure, exit 1; a cached repo still loads (huggingface_hub falls back to the cache)."""
    env = env_with(HF_HUB_CACHE=str(cache))
    p = hf2q_cli("load", "z-lab/never-fetched", "--download", "--device", "host", env=env)
    assert p.returncode == 1 and p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("hf2q load: error: z-lab/never-fetched: download failed on the network: "), p.stderr
    p = hf2q_cli("inspect", "z-lab/never-fetched", "--download", "--json", env=env)
    assert p.returncode == 1 and json.loads(p.stdout)["error"]["type"] == "HubNetworkError"
    p = hf2q_cli("load", REPO, "--download", "--device", "host", "--json", env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["resident_bytes"] == RESIDENT


def test_drafter_has_its_own_revision_and_download(hub_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`--revision`/`--download` are the target's; `--drafter-revision`/`--drafter-download` the drafter's."""
    seen: list[tuple[Any, ...]] = []
    real = hub.resolve

    class Stop(Exception):
        pass

    def spy(path: Any, revision: Any = None, *, download: bool = False, **kw: Any) -> Path:
        seen.append((path, revision, download))
        if len(seen) == 2:
            raise Stop
        return real(path, revision, download=download, **kw)

    monkeypatch.setattr(hub, "resolve", spy)
    with pytest.raises(Stop):
        main(["load", GEMMA_REPO, "--revision", "dev", "--drafter", REPO, "--drafter-revision", "v1.0",
              "--drafter-download", "--device", "host"])
    assert seen == [(GEMMA_REPO, "dev", False), (REPO, "v1.0", True)]
    monkeypatch.setattr(hub, "resolve", real)
    capsys.readouterr()
    assert main(["load", GEMMA_REPO, "--drafter-revision", "dev", "--device", "host"]) == 2
    assert "--drafter-revision and --drafter-download apply to --drafter only" in capsys.readouterr().err
    assert main(["load", GEMMA_REPO, "--drafter", str(tmp_path), "--drafter-download", "--device", "host"]) == 2
    assert "--drafter-download applies to Hugging Face repo ids only" in capsys.readouterr().err
    assert main(["load", GEMMA_REPO, "--drafter", REPO, "--drafter-revision", "..", "--device", "host",
                 "--json"]) == 2
    assert "not a valid revision" in json.loads(capsys.readouterr().out)["error"]["message"]
