"""Where the bytes of a host-to-device load come from: staged through pinned
memory (what hf2q's CUDA backend does) or copied by the GPU straight out of the
page cache, through a read-only mapping of the file registered with the driver
(``cuMemHostRegister(..., CU_MEMHOSTREGISTER_READ_ONLY)``). A probe for
issue 21's line-rate plan (docs/CUDA.md, "What limits a full-size load"): the
CPU copy from the page cache into pinned staging is what limits hf2q at full
size; a registered mapping has no CPU copy, if the driver pins page-cache pages
quickly.

    python benchmarks/bench_h2d_sources.py FILE [FILE ...] [--threads N] [--json OUT]

Cases, for the given files together (put them on tmpfs, e.g. the shards of
bench_fullscale.py's qwen-fused checkpoint in /dev/shm; page cache warm):

  pinned limit      cuMemcpyHtoDAsync of the same byte count from one 1 GiB
                    pinned buffer (no file)
  staged            N threads, each pread()s 8 MiB pieces into its own pinned
                    buffers (two, alternating) and queues their copies on its
                    stream: a plain version of hf2q's pipeline
  registered        N threads, each maps one file (PROT_READ, MAP_SHARED),
                    registers the mapping read-only, queues its copies in 64 MiB
                    pieces, waits, unregisters, unmaps; also reported: the time
                    spent in cuMemHostRegister alone

Only the driver API is used (ctypes on libcuda.so.1), so the numbers are the
driver's and the kernel's, not a framework's.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import threading
import time
from pathlib import Path

CU_MEMHOSTREGISTER_READ_ONLY = 0x08
PROT_READ, MAP_SHARED = 0x1, 0x01
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
CU_MEMHOSTALLOC_PORTABLE = 0x01
GB = 1e9
MiB = 1 << 20


class Driver:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check(self.lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev), "cuDevicePrimaryCtxRetain")
        self.bind()

    def bind(self) -> None:
        self.check(self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what}: CUDA error {rc} ({(name.value or b'?').decode()})")

    def alloc(self, n: int) -> int:
        p = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), "cuMemAlloc")
        return p.value

    def free(self, p: int) -> None:
        self.lib.cuMemFree_v2(ctypes.c_uint64(p))

    def host_alloc(self, n: int) -> int:
        p = ctypes.c_void_p()
        self.check(self.lib.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(n), CU_MEMHOSTALLOC_PORTABLE),
                   "cuMemHostAlloc")
        return p.value

    def stream(self) -> ctypes.c_void_p:
        s = ctypes.c_void_p()
        self.check(self.lib.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")  # non-blocking
        return s

    def copy(self, dst: int, src: int, n: int, stream: ctypes.c_void_p) -> None:
        self.check(self.lib.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(dst), ctypes.c_void_p(src), ctypes.c_size_t(n),
                                                 stream), "cuMemcpyHtoDAsync")

    def sync(self, stream: ctypes.c_void_p) -> None:
        self.check(self.lib.cuStreamSynchronize(stream), "cuStreamSynchronize")


def pinned_limit(d: Driver, dst: int, total: int) -> float:
    buf_n = 1 << 30
    buf = d.host_alloc(buf_n)
    s = d.stream()
    t0 = time.perf_counter()
    off = 0
    while off < total:
        n = min(buf_n, total - off)
        d.copy(dst + off, buf, n, s)
        off += n
    d.sync(s)
    return time.perf_counter() - t0


def _run_threads(n: int, fn) -> None:  # type: ignore[no-untyped-def]
    errors: list[BaseException] = []

    def wrap(i: int) -> None:
        try:
            fn(i)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    ts = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


def staged(d: Driver, dst: int, files: list[Path], threads: int) -> float:
    piece = 8 * MiB
    jobs: list[tuple[Path, int, int, int]] = []  # file, offset, length, dst offset
    at = 0
    for f in files:
        size = f.stat().st_size
        for off in range(0, size, piece):
            jobs.append((f, off, min(piece, size - off), at + off))
        at += size
    bufs = [[d.host_alloc(piece), d.host_alloc(piece)] for _ in range(threads)]
    streams = [d.stream() for _ in range(threads)]
    fds = {f: os.open(f, os.O_RDONLY) for f in files}
    lock = threading.Lock()
    nxt = [0]

    def work(i: int) -> None:
        d.bind()
        k = 0
        events = [None, None]
        while True:
            with lock:
                j = nxt[0]
                nxt[0] += 1
            if j >= len(jobs):
                break
            f, off, n, to = jobs[j]
            slot = k % 2
            if events[slot] is not None:  # the copy that used this buffer must be done
                d.check(d.lib.cuEventSynchronize(events[slot]), "cuEventSynchronize")
            else:
                ev = ctypes.c_void_p()
                d.check(d.lib.cuEventCreate(ctypes.byref(ev), 2), "cuEventCreate")  # disable timing
                events[slot] = ev
            view = (ctypes.c_char * n).from_address(bufs[i][slot])
            got = os.preadv(fds[f], [memoryview(view).cast("B")], off)
            if got != n:
                raise OSError(f"short read {got} of {n}")
            d.copy(dst + to, bufs[i][slot], n, streams[i])
            d.check(d.lib.cuEventRecord(events[slot], streams[i]), "cuEventRecord")
            k += 1
        d.sync(streams[i])

    t0 = time.perf_counter()
    _run_threads(threads, work)
    t = time.perf_counter() - t0
    for fd in fds.values():
        os.close(fd)
    return t


def registered(d: Driver, dst: int, files: list[Path], threads: int) -> tuple[float, float]:
    piece = 64 * MiB
    offsets = []
    at = 0
    for f in files:
        offsets.append(at)
        at += f.stat().st_size
    reg_s = [0.0] * len(files)
    flags_seen: set[str] = set()
    lock = threading.Lock()
    nxt = [0]

    def work(i: int) -> None:
        d.bind()
        s = d.stream()
        while True:
            with lock:
                k = nxt[0]
                nxt[0] += 1
            if k >= len(files):
                break
            f = files[k]
            size = f.stat().st_size
            fd = os.open(f, os.O_RDONLY)
            try:
                base = _libc.mmap(None, ctypes.c_size_t(size), PROT_READ, MAP_SHARED, fd, ctypes.c_long(0))
            finally:
                os.close(fd)
            if base is None or base == ctypes.c_void_p(-1).value:
                raise OSError(ctypes.get_errno(), f"mmap {f}")
            t0 = time.perf_counter()
            rc = d.lib.cuMemHostRegister_v2(ctypes.c_void_p(base), ctypes.c_size_t(size), CU_MEMHOSTREGISTER_READ_ONLY)
            if rc != 0:  # read-only registration not supported: say so, then try plain (pins for writing)
                flags_seen.add(f"READ_ONLY refused ({rc})")
                rc = d.lib.cuMemHostRegister_v2(ctypes.c_void_p(base), ctypes.c_size_t(size), 0)
            d.check(rc, f"cuMemHostRegister {f.name}")
            reg_s[k] = time.perf_counter() - t0
            for off in range(0, size, piece):
                d.copy(dst + offsets[k] + off, base + off, min(piece, size - off), s)
            d.sync(s)
            d.check(d.lib.cuMemHostUnregister(ctypes.c_void_p(base)), "cuMemHostUnregister")
            _libc.munmap(ctypes.c_void_p(base), ctypes.c_size_t(size))

    t0 = time.perf_counter()
    _run_threads(threads, work)
    t = time.perf_counter() - t0
    if flags_seen:
        print(f"registered: {', '.join(sorted(flags_seen))}", file=sys.stderr)
    return t, sum(reg_s)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 4))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--cases", default="pinned,staged,registered", help="comma-separated: pinned, staged, registered")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    wanted = {c.strip() for c in a.cases.split(",")}
    files = [f for f in a.files if f.is_file()]
    total = sum(f.stat().st_size for f in files)
    d = Driver()
    dst = d.alloc(total)
    rows = []
    cases = {
        "pinned limit": lambda: (pinned_limit(d, dst, total), None),
        "staged (pread -> pinned -> H2D)": lambda: (staged(d, dst, files, a.threads), None),
        "registered mapping (H2D from the page cache)": lambda: registered(d, dst, files, a.threads),
    }
    cases = {k: v for k, v in cases.items() if k.split()[0] in wanted}
    for name, fn in cases.items():
        best = None
        for _ in range(a.repeat + 1):  # the first is a warm-up
            try:
                t, extra = fn()
            except Exception as e:  # noqa: BLE001 - a case the machine refuses is reported
                print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
                best = None
                break
            if best is None or t < best[0]:
                best = (t, extra)
        if best is not None:
            row = {"case": name, "seconds": best[0], "GB/s": total / best[0] / GB}
            if best[1] is not None:
                row["register_s_summed_over_threads"] = best[1]
            rows.append(row)
            print(json.dumps(row), flush=True)
    lim = next((r for r in rows if r["case"] == "pinned limit"), None)
    for r in rows:
        if lim:
            r["x limit"] = lim["seconds"] / r["seconds"]
    print(f"{len(files)} files, {total / GB:.2f} GB, {a.threads} threads")
    for r in rows:
        print(f"  {r['case']:<48} {r['seconds']:7.3f} s  {r['GB/s']:6.1f} GB/s  {r.get('x limit', 0):.2f}x"
              + (f"  (register {r['register_s_summed_over_threads']:.2f} s summed)"
                 if "register_s_summed_over_threads" in r else ""))
    if a.json:
        a.json.write_text(json.dumps({"files": len(files), "bytes": total, "threads": a.threads, "rows": rows},
                                     indent=2) + "\n")


if __name__ == "__main__":
    main()
