"""The "fetch it with: ..." hint of a repo id that is not in the Hugging Face
cache is a command that works: the user's command with the download flag of
the repo id that is missing (``--download`` for the checkpoint,
``--drafter-download`` for ``load``'s drafter), keeping what the command
needs (``convert``'s OUT.gguf, the revisions, the drafter)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hf2q.cli import build_parser
from hf2q.testing import make_dflash_checkpoint

REPO = "Qwen/Qwen3.6-35B-A3B"
DRAFTER = "z-lab/nope"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An empty Hugging Face cache, offline, no network either way."""
    root = tmp_path_factory.mktemp("hf")
    (root / "hub").mkdir()
    e = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    e.update(HF_HOME=str(root), HF_HUB_CACHE=str(root / "hub"), HF_HUB_OFFLINE="1",
             HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_DISABLE_TELEMETRY="1", HF2Q_NUM_THREADS="2")
    return e


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local checkpoint (the target of a pair whose drafter is not cached)."""
    return make_dflash_checkpoint(tmp_path_factory.mktemp("target") / "t", "tiny", seed=5)


def hf2q(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hf2q", *argv], capture_output=True, text=True, timeout=120,
                          env=env)


def hint_of(env: dict[str, str], *argv: str) -> str:
    """The hint, checked the same in the message (stderr) and in --json."""
    p = hf2q(env, *argv)
    assert p.returncode == 2 and p.stdout == "", p.stderr
    assert p.stderr.count("\n") == 1 and "fetch it with: " in p.stderr, p.stderr
    hint = p.stderr.rstrip("\n").rsplit("fetch it with: ", 1)[1]
    p = hf2q(env, *argv, "--json")
    assert p.returncode == 2 and p.stderr == "", p.stderr
    e = json.loads(p.stdout)["error"]
    assert e["type"] == "RepoNotCachedError" and e["hint"] == hint
    assert e["message"].endswith(f"fetch it with: {hint}")
    return hint


def runs(env: dict[str, str], hint: str) -> list[str]:
    """The hint's arguments: they parse (hf2q's own parser, then hf2q itself,
    which gets past the command line and stops at the offline download)."""
    argv = shlex.split(hint)
    assert argv[0] == "hf2q"
    build_parser().parse_args(argv[1:])  # a usage error raises
    p = hf2q(env, *argv[1:], "--json")
    e = json.loads(p.stdout)["error"]
    assert e["type"] != "UsageError", e
    assert "offline mode is on" in e["message"], e  # it tried to download: the flag was taken
    return argv[1:]


def test_convert_hint_keeps_out(env: dict[str, str], tmp_path: Path) -> None:
    out = str(tmp_path / "out.gguf")
    hint = hint_of(env, "convert", REPO, out)
    assert hint == f"hf2q convert {REPO} {out} --download"
    args = build_parser().parse_args(runs(env, hint))
    assert (args.command, args.path, args.out, args.download) == ("convert", REPO, out, True)
    assert not os.path.exists(out)


def test_convert_hint_keeps_every_option_and_quotes(env: dict[str, str], tmp_path: Path) -> None:
    # Following the hint must write the file asked for: the outtype, the
    # recipe and the name kept (a hint of the repo and OUT alone wrote a
    # q8_0 file at OUT, and the command asked for then found it there).
    out = str(tmp_path / "my model.gguf")
    hint = hint_of(env, "convert", REPO, out, "--revision", "v1", "--outtype", "bf16", "--name", "My X")
    assert hint == f"hf2q convert {REPO} {shlex.quote(out)} --revision v1 --outtype bf16 --name 'My X' --download"
    args = build_parser().parse_args(runs(env, hint))
    assert (args.path, args.revision, args.out, args.outtype, args.name, args.download) == \
        (REPO, "v1", out, "bf16", "My X", True)
    hint = hint_of(env, "convert", REPO, out, "--recipe", "q4_k_m", "--no-progress")
    assert hint == f"hf2q convert {REPO} {shlex.quote(out)} --recipe q4_k_m --no-progress --download"
    args = build_parser().parse_args(runs(env, hint))
    assert (args.recipe, args.download) == ("q4_k_m", True)


def test_hint_flag_goes_before_a_double_dash() -> None:
    import argparse

    from hf2q.cli import fetch_hint

    argv = ["convert", REPO, "--json", "--", "-odd.gguf"]
    hint = fetch_hint(argparse.Namespace(argv=argv), "download")
    assert hint == f"hf2q convert {REPO} --download -- -odd.gguf"
    args = build_parser().parse_args(shlex.split(hint)[1:])
    assert (args.out, args.download, args.json) == ("-odd.gguf", True, False)
    assert fetch_hint(argparse.Namespace(), "download") == ""  # not parsed by main(): hf2q.hub's hint stands


def test_load_and_inspect_hints_unchanged(env: dict[str, str]) -> None:
    for cmd in ("load", "inspect"):
        hint = hint_of(env, cmd, REPO)
        assert hint == f"hf2q {cmd} {REPO} --download"
        runs(env, hint)


def test_drafter_hint_is_drafter_download(env: dict[str, str], target: Path) -> None:
    hint = hint_of(env, "load", str(target), "--drafter", DRAFTER, "--device", "host")
    assert hint == f"hf2q load {shlex.quote(str(target))} --drafter {DRAFTER} --device host --drafter-download"
    args = build_parser().parse_args(runs(env, hint))
    assert (args.path, args.drafter, args.drafter_download, args.download) == (str(target), DRAFTER, True, False)


def test_drafter_hint_keeps_revisions(env: dict[str, str], target: Path) -> None:
    hint = hint_of(env, "load", str(target), "--drafter", DRAFTER, "--drafter-revision", "dev")
    assert hint == (f"hf2q load {shlex.quote(str(target))} --drafter {DRAFTER} --drafter-revision dev "
                    "--drafter-download")
    args = build_parser().parse_args(runs(env, hint))
    assert (args.drafter_revision, args.drafter_download) == ("dev", True)


def test_target_hint_keeps_drafter(env: dict[str, str]) -> None:
    """The target of a pair missing: the pair's command with --download (the
    drafter, not yet looked at, kept)."""
    hint = hint_of(env, "load", REPO, "--revision", "v2", "--drafter", DRAFTER)
    assert hint == f"hf2q load {REPO} --revision v2 --drafter {DRAFTER} --download"
    args = build_parser().parse_args(runs(env, hint))
    assert (args.path, args.revision, args.drafter, args.download, args.drafter_download) == \
        (REPO, "v2", DRAFTER, True, False)
