"""Interpreter exit with daemon threads inside native calls (issue 11, row
"interpreter exit"): the process exits with the status plain numpy gives in
the same situation (0), and prints nothing. Before the fix: status 134,
"terminate called without an active exception" (the GIL-release guard met
pthread_exit's forced unwind)."""

from __future__ import annotations

import sys

import pytest
from _hardening import run_python

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="pthread_exit semantics")

RUNS = 4

# Each body runs forever in daemon threads; the main thread returns after a
# moment, while they are (almost surely) inside a GIL-released native call.
BODIES = {
    "numpy": """
import numpy as np
a = np.random.default_rng(0).standard_normal(1 << 22)  # element-wise: no BLAS threads
def body():
    while True:
        np.multiply(a, 1.5).sum(); np.sort(a)
""",
    "ops.quantize_q8_0": """
import numpy as np
from hf2q import ops
x = np.random.default_rng(0).standard_normal(1 << 22).astype(np.float32)
def body():
    while True:
        ops.quantize_q8_0(x)
""",
    "ops.bf16_to_f32": """
import numpy as np
from hf2q import ops
x = np.zeros(1 << 23, np.uint16)
def body():
    while True:
        ops.bf16_to_f32(x)
""",
    "device uploads": """
import numpy as np, hf2q
dev = hf2q.Device("host")
x = np.random.default_rng(0).standard_normal(1 << 21).astype(np.float32)
def body():
    while True:
        b = dev.upload(x, to="q8_0"); dev.residency.stats(); del b
""",
    "dflash.load": """
import hf2q, sys
from hf2q.testing import make_dflash_checkpoint
cfg = dict(hf2q.dflash.DRAFTER_CONFIGS["tiny"], hidden_size=512, intermediate_size=1024, vocab_size=512)
path = make_dflash_checkpoint(sys.argv[1], cfg, seed=1)
dev = hf2q.Device("host")
def body():
    while True:
        m = hf2q.dflash.load(path, dev, progress=False); del m
""",
    "loads through a batch queue": """
import hf2q, sys
from hf2q import loader, qwen35
from hf2q.testing import make_qwen35_moe_checkpoint
loader._OVERLAP = True  # the GPU's path: batches read by a queue's native thread
loader.GPU_BATCH_BYTES = loader.BATCH_BYTES = loader.GPU_FIRST_BATCH_BYTES = 64 << 10
path = make_qwen35_moe_checkpoint(sys.argv[1], "tiny", seed=1)
dev = hf2q.Device("host")
def body():
    while True:
        m = qwen35.load(path, device=dev, progress=False); del m
""",
}


@pytest.mark.slow
@pytest.mark.parametrize("what", list(BODIES))
def test_daemon_threads_in_native_calls_at_exit(what: str, tmp_path) -> None:
    code = BODIES[what] + """
import threading, time
for _ in range(2):
    threading.Thread(target=body, daemon=True).start()
time.sleep(0.3)
"""
    for i in range(RUNS):
        r = run_python(code, args=[str(tmp_path / f"ck{i}")], env={"HF2Q_NUM_THREADS": "3"}, timeout=60)
        assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), f"run {i}: rc={r.returncode}\n{r.stderr[-2000:]}"


def test_open_files_stay_open_for_daemon_threads_during_atexit(tmp_path) -> None:
    """weakref.finalize's atexit hook used to close every open safetensors
    file while daemon threads still read them (found by the fault-injection
    exit test under ASan: 'I/O on closed safetensors file' in a daemon)."""
    code = r"""
import sys, threading, time, atexit
from hf2q import safetensors
from hf2q.testing import make_dflash_checkpoint
errors = []
def late():  # registered before the file's finalizer: runs after weakref's atexit hook
    time.sleep(0.2)
    if errors:
        sys.stderr.write("daemon saw " + errors[0] + "\n")
atexit.register(late)
path = make_dflash_checkpoint(sys.argv[1], "tiny", seed=1)
f = safetensors.open(path / "model.safetensors")
name = f.keys()[0]
def body():
    while True:
        try:
            f.read_bytes(name)
        except Exception as e:
            errors.append(repr(e))
            return
threading.Thread(target=body, daemon=True).start()
time.sleep(0.05)
"""
    r = run_python(code, args=[str(tmp_path / "ck")], timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), r.stderr[-2000:]
