"""`hf2q demo`'s cache (issue 26): data synced before it is marked complete,
no temporary folder left by SIGTERM/SIGINT (nor after a run that was killed),
`--remove` says what it did, concurrent runs one after the other."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hf2q.cli import main

ENV = {**os.environ, "HF2Q_NUM_THREADS": "2", "HF2Q_NO_PROGRESS": "1"}

#: A demo whose writer stops after the first file (with READY on stderr) for ``HOLD`` seconds.
# (SIGINT made KeyboardInterrupt first: a suite started in the background by a non-interactive
# shell hands its children SIGINT ignored, which Python keeps.)
SLOW_DEMO = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
import hf2q.testing
real = hf2q.testing.make_dflash_checkpoint
def slow(directory, config=None, *a, **kw):
    out = real(directory, config, *a, **kw)
    sys.stderr.write("READY\n"); sys.stderr.flush()
    time.sleep(float(os.environ["HOLD"]))
    return out
hf2q.testing.make_dflash_checkpoint = slow
from hf2q.cli import main
sys.exit(main(sys.argv[1:]))
"""


def slow_demo(cache: Path, *argv: str, hold: float = 60) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", SLOW_DEMO, "demo", "--device", "host", "--cache-dir", str(cache),
                             "--config", "tiny", "--no-verify", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**ENV, "HOLD": str(hold)})


def wait_ready(p: subprocess.Popen[str]) -> None:
    assert p.stderr is not None
    lines = []
    while True:
        line = p.stderr.readline()
        assert line, f"the demo ended before writing: {''.join(lines)}"
        lines.append(line)
        if line == "READY\n":
            return


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_synced_before_marked_complete(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(a: Any, b: Any) -> None:
        events.append(("replace", os.fspath(a)))
        real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    cache = tmp_path / "cache"
    rc, _, err = run(capsys, "demo", "--device", "host", "--cache-dir", str(cache), "--config", "tiny", "--no-verify")
    assert rc == 0, err
    tmp = str(cache / f"demo-tiny-dflash.tmp{os.getpid()}")
    synced = [p for kind, p in events if kind == "fsync"]
    at = events.index(("replace", tmp))
    before = {p for kind, p in events[:at] if kind == "fsync"}
    for name in ("config.json", "model.safetensors", ".complete"):
        assert os.path.join(tmp, name) in before, (name, events)
    assert tmp in before  # the folder's entries
    # the data before the mark that says it is complete
    assert synced.index(os.path.join(tmp, "model.safetensors")) < synced.index(os.path.join(tmp, ".complete"))
    assert ("fsync", str(cache)) in events[at:]  # the rename itself
    assert sorted(os.listdir(cache)) == ["demo-tiny-dflash"]


@pytest.mark.parametrize(("sig", "status", "kind"), [(signal.SIGTERM, 143, "Terminated"),
                                                     (signal.SIGINT, 130, "KeyboardInterrupt")])
@pytest.mark.parametrize("as_json", [False, True])
def test_signal_while_writing_removes_the_temporary_folder(sig: int, status: int, kind: str, as_json: bool,
                                                            tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    p = slow_demo(cache, *(["--json"] if as_json else []))
    wait_ready(p)
    tmps = list(cache.glob("demo-tiny-dflash.tmp*"))
    assert len(tmps) == 1 and (tmps[0] / "model.safetensors").is_file()  # written, not yet complete
    p.send_signal(sig)
    out, err = p.communicate(timeout=30)
    assert p.returncode == status, (out, err)
    assert os.listdir(cache) == [], os.listdir(cache)
    assert "Traceback" not in err
    if as_json:
        assert json.loads(out)["error"]["type"] == kind and err == ""
    else:
        assert out == "" and err.strip().endswith("terminated" if kind == "Terminated" else "interrupted")


def test_the_next_run_removes_a_killed_runs_temporary_folder(capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    p = slow_demo(cache)
    wait_ready(p)
    p.kill()  # SIGKILL: no handler runs
    p.communicate(timeout=30)
    (left,) = cache.glob("demo-tiny-dflash.tmp*")
    rc, _, err = run(capsys, "demo", "--device", "host", "--cache-dir", str(cache), "--config", "tiny", "--no-verify")
    assert rc == 0, err
    assert f"removed 1 temporary folder(s) left by an interrupted run: {left}" in err
    assert sorted(os.listdir(cache)) == ["demo-tiny-dflash"]


def test_remove_says_what_it_did(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    args = ("demo", "--cache-dir", str(cache), "--config", "tiny", "--remove")
    # missing: the cache folder is not even created
    rc, _, err = run(capsys, *args)
    assert rc == 0 and f"nothing to remove: {cache / 'demo-tiny-dflash'} does not exist" in err
    assert not cache.exists()
    # a symbolic link: the link goes, what it points to stays (it was reported removed and kept before)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("keep")
    cache.mkdir()
    os.symlink(elsewhere, cache / "demo-tiny-dflash")
    rc, out, err = run(capsys, *args, "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["symlink"] is True and d["existed"] is True and d["link_target"] == str(elsewhere)
    assert "removed the symbolic link" in d["did"] and "left as it is" in d["did"]
    assert not os.path.lexists(cache / "demo-tiny-dflash") and (elsewhere / "precious.txt").read_text() == "keep"
    # a dangling link is a link too
    os.symlink(tmp_path / "gone", cache / "demo-tiny-dflash")
    rc, _, err = run(capsys, *args)
    assert rc == 0 and "removed the symbolic link" in err and not os.path.lexists(cache / "demo-tiny-dflash")
    # a real one, with a stale temporary folder beside it
    rc, _, err = run(capsys, "demo", "--device", "host", "--cache-dir", str(cache), "--config", "tiny", "--no-verify")
    assert rc == 0, err
    (cache / "demo-tiny-dflash.tmp1").mkdir()
    rc, out, err = run(capsys, *args, "--json")
    d = json.loads(out)
    assert rc == 0 and d["existed"] is True and d["symlink"] is False
    assert d["temporaries_removed"] == [str(cache / "demo-tiny-dflash.tmp1")]
    assert os.listdir(cache) == []


def test_remove_failure_is_reported(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder that cannot be removed is an error (it was reported removed before: rmtree ignored errors)."""
    import errno
    import shutil

    cache = tmp_path / "cache"
    (cache / "demo-tiny-dflash").mkdir(parents=True)

    def refuse(path: Any, *a: Any, **kw: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(shutil, "rmtree", refuse)
    rc, out, err = run(capsys, "demo", "--cache-dir", str(cache), "--config", "tiny", "--remove")
    assert rc == 1 and out == "" and err == f"hf2q demo: error: {cache / 'demo-tiny-dflash'}: Permission denied\n"
    assert (cache / "demo-tiny-dflash").is_dir()


def test_concurrent_runs_one_after_the_other(tmp_path: Path) -> None:
    """The second run waits for the first's lock, then finds the checkpoint complete and writes nothing."""
    cache = tmp_path / "cache"
    first = slow_demo(cache, "--json", hold=2)
    wait_ready(first)
    second = subprocess.Popen([sys.executable, "-m", "hf2q", "demo", "--device", "host", "--cache-dir", str(cache),
                               "--config", "tiny", "--no-verify", "--json"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=ENV)
    time.sleep(0.5)
    assert second.poll() is None  # waiting on the lock
    out1, err1 = first.communicate(timeout=60)
    out2, err2 = second.communicate(timeout=60)
    assert first.returncode == 0 and second.returncode == 0, (err1, err2)
    assert "cached in" in err1 and "writing" not in err2 and "using the cached" in err2  # (err1's "writing" was read)
    assert json.loads(out1)["tensors"] == json.loads(out2)["tensors"] == 25
    assert sorted(os.listdir(cache)) == ["demo-tiny-dflash"]
