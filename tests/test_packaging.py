"""Wheels people can install: LICENSE in the repo and the wheel, one version
source, the stable-ABI and cibuildwheel settings, and a real build here:
scripts/build_wheels.sh (pip wheel + auditwheel repair) must give a
manylinux wheel that carries the license, the typed API and the extension."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import hf2q

ROOT = Path(__file__).resolve().parents[1]

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None  # type: ignore[assignment]


def pyproject() -> dict:
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_file_is_mit() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "WITHOUT WARRANTY OF ANY KIND" in text
    project = pyproject()["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]


def test_dependencies() -> None:
    deps = " ".join(pyproject()["project"]["dependencies"])
    for name in ("numpy", "ml_dtypes", "safetensors", "tqdm", "huggingface_hub"):
        assert name in deps


def test_version_has_one_source() -> None:
    cfg = pyproject()
    assert cfg["project"]["dynamic"] == ["version"] and "version" not in cfg["project"]
    meta = cfg["tool"]["scikit-build"]["metadata"]["version"]
    assert meta["input"] == "python/hf2q/_version.py"
    written = re.search(r'__version__ = "([^"]+)"', (ROOT / meta["input"]).read_text())
    assert written and written.group(1) == hf2q.__version__


def test_stable_abi_and_platform_configuration() -> None:
    cfg = pyproject()
    assert cfg["tool"]["scikit-build"]["wheel"]["py-api"] == "cp312"
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert re.search(r"nanobind_add_module\(_core STABLE_ABI", cmake)
    assert "${SKBUILD_SABI_COMPONENT}" in cmake
    assert '"-framework Metal"' in cmake  # the macOS wheel links Metal
    cbw = cfg["tool"]["cibuildwheel"]
    assert "cp312-*" in cbw["build"] and not any(b.startswith(("cp313", "cp314")) for b in cbw["build"])
    assert cbw["linux"]["manylinux-x86_64-image"] == "manylinux_2_28"
    assert "auditwheel repair" in cbw["linux"]["repair-wheel-command"]
    assert cbw["macos"]["archs"] == ["arm64"]
    # the wheel's tag and CMakeLists.txt's default deployment target are one value
    target = re.search(r"set\(CMAKE_OSX_DEPLOYMENT_TARGET ([0-9.]+)", cmake)
    assert target and cbw["macos"]["environment"]["MACOSX_DEPLOYMENT_TARGET"] == target.group(1)


@pytest.mark.host_tools
@pytest.mark.slow  # builds the whole wheel from source (minutes)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="auditwheel repairs Linux wheels")
@pytest.mark.skipif(os.environ.get("HF2Q_UNDER_SANITIZER") == "1",
                    reason="scripts/run_sanitizers.sh: the compilers would run with the ASan runtime preloaded; "
                           "the main suite builds the wheel")
def test_build_wheels_script_gives_a_manylinux_wheel(tmp_path: Path) -> None:
    bindir = Path(sysconfig.get_path("scripts"))
    if shutil.which("auditwheel", path=str(bindir)) is None and shutil.which("auditwheel") is None:
        pytest.skip("auditwheel is not installed (pip install '.[test]' installs it)")
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
           "DIST": str(tmp_path / "dist"), "WHEELHOUSE": str(tmp_path / "wheelhouse")}
    p = subprocess.run(["bash", str(ROOT / "scripts" / "build_wheels.sh"), sys.executable], capture_output=True,
                       text=True, timeout=1200, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    wheels = sorted((tmp_path / "wheelhouse").glob("hf2q-*.whl"))
    assert len(wheels) == 1, wheels
    name = wheels[0].name
    m = re.match(r"hf2q-(?P<v>[^-]+)-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>.+)\.whl$", name)
    assert m and m["v"] == hf2q.__version__, name
    assert re.fullmatch(r"manylinux_2_\d+_(x86_64|aarch64)", m["plat"].split(".")[0]), name
    if sys.version_info >= (3, 12):
        assert (m["py"], m["abi"]) == ("cp312", "abi3"), name  # one wheel for 3.12+
    else:
        tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
        assert (m["py"], m["abi"]) == (tag, tag), name
    with zipfile.ZipFile(wheels[0]) as z:
        names = z.namelist()
        lic = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert lic and z.read(lic[0]).decode().startswith("MIT License")
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in meta and "Requires-Dist: huggingface_hub" in meta
    assert "hf2q/py.typed" in names and "hf2q/_core.pyi" in names and "hf2q/hub.py" in names
    assert any(re.fullmatch(r"hf2q/_core\..*so", n) for n in names)
