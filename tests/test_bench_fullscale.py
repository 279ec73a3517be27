"""benchmarks/bench_fullscale.py at a tiny size on the host backend: every
case's checkpoint is written (Hub layout, parallel writer), loaded by hf2q with
its defaults and with the bytes kept, by the peers this machine has, and
against the limit; the report holds what the README quotes. No timing is
asserted (performance lives in the benchmark)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_fullscale  # noqa: E402


@pytest.mark.slow
def test_fullscale_smoke_on_the_host(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_fullscale.py"), "--dir", str(tmp_path / "ck"),
                        "--device", "host", "--layers", "1", "--vocab", "256", "--experts", "4", "--dense-shrink", "16",
                        "--repeat", "1", "--threads", "2", "--json", str(out),
                        "--isolate", "st.load_file"],  # the child path InstantTensor takes on a GPU
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr + p.stdout
    r = json.loads(out.read_text())
    rows = {(x["case"], x["loader"]): x for x in r["rows"]}
    assert {c for c, _ in rows} == set(bench_fullscale.CASES)
    for case in bench_fullscale.CASES:
        names = {n for c, n in rows if c == case}
        assert "st.load_file" in names and any(n.startswith("limit") for n in names)
        assert sum(n.startswith("hf2q") for n in names) == 2
    for x in r["rows"]:
        assert x["seconds"] > 0 and x["GB/s"] > 0 and x["bytes"] > 0 and x["rss_peak_MiB"] > 0
    q = rows[("qwen-experts", "hf2q (default: experts q8_0)")]
    assert q["tensors"] > rows[("qwen-fused", "hf2q (default: experts q8_0)")]["tensors"]
    assert q["resident_GiB"] > 0
    assert "targets" in r and "full-size loads" in p.stdout
    assert not list((tmp_path / "ck").glob("*/*.safetensors"))  # deleted after each case (tmpfs is memory)


def test_writer_tiles_the_pool_and_shards_like_the_hub(tmp_path: Path) -> None:
    """Files as the Hub lays them out (shards and index past SHARD_BYTES) with
    the pool's bytes at every offset: finite values for every float dtype."""
    specs = {f"model.layers.{i}.w": ("BF16", (1024, 1024)) for i in range(5)}
    specs["model.layers.0.a"] = ("F32", (64,))
    old = bench_fullscale.SHARD_BYTES
    bench_fullscale.SHARD_BYTES = 5 << 20  # three shards: [a, w0, w1], [w2, w3], [w4]
    try:
        bench_fullscale.write_checkpoint(tmp_path, None, specs, threads=3)
    finally:
        bench_fullscale.SHARD_BYTES = old
    files = sorted(tmp_path.glob("*.safetensors"))
    assert len(files) == 3 and (tmp_path / "model.safetensors.index.json").is_file()
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(specs)
    from safetensors.numpy import load_file

    import ml_dtypes  # noqa: F401 - bfloat16 for load_file

    pool = bench_fullscale._pool()
    seen = {}
    for f in files:
        seen.update(load_file(str(f)))
    assert set(seen) == set(specs)
    for k, a in seen.items():
        assert np.isfinite(a.astype(np.float32)).all(), k
    raw = files[0].read_bytes()
    n = int.from_bytes(raw[:8], "little")
    start = 8 + n
    tail = np.frombuffer(raw, np.uint8)[start:]
    want = np.resize(np.roll(pool, -(start % bench_fullscale.POOL_BYTES)), tail.size)
    assert np.array_equal(tail, want)


def test_a_checkpoint_that_does_not_fit_is_refused_before_writing(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"x" * 4096)  # replaced: counts as room
    bench_fullscale.check_room(tmp_path, 1 << 20)
    with pytest.raises(SystemExit, match="needs .* GB"):
        bench_fullscale.check_room(tmp_path, 1 << 60)
    assert (tmp_path / "model.safetensors").stat().st_size == 4096  # nothing written or removed


def test_an_isolated_peer_that_fails_is_reported_with_its_output(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no loader 'nope'"):
        bench_fullscale.run_isolated("nope", "qwen-fused", tmp_path, "host", 1)
