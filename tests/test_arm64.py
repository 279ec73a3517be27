"""arm64 (NEON) kernels verified under emulation.

Writes test vectors with hf2q.reference (tests/native/gen_arm64_vectors.py),
then runs scripts/run_arm64_tests.sh, which cross-compiles csrc/kernels/ and
tests/native/arm64_driver.cpp for aarch64 Linux and runs the driver under
qemu-aarch64. Skipped when the cross toolchain or qemu is missing, unless
CI=true, in which case the script may install them with apt-get.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "run_arm64_tests.sh"
GENERATOR = ROOT / "tests" / "native" / "gen_arm64_vectors.py"
INSTALL_HINT = "apt-get install g++-aarch64-linux-gnu qemu-user-static"

# slow (cross-compiles the kernels and runs them under qemu); run in every suite, CI included
pytestmark = pytest.mark.slow


def _load_generator():
    spec = importlib.util.spec_from_file_location("hf2q_gen_arm64_vectors", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tools_missing() -> list[str]:
    if platform.machine() in ("aarch64", "arm64"):
        return [] if (shutil.which("g++") or shutil.which("c++")) else ["g++"]
    missing = []
    if not (os.environ.get("HF2Q_ARM64_CXX") or shutil.which("aarch64-linux-gnu-g++")):
        missing.append("aarch64-linux-gnu-g++")
    if not (os.environ.get("HF2Q_ARM64_QEMU") or shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")):
        missing.append("qemu-aarch64")
    return missing


def test_arm64_neon_kernels_under_qemu(tmp_path: Path) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("the arm64 emulation test needs Linux (Debian cross toolchain + qemu-user)")
    if shutil.which("bash") is None:
        pytest.skip("bash not found")
    ci = os.environ.get("CI", "").strip().lower() == "true"
    missing = _tools_missing()
    if missing and not ci:
        pytest.skip(
            f"{', '.join(missing)} not installed ({INSTALL_HINT}, or run scripts/run_arm64_tests.sh, "
            "which installs them; with CI=true this test installs them)"
        )

    vectors = tmp_path / "arm64_vectors.bin"
    counts = _load_generator().write_vectors(vectors)
    assert vectors.stat().st_size > 0 and counts

    cmd = ["bash", str(SCRIPT), "--vectors", str(vectors)]
    if not ci:
        cmd.append("--no-install")
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    out = proc.stdout
    if proc.returncode == 77:
        reason = next((line for line in out.splitlines() if line.startswith("skipped:")), "skipped: (no reason given)")
        pytest.skip(f"arm64 emulation test {reason}")
    tail = "\n".join(out.splitlines()[-60:])
    assert proc.returncode == 0, f"scripts/run_arm64_tests.sh failed (exit {proc.returncode}):\n{tail}"
    m = re.search(r"^arm64 driver: (\d+) passed, (\d+) failed", out, re.MULTILINE)
    assert m is not None, f"no summary line from the arm64 driver:\n{tail}"
    assert int(m.group(2)) == 0 and int(m.group(1)) > 0, tail
