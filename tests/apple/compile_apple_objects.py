#!/usr/bin/env python3
"""Compile every translation unit of a CMake build dir; check each object.

Used by scripts/check_apple_build.sh (test support, not part of any build).
Reads BUILD/compile_commands.json, which CMake wrote while configuring the
project for an Apple target, and runs each command exactly as CMake would,
adding -Werror to the project's own sources (third-party sources, e.g.
nanobind's, keep their own flags). Then checks that every object is a Mach-O
arm64 object (MH_OBJECT, CPU_TYPE_ARM64) built for macOS with the expected
minimum OS version (LC_BUILD_VERSION), and whether the Metal backend's object
references the residency-set selectors (it must exactly when the SDK is 15),
with the macOS 15 classes weak-linked when the deployment target is older,
and that arm_neon.cpp's object defines the NEON kernels.

Prints one line per translation unit and a summary; exit 0 when all pass,
1 when any compile or check fails, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MH_MAGIC_64 = 0xFEEDFACF
CPU_TYPE_ARM64 = 0x0100000C
MH_OBJECT = 1
LC_BUILD_VERSION = 0x32
LC_SYMTAB = 0x2
N_WEAK_REF = 0x0040
# Classes that exist only from macOS 15: below it, their references must be weak
# (else the module would not load on macOS 14: "Symbol not found").
MACOS15_CLASSES = ("_OBJC_CLASS_$_MTLResidencySetDescriptor",)
PLATFORM_MACOS = 1
RESIDENCY_SELECTORS = (b"newResidencySetWithDescriptor:error:", b"addResidencySet:", b"addAllocation:",
                       b"requestResidency", b"endResidency", b"removeAllAllocations")


def macho_info(path: Path) -> tuple[str, str | None]:
    """(problem or '', minos 'X.Y' or None) of a Mach-O object."""
    data = path.read_bytes()
    if len(data) < 32:
        return "not a Mach-O file (too short)", None
    magic, cputype, _sub, filetype, ncmds, _size, _flags, _res = struct.unpack_from("<IiiIIIII", data, 0)
    if magic != MH_MAGIC_64:
        return f"not a 64-bit Mach-O file (magic {magic:#x})", None
    if cputype != CPU_TYPE_ARM64:
        return f"not arm64 (cputype {cputype:#x})", None
    if filetype != MH_OBJECT:
        return f"not an object file (filetype {filetype})", None
    off = 32
    for _ in range(ncmds):
        cmd, cmdsize = struct.unpack_from("<II", data, off)
        if cmd == LC_BUILD_VERSION:
            platform, minos = struct.unpack_from("<II", data, off + 8)
            if platform != PLATFORM_MACOS:
                return f"built for platform {platform}, not macOS", None
            return "", f"{minos >> 16}.{(minos >> 8) & 0xFF}"
        off += cmdsize
    return "no LC_BUILD_VERSION load command", None


def symbols(path: Path, undefined: bool = True) -> dict[str, bool]:
    """External symbols of a Mach-O object, undefined (-> whether weak-referenced)
    or defined (-> False)."""
    data = path.read_bytes()
    ncmds = struct.unpack_from("<I", data, 16)[0]
    off = 32
    out: dict[str, bool] = {}
    for _ in range(ncmds):
        cmd, cmdsize = struct.unpack_from("<II", data, off)
        if cmd == LC_SYMTAB:
            symoff, nsyms, stroff, _strsize = struct.unpack_from("<IIII", data, off + 8)
            for i in range(nsyms):
                strx, ntype, _sect, desc, _value = struct.unpack_from("<IBBHQ", data, symoff + 16 * i)
                if ntype & 0x01 and ((ntype & 0x0E) == 0) == undefined:  # N_EXT; N_UNDF or defined
                    end = data.index(b"\0", stroff + strx)
                    out[data[stroff + strx:end].decode()] = bool(desc & N_WEAK_REF)
        off += cmdsize
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build_dir", type=Path)
    ap.add_argument("--root", type=Path, required=True, help="project root: sources under ROOT/csrc get -Werror")
    ap.add_argument("--minos", required=True, help="expected minimum macOS version of every object, e.g. 14.0")
    ap.add_argument("--residency", choices=("yes", "no"), required=True,
                    help="whether metal_backend.mm's object must reference the residency-set selectors")
    ap.add_argument("--only", action="append", default=[], help="compile only sources whose path ends with this")
    ap.add_argument("--replace", action="append", default=[], metavar="SRC=FILE",
                    help="compile FILE in place of the project source SRC (relative to the root)")
    ap.add_argument("--skip-third-party", action="store_true", help="compile only the sources under ROOT/csrc")
    ap.add_argument("--label", default="")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    root = args.root.resolve()
    db_path = args.build_dir / "compile_commands.json"
    try:
        entries = json.loads(db_path.read_text())
    except (OSError, ValueError) as e:
        print(f"error: cannot read {db_path}: {e}", file=sys.stderr)
        return 2
    replace = {}
    for r in args.replace:
        src, sep, file = r.partition("=")
        if not sep:
            print(f"error: --replace needs SRC=FILE, got '{r}'", file=sys.stderr)
            return 2
        replace[str((root / src).resolve())] = str(Path(file).resolve())
    ours_dir = str(root / "csrc") + os.sep
    if args.skip_third_party:
        entries = [e for e in entries if str(Path(e["file"]).resolve()).startswith(ours_dir)]
    if args.only:
        entries = [e for e in entries if any(e["file"].endswith(o) for o in args.only)]
    if not entries:
        print("error: no translation unit selected", file=sys.stderr)
        return 2
    if not any(e["file"].endswith(".mm") for e in entries) and not args.only:
        print("error: no Objective-C++ translation unit: CMake did not take its APPLE branch", file=sys.stderr)
        return 2

    def run(e: dict) -> tuple[dict, bool, int, str, str, float]:
        argv = shlex.split(e["command"]) if "command" in e else list(e["arguments"])
        src = str(Path(e["file"]).resolve())
        ours = src.startswith(ours_dir)  # the project's sources (not nanobind's)
        if src in replace:
            argv = [replace[src] if a == e["file"] else a for a in argv]
        if ours:
            argv.append("-Werror")
        out = argv[argv.index("-o") + 1]
        out_path = Path(e["directory"]) / out
        out_path.parent.mkdir(parents=True, exist_ok=True)
        if out_path.exists():
            out_path.unlink()
        t0 = time.monotonic()
        p = subprocess.run(argv, cwd=e["directory"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return e, ours, p.returncode, p.stdout, str(out_path), time.monotonic() - t0

    failed = 0
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(run, entries))
    for e, ours, rc, output, obj, secs in results:
        name = os.path.relpath(e["file"], root) if e["file"].startswith(str(root)) else e["file"]
        problem = ""
        if rc != 0:
            problem = f"compile failed (exit {rc})"
        elif output.strip() and ours:
            problem = "diagnostics printed"
        else:
            bad, minos = macho_info(Path(obj))
            if bad:
                problem = bad
            elif minos != args.minos:
                problem = f"minimum macOS {minos}, expected {args.minos}"
            elif e["file"].endswith("arm_neon.cpp"):
                if not any("4neon" in name for name in symbols(Path(obj), undefined=False)):
                    problem = "the NEON kernels compiled out (no hf2q::kernels::neon symbol defined)"
            elif e["file"].endswith("metal_backend.mm"):
                data = Path(obj).read_bytes()
                missing = [s.decode() for s in RESIDENCY_SELECTORS if s not in data]
                if args.residency == "yes" and missing:
                    problem = f"residency-set code not compiled (selectors missing: {', '.join(missing)})"
                elif args.residency == "yes":
                    syms = symbols(Path(obj))
                    below15 = tuple(int(x) for x in args.minos.split(".")) < (15, 0)
                    for sym in MACOS15_CLASSES:
                        if sym not in syms:
                            problem = f"{sym} is not referenced"
                        elif below15 and not syms[sym]:
                            problem = f"{sym} is not weak-linked: the module would not load below macOS 15"
                if args.residency == "no" and len(missing) != len(RESIDENCY_SELECTORS):
                    problem = "residency-set selectors present although the SDK has no residency sets"
        status = "ok" if not problem else "FAIL: " + problem
        print(f"  [{args.label}] {name}: {status} ({secs:.1f} s)")
        if problem:
            failed += 1
            if output.strip():
                print("\n".join("      " + line for line in output.rstrip().splitlines()[-60:]))
    n = len(results)
    print(f"{args.label}: {n - failed}/{n} translation units -> Mach-O arm64 objects, macOS {args.minos}, "
          f"residency sets {'compiled' if args.residency == 'yes' else 'compiled out'}"
          f"{'' if not failed else f', {failed} FAILED'} ({time.monotonic() - t0:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
