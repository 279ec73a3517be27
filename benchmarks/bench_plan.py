"""The Python side of a load, without the uploads: open + header validation,
planning and the numpy transforms, for

  qwen     the two-layer Qwen3.6 checkpoint of bench_cuda.py
           (``make_qwen35_moe_checkpoint(d, config="bench")``: 1568 tensors,
           experts per expert, 3.39 GB);
  drafter  the full gemma-4-26B-A4B DFlash drafter (58 tensors, 859 MB).

Only headers, ``config.json`` and the few small transformed tensors are ever
read here, so the files are written **sparse** by default: the same header
bytes and ``config.json`` as the testing writers produce (same names, dtypes,
shapes, offsets and key order), with a hole for the data (zeros). The
transformed tensors then hold zeros, which costs numpy the same time as
random values. ``--real`` writes the real checkpoints instead (3.4 GB + 0.9 GB).

Phases, each timed separately, median of ``--repeat`` runs after one warm-up
(page cache warm; each run starts from the path, nothing is cached between runs):

  open       ``hf2q.safetensors.open_checkpoint`` (read + validate every header)
  plan       the family's config read + plan + ``LoadPlan`` + the loader's
             byte accounting (``plan.source_nbytes`` and each entry's)
  read       (qwen) the sources of every entry with a ``transform``, read
             with ``read_array`` as the loader does (mostly page faults in
             fresh memory: native reader and kernel, listed apart)
  transform  (qwen) those entries' transforms (numpy), as before an upload

    python benchmarks/bench_plan.py [--dir DIR] [--repeat 15] [--real] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump_json, print_table  # noqa: E402

from hf2q import formats  # noqa: E402
from hf2q.models.dflash.config import DFlashConfig  # noqa: E402
from hf2q.models.dflash.manifest import DFlashWeights, expected_manifest  # noqa: E402
from hf2q.models.dflash.plan import plan_dflash  # noqa: E402
from hf2q.models.qwen35.config import Qwen35Config  # noqa: E402
from hf2q.models.qwen35.plan import plan_qwen35_moe  # noqa: E402
from hf2q.safetensors import open_checkpoint  # noqa: E402


def _write_sparse(path: Path, header: dict[str, Any], data_bytes: int, ensure_ascii: bool = True) -> None:
    """A safetensors file with ``header`` (compact JSON, space-padded to a
    multiple of 8, as the reference writer) and ``data_bytes`` of zeros left as a hole."""
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=ensure_ascii).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        f.truncate(8 + len(text) + data_bytes)


def make_sparse_qwen(d: Path) -> Path:
    """The header and config.json of ``make_qwen35_moe_checkpoint(d, config="bench")``."""
    from hf2q.testing.qwen35_checkpoint import checkpoint_tensor_specs, qwen35_config_dict

    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(qwen35_config_dict("bench"), indent=2) + "\n", encoding="utf-8")
    specs = checkpoint_tensor_specs("bench")
    # The testing writer's order: descending element size, then name.
    order = sorted(specs, key=lambda n: (-formats.from_safetensors(specs[n][0]).itemsize, n))
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name in order:
        dtype, shape = specs[name]
        n = formats.nbytes(shape, dtype)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    _write_sparse(d / "model.safetensors", header, off)
    return d


def make_sparse_drafter(d: Path) -> Path:
    """The header and config.json of ``make_dflash_checkpoint(d)`` (the full drafter)."""
    from hf2q.testing.dflash_checkpoint import GEMMA4_26B_A4B_DRAFTER_CONFIG

    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(GEMMA4_26B_A4B_DRAFTER_CONFIG, indent=2) + "\n", encoding="utf-8")
    manifest = sorted(expected_manifest(DFlashConfig.from_dict(GEMMA4_26B_A4B_DRAFTER_CONFIG)), key=lambda e: e.name)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for e in manifest:
        header[e.name] = {"dtype": "BF16", "shape": list(e.shape), "data_offsets": [off, off + e.disk_nbytes]}
        off += e.disk_nbytes
    _write_sparse(d / "model.safetensors", header, off, ensure_ascii=False)
    return d


def _account(plan: Any) -> int:
    """The loader's byte accounting: the plan's total once, each entry's as it goes."""
    total = plan.source_nbytes
    for e in plan:
        total -= e.source_nbytes
    assert total == 0
    return len(plan)


def qwen_phases(d: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    ckpt = open_checkpoint(d)
    t1 = time.perf_counter()
    cfg = Qwen35Config.from_file(d / "config.json")
    lp = plan_qwen35_moe(ckpt, cfg)  # the loader's LoadPlan itself
    _account(lp)
    t2 = time.perf_counter()
    read = transform = 0.0
    for e in lp:
        if e.transform is not None:
            t3 = time.perf_counter()
            arrays = [ckpt.read_array(p.tensor) for p in e.sources]
            t4 = time.perf_counter()
            e.transform(arrays)
            t5 = time.perf_counter()
            read += t4 - t3
            transform += t5 - t4
    ckpt.close()
    return {"open": t1 - t0, "plan": t2 - t1, "read": read, "transform": transform}


def drafter_phases(d: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    ckpt = open_checkpoint(d)
    t1 = time.perf_counter()
    weights = DFlashWeights.load(ckpt)
    _account(plan_dflash(weights))
    t2 = time.perf_counter()
    ckpt.close()
    return {"open": t1 - t0, "plan": t2 - t1, "read": 0.0, "transform": 0.0}


def median_phases(fn: Callable[[Path], dict[str, float]], d: Path, repeat: int) -> dict[str, float]:
    fn(d)  # warm-up: imports, page cache
    runs = [fn(d) for _ in range(repeat)]
    out = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    # What this work is about: everything but the reads.
    out["python"] = statistics.median(r["open"] + r["plan"] + r["transform"] for r in runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, help="where the checkpoints go (default: a temporary folder)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--real", action="store_true", help="write the real checkpoints, not sparse copies")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hf2q-bench-plan-") as tmp:
        root = args.dir or Path(tmp)
        qd, dd = root / "qwen", root / "drafter"
        if args.real:
            from hf2q.testing import make_dflash_checkpoint, make_qwen35_moe_checkpoint

            if not (qd / "model.safetensors").exists():
                make_qwen35_moe_checkpoint(qd, config="bench")
            if not (dd / "model.safetensors").exists():
                make_dflash_checkpoint(dd)
        else:
            make_sparse_qwen(qd)
            make_sparse_drafter(dd)
        rows = []
        for name, fn, d in (("qwen", qwen_phases, qd), ("drafter", drafter_phases, dd)):
            ph = median_phases(fn, d, args.repeat)
            rows.append({"checkpoint": name, **{f"{k}_ms": round(v * 1e3, 2) for k, v in ph.items()}})
    if args.json:
        dump_json(rows)
    else:
        print_table(f"Python load overhead without uploads (median of {args.repeat}, ms)", rows,
                    ["checkpoint", "open_ms", "plan_ms", "transform_ms", "python_ms", "read_ms"])


if __name__ == "__main__":
    main()
