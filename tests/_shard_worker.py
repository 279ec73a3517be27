"""One rank of a sharded load, run in its own process by tests/test_shard.py
(plain multiprocessing, or torch.distributed with the gloo backend).

Every byte the loader reads from a checkpoint file goes through one of four
calls (docs/SHARDING.md, "Counting reads"): the device's batched and
segmented file writes, and the safetensors file's ``read_slice_into`` /
``read_array``. The counter wraps those four in this process only and sums
the bytes they ask for."""

from __future__ import annotations

import os
from typing import Any


_COUNTER: list[int] = []
_ORIGINALS: dict[tuple[type, str], Any] = {}


def remove_read_counter() -> None:
    """Put the four calls back (a test that counts in the pytest process)."""
    for (cls, name), fn in _ORIGINALS.items():
        setattr(cls, name, fn)
    _ORIGINALS.clear()
    _COUNTER.clear()


def install_read_counter() -> list[int]:
    """Wrap the four read paths (once per process) and zero the count; the
    returned one-cell list holds the bytes read since."""
    if _COUNTER:
        _COUNTER[0] = 0
        return _COUNTER
    from hf2q import device as device_mod
    from hf2q import safetensors as st

    _COUNTER.append(0)
    total = _COUNTER
    Device, File = device_mod.Device, st.SafetensorsFile
    batch, segments = Device._finish_file_batch, Device.write_from_file_segments
    read_slice, read_array = File.read_slice_into, File.read_array

    def counted_batch(self, prepared):  # type: ignore[no-untyped-def]
        # every batch of file jobs ends here (write_from_file_batch, or a loader's prepared batch, queued or not)
        total[0] += sum(n for job in prepared.planned for _, _, n in job[2])
        return batch(self, prepared)

    def counted_segments(self, buf, file, segs, *a, **kw):  # type: ignore[no-untyped-def]
        total[0] += sum(n for _, _, n in segs)
        return segments(self, buf, file, segs, *a, **kw)

    def counted_slice(self, name, start, out):  # type: ignore[no-untyped-def]
        n = getattr(out, "nbytes", None)  # numpy (bf16 / f8 included: memoryview refuses those)
        total[0] += int(n) if n is not None else memoryview(out).nbytes
        return read_slice(self, name, start, out)

    def counted_array(self, name):  # type: ignore[no-untyped-def]
        total[0] += self[name].nbytes
        return read_array(self, name)

    _ORIGINALS.update({(Device, "_finish_file_batch"): batch, (Device, "write_from_file_segments"): segments,
                       (File, "read_slice_into"): read_slice, (File, "read_array"): read_array})
    Device._finish_file_batch = counted_batch  # type: ignore[method-assign]
    Device.write_from_file_segments = counted_segments  # type: ignore[method-assign]
    File.read_slice_into = counted_slice  # type: ignore[method-assign]
    File.read_array = counted_array  # type: ignore[method-assign]
    return total


def load_rank(path: str, family: str, options: dict[str, Any], rank: int, world: int, mode: str,
              device: str = "host") -> tuple[dict[str, tuple[str, tuple[int, ...], bytes]], int]:
    """Load rank ``rank`` of ``world``: {name: (dtype, shape, bytes)} and the bytes read."""
    import hf2q

    counter = install_read_counter()
    model: Any = hf2q.load(path, hf2q.Device(device), family=family, progress=False,
                           shard=hf2q.Shard(rank, world, mode), **options)  # type: ignore[arg-type]
    out = {n: (b.dtype, tuple(b.shape), b.to_host().tobytes()) for n, b in model.buffers_by_name().items()}
    return out, counter[0]


def run_cases(rank: int, world: int, cases: list[tuple[str, str, dict[str, Any], str]], device: str = "host"
              ) -> list[tuple[dict[str, tuple[str, tuple[int, ...], bytes]], int]]:
    """Every case as rank ``rank``: one process loads all cases in turn."""
    return [load_rank(p, fam, opts, rank, world, mode, device) for p, fam, opts, mode in cases]


def mp_main(rank: int, world: int, cases: list, queue: Any, device: str = "host") -> None:
    """multiprocessing entry: results (or the error's text) on ``queue``."""
    try:
        queue.put((rank, run_cases(rank, world, cases, device)))
    except BaseException as e:  # the parent reports it
        queue.put((rank, f"{type(e).__name__}: {e}"))


def gloo_main(rank: int, world: int, port: int, cases: list, queue: Any) -> None:
    """torch.distributed entry: the rank and world come from the gloo group
    (:meth:`hf2q.Shard.from_torch_distributed`), not from the arguments."""
    try:
        import torch.distributed as dist

        import hf2q

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        try:
            results = []
            for path, fam, opts, mode in cases:
                shard = hf2q.Shard.from_torch_distributed(mode)
                assert (shard.rank, shard.world) == (rank, world)
                counter = install_read_counter()
                model: Any = hf2q.load(path, hf2q.Device("host"), family=fam, progress=False, shard=shard, **opts)
                out = {n: (b.dtype, tuple(b.shape), b.to_host().tobytes()) for n, b in model.buffers_by_name().items()}
                results.append((out, counter[0]))
            dist.barrier()
        finally:
            dist.destroy_process_group()
        queue.put((rank, results))
    except BaseException as e:
        queue.put((rank, f"{type(e).__name__}: {e}"))
