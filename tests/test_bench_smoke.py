"""The kernel benchmark runs at a tiny size (no timing asserted): a benchmark
that no longer runs is found by the suite, not by the next person measuring."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_kernels_smoke() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_kernels.py"), "--elements", "65536",
                        "--gguf-elements", "4096", "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["elements"] == 65536 and r["gguf_bytes_equal"] is True
    assert {row["case"] for row in r["rows"]} >= {"memcpy, q8_0-sized (numpy copyto)", "hf2q bf16->f32 into out"}
    assert all(row["seconds"] > 0 for row in r["rows"] if row["kind"] in ("ours", "baseline"))


def test_bench_kquants_smoke() -> None:
    # ggml's C code is not built in CI (it needs the pinned sdist): hf2q only.
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_kquants.py"), "--elements", "8192",
                        "--no-ggml", "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["elements"] == 8192
    assert {(row["format"], row["case"].split(",")[0]) for row in r["rows"]} == {
        (f, "hf2q") for f in ("q4_0", "q4_k", "q5_k", "q6_k")}
    assert all(row["seconds"] > 0 for row in r["rows"])
