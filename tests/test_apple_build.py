"""The Apple build check (scripts/check_apple_build.sh) finds planted mistakes.

The script compiles the Apple translation units for arm64-apple-macos14/15
against Apple's headers (HF2Q_APPLE_SDK, default ../shared/apple-sdk beside the
checkout). Here: the macOS 15 overlay matches metal-cpp; the clean Metal
backend compiles in every configuration; and each planted mistake in
csrc/device/metal/metal_backend.mm (a misspelt selector, a wrong argument type,
a missing @available, ...) makes the check fail with the diagnostic it should.
The whole check (every translation unit) runs in .ci/run.

Skipped when there is no SDK or no clang/cmake (the script exits 77), except
with CI=true, where the SDK and the tools must be there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_apple_build.sh"
GENERATOR = ROOT / "tests" / "apple" / "gen_sdk15_overlay.py"
OVERLAY = ROOT / "tests" / "apple" / "sdk15" / "Metal"
MM = "csrc/device/metal/metal_backend.mm"
CI = os.environ.get("CI", "").strip().lower() == "true"
INSTALL = "--install" if CI else "--no-install"  # CI may install clang/cmake/nanobind; elsewhere never

# slow (configures CMake and compiles every Apple translation unit, several times); run in every suite, CI included
pytestmark = [pytest.mark.slow, pytest.mark.host_tools]


def _sdk() -> Path | None:
    env = os.environ.get("HF2Q_APPLE_SDK")
    if env:
        return Path(env)
    default = ROOT.parent / "shared" / "apple-sdk"
    return default if default.is_dir() else None


def _skip_or_fail(reason: str) -> None:
    if CI:
        pytest.fail(f"CI=true, but {reason}")
    pytest.skip(reason)


def _run(build: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHON=sys.executable, HF2Q_APPLE_BUILD_DIR=str(build))
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build dirs of all three configurations, after the clean .mm passed in each."""
    if not sys.platform.startswith("linux") or shutil.which("bash") is None:
        pytest.skip("the Apple build check runs on Linux with bash")
    if _sdk() is None:
        _skip_or_fail("no Apple SDK (HF2Q_APPLE_SDK unset and ../shared/apple-sdk missing)")
    build = tmp_path_factory.mktemp("apple")
    proc = _run(build, INSTALL, "--only", MM)
    if proc.returncode == 77:
        reason = next((ln for ln in proc.stdout.splitlines() if ln.startswith("skipped:")), "skipped")
        _skip_or_fail(f"the Apple build check {reason}")
    assert proc.returncode == 0, f"the clean tree fails the Apple build check:\n{proc.stdout[-6000:]}"
    for cfg in ("macos14-sdk14", "macos14-sdk15", "macos15-sdk15"):
        assert re.search(rf"^{cfg}: 1/1 translation units", proc.stdout, re.M), proc.stdout[-3000:]
    return build


def test_overlay_matches_metal_cpp() -> None:
    sdk = _sdk()
    if sdk is None or not (sdk / "metal-cpp").is_dir():
        _skip_or_fail("no metal-cpp (HF2Q_APPLE_SDK unset and ../shared/apple-sdk missing)")
    proc = subprocess.run([sys.executable, str(GENERATOR), "check", str(sdk / "metal-cpp"), str(OVERLAY)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout


def test_overlay_check_detects_an_edit(tmp_path: Path) -> None:
    sdk = _sdk()
    if sdk is None or not (sdk / "metal-cpp").is_dir():
        _skip_or_fail("no metal-cpp (HF2Q_APPLE_SDK unset and ../shared/apple-sdk missing)")
    edited = tmp_path / "Metal"
    shutil.copytree(OVERLAY, edited)
    h = edited / "MTLResidencySet.h"
    h.write_text(h.read_text().replace("requestResidency", "requestResidence"))
    proc = subprocess.run([sys.executable, str(GENERATOR), "check", str(sdk / "metal-cpp"), str(edited)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 1 and "MTLResidencySet.h" in proc.stdout, proc.stdout


def test_overlay_declares_what_the_backend_uses() -> None:
    """Every residency selector metal_backend.mm sends is declared by the overlay."""
    text = "\n".join(p.read_text() for p in OVERLAY.glob("*.h"))
    for sel in ("newResidencySetWithDescriptor:", "addResidencySet:", "removeResidencySet:", "addAllocation:",
                "removeAllocation:", "removeAllAllocations", "commit", "requestResidency", "endResidency",
                "initialCapacity", "label", "mathMode", "allocatedSize", "allocationCount"):
        assert sel in text, sel
    assert "API_AVAILABLE(macos(15.0), ios(18.0))" in text


def test_clean_metal_backend_passes(configured: Path) -> None:
    # The fixture ran it; running again without configuring must also pass.
    proc = _run(configured, INSTALL, "--no-configure", "--only", MM)
    assert proc.returncode == 0, proc.stdout[-4000:]


# (what is planted, text in metal_backend.mm, replacement, configuration, diagnostic expected)
MISTAKES = [
    ("misspelt selector in a message", "[rs requestResidency]", "[rs requestResidence]",
     "macos14-sdk15", r"instance method 'requestResidence' not found|no known instance method for selector 'requestResidence'"),
    ("misspelt @selector", "@selector(newResidencySetWithDescriptor:error:)",
     "@selector(newResidencySetWithDescriptor:eror:)", "macos14-sdk15", r"undeclared selector"),
    ("wrong argument type", "[queue_ addResidencySet:rs];", "[queue_ addResidencySet:desc];",
     "macos14-sdk15", r"cannot initialize a parameter of type 'id<MTLResidencySet>"),
    ("wrong property type", "desc.initialCapacity = static_cast<NSUInteger>(initial_capacity);",
     "desc.initialCapacity = desc.label;", "macos15-sdk15", r"incompatible pointer to integer"),
    ("missing @available (residency set)",
     "if (@available(macOS 15.0, iOS 18.0, *)) {\n        id<MTLResidencySet> rs = sets_[set];\n        if (rs != nil) [rs commit];",
     "{\n        id<MTLResidencySet> rs = sets_[set];\n        if (rs != nil) [rs commit];",
     "macos14-sdk15", r"only available on macOS 15\.0 or newer|unguarded-availability"),
    ("missing @available (mathMode)",
     "if (@available(macOS 15.0, iOS 18.0, *)) {\n    opts.mathMode = MTLMathModeSafe;",
     "{\n    opts.mathMode = MTLMathModeSafe;",
     "macos14-sdk15", r"only available on macOS 15\.0 or newer|unguarded-availability"),
    ("misspelt selector outside the residency code", "[device_ newBufferWithLength:static_cast<NSUInteger>(len)",
     "[device_ newBufferWithLenght:static_cast<NSUInteger>(len)", "macos14-sdk14",
     r"no known instance method for selector 'newBufferWithLenght:options:'"),
]


@pytest.mark.parametrize("what,old,new,config,diagnostic", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_planted_mistake_fails_the_check(configured: Path, tmp_path: Path, what: str, old: str, new: str,
                                         config: str, diagnostic: str) -> None:
    source = (ROOT / MM).read_text()
    assert source.count(old) >= 1, f"the text to plant '{what}' in is no longer in {MM}: update this test"
    planted = tmp_path / "metal_backend.mm"
    planted.write_text(source.replace(old, new, 1))
    proc = _run(configured, INSTALL, "--no-configure", "--config", config, "--only", MM,
                "--replace", f"{MM}={planted}")
    assert proc.returncode == 1, f"planted {what}: the check did not fail (exit {proc.returncode}):\n{proc.stdout[-4000:]}"
    assert "FAIL" in proc.stdout and re.search(diagnostic, proc.stdout), proc.stdout[-4000:]
