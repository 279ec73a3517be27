"""Special files (issue 11, row "special files"): every path hf2q opens
(config.json, the index, shards, upload_from_file, the demo cache) is opened
without blocking, must be a regular file and is read with a size cap. A FIFO,
a device node, a directory or a socket is a typed error at once, in the API
and in the CLI (one line, exit 2). Scenarios that hung before run in a child
interpreter under a deadline."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

import pytest
from _hardening import run_python

import hf2q
from hf2q import dflash
from hf2q.device import Device, FileReadError
from hf2q.errors import ConfigError, SafetensorsError
from hf2q.testing import make_dflash_checkpoint

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs, device nodes")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dflash_checkpoint(tmp_path_factory.mktemp("files") / "single", "tiny", seed=3)


@pytest.fixture(scope="module")
def tiny_sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dflash_checkpoint(tmp_path_factory.mktemp("files") / "sharded", "tiny", seed=3, sharded=True,
                                  num_shards=2)


def _replace(path: Path, kind: str) -> None:
    """Turn ``path`` into a special file of ``kind``."""
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "socket":
        # Bound by its name from inside its folder: a socket address holds at
        # most 107 bytes, and pytest's temporary paths can be longer.
        s = socket.socket(socket.AF_UNIX)
        cwd = os.getcwd()
        try:
            os.chdir(path.parent)
            s.bind(path.name)
        finally:
            os.chdir(cwd)
            s.close()  # the socket file stays
    else:
        raise AssertionError(kind)


KINDS = ["fifo", "dir", "dev-zero", "socket"]

# Every case in one child process per kind: before the fix, FIFOs hung.
CHILD = r"""
import sys, os, shutil, time
from pathlib import Path
import hf2q
from hf2q import dflash, safetensors
from hf2q.errors import Hf2qError
base, kind = Path(sys.argv[1]), sys.argv[2]
results = []
def check(label, fn):
    t0 = time.monotonic()
    try:
        fn()
        results.append(f"{label}: no error")
    except Hf2qError as e:
        results.append(f"{label}: ok {type(e).__name__} {time.monotonic() - t0:.2f}s")
    except BaseException as e:
        results.append(f"{label}: UNTYPED {type(e).__name__}: {e}")
dev = hf2q.Device._isolated("host")
single, sharded = base / "single", base / "sharded"
check("config.json", lambda: dflash.load(single, dev, progress=False))
check("config via DFlashConfig", lambda: dflash.DFlashConfig.from_file(single))
check("config via Qwen35Config", lambda: hf2q.qwen35.Qwen35Config.from_file(single))
check("index", lambda: safetensors.open_checkpoint(sharded))
check("index via load", lambda: dflash.load(sharded, dev, progress=False))
check("shard", lambda: safetensors.open_checkpoint(base / "shard"))
check("upload_from_file", lambda: dev.upload_from_file(base / "upload", 0, 8, "bf16", "bf16", (4,)))
check("write_from_file", lambda: dev.write_from_file(dev.alloc((4,), "bf16"), base / "upload", 0, 8, "bf16"))
print("\n".join(results))
"""


@pytest.mark.parametrize("kind", KINDS)
def test_special_files_are_typed_errors_at_once(kind: str, tiny: Path, tiny_sharded: Path, tmp_path: Path) -> None:
    base = tmp_path / "b"
    shutil.copytree(tiny, base / "single")
    shutil.copytree(tiny_sharded, base / "sharded")
    (base / "shard").mkdir()
    shutil.copy(tiny / "model.safetensors", base / "shard" / "model.safetensors")
    _replace(base / "single" / "config.json", kind)
    _replace(base / "sharded" / "model.safetensors.index.json", kind)
    _replace(base / "shard" / "model.safetensors", kind)
    _replace(base / "upload", kind)
    r = run_python(CHILD, args=[str(base), kind], timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 8, r.stdout
    for line in lines:
        assert ": ok " in line, f"{kind}: {line}"
        assert float(line.rsplit(" ", 1)[1].rstrip("s")) < 5.0, line


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("command", ["inspect", "load"])
def test_cli_on_special_config_or_index_exits_2_with_one_line(kind: str, command: str, tiny: Path,
                                                              tiny_sharded: Path, tmp_path: Path) -> None:
    for src, victim in ((tiny, "config.json"), (tiny_sharded, "model.safetensors.index.json")):
        d = tmp_path / f"{command}-{kind}-{victim}"
        shutil.copytree(src, d)
        _replace(d / victim, kind)
        r = run_python("import sys; from hf2q.cli import main; sys.exit(main(sys.argv[1:]))",
                       args=[command, str(d)], timeout=60)
        assert r.returncode == 2, (victim, r.returncode, r.stderr)
        assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr and "not a regular file" in r.stderr, r.stderr


def test_config_json_size_cap(tiny: Path, tmp_path: Path) -> None:
    d = tmp_path / "ck"
    shutil.copytree(tiny, d)
    cfg = d / "config.json"
    # A 4 GiB sparse file: refused from its size, without reading it.
    with open(cfg, "r+b") as f:
        f.truncate(4 << 30)
    with pytest.raises(ConfigError, match="more than the .* bytes a config.json may have"):
        dflash.load(d, Device._isolated("host"), progress=False)
    # Just over the cap: also refused; a few MB of padding is still legal JSON.
    from hf2q._files import CONFIG_MAX_BYTES

    text = (tiny / "config.json").read_text()
    cfg.write_text(text[:-2] + " " * (CONFIG_MAX_BYTES + 1 - len(text)) + text[-2:])
    assert cfg.stat().st_size == CONFIG_MAX_BYTES + 1
    with pytest.raises(ConfigError, match="more than"):
        dflash.DFlashConfig.from_file(d)
    cfg.write_text(text[:-2] + " " * (CONFIG_MAX_BYTES - len(text)) + text[-2:])
    assert dflash.DFlashConfig.from_file(d).num_hidden_layers == 2


def test_index_size_cap(tiny_sharded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "ck"
    shutil.copytree(tiny_sharded, d)
    monkeypatch.setattr(hf2q.safetensors, "_MAX_INDEX_BYTES", 100)
    with pytest.raises(SafetensorsError) as ei:
        hf2q.open_checkpoint(d)
    assert ei.value.code == "InvalidIndex" and "more than the 100 bytes" in str(ei.value)


def test_upload_from_file_range_past_the_end_is_refused_before_reading(tmp_path: Path) -> None:
    p = tmp_path / "short.bin"
    p.write_bytes(b"\0" * 10)
    dev = Device._isolated("host")
    with pytest.raises(FileReadError, match="end of file"):
        dev.upload_from_file(p, 4, 8, "bf16", "bf16", (4,))
    assert dev.residency.count == 0


def test_demo_cache_dir_that_is_a_file_exits_2_with_one_line(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    r = run_python("import sys; from hf2q.cli import main; sys.exit(main(sys.argv[1:]))",
                   args=["demo", "--cache-dir", str(f), "--config", "tiny", "--no-verify"], timeout=60)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "not a directory" in r.stderr.lower(), r.stderr
    assert f"--cache-dir {f}: not a directory (a file is there); choose a folder with --cache-dir DIR or " \
           "HF2Q_CACHE=DIR" in r.stderr


def test_hf2q_cache_that_is_a_file_exits_2_like_cache_dir(tmp_path: Path) -> None:
    """HF2Q_CACHE=<a regular file> was "File exists", exit 1; now what --cache-dir <file> gives, naming the
    variable (--json: the usage error as its object)."""
    import json
    import os

    f = tmp_path / "file"
    f.write_text("x")
    env = {**os.environ, "HF2Q_CACHE": str(f)}
    for extra in ([], ["--json"]):
        r = run_python("import sys; from hf2q.cli import main; sys.exit(main(sys.argv[1:]))",
                       args=["demo", "--config", "tiny", "--no-verify", "--device", "host", *extra], timeout=60,
                       env=env)
        assert r.returncode == 2, r.stderr
        msg = f"HF2Q_CACHE={f}: not a directory (a file is there); choose a folder with --cache-dir DIR or HF2Q_CACHE=DIR"
        if extra:
            assert r.stderr == "" and json.loads(r.stdout)["error"]["message"].endswith(msg), r.stdout
        else:
            assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr, r.stderr
    assert f.read_text() == "x"


def _interrupt_each_line(once, traced):  # type: ignore[no-untyped-def]
    """Run ``once()`` again and again, a KeyboardInterrupt raised at its
    n-th line event in files ``traced(filename)`` selects (n = 1, 2, ...),
    until a run ends without one: after every run no descriptor is left
    open. Returns (the uninterrupted run's result, the number of runs)."""
    import gc

    fds = len(os.listdir("/proc/self/fd"))
    n = 0
    while True:
        n += 1
        seen = [0]

        def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
            if not traced(frame.f_code.co_filename):
                return None
            if event == "line":
                seen[0] += 1
                if seen[0] == n:
                    raise KeyboardInterrupt("injected")
            return tracer

        sys.settrace(tracer)
        try:
            got = once()
        except KeyboardInterrupt:
            got = None
        finally:
            sys.settrace(None)
        gc.collect()
        assert len(os.listdir("/proc/self/fd")) == fds, f"interrupted at line event {n}"
        if got is not None:  # n went past the last line: every line was tried
            return got, n


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_ctrl_c_on_any_line_of_a_capped_read_leaves_no_fd_open(tiny: Path) -> None:
    """read_capped (config.json, the index) interrupted by a KeyboardInterrupt
    at each of its lines in turn, its last ones included: the descriptor is
    closed every time (a close in a ``finally`` was skipped when the
    interrupt landed on the close's own line)."""
    from hf2q import _files
    from hf2q.errors import ConfigError

    path = str(tiny / "config.json")

    def error(reason: str, e: OSError | None) -> ConfigError:
        return ConfigError(f"{path}: {reason}")

    def once() -> bytes:
        return _files.read_capped(path, 1 << 20, "config.json", error)

    want = once()
    got, runs = _interrupt_each_line(once, lambda f: f == _files.__file__)
    assert got == want and runs > 10


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("call", ["write_from_file", "write_from_file_segments", "write_from_file_batch"])
def test_ctrl_c_on_any_line_of_a_read_by_path_leaves_no_fd_open(tmp_path: Path, call: str) -> None:
    """A device read of a file named by path, interrupted by a
    KeyboardInterrupt at each line of hf2q's Python in turn: the descriptor
    it opened is closed every time (the old opener's ``__exit__`` skipped its
    close when the interrupt landed on that line, and an interrupt between
    the open and its bookkeeping left the descriptor unowned)."""
    import numpy as np

    from hf2q import device as hdevice

    f = tmp_path / "data.bin"
    f.write_bytes(np.arange(64, dtype=np.float32).tobytes())
    dev = Device("host")
    hf2q_dir = os.path.dirname(hdevice.__file__)

    def once() -> np.ndarray:
        buf = dev.alloc((16,), "f32")
        if call == "write_from_file":
            dev.write_from_file(buf, str(f), 64, 64, "f32")
        elif call == "write_from_file_segments":
            dev.write_from_file_segments(buf, str(f), [(0, 64, 32), (8, 96, 32)], "f32")
        else:
            dev.write_from_file_batch([(buf, str(f), [(0, 64, 64)], "f32", "t")])
        return buf.to_host().copy()

    want = once()
    assert want.tolist() == list(range(16, 32))
    got, runs = _interrupt_each_line(once, lambda name: name.startswith(hf2q_dir))
    assert (got == want).all() and runs > 10
