"""benchmarks/bench_dflash.py --fresh-process runs from a clone and reports
what the README quotes (a smoke run on the tiny drafter: no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hf2q.testing import make_dflash_checkpoint

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_fresh_process_smoke(tmp_path: Path) -> None:
    d = make_dflash_checkpoint(tmp_path / "tiny", "tiny")
    (d / ".complete").write_text("ok\n")  # the bench's "already written" marker
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_dflash.py"), "--fresh-process", "--runs", "1",
                        "--dir", str(d), "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert set(r["median_seconds"]) == {"ours", "ours_huge", "ours_nores", "peer", "read_floor", "import_hf2q",
                                        "import_numpy", "device", "bare_python"}
    assert r["peer_over_read_floor"] > 0 and r["ours_over_read_floor"] > 0
    assert all(len(v) == 1 and v[0] > 0 for v in r["all_seconds"].values())
    assert set(r["targets"]) == {"peer_over_ours>=3", "import_hf2q+Device(host)<=100ms",
                                 "import_hf2q<=import_numpy+40ms", "peak_rss<=resident+64MiB"}
    # what explains the numbers: CPU seconds per process, the THP settings, and no ml_dtypes in our load
    assert all(st["user"] >= 0 and st["sys"] >= 0 for st in r["median_process_stats"].values())
    assert set(r["thp"]) == {"enabled", "defrag"}
    assert r["ml_dtypes_imported_by_load"] is False
    assert 0 < r["import_hf2q_device_host_seconds"]["median"] < 60
    assert r["resident_bytes"] == 165_632 and r["ours_peak_rss"] > 0
