"""Environment variables with bad values warn once and say what is used;
progress bars appear on a terminal only and obey HF2Q_NO_PROGRESS and
HF_HUB_DISABLE_PROGRESS_BARS; `import hf2q` keeps heavy modules off its path."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from hf2q.testing import make_dflash_checkpoint

BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("HF2Q_", "HF_HUB_DISABLE_PROGRESS"))}


def py(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**BASE_ENV, **env})


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# --------------------------------------------------------------------------- environment variables

CHECK = "import hf2q; hf2q.set_num_threads(hf2q.get_num_threads()); print(hf2q.get_num_threads(), hf2q.Device('host').residency_enabled)"


@pytest.mark.parametrize("value,why", [("abc", "is not an integer"), ("0", "is outside 1..1024"),
                                       ("99999", "is outside 1..1024"), ("-3", "is outside 1..1024"),
                                       ("2.5", "is not an integer")])
def test_bad_num_threads_warns_once(value: str, why: str) -> None:
    p = py(CHECK + "; import hf2q.cli, hf2q.dflash", HF2Q_NUM_THREADS=value)
    assert p.returncode == 0, p.stderr
    n = _cpus()
    assert p.stdout.split()[0] == str(n)  # the native core used the CPU count too
    lines = [ln for ln in p.stderr.splitlines() if "EnvVarWarning" in ln]
    assert len(lines) == 1, p.stderr
    assert f"HF2Q_NUM_THREADS={value!r} {why}; using {n} thread" in lines[0]


def test_good_values_are_silent() -> None:
    p = py(CHECK, HF2Q_NUM_THREADS="3", HF2Q_NO_RESIDENCY="0", HF2Q_FORCE_SCALAR="", HF2Q_NO_PROGRESS="1")
    assert p.returncode == 0 and p.stderr == "" and p.stdout.split() == ["3", "True"]
    p = py(CHECK, HF2Q_NO_RESIDENCY="1")
    assert p.returncode == 0 and p.stderr == "" and p.stdout.split()[1] == "False"


@pytest.mark.parametrize("name,what", [("HF2Q_NO_RESIDENCY", "residency stays on"),
                                       ("HF2Q_FORCE_SCALAR", "the SIMD kernels stay on"),
                                       ("HF2Q_NO_PROGRESS", "progress bars stay on")])
def test_bad_switch_warns_once(name: str, what: str) -> None:
    p = py(CHECK + "; from hf2q import _progress; _progress.progress_enabled(); _progress.progress_enabled()",
           **{name: "yes"})
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "EnvVarWarning" in ln]
    assert len(lines) == 1 and f"{name}='yes' is not 1 or 0; {what}" in lines[0], p.stderr
    if name == "HF2Q_NO_RESIDENCY":
        assert p.stdout.split()[1] == "True"  # what the warning says is what happened


def test_env_warning_category() -> None:
    p = py("import warnings\nwarnings.simplefilter('error')\ntry:\n import hf2q\nexcept Exception as e:\n"
           " print(type(e).__name__)", HF2Q_NUM_THREADS="abc")
    assert p.stdout.strip() == "EnvVarWarning"


# --------------------------------------------------------------------------- import cost


def test_import_keeps_heavy_modules_off_the_path() -> None:
    p = py("import sys, hf2q\n"
           "heavy = ['numpy', 'ml_dtypes', 'tqdm', 'safetensors', 'huggingface_hub', 'importlib.metadata',\n"
           "         'hf2q._core', 'hf2q.models.dflash', 'hf2q.models.qwen35']\n"
           "print([m for m in heavy if m in sys.modules]); print(hf2q.__version__)\n"
           "hf2q.Device; hf2q.dflash.load; hf2q.qwen35.load; print(hf2q.get_num_threads() >= 1)")
    assert p.returncode == 0, p.stderr
    loaded, version, ok = p.stdout.splitlines()
    assert loaded == "[]" and version and ok == "True"


def test_a_drafter_load_imports_only_what_it_needs(tmp_path: Path) -> None:
    d = make_dflash_checkpoint(tmp_path / "d", "tiny")
    p = py("import sys, hf2q\n"
           f"m = hf2q.dflash.load({str(d)!r}, hf2q.Device('host'))\n"
           "print([k for k in ('tqdm', 'safetensors', 'huggingface_hub', 'importlib.metadata', 'hf2q.qwen35',\n"
           "                   'hf2q.models.qwen35_plan', 'hf2q.testing') if k in sys.modules])")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_lazy_attributes_and_dir() -> None:
    import hf2q

    for name in hf2q.__all__:
        assert getattr(hf2q, name) is not None, name
    assert set(hf2q.__all__) <= set(dir(hf2q))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        hf2q.nope  # noqa: B018


# --------------------------------------------------------------------------- progress bars


def run_in_pty(argv: list[str], env: dict[str, str], timeout: float = 120) -> tuple[int, str]:
    """Run with stdout and stderr on a pseudo-terminal, as in an interactive shell."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns, as a terminal has
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 0.5)
        if r:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    rc = proc.wait(timeout=30)
    return rc, b"".join(chunks).decode("utf-8", "replace")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dflash_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny")


def _load(tiny: Path) -> list[str]:
    return [sys.executable, "-m", "hf2q", "load", "--device", "host", str(tiny)]


def test_bar_on_a_terminal(tiny: Path) -> None:
    rc, out = run_in_pty(_load(tiny), BASE_ENV)
    assert rc == 0 and "hf2q load:" in out and "/165kB" in out and "model:            dflash" in out


@pytest.mark.parametrize("env", [{"HF2Q_NO_PROGRESS": "1"}, {"HF_HUB_DISABLE_PROGRESS_BARS": "1"},
                                 {"HF_HUB_DISABLE_PROGRESS_BARS": "true"}])
def test_bar_switched_off(tiny: Path, env: dict[str, str]) -> None:
    rc, out = run_in_pty(_load(tiny), {**BASE_ENV, **env})
    assert rc == 0 and "model:            dflash" in out and "hf2q load:" not in out


def test_no_bar_in_a_pipe_or_with_flags(tiny: Path) -> None:
    p = subprocess.run(_load(tiny), capture_output=True, text=True, env=BASE_ENV, timeout=120)
    assert p.returncode == 0 and p.stderr == ""
    rc, out = run_in_pty(_load(tiny) + ["--no-progress"], BASE_ENV)
    assert rc == 0 and "hf2q load:" not in out
    rc, out = run_in_pty(_load(tiny) + ["--json"], BASE_ENV)
    assert rc == 0 and "hf2q load:" not in out and json.loads(out.replace("\r\n", "\n"))["tensors"] == 25


def test_demo_writing_has_a_bar(tmp_path: Path) -> None:
    # the tiny drafter: the bar is drawn for any size once stderr is a terminal
    env = {**BASE_ENV, "HF2Q_DEMO_CONFIG": "tiny"}
    rc, out = run_in_pty([sys.executable, "-m", "hf2q", "demo", "--device", "host", "--cache-dir", str(tmp_path),
                          "--no-verify"], env)
    assert rc == 0, out
    assert "hf2q writing:" in out and "hf2q demo: writing the synthetic tiny DFlash drafter (165 kB)" in out
    assert f"remove it with: hf2q demo --remove --cache-dir {tmp_path}" in out
