"""The native thread pool under a thread or address-space limit (issue 11,
row "threads"): HF2Q_NUM_THREADS=1024 with RLIMIT_AS set so that most
thread creations fail. The process never aborts, results stay exact, and the
pool keeps the workers it could start instead of tearing them down and
re-creating them on every parallel call."""

from __future__ import annotations

import sys

import pytest
from _hardening import UNDER_SANITIZER, run_python

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/task"),
    pytest.mark.skipif(UNDER_SANITIZER, reason="ASan reserves terabytes of address space: RLIMIT_AS cannot apply"),
]

CODE = r"""
import os, resource, numpy as np
import hf2q
from hf2q import ops, reference
x = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
want = np.asarray(reference.quantize_q8_0(x)).view(np.uint8)
pages = int(open("/proc/self/statm").read().split()[0])
vm = pages * os.sysconf("SC_PAGESIZE")
# Room for ~100 of the 1023 workers' 8 MiB stacks, not for all of them.
resource.setrlimit(resource.RLIMIT_AS, (vm + (900 << 20), resource.RLIM_INFINITY))
def tids():
    return set(os.listdir("/proc/self/task"))
ok = True
seen = None
for i in range(20):
    got = ops.quantize_q8_0(x).view(np.uint8)
    ok &= bool(np.array_equal(got, want))
    now = tids()
    if seen is not None and now != seen:
        print(f"call {i}: worker threads changed ({len(seen)} -> {len(now)} threads)")
        ok = False
    seen = now
print("threads", len(seen), "exact" if ok else "FAILED")
"""


def test_thread_limit_keeps_the_workers_it_got_and_never_aborts() -> None:
    for run in range(6):
        r = run_python(CODE, env={"HF2Q_NUM_THREADS": "1024"}, timeout=120)
        assert r.returncode == 0, f"run {run}: rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr[-2000:]}"
        last = r.stdout.strip().splitlines()[-1]
        assert last.endswith("exact"), r.stdout
        n = int(last.split()[1])
        assert 1 < n < 1024, f"expected a partially started pool, got {n} threads"
