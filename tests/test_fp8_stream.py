"""Block-scaled FP8 weights decoded as they are read (a scaled job of
Device.write_from_file_batch: the path a GPU takes inside its staging
pipeline, run here by the host backend's kernels): the bytes equal the CPU
decoder's for any cut of the stack into row segments, a non-finite product is
reported at its buffer element, and every malformed job is refused before a
byte is read (docs/FP8.md)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import hf2q
from _helpers import why_no_cuda
from hf2q import formats, ops
from hf2q.errors import DeviceError

_NO_CUDA = why_no_cuda()
# The host backend runs the CPU decoder by rows; CUDA decodes each staged chunk of the pipeline
# ("cuda-wide": with the 64-bit index arithmetic its kernels use where an index passes 32 bits).
_CUDA = [pytest.mark.cuda, pytest.mark.skipif(bool(_NO_CUDA), reason=f"no CUDA device: {_NO_CUDA}")]
DEVICES = ["host", pytest.param("cuda", marks=_CUDA), pytest.param("cuda-wide", marks=_CUDA)]


def _device(kind: str, monkeypatch: pytest.MonkeyPatch) -> hf2q.Device:
    if kind == "cuda-wide":
        monkeypatch.setenv("HF2Q_CUDA_WIDE_INDEX", "1")  # read when the backend is made
        return hf2q.Device._isolated("cuda")
    return hf2q.Device._isolated(kind)
FMT = {"f8_e4m3": ml_dtypes.float8_e4m3fn, "f8_e5m2": ml_dtypes.float8_e5m2}


def _stack(rng: np.random.Generator, fmt: str, lead: int, rows: int, cols: int) -> np.ndarray:
    w = rng.integers(0, 256, (lead, rows, cols), dtype=np.uint8)
    nan = (w & 0x7F) == 0x7F if fmt == "f8_e4m3" else (w & 0x7C) == 0x7C  # no NaN / Inf encodings
    w[nan] = 0x21
    return w


def _grid(rng: np.random.Generator, lead: int, rows: int, cols: int, block: tuple[int, int]) -> np.ndarray:
    sr, sc = -(-rows // block[0]), -(-cols // block[1])
    return (rng.random((lead, sr, sc), dtype=np.float32) * 1e-2 + 1e-4).astype(np.float32)


def _file(tmp_path: Path, w: np.ndarray, junk: int = 13) -> tuple[Path, int]:
    """The stack's bytes in a file after ``junk`` bytes (file offsets are not aligned)."""
    path = tmp_path / "w.bin"
    path.write_bytes(b"\x55" * junk + w.tobytes())
    return path, junk


def _job(dev: hf2q.Device, buf: Any, path: Path, segs: list[tuple[int, int, int]], fmt: str, sbuf: Any,
         rows: int, cols: int, block: tuple[int, int], base: int) -> list[tuple[int, int]]:
    return dev.write_from_file_batch([(buf, path, segs, fmt, "w", (sbuf, rows, cols, block[0], block[1], base))])


def _cuts(rows_total: int, cuts: list[int]) -> list[tuple[int, int]]:
    edges = [0, *cuts, rows_total]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", sorted(FMT))
@pytest.mark.parametrize("to", ["f32", "bf16", "f16", "q8_0"])
@pytest.mark.parametrize("geometry", [
    # lead, rows, cols, block, row cuts, segments in stack order?, matrices before the stack
    (3, 40, 64, (32, 24), [7, 40, 41, 100], False, 1),  # partial edge blocks, cuts inside and across matrices
    (2, 256, 512, (128, 128), [256], False, 0),         # a segment of several pieces (the host's row chunks)
    (2, 1536, 1024, (128, 128), [100], True, 0),        # a segment of several staged chunks on a GPU
    (4, 3, 96, (1, 96), [1, 2, 9], True, 2),            # per-channel scales; small segments gathered in one chunk
])
def test_streamed_decode_equals_the_cpu_decoder(tmp_path, monkeypatch, device, fmt, to, geometry) -> None:
    lead, rows, cols, block, cuts, ordered, before = geometry
    rng = np.random.default_rng(lead * rows + cols)
    w = _stack(rng, fmt, lead, rows, cols)
    s = _grid(rng, lead, rows, cols, block)
    want, _ = ops.dequantize_fp8(w.view(FMT[fmt]), s, block, to=to)
    path, junk = _file(tmp_path, w)
    dev = _device(device, monkeypatch)
    total = before + lead + 1  # a matrix after the stack stays untouched too
    buf = dev.alloc((total, rows, cols), to)
    sbuf = dev.upload(s.reshape(-1))
    base = before * rows * cols
    segs = [(base + a * cols, junk + a * cols, (b - a) * cols) for a, b in _cuts(lead * rows, cuts)]
    if not ordered:
        segs = segs[1::2] + segs[0::2]
    results = _job(dev, buf, path, segs, fmt, sbuf, rows, cols, block, base)
    assert results == [(-1, 0)]
    got = np.ascontiguousarray(buf.to_host()).reshape(-1).view(np.uint8)
    one = formats.nbytes((rows, cols), to)
    assert got[before * one:(before + lead) * one].tobytes() == want.view(np.uint8).tobytes()
    assert not got[:before * one].any() and not got[(before + lead) * one:].any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("to", ["f32", "q8_0"])
def test_a_non_finite_product_is_reported_at_its_buffer_element(tmp_path, monkeypatch, device, to) -> None:
    rng = np.random.default_rng(3)
    lead, rows, cols, block = 2, 8, 64, (4, 32)
    w = _stack(rng, "f8_e4m3", lead, rows, cols)
    w[1, 5, 33] = 0x7F  # E4M3 NaN: stack element 1 * 512 + 5 * 64 + 33
    w[1, 6, 2] = 0xFF
    s = _grid(rng, lead, rows, cols, block)
    path, junk = _file(tmp_path, w)
    dev = _device(device, monkeypatch)
    buf = dev.alloc((3, rows, cols), to)
    base = rows * cols
    segs = [(base + r * cols, junk + r * cols, cols) for r in range(lead * rows)]
    [(bad, inf)] = _job(dev, buf, path, segs, "f8_e4m3", dev.upload(s.reshape(-1)), rows, cols, block, base)
    assert bad == base + 1 * rows * cols + 5 * cols + 33 and inf == 0
    s[0, 0, 0] = np.inf  # an infinite scale makes every product of its block non-finite (or NaN for 0)
    [(bad, _)] = _job(dev, dev.alloc((3, rows, cols), to), path, segs[:rows], "f8_e4m3", dev.upload(s.reshape(-1)),
                      rows, cols, block, base)
    assert bad == base


@pytest.mark.parametrize("device", DEVICES)
def test_overflowing_q8_0_scales_are_counted(tmp_path, monkeypatch, device) -> None:
    lead, rows, cols, block = 1, 2, 64, (1, 64)
    w = np.full((lead, rows, cols), 0x7E, dtype=np.uint8)  # E4M3 448
    s = np.array([[[1e30], [1.0]]], dtype=np.float32)  # 448e30 / 127 overflows float16
    path, junk = _file(tmp_path, w)
    dev = _device(device, monkeypatch)
    buf = dev.alloc((rows, cols), "q8_0")
    [(bad, inf)] = _job(dev, buf, path, [(0, junk, rows * cols)], "f8_e4m3", dev.upload(s.reshape(-1)), rows, cols,
                        block, 0)
    assert bad == -1 and inf == 2  # the first row's two blocks


def _refused(tmp_path: Path, **change: Any) -> str:
    """The error a malformed scaled job raises (nothing written)."""
    rng = np.random.default_rng(1)
    lead, rows, cols, block = 2, 8, 64, (4, 32)
    w = _stack(rng, "f8_e4m3", lead, rows, cols)
    path, junk = _file(tmp_path, w)
    dev = hf2q.Device._isolated("host")
    job = dict(to="f32", shape=(3, rows, cols), scale=_grid(rng, lead, rows, cols, block).reshape(-1), fmt="f8_e4m3",
               rows=rows, cols=cols, block=block, base=rows * cols,
               segs=[(rows * cols, junk, lead * rows * cols)])
    job.update(change)
    buf = dev.alloc(job["shape"], job["to"])
    sbuf = job.pop("sbuf", None) or dev.upload(job["scale"])
    if sbuf == "self":
        sbuf = buf
    with pytest.raises((ValueError, DeviceError, TypeError)) as e:
        _job(dev, buf, path, job["segs"], job["fmt"], sbuf, job["rows"], job["cols"], job["block"], job["base"])
    assert not np.ascontiguousarray(buf.to_host()).view(np.uint8).any()
    return str(e.value)


@pytest.mark.parametrize("change, message", [
    (dict(scale=np.zeros(16, np.float16)), "scale buffer must be f32"),
    (dict(block=(0, 32)), "no zero dimension"),
    (dict(to="f8_e4m3"), "decodes into f32, bf16, f16 or q8_0"),
    (dict(fmt="bf16"), "f8_e4m3 or f8_e5m2"),
    (dict(to="q8_0", cols=48, rows=32, block=(16, 16), scale=np.ones(12, np.float32)), "whole blocks of 32"),
    (dict(segs=[(8 * 64 + 5, 13, 64)]), "whole rows"),
    (dict(segs=[(8 * 64, 13, 100)]), "whole rows"),
    (dict(segs=[(0, 13, 64)]), "outside the stack"),  # before the stack's base
    (dict(scale=np.ones(4, np.float32), segs=[(2 * 8 * 64, 13 + 8 * 64, 64)]), "outside the stack"),  # no grid
    (dict(segs=[(2 * 8 * 64, 13, 2 * 8 * 64)]), "outside the stack"),  # past the buffer's end
    (dict(rows=1 << 40, cols=1 << 40), "overflow"),
    (dict(segs=[(8 * 64, (1 << 63) - 8, 64)]), "file range overflows"),
    (dict(sbuf="self"), "scale buffer is written by the same call"),
    (dict(scale=np.ones(4 * 2 + 1, np.float32)), "not a whole number of 4-value grids"),
])
def test_a_malformed_scaled_job_is_refused(tmp_path, change, message) -> None:
    assert message in _refused(tmp_path, **change)


def test_a_scale_buffer_another_job_writes_is_refused(tmp_path) -> None:
    # The scales are read while the call's jobs write: a job of the same call may not write them.
    rng = np.random.default_rng(2)
    w = _stack(rng, "f8_e4m3", 1, 8, 64)
    path, junk = _file(tmp_path, w)
    dev = hf2q.Device._isolated("host")
    buf, sbuf = dev.alloc((8, 64), "f32"), dev.alloc((4,), "f32")
    jobs = [(buf, path, [(0, junk, 512)], "f8_e4m3", "w", (sbuf, 8, 64, 4, 32, 0)),
            (sbuf, path, [(0, junk, 4)], "f8_e4m3", "s")]
    with pytest.raises(ValueError, match="scale buffer is written by the same call"):
        dev.write_from_file_batch(jobs)
    assert not np.ascontiguousarray(buf.to_host()).view(np.uint8).any()


def test_a_scale_buffer_of_another_device_is_refused(tmp_path) -> None:
    other = hf2q.Device._isolated("host").upload(np.ones(8, np.float32))
    assert "belongs to the host device, not to this host device" in _refused(tmp_path, sbuf=other)


# The CUDA decoders emulated on the CPU (tests/native/cuda_kquants_emu.cpp: one CTA of 256
# threads, the warp shuffle an exchange among 32 of them), so that CI without a GPU checks the
# kernels the staging pipeline runs on each chunk: their bytes, the first non-finite index, the
# overflow count; both index widths.
@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from _helpers import build_cuda_emulator

    out = build_cuda_emulator(tmp_path_factory.mktemp("cuda_emu"))
    if out is None:
        pytest.skip("no C++ compiler")
    return out


@pytest.mark.host_tools
@pytest.mark.parametrize("wide", [0, 1])
@pytest.mark.parametrize("geometry", [
    # lead, rows, cols, block, the chunk's first and last stack rows
    (3, 40, 64, (32, 24), 7, 100),       # a chunk from mid-matrix across two matrices, partial edge blocks
    (2, 130, 256, (128, 128), 0, 260),   # the whole stack, one scale per lane
    (1, 33, 160, (5, 48), 3, 33),        # a Q8_0 block across two scale blocks
    (2, 9, 70, (4, 6), 5, 18),           # rows no multiple of 4 (no Q8_0): edges among a thread's four
])
def test_cuda_fp8_kernels_emulated_on_the_cpu(emulator: Path, tmp_path: Path, wide: int, geometry) -> None:
    import subprocess

    lead, rows, cols, block, r0, r1 = geometry
    rng = np.random.default_rng(rows * cols + r0)
    for fmt, code in (("f8_e4m3", "f8_e4m3"), ("f8_e5m2", "f8_e5m2")):
        w = _stack(rng, fmt, lead, rows, cols)
        if fmt == "f8_e4m3":  # one NaN in the chunk: its stack index is reported
            nan_at = (r0 + 1) * cols + 5
            w.reshape(-1)[nan_at] = 0x7F
        s = _grid(rng, lead, rows, cols, block)
        chunk = w.reshape(-1)[r0 * cols:r1 * cols]
        chunk.tofile(tmp_path / "w.u8")
        s.reshape(-1).tofile(tmp_path / "s.f32")
        subprocess.run([str(emulator), "fp8", str(tmp_path / "w.u8"), str(tmp_path / "s.f32"), str(rows), str(cols),
                        str(block[0]), str(block[1]), str(r0 * cols), str(wide), str(tmp_path / "out")], check=True,
                       capture_output=True)
        for to in ("f32", "bf16", "f16", "q8_0"):
            if to == "q8_0" and cols % 32:
                continue
            src = w
            if to == "q8_0" and fmt == "f8_e4m3":  # the CPU's quantizer refuses the NaN: its block is left out below
                src = w.copy()
                src.reshape(-1)[nan_at] = 0x21
            want, _ = ops.dequantize_fp8(src.view(FMT[fmt]), s, block, to=to)
            one_row = formats.nbytes((1, cols), to)
            got = np.fromfile(tmp_path / f"out.{code}.{to}", dtype=np.uint8)
            bad, inf = np.fromfile(tmp_path / f"out.{code}.{to}.status", dtype=np.uint64).tolist()
            want_bytes = want.view(np.uint8).reshape(-1)[r0 * one_row:r1 * one_row]
            if fmt == "f8_e4m3":
                assert bad == nan_at, (to, bad, nan_at)
                if to == "q8_0":  # the NaN's block is unwritten (the load fails): the others must match
                    blk = nan_at // 32 - r0 * cols // 32
                    keep = np.ones(len(want_bytes) // 34, bool)
                    keep[blk] = False
                    assert np.array_equal(got.reshape(-1, 34)[keep], want_bytes.reshape(-1, 34)[keep]), to
                    continue
            else:
                assert bad == (1 << 64) - 1 and inf == 0, (to, bad)
            assert got.tobytes() == want_bytes.tobytes(), (fmt, to)


def test_a_stack_read_from_two_files_names_its_first_nan(monkeypatch, tmp_path) -> None:
    # An expert stack whose experts lie in two shards is two scaled jobs (one per file): their
    # results combine to the stack's first non-finite product, named by its expert and own index.
    from hf2q import loader, qwen35
    from hf2q.errors import NonFiniteError
    from hf2q.safetensors import open_checkpoint
    from hf2q.testing import make_qwen35_moe_checkpoint

    d = make_qwen35_moe_checkpoint(tmp_path / "ck", "tiny", seed=1, fp8_block=(32, 32), sharded=True)
    with open_checkpoint(d) as ck:
        stacks: dict[str, list[str]] = {}
        for n in ck.keys():
            if ".mlp.experts." in n and n.endswith("_proj.weight") and ck[n].dtype == "F8_E4M3":
                head, tail = n.split(".mlp.experts.")
                stacks.setdefault(head + tail.split(".", 1)[1], []).append(n)
        split = [v for v in stacks.values() if len({ck[n].path for n in v}) == 2]
        assert split  # a stack spanning two shards: two jobs
        names = sorted(split[0], key=lambda n: int(n.split(".mlp.experts.")[1].split(".")[0]))
        where = {n: (ck[n].path, ck[n].offset) for n in names}
    files = [where[n][0] for n in names]
    later = [n for n in names if files[names.index(n)] != files[0]]

    def poison(name: str, at: int) -> None:
        path, offset = where[name]
        with open(path, "r+b") as f:
            f.seek(offset + at)
            f.write(b"\x7f")  # E4M3 NaN

    monkeypatch.setattr(loader, "_SCALED_ON_DEVICE", True)
    poison(later[-1], 70)  # only in the second file's job
    with pytest.raises(NonFiniteError) as e:
        qwen35.load(d, device=hf2q.Device._isolated("host"), expert_dtype="q8_0", progress=False)
    assert (e.value.tensor, e.value.index) == (later[-1], 70)
    poison(names[0], 9)  # and in the first file's: the earlier expert is named
    with pytest.raises(NonFiniteError) as e:
        qwen35.load(d, device=hf2q.Device._isolated("host"), expert_dtype="q8_0", progress=False)
    assert (e.value.tensor, e.value.index) == (names[0], 9)
