"""The CLI's streams, signals and exit statuses (issue 26), each run as a
subprocess the way a user or a script runs it: a path that is not UTF-8 on a
strict UTF-8 stdout, a reader that went away, unbuffered output, SIGINT
under --json, and the machine's own limits (file descriptors, memory) set
with setrlimit as `ulimit` does."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from hf2q.testing import make_dflash_checkpoint

ENV = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "PYTHONIOENCODING", "LC_", "LANG"))}
ENV.update(HF2Q_NUM_THREADS="2", HF2Q_NO_PROGRESS="1", OPENBLAS_NUM_THREADS="1")
HF2Q = [sys.executable, "-m", "hf2q"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dflash_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=5)


@pytest.fixture(scope="module")
def odd_name(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A checkpoint folder whose name is not UTF-8 (legal on Linux)."""
    root = os.fsencode(tmp_path_factory.mktemp("odd"))
    path = os.path.join(root, b"ck-\xff\xfe-caf\xc3\xa9")
    make_dflash_checkpoint(Path(os.fsdecode(path)), "tiny", seed=5)
    return path


# --------------------------------------------------------------------------- encoding


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "utf-8"}, {"LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8:strict"},
                                 {"PYTHONIOENCODING": "ascii"}])
@pytest.mark.parametrize("argv", [["inspect"], ["load", "--device", "host", "--verify"]])
def test_any_path_prints(odd_name: bytes, env: dict[str, str], argv: list[str]) -> None:
    """A UnicodeEncodeError traceback before: the name's bytes come back as they are (an ASCII stdout gets
    backslash escapes for what it cannot hold)."""
    p = subprocess.run([*HF2Q, *argv, odd_name], capture_output=True, timeout=120, env={**ENV, **env})
    assert p.returncode == 0 and p.stderr == b"", p.stderr.decode(errors="replace")
    if env["PYTHONIOENCODING"].startswith("utf-8"):
        assert odd_name in p.stdout
    else:
        assert os.path.basename(odd_name).replace(b"\xc3\xa9", b"\\xe9") in p.stdout
    pj = subprocess.run([*HF2Q, *argv, odd_name, "--json"], capture_output=True, timeout=120, env={**ENV, **env})
    assert pj.returncode == 0 and pj.stderr == b""
    report = json.loads(pj.stdout)  # JSON escapes it: \udcff, as json.dumps writes such a str
    assert os.fsencode(report.get("path") or report["checkpoint"]) == odd_name


def test_errors_name_any_path(odd_name: bytes) -> None:
    missing = odd_name + b"-missing"
    p = subprocess.run([*HF2Q, "load", missing], capture_output=True, timeout=60,
                       env={**ENV, "PYTHONIOENCODING": "utf-8"})
    assert p.returncode == 2 and p.stdout == b"" and b"Traceback" not in p.stderr
    assert p.stderr.startswith(b"hf2q load: error: ") and p.stderr.count(b"\n") == 1


# --------------------------------------------------------------------------- a reader that went away


def run_into_closed_pipe(argv: list[Any], **env: str) -> tuple[int, bytes]:
    """Run with stdout a pipe whose reading end is already closed (`hf2q ... | (exec <&-; ...)`)."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([*HF2Q, *argv], stdout=w, stderr=subprocess.PIPE, timeout=120, env={**ENV, **env})
    finally:
        os.close(w)
    return p.returncode, p.stderr


CLOSED_PIPE_CASES = {
    "inspect": lambda tiny: ["inspect", tiny],
    "inspect --json": lambda tiny: ["inspect", tiny, "--json"],
    "load --json": lambda tiny: ["load", tiny, "--device", "host", "--json"],
    "load MISSING --json": lambda tiny: ["load", tiny / "missing", "--json"],
    "load MISSING": lambda tiny: ["load", tiny / "missing"],  # (the error goes to stderr: exit 2 as usual)
    "--version": lambda tiny: ["--version"],
    "--help": lambda tiny: ["--help"],
    "no command": lambda tiny: [],
}


@pytest.mark.parametrize(("case", "unbuffered"), [(c, False) for c in CLOSED_PIPE_CASES] + [
    (c, True) for c in ("inspect", "load --json", "load MISSING --json", "--version")])
def test_closed_stdout_exits_quietly(case: str, unbuffered: bool, tiny: Path) -> None:
    """Exit 120 and "Exception ignored ... BrokenPipeError" before (a traceback with PYTHONUNBUFFERED=1)."""
    env = {"PYTHONUNBUFFERED": "1"} if unbuffered else {}
    rc, err = run_into_closed_pipe(CLOSED_PIPE_CASES[case](tiny), **env)
    if case == "load MISSING":
        assert rc == 2 and err.startswith(b"hf2q load: error:") and err.count(b"\n") == 1
        return
    if case == "no command":  # usage and error go to stderr (argparse's convention), status 2; stdout unused
        assert rc == 2 and b"a command is required" in err and b"Traceback" not in err
        return
    assert rc == 141 and err == b"", (rc, err.decode(errors="replace"))


@pytest.mark.parametrize("argv", [["inspect", "{tiny}"], ["inspect", "{tiny}", "--json"], ["--version"], ["--help"],
                                  ["load", "{tiny}", "--device", "host", "--no-progress"]])
def test_stdout_closed_altogether(argv: list[str], tiny: Path) -> None:
    """`hf2q inspect X >&-`: no stdout at all (Python's sys.stdout is None). The output could not be
    written: exit 1 (as GNU tools exit on a write error; was 0 having written nothing) with one short
    line on stderr, no traceback."""
    args = [a.format(tiny=tiny) for a in argv]
    p = subprocess.run([*HF2Q, *args], stderr=subprocess.PIPE, timeout=60, env=ENV, preexec_fn=lambda: os.close(1))
    err = p.stderr.decode()
    assert p.returncode == 1, err
    assert err.count("\n") == 1 and len(err) < 120 and "Traceback" not in err
    assert err.startswith("hf2q") and "standard output is closed: the output could not be written" in err
    if argv[0] in ("inspect", "load"):
        assert err.startswith(f"hf2q {argv[0]}: error:")


def test_stdout_closed_after_a_failure_keeps_its_status(tmp_path: Path) -> None:
    """Bad input stays exit 2 (its message on stderr); under --json, whose error object could not be
    written, one more line says so."""
    missing = str(tmp_path / "missing")
    p = subprocess.run([*HF2Q, "inspect", missing], stderr=subprocess.PIPE, timeout=60, env=ENV,
                       preexec_fn=lambda: os.close(1))
    assert p.returncode == 2 and p.stderr.decode().count("\n") == 1 and "standard output" not in p.stderr.decode()
    p = subprocess.run([*HF2Q, "inspect", missing, "--json"], stderr=subprocess.PIPE, timeout=60, env=ENV,
                       preexec_fn=lambda: os.close(1))
    assert p.returncode == 2 and p.stderr.decode().count("\n") == 1 and "standard output is closed" in p.stderr.decode()


# --------------------------------------------------------------------------- SIGINT

#: The CLI with the family's config read blocked (READY on stderr first), so that a signal lands mid-command.
#: SIGINT is made Python's KeyboardInterrupt first: a suite started in the background by a
#: non-interactive shell (``.ci/run &``) hands its children SIGINT ignored, which Python keeps.
BLOCKED = r"""
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
import hf2q.models as models
def blocked(*a, **kw):
    sys.stderr.write("READY\n"); sys.stderr.flush(); time.sleep(60)
models.read_config = blocked
from hf2q.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("as_json", [True, False])
@pytest.mark.parametrize("command", ["inspect", "load"])
def test_sigint(command: str, as_json: bool, tiny: Path) -> None:
    """Exit 130 with nothing on stdout before, under --json too: now the one error object."""
    argv = [command, str(tiny), *(["--device", "host"] if command == "load" else []), *(["--json"] if as_json else [])]
    p = subprocess.Popen([sys.executable, "-c", BLOCKED, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=ENV)
    assert p.stderr is not None and p.stderr.readline() == "READY\n"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, (out, err)
    if as_json:
        assert json.loads(out) == {"error": {"type": "KeyboardInterrupt", "message": "interrupted"}} and err == ""
    else:
        assert out == "" and err == f"hf2q {command}: interrupted\n"


# --------------------------------------------------------------------------- the machine's own limits: exit 1


def sharded_generic(root: Path, n: int) -> Path:
    """A generic checkpoint of ``n`` shards and their index."""
    root.mkdir()
    weight_map = {}
    for i in range(n):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file({f"t{i}": np.full((4,), i, np.float32)}, str(root / name))
        weight_map[f"t{i}"] = name
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (root / "config.json").write_text("{}")
    return root


def limit(kind: int, value: int) -> Any:
    def set_limit() -> None:
        resource.setrlimit(kind, (value, value))
    return set_limit


def fd_limit_that_fails_late() -> int:
    """The lowest RLIMIT_NOFILE at which the interpreter still starts and imports hf2q (plus a margin),
    measured, so that a checkpoint of more shards than that runs out of descriptors in hf2q's own code."""
    for n in range(8, 200, 4):
        p = subprocess.run([sys.executable, "-c", "import hf2q.cli, hf2q.models, hf2q.safetensors, numpy"],
                           capture_output=True, env=ENV, preexec_fn=limit(resource.RLIMIT_NOFILE, n))
        if p.returncode == 0:
            return n + 8
    pytest.skip("the interpreter needs too many descriptors to start")


@pytest.mark.parametrize("command", ["inspect", "load"])
def test_too_many_open_files_is_exit_1(command: str, tmp_path: Path) -> None:
    """EMFILE was a SafetensorsError, exit 2 ("bad input"); still a SafetensorsError, now marked a system
    failure: exit 1 (`ulimit -n`)."""
    n = fd_limit_that_fails_late()
    ck = sharded_generic(tmp_path / "ck", n + 16)
    argv = [command, str(ck), *(["--device", "host"] if command == "load" else [])]
    ok = subprocess.run([*HF2Q, *argv, "--json"], capture_output=True, text=True, timeout=120, env=ENV)
    assert ok.returncode == 0, ok.stdout  # the checkpoint itself is fine
    p = subprocess.run([*HF2Q, *argv, "--json"], capture_output=True, text=True, timeout=120, env=ENV,
                       preexec_fn=limit(resource.RLIMIT_NOFILE, n))
    assert p.returncode == 1, (p.stdout, p.stderr)
    err = json.loads(p.stdout)["error"]
    assert err["type"] == "SafetensorsError" and "Too many open files" in err["message"], err
    assert err["system_failure"] is True and p.stderr == ""
    p = subprocess.run([*HF2Q, *argv], capture_output=True, text=True, timeout=120, env=ENV,
                       preexec_fn=limit(resource.RLIMIT_NOFILE, n))
    assert p.returncode == 1 and "Too many open files" in p.stderr and p.stderr.count("\n") == 1


@pytest.mark.skipif(os.environ.get("HF2Q_UNDER_SANITIZER") == "1",
                    reason="scripts/run_sanitizers.sh: ASan reserves terabytes of shadow address space, which an "
                           "address-space limit refuses before hf2q runs; the main suite runs it")
def test_out_of_memory_is_exit_1(tmp_path: Path) -> None:
    """ENOMEM from the host backend (a 4 GiB tensor under a 2 GiB address-space limit, `ulimit -v`): a
    DeviceError, exit 1 (it was 2)."""
    ck = tmp_path / "big"
    ck.mkdir()
    header = json.dumps({"w": {"dtype": "U8", "shape": [1 << 32], "data_offsets": [0, 1 << 32]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(ck / "model.safetensors", "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + (1 << 32))  # sparse
    (ck / "config.json").write_text("{}")
    p = subprocess.run([*HF2Q, "load", str(ck), "--device", "host", "--json"], capture_output=True, text=True,
                       timeout=120, env=ENV, preexec_fn=limit(resource.RLIMIT_AS, 2 << 30))
    assert p.returncode == 1, (p.stdout, p.stderr)
    err = json.loads(p.stdout)["error"]
    assert err["type"] in ("DeviceError", "MemoryError") and err["system_failure"] is True, err
    assert p.stderr == ""


def test_bad_input_is_still_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"# not a checkpoint")
    p = subprocess.run([*HF2Q, "inspect", str(bad), "--json"], capture_output=True, text=True, timeout=60, env=ENV)
    err = json.loads(p.stdout)["error"]
    assert p.returncode == 2 and "system_failure" not in err


def test_exit_code_rule() -> None:
    import errno

    import hf2q
    from hf2q.cli import UsageError, exit_code
    from hf2q.errors import mark_system_failure
    from hf2q.hub import HubError, HubNetworkError

    assert exit_code(UsageError("x")) == 2
    assert exit_code(hf2q.SafetensorsError("x")) == 2 and exit_code(hf2q.ConfigError("x")) == 2
    assert exit_code(HubError("x", repo_id="o/n")) == 2 and exit_code(HubNetworkError("x", repo_id="o/n")) == 1
    assert exit_code(hf2q.DeviceError("cannot open")) == 1
    for code in (errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EIO):
        e = mark_system_failure(hf2q.SafetensorsError("x"), OSError(code, os.strerror(code)))
        assert exit_code(e) == 1 and e.system_errno == code  # type: ignore[attr-defined]
    for code in (errno.ENOENT, errno.EACCES, errno.EISDIR, errno.ENXIO, errno.ELOOP):
        assert exit_code(mark_system_failure(hf2q.ConfigError("x"), OSError(code, "x"))) == 2
    assert exit_code(mark_system_failure(hf2q.ConfigError("x"), MemoryError())) == 1
    assert exit_code(OSError(errno.ENOSPC, "full")) == 1 and exit_code(MemoryError()) == 1
