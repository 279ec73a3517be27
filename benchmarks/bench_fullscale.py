"""Full-size loads: whole checkpoints at real shapes and Hub layouts, hf2q
against the fastest peers and against the pinned host-to-device copy rate
that bounds them all.

    python benchmarks/bench_fullscale.py --dir /dev/shm/hf2q-full [--device cuda|host]
        [--cases qwen-fused,qwen-experts,gemma4,dense] [--layers N] [--repeat 3]
        [--json FILE] [--markdown FILE] [--keep]

Checkpoints (synthetic, written into --dir once and reused; tmpfs such as
/dev/shm on the GPU machine, so that the page cache is not the question):

  qwen-fused    Qwen3.6-35B-A3B, experts fused as the BF16 Hub repo stores
                them (experts.gate_up_proj [256, 1024, 2048], experts.down_proj)
  qwen-experts  the same model, one tensor per expert (the FP8 repos' and older
                layouts: 32,118 tensors)
  gemma4        gemma-4-26B-A4B (Gemma4ForConditionalGeneration names, fused
                experts)
  dense         a 32.8B dense model (Qwen2.5-32B shapes, Llama names) that
                hf2q loads through the generic family (no config.json)

Files are cut into ~5 GB shards with a model.safetensors.index.json, as the
Hub stores them. Values come from one random pool of BF16 bits tiled over the
file (finite for every float dtype a tensor has), written by a pool of
threads with pwrite: a 71 GB checkpoint takes about a minute on 16 cores.

Cases, each the best of --repeat runs after one warm-up, in one process
(memory of the previous run freed first):

  hf2q            the family's defaults (experts -> Q8_0, dense -> F32;
                  generic: dtype "keep", and also dtype "q8_0")
  hf2q keep       bytes kept: expert_dtype = dense_dtype = "bf16" (generic "keep")
  instanttensor   instanttensor.safe_open(all_files, framework="pt", device=0),
                  every tensor (CUDA only, where it imports)
  st.load_file    safetensors.torch.load_file(f, device="cuda") per file
                  (host: safetensors.numpy.load_file)
  fastsafetensors fastsafe_open(files, device="cuda:N", nogds=True) + get_tensor
                  (CUDA only, where it imports)
  limit           CUDA: a pinned host-to-device copy of the same byte count
                  (1 GiB pinned buffer, copied over the whole device range);
                  host: a plain read of every file into fresh memory
  bus             CUDA: the same copy into device memory it wrote just before
                  (the limit's first write into memory the process freed and
                  allocated again is slower, as is every warm load's; the
                  ratios are to the limit, measured as the loads are)

Reported per case: seconds, GB/s of checkpoint data bytes, the ratio to the
limit's rate, the peak host RSS during the load (VmRSS sampled every 2 ms,
and its growth over the RSS before the load), the peak GPU memory in use
during the load (cuMemGetInfo sampled every 2 ms, over the use before it)
beside the resident bytes of the loaded model.

Targets (issue 21; CUDA, one H200, tmpfs, warm): qwen-fused hf2q (experts ->
Q8_0) faster than instanttensor and >= 0.9x the limit; qwen-experts,
gemma4 and dense >= 0.8x; peak host RSS <= staging ring + 512 MiB; GPU
memory <= resident + 1 GiB.

``--layers N`` writes N layers of each model (the real shapes, real vocab
unless ``--vocab``), ``--experts E`` fewer experts, ``--dense-shrink K`` a
dense model K times narrower: small sizes for the CI machine and the host
backend (tests/test_bench_fullscale.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table  # noqa: E402

import hf2q  # noqa: E402

GB = 1e9
MiB = 1 << 20
SHARD_BYTES = 5 * 10**9  # the Hub's default max_shard_size
POOL_BYTES = 64 * MiB  # tiled random pool (a multiple of every element size)
WRITE_CHUNK = 64 * MiB
CASES = ("qwen-fused", "qwen-experts", "gemma4", "dense")
#: Run only when named: the fused model in the text-only layout
#: (Qwen3_5MoeForCausalLM, ``model.layers.*``, no vision or MTP tensors), which
#: transformers' from_pretrained fills completely (benchmarks/bench_handoff.py --full).
EXTRA_CASES = ("qwen-text",)

# A 32.8B dense model at Qwen2.5-32B's shapes (64 layers, 5120 hidden, 27648
# intermediate, 40 heads of 128, 8 KV heads, 152064 tokens).
DENSE = {"hidden": 5120, "intermediate": 27648, "layers": 64, "heads": 40, "kv_heads": 8, "head_dim": 128,
         "vocab": 152064}


# --------------------------------------------------------------------------- checkpoints
def _qwen_specs(layers: int | None, vocab: int | None, experts: int | None, fused: bool, multimodal: bool = True
                ) -> tuple[dict[str, Any], dict[str, tuple[str, tuple[int, ...]]]]:
    from hf2q.testing.qwen35_checkpoint import QWEN36_35B_A3B_TEXT_CONFIG, checkpoint_tensor_specs, qwen35_config_dict

    text = dict(QWEN36_35B_A3B_TEXT_CONFIG)
    if layers is not None:
        text["num_hidden_layers"] = layers
        text["layer_types"] = text["layer_types"][:layers]
        if layers < 4:  # keep one full-attention layer among few
            text["layer_types"] = ["linear_attention"] * (layers - 1) + ["full_attention"]
            text["full_attention_interval"] = layers
    if vocab is not None:
        text["vocab_size"] = vocab
    if experts is not None:
        text["num_experts"] = experts
        text["num_experts_per_tok"] = min(text["num_experts_per_tok"], experts)
    specs = checkpoint_tensor_specs(text, fused_gate_up=fused, multimodal=multimodal, mtp=multimodal)
    return qwen35_config_dict(text, multimodal=multimodal), specs


def _gemma4_specs(layers: int | None, vocab: int | None, experts: int | None
                  ) -> tuple[dict[str, Any], dict[str, tuple[str, tuple[int, ...]]]]:
    from hf2q.testing.gemma4_checkpoint import GEMMA4_26B_A4B_TEXT_CONFIG, gemma4_config_dict, gemma4_tensor_shapes

    text = dict(GEMMA4_26B_A4B_TEXT_CONFIG)
    if layers is not None:
        text["num_hidden_layers"] = layers
        text["layer_types"] = (["sliding_attention"] * (layers - 1) + ["full_attention"]) if layers < 6 \
            else text["layer_types"][:layers]
    if vocab is not None:
        text["vocab_size"] = vocab
    if experts is not None:
        text["num_experts"] = experts
        text["top_k_experts"] = min(text["top_k_experts"], experts)
    shapes = gemma4_tensor_shapes(text, wrapper=True)
    return gemma4_config_dict(text, wrapper=True), {n: ("BF16", s) for n, s in shapes.items()}


def _dense_specs(layers: int | None, vocab: int | None, shrink: int = 1) -> dict[str, tuple[str, tuple[int, ...]]]:
    d = dict(DENSE)
    for k in ("hidden", "intermediate", "heads", "kv_heads"):
        d[k] = max(1, d[k] // shrink)
    if layers is not None:
        d["layers"] = layers
    if vocab is not None:
        d["vocab"] = vocab
    H, I, V, hd = d["hidden"], d["intermediate"], d["vocab"], d["head_dim"]
    q, kv = d["heads"] * hd, d["kv_heads"] * hd
    out: dict[str, tuple[str, tuple[int, ...]]] = {"model.embed_tokens.weight": ("BF16", (V, H))}
    for i in range(d["layers"]):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": ("BF16", (H,)),
            p + "post_attention_layernorm.weight": ("BF16", (H,)),
            p + "self_attn.q_proj.weight": ("BF16", (q, H)), p + "self_attn.q_proj.bias": ("BF16", (q,)),
            p + "self_attn.k_proj.weight": ("BF16", (kv, H)), p + "self_attn.k_proj.bias": ("BF16", (kv,)),
            p + "self_attn.v_proj.weight": ("BF16", (kv, H)), p + "self_attn.v_proj.bias": ("BF16", (kv,)),
            p + "self_attn.o_proj.weight": ("BF16", (H, q)),
            p + "mlp.gate_proj.weight": ("BF16", (I, H)),
            p + "mlp.up_proj.weight": ("BF16", (I, H)),
            p + "mlp.down_proj.weight": ("BF16", (H, I)),
        })
    out["model.norm.weight"] = ("BF16", (H,))
    out["lm_head.weight"] = ("BF16", (V, H))
    return out


def case_specs(case: str, layers: int | None, vocab: int | None, experts: int | None, dense_shrink: int = 1
               ) -> tuple[dict[str, Any] | None, dict[str, tuple[str, tuple[int, ...]]]]:
    """(config.json or None, name -> (safetensors dtype, shape)) of a case."""
    if case in ("qwen-fused", "qwen-experts"):
        return _qwen_specs(layers, vocab, experts, fused=case == "qwen-fused")
    if case == "qwen-text":
        return _qwen_specs(layers, vocab, experts, fused=True, multimodal=False)
    if case == "gemma4":
        return _gemma4_specs(layers, vocab, experts)
    if case == "dense":
        return None, _dense_specs(layers, vocab, dense_shrink)
    raise ValueError(f"unknown case {case!r}; expected one of {', '.join(CASES + EXTRA_CASES)}")


_ITEMSIZE = {"F8_E4M3": 1, "BF16": 2, "F16": 2, "F32": 4}
#: A spec: (safetensors dtype, shape), or (dtype, shape, key of the byte pool its values come from).
Spec = tuple[Any, ...]


def _shards(specs: dict[str, Spec]) -> list[list[str]]:
    """Tensor names per shard, in the order the Hub's writer fills them (the
    names in order, a new shard once the next tensor would pass SHARD_BYTES)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name in sorted(specs, key=_natural):
        dt, shape = specs[name][:2]
        n = _ITEMSIZE[dt] * int(np.prod(shape, dtype=np.int64))
        if shards[-1] and size + n > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def _natural(name: str) -> tuple[Any, ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in name.split("."))


def _pool() -> np.ndarray:
    """POOL_BYTES of BF16 bits of normal(0, 0.02) values: read as BF16, F16
    or F32 (two BF16 words) every element is finite."""
    rng = np.random.default_rng(21)
    f = rng.standard_normal(POOL_BYTES // 2, dtype=np.float32) * np.float32(0.02)
    bits = (f.view(np.uint32) >> 16).astype(np.uint16)  # truncation: finite, small
    return bits.view(np.uint8)


def write_checkpoint(d: Path, config: dict[str, Any] | None, specs: dict[str, Spec], threads: int, *,
                     pools: dict[str, np.ndarray] | None = None, always_index: bool = False) -> float:
    """Write the checkpoint (shards, index, then config.json: a folder with a
    config.json is finished) into ``d``; returns seconds. ``pools``: key ->
    byte pool for specs that name one (default: one pool of BF16 bits, finite
    read as any float dtype); ``always_index``: an index also for one shard."""
    t0 = time.perf_counter()
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").unlink(missing_ok=True)
    for old in d.glob("*.safetensors"):
        old.unlink()
    pools = {"": _pool()} if pools is None else pools
    shards = _shards(specs)
    n = len(shards)
    names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)] if n > 1 or always_index \
        else ["model.safetensors"]
    jobs: list[tuple[int, int, int, np.ndarray]] = []  # (fd, file offset, bytes, pool)
    fds = []
    weight_map = {}
    total = 0
    try:
        for fname, members in zip(names, shards):
            # Layout as the reference writer: by descending dtype size, then name.
            order = sorted(members, key=lambda k: (-_ITEMSIZE[specs[k][0]], k))
            header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
            placed = []
            off = 0
            for k in order:
                dt, shape = specs[k][:2]
                nb = _ITEMSIZE[dt] * int(np.prod(shape, dtype=np.int64))
                header[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + nb]}
                placed.append((off, nb, pools[specs[k][2] if len(specs[k]) > 2 else ""]))
                off += nb
                weight_map[k] = fname
            hb = json.dumps(header, separators=(",", ":")).encode()
            hb += b" " * (-len(hb) % 8)
            fd = os.open(d / fname, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            fds.append(fd)
            os.pwrite(fd, len(hb).to_bytes(8, "little") + hb, 0)
            base = 8 + len(hb)
            os.ftruncate(fd, base + off)
            for at, nb, pool in placed:
                for o in range(0, nb, WRITE_CHUNK):
                    jobs.append((fd, base + at + o, min(WRITE_CHUNK, nb - o), pool))
            total += off

        def write(job: tuple[int, int, int, np.ndarray]) -> None:
            fd, at, nbytes, pool = job
            view = memoryview(pool)
            done = 0
            while done < nbytes:  # file-offset phase: elements stay aligned to the pool's
                start = (at + done) % pool.nbytes
                k = min(nbytes - done, pool.nbytes - start)
                done += os.pwrite(fd, view[start:start + k], at + done)

        with ThreadPoolExecutor(max_workers=max(1, threads)) as ex:
            list(ex.map(write, jobs))
    finally:
        for fd in fds:
            os.close(fd)
    if len(names) > 1 or always_index:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    if config is not None:
        (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return time.perf_counter() - t0


def _tmpfs(path: Path) -> bool:
    """Whether ``path`` lies on a tmpfs (its files are memory)."""
    best, fstype = "", ""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and (str(path) + "/").startswith(parts[1].rstrip("/") + "/") \
                        and len(parts[1]) >= len(best):
                    best, fstype = parts[1], parts[2]
    except OSError:  # pragma: no cover - no /proc
        return False
    return fstype == "tmpfs"


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):  # pragma: no cover - no /proc
        pass
    return None


def check_room(d: Path, nbytes: int) -> None:
    """Refuse, before writing, a checkpoint that the folder (and, on tmpfs,
    memory) cannot hold: the old files in ``d`` are about to be replaced,
    so they count as room. A tmpfs that fills memory gets the benchmark or
    its machine's other processes killed rather than an error."""
    d.mkdir(parents=True, exist_ok=True)
    old = sum(f.stat().st_size for f in d.glob("*.safetensors"))
    room = shutil.disk_usage(d).free + old
    where = "free in the folder"
    if _tmpfs(d):
        avail = _mem_available()
        if avail is not None and avail + old < room:
            room, where = avail + old, "of memory available (the folder is on tmpfs)"
    need = nbytes + nbytes // 50 + 256 * MiB  # headers, and room for the loads to run
    if need > room:
        raise SystemExit(f"{d}: the checkpoint needs {need / GB:.1f} GB, {room / GB:.1f} GB {where}; free some "
                         f"(an earlier case's checkpoint kept with --keep?) or use smaller --layers")


def ensure_checkpoint(root: Path, case: str, args: argparse.Namespace) -> tuple[Path, float | None]:
    config, specs = case_specs(case, args.layers, args.vocab, args.experts, args.dense_shrink)
    key = json.dumps({"config": config, "specs": sorted((k, v[0], list(v[1])) for k, v in specs.items())},
                     sort_keys=True)
    d = root / case
    marker = d / ".complete"
    if marker.is_file() and marker.read_text() == key:
        return d, None
    if marker.exists():
        marker.unlink()
    check_room(d, sum(_ITEMSIZE[v[0]] * int(np.prod(v[1], dtype=np.int64)) for v in specs.values()))
    t = write_checkpoint(d, config, specs, args.threads)
    marker.write_text(key)
    return d, t


def files_of(d: Path) -> list[Path]:
    return sorted(d.glob("*.safetensors"))


def data_bytes(files: list[Path]) -> tuple[int, int]:
    """(tensor data bytes, tensor count) of the files."""
    total = count = 0
    for f in files:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        header.pop("__metadata__", None)
        count += len(header)
        total += f.stat().st_size - 8 - n
    return total, count


def warm(files: list[Path]) -> None:
    buf = bytearray(64 * MiB)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


# --------------------------------------------------------------------------- sampling
def _vmrss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # pragma: no cover - no /proc
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Sampler:
    """Peak host RSS and GPU memory in use while a load runs (a thread
    sampling every 2 ms; the loads release the GIL while they read)."""

    def __init__(self, gpu_used: Callable[[], int] | None) -> None:
        self.gpu_used = gpu_used
        self.rss0 = self.rss_peak = _vmrss()
        self.gpu0 = self.gpu_peak = gpu_used() if gpu_used else 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.rss_peak = max(self.rss_peak, _vmrss())
            if self.gpu_used:
                self.gpu_peak = max(self.gpu_peak, self.gpu_used())

    def __enter__(self) -> "Sampler":
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.rss_peak = max(self.rss_peak, _vmrss())
        if self.gpu_used:
            self.gpu_peak = max(self.gpu_peak, self.gpu_used())


# --------------------------------------------------------------------------- cases
def resident_of(model: Any) -> int:
    if hasattr(model, "summary"):
        return int(model.summary.resident_bytes)
    if isinstance(model, dict):
        return sum(int(t.numel() * t.element_size()) if hasattr(t, "numel") else int(t.nbytes) for t in model.values())
    return 0


def loaders(case: str, d: Path, files: list[Path], dev: Any, cuda: bool, total: int,
            recipe: str | None = None) -> dict[str, Callable[[], Any]]:
    out: dict[str, Callable[[], Any]] = {}

    def synced(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            m = fn()
            dev.synchronize()
            return m
        return run

    family = {"dense": "generic"}.get(case)
    if case == "dense":
        out["hf2q keep (default)"] = synced(lambda: hf2q.load(d, dev, family=family, progress=False, dtype="keep"))
        out["hf2q q8_0"] = synced(lambda: hf2q.load(d, dev, family=family, progress=False, dtype="q8_0"))
    else:
        out["hf2q (default: experts q8_0)"] = synced(lambda: hf2q.load(d, dev, progress=False))
        out["hf2q keep (bf16)"] = synced(lambda: hf2q.load(d, dev, progress=False, expert_dtype="bf16",
                                                            dense_dtype="bf16"))
        if recipe:
            # Issue 24's GPU target: every tensor's type as llama-quantize's recipe,
            # k-quants encoded on the device (>= 0.7x the line rate of the bytes read).
            out[f"hf2q recipe {recipe}"] = synced(lambda: hf2q.load(d, dev, progress=False, recipe=recipe))
    if cuda:
        import torch

        try:
            import instanttensor

            def it() -> Any:
                res = {}
                with instanttensor.safe_open([str(p) for p in files], framework="pt", device=dev.index) as f:
                    for name, t in f.tensors():
                        res[name] = t
                torch.cuda.synchronize()
                return res

            out["instanttensor"] = it
        except Exception as e:  # noqa: BLE001 - not installed here
            print(f"instanttensor not run: {e}", file=sys.stderr)
        from safetensors.torch import load_file

        def st() -> Any:
            res = {}
            for p in files:
                res.update(load_file(str(p), device=f"cuda:{dev.index}"))
            torch.cuda.synchronize()
            return res

        out["st.load_file"] = st
        try:
            from fastsafetensors import fastsafe_open

            def fst() -> Any:
                with fastsafe_open([str(p) for p in files], framework="pt", device=f"cuda:{dev.index}",
                                   nogds=True) as fo:
                    res = {k: fo.get_tensor(k).clone() for k in fo.keys()}
                torch.cuda.synchronize()
                return res

            out["fastsafetensors"] = fst
        except Exception as e:  # noqa: BLE001 - not installed, or no wheel for this platform
            print(f"fastsafetensors not run: {e}", file=sys.stderr)
    else:
        from safetensors.numpy import load_file as np_load_file

        def st_np() -> Any:
            import ml_dtypes  # noqa: F401 - numpy's bfloat16, which load_file needs

            res = {}
            for p in files:
                res.update(np_load_file(str(p)))
            return res

        out["st.load_file"] = st_np
    return out


def limit_case(files: list[Path], total: int, cuda: bool, index: int) -> Callable[[], Any]:
    if cuda:
        import torch

        chunk = 1 << 30
        pinned = torch.empty(chunk, dtype=torch.uint8, pin_memory=True)
        pinned.random_(0, 255)

        def h2d() -> Any:
            dst = torch.empty(total, dtype=torch.uint8, device=f"cuda:{index}")
            for o in range(0, total, chunk):
                n = min(chunk, total - o)
                dst[o:o + n].copy_(pinned[:n], non_blocking=True)
            torch.cuda.synchronize()
            return dst

        return h2d

    def read_fresh() -> Any:
        # Every file into fresh memory, the files in parallel (as many
        # threads as hf2q uses), each read in 64 MiB pieces. Anonymous
        # mappings, not np.empty: numpy advises huge pages on large arrays,
        # which stalls where THP defrag is "madvise" (docs/RESIDENCY.md).
        import mmap

        bufs = [mmap.mmap(-1, max(1, f.stat().st_size), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) for f in files]

        def one(i: int) -> None:
            mv = memoryview(bufs[i])
            with open(files[i], "rb", buffering=0) as fh:
                pos = 0
                while pos < len(mv):
                    n = fh.readinto(mv[pos:pos + 64 * MiB])
                    if not n:
                        raise EOFError(files[i])
                    pos += n

        with ThreadPoolExecutor(max_workers=hf2q.get_num_threads()) as ex:
            list(ex.map(one, range(len(files))))
        return bufs

    return read_fresh


def bus_seconds(total: int, index: int, repeat: int) -> tuple[float, list[float]]:
    """The pinned copy of ``limit_case`` into device memory that the same
    copy wrote just before (best of ``repeat``). On the H200 machine the
    first write into device memory that the process freed and allocated
    again runs at about 49 GB/s, a write into memory never used or already
    written at about 55 GB/s (docs/CUDA.md, "What limits a full-size
    load"): the limit row, like every warm load it is compared with, is the
    first kind; this row is the bus."""
    import torch

    chunk = 1 << 30
    pinned = torch.empty(chunk, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(total, dtype=torch.uint8, device=f"cuda:{index}")

    def copy() -> float:
        t0 = time.perf_counter()
        for o in range(0, total, chunk):
            n = min(chunk, total - o)
            dst[o:o + n].copy_(pinned[:n], non_blocking=True)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    try:
        copy()
        runs = [copy() for _ in range(max(1, repeat))]
    finally:
        del dst, pinned
    return min(runs), runs


#: Peers run in a child process of their own (``--isolate``). InstantTensor
#: 0.2.2 leaves every file mapped after its ``safe_open`` has closed: measured on
#: the H200 machine, the process's RSS grew by the checkpoint's size with each
#: call (67.8 GB; 137 GB after the warm-up and one run) and stayed there, so the
#: tmpfs pages of the checkpoint, deleted after its case, were never freed and
#: writing the next case's 71 GB got the benchmark killed for memory. A child's
#: exit returns them.
ISOLATE = ("instanttensor",)


def run_isolated(name: str, case: str, d: Path, device: str, repeat: int, timeout: float = 900) -> dict[str, Any]:
    """``run_case`` of the peer ``name`` in a fresh interpreter (this file's
    ``--child`` mode); its result as ``run_case`` returns it. A child that
    fails raises RuntimeError with the end of its output (reported like a
    peer that fails in process)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--child-case", case, "--dir", str(d),
           "--device", device, "--repeat", str(repeat)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    last = p.stdout.strip().splitlines()[-1:] if p.stdout.strip() else []
    if p.returncode != 0 or not last or not last[0].startswith(CHILD_RESULT):
        tail = (p.stderr + p.stdout).strip()[-2000:]
        raise RuntimeError(f"child for {name!r} exited with {p.returncode}: {tail}")
    return json.loads(last[0][len(CHILD_RESULT):])


CHILD_RESULT = "child-result: "


def child_main(args: argparse.Namespace) -> int:
    """One peer of one case, timed as in process, its result on the last
    line of stdout (``run_isolated``)."""
    dev, cuda, gpu_used, cleanup = open_device(args.device)
    files = files_of(args.dir)
    total, _ = data_bytes(files)
    fns = loaders(args.child_case, args.dir, files, dev, cuda, total)
    if args.child not in fns:
        print(f"no loader {args.child!r} here (have: {', '.join(fns)})", file=sys.stderr)
        return 2
    r = run_case(fns[args.child], args.repeat, cleanup, gpu_used)
    print(CHILD_RESULT + json.dumps(r), flush=True)
    return 0


def open_device(kind: str | None) -> tuple[Any, bool, Callable[[], int] | None, Callable[[], None]]:
    """(device, is CUDA, GPU memory in use or None, cleanup between runs)."""
    if kind is None:
        try:
            dev = hf2q.Device("cuda")
        except hf2q.DeviceError:
            dev = hf2q.Device("host")
    else:
        dev = hf2q.Device(kind)
    cuda = dev.kind == "cuda"
    gpu_used: Callable[[], int] | None = None
    if cuda:
        import torch

        torch.cuda.init()
        torch.empty(1, device=f"cuda:{dev.index}")

        def gpu_used() -> int:
            free, tot = torch.cuda.mem_get_info(dev.index)
            return tot - free

        def cleanup() -> None:
            gc.collect()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    else:
        def cleanup() -> None:
            gc.collect()
    return dev, cuda, gpu_used, cleanup


def run_case(fn: Callable[[], Any], repeat: int, cleanup: Callable[[], None],
             gpu_used: Callable[[], int] | None) -> dict[str, Any]:
    times: list[float] = []
    rss_peak = gpu_peak = rss_growth = gpu_growth = 0
    resident = 0
    for i in range(repeat + 1):  # run 0 warms up (kernels, staging ring, allocator)
        cleanup()
        with Sampler(gpu_used) as s:
            t0 = time.perf_counter()
            keep = fn()
            dt = time.perf_counter() - t0
        resident = resident_of(keep)
        del keep
        if i:
            times.append(dt)
            rss_peak = max(rss_peak, s.rss_peak)
            rss_growth = max(rss_growth, s.rss_peak - s.rss0)
            gpu_peak = max(gpu_peak, s.gpu_peak)
            gpu_growth = max(gpu_growth, s.gpu_peak - s.gpu0)
    cleanup()
    return {"seconds": min(times), "runs": times, "rss_peak": rss_peak, "rss_growth": rss_growth,
            "gpu_growth": gpu_growth, "resident": resident}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True, help="where the checkpoints are written (tmpfs on a GPU machine)")
    ap.add_argument("--device", default=None, help="cuda, cuda:N or host (default: cuda where there is one)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES + EXTRA_CASES)}")
    ap.add_argument("--layers", type=int, help="layers per model (default: the real count)")
    ap.add_argument("--vocab", type=int, help="vocabulary rows (default: the real size)")
    ap.add_argument("--experts", type=int, help="experts per MoE layer (default: the real count)")
    ap.add_argument("--dense-shrink", type=int, default=1,
                    help="divide the dense model's hidden and intermediate sizes and head counts by this (smoke tests)")
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs after a warm-up (default 3)")
    ap.add_argument("--peers", default="all", help="'all', 'none' (hf2q and the limit only) or a comma-separated "
                                                  "list of instanttensor, st.load_file, fastsafetensors")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 4, help="writer threads")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints afterwards (default: delete each "
                                                        "after its case, tmpfs is memory)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--recipe", help="also time hf2q with this recipe (q4_k_m, ...) on the MoE cases")
    ap.add_argument("--isolate", default=",".join(ISOLATE),
                    help="comma-separated peers run in a child process of their own, that the memory they keep is "
                         f"returned when it exits (default: {','.join(ISOLATE)}; see ISOLATE)")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # run_isolated's child: this peer, --child-case, --dir
    ap.add_argument("--child-case", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for c in cases:
        if c not in CASES + EXTRA_CASES:
            ap.error(f"unknown case {c!r}; expected one of {', '.join(CASES + EXTRA_CASES)}")

    if args.child:
        return child_main(args)
    dev, cuda, gpu_used, cleanup = open_device(args.device)
    isolate = {p.strip() for p in args.isolate.split(",") if p.strip()}
    device_arg = f"cuda:{dev.index}" if cuda else dev.kind
    where = f"{dev.name} ({dev.kind}{':' + str(dev.index) if cuda else ''})"
    results: list[dict[str, Any]] = []
    buses: list[dict[str, Any]] = []
    for case in cases:
        d, t_write = ensure_checkpoint(args.dir, case, args)
        files = files_of(d)
        total, ntensors = data_bytes(files)
        print(f"{case}: {total / GB:.2f} GB of tensor data, {ntensors:,} tensors, {len(files)} files"
              + (f" (written in {t_write:.1f} s)" if t_write is not None else " (reused)"), file=sys.stderr)
        warm(files)
        fns = loaders(case, d, files, dev, cuda, total, args.recipe if case != "dense" else None)
        if args.peers != "all":
            keep = {p.strip() for p in args.peers.split(",")}
            fns = {k: v for k, v in fns.items() if k.startswith("hf2q") or k in keep}
        fns["limit: " + ("pinned H2D copy" if cuda else "plain read into fresh memory")] = \
            limit_case(files, total, cuda, dev.index)
        rows = {}
        for name, fn in fns.items():
            try:
                if name in isolate:
                    cleanup()
                    rows[name] = run_isolated(name, case, d, device_arg, args.repeat)
                else:
                    rows[name] = run_case(fn, args.repeat, cleanup, gpu_used)
            except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
                if name.startswith("hf2q"):
                    raise
                print(f"{case}: {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
        limit_name = next(k for k in rows if k.startswith("limit"))
        limit_rate = total / rows[limit_name]["seconds"]
        if cuda:  # not a load: its own list, no memory columns
            try:
                cleanup()
                best, runs = bus_seconds(total, dev.index, args.repeat)
                buses.append({"case": case, "bytes": total, "seconds": best, "runs": runs,
                              "GB/s": total / best / GB, "x limit": total / best / limit_rate})
                print(f"{case}: bus (pinned H2D copy into memory written before): {best:.3f} s, "
                      f"{total / best / GB:.1f} GB/s, {total / best / limit_rate:.3f}x the limit", file=sys.stderr)
            except Exception as e:  # noqa: BLE001 - reported like a failing peer
                print(f"{case}: bus failed: {type(e).__name__}: {e}", file=sys.stderr)
            finally:
                cleanup()
        for name, r in rows.items():
            rate = total / r["seconds"]
            results.append({"case": case, "loader": name, "bytes": total, "tensors": ntensors, "files": len(files),
                            "seconds": r["seconds"], "GB/s": rate / GB, "x limit": rate / limit_rate,
                            "runs": r["runs"], "rss_peak_MiB": r["rss_peak"] / MiB,
                            "rss_growth_MiB": r["rss_growth"] / MiB, "gpu_growth_GiB": r["gpu_growth"] / 2**30,
                            "resident_GiB": r["resident"] / 2**30})
        if not args.keep:
            for f in files:
                f.unlink()
            (d / ".complete").unlink(missing_ok=True)
        if args.json:  # after every case: a run cut short keeps what it measured
            args.json.write_text(json.dumps({"device": where, "rows": results, "bus": buses}, indent=2) + "\n")
        for r in results[-len(rows):]:  # and on the terminal, as each case ends
            print(f"{case}: {r['loader']}: {r['seconds']:.3f} s, {r['GB/s']:.1f} GB/s, {r['x limit']:.3f}x the limit",
                  file=sys.stderr, flush=True)

    cols = ["case", "loader", "seconds", "GB/s", "x limit", "rss_peak_MiB", "rss_growth_MiB", "gpu_growth_GiB",
            "resident_GiB"]
    print(f"\n{where}; {hf2q.get_num_threads()} hf2q threads, {os.cpu_count()} CPUs; checkpoints in {args.dir}; "
          f"best of {args.repeat} after a warm-up; GB/s of tensor data bytes; 'x limit' = rate / the limit's rate")
    print_table("full-size loads", results, cols)
    targets = {}
    by = {(r["case"], r["loader"]): r for r in results}
    for case in cases:
        hf = next((r for (c, n), r in by.items() if c == case and n.startswith("hf2q")), None)
        if hf is None:
            continue
        want = 0.9 if case == "qwen-fused" else 0.8
        targets[f"{case}: hf2q >= {want}x limit"] = hf["x limit"] >= want
        it = by.get((case, "instanttensor"))
        if it is not None and case == "qwen-fused":
            targets[f"{case}: hf2q faster than instanttensor"] = hf["seconds"] < it["seconds"]
        if cuda:
            targets[f"{case}: hf2q GPU memory <= resident + 1 GiB"] = hf["gpu_growth_GiB"] <= hf["resident_GiB"] + 1
    if targets:
        print("\ntargets:")
        for k, ok in targets.items():
            print(f"  {k}: {'ok' if ok else 'MISSED'}")
    out = {"device": where, "cuda": cuda, "threads": hf2q.get_num_threads(), "cpus": os.cpu_count(),
           "layers": args.layers, "vocab": args.vocab, "experts": args.experts, "repeat": args.repeat,
           "rows": results, "bus": buses, "targets": targets}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    if args.markdown:
        lines = ["| case | loader | s | GB/s | x limit | peak RSS MiB (growth) | GPU growth GiB | resident GiB |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in results:
            lines.append(f"| {r['case']} | {r['loader']} | {r['seconds']:.3f} | {r['GB/s']:.1f} | {r['x limit']:.2f} | "
                         f"{r['rss_peak_MiB']:.0f} ({r['rss_growth_MiB']:.0f}) | {r['gpu_growth_GiB']:.2f} | "
                         f"{r['resident_GiB']:.2f} |")
        for b in buses:
            lines.append(f"| {b['case']} | bus: pinned H2D copy into memory written before | {b['seconds']:.3f} | "
                         f"{b['GB/s']:.1f} | {b['x limit']:.2f} | | | |")
        args.markdown.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
