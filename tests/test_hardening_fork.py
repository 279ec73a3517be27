"""Fork safety (issue 11, row "fork"): a child forked while other threads are
mid-alloc/residency, mid-read and mid-kernel works, and the parent is
unaffected. Each scenario runs in a child interpreter with a deadline; a
forked child that hangs is killed and counted as a failure."""

from __future__ import annotations

import sys

import pytest
from _hardening import FORK_HELPERS, run_python

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fork")

FORKS = 8


def _check(r, forks: int = FORKS) -> None:
    assert r.returncode == 0, f"rc={r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    assert r.stdout.strip().splitlines()[-1] == f"children ok {forks}/{forks}; parent ok", \
        f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-6000:]}"


def test_fork_while_another_thread_holds_the_device_lock() -> None:
    # A thread loops over residency calls that hold the host device's mutex
    # for a while (request_residency locks/prefaults 64 MiB), plus allocs and
    # frees; the main thread forks in the middle of it.
    r = run_python(FORK_HELPERS + r'''
import threading, numpy as np, hf2q
dev = hf2q.Device("host")
big = dev.alloc((8 << 20,), "bf16")
stop = False
def churn():
    while not stop:
        dev.residency.end(); dev.residency.request()
        b = dev.alloc((4096,), "f32"); del b
        dev.residency.stats()
t = threading.Thread(target=churn, daemon=True); t.start()
time.sleep(0.05)
def child():
    b = dev.alloc((1 << 20,), "f32")
    dev.residency.commit(); dev.residency.stats()
    up = dev.upload(np.arange(1 << 16, dtype=np.float32))
    return bool((up.numpy() == np.arange(1 << 16, dtype=np.float32)).all()) and b.registered
ok = 0
for i in range(@N@):
    time.sleep(0.01 * (i % 3))
    st = fork_and_wait(child)
    ok += st == 0
    if st != 0: print("child", i, "->", st)
stop = True; t.join(10)
b = dev.alloc((1 << 20,), "f32"); dev.residency.stats()
print(f"children ok {ok}/@N@; parent ok")
'''.replace('@N@', str(FORKS)), timeout=120)
    _check(r)


@pytest.mark.slow
def test_fork_after_the_read_pool_started_and_while_a_read_is_running(tmp_path) -> None:
    # Tensors over 2 x 32 MiB are read by the package's thread pool. The child
    # is forked after the pool started and while another thread reads.
    path = tmp_path / "big.safetensors"
    r = run_python(FORK_HELPERS + r'''
import threading, numpy as np, hf2q
from hf2q import safetensors as st
import safetensors.numpy as sn
path = sys.argv[1]
data = (np.arange(48 << 20, dtype=np.uint32) * 2654435761).astype(np.uint32)
sn.save_file({"t": data.view(np.uint16)}, path)
f = st.open(path)
out = np.empty(f["t"].nbytes, np.uint8)
f.read_into("t", out)   # the pool exists now
stop = False
def reader():
    o = np.empty(f["t"].nbytes, np.uint8)
    while not stop:
        f.read_into("t", o)
t = threading.Thread(target=reader, daemon=True); t.start()
def child():
    o = np.empty(f["t"].nbytes, np.uint8)
    f.read_into("t", o)
    return bool((o.view(np.uint32) == data).all())
ok = 0
for i in range(@N@):
    time.sleep(0.02)
    s = fork_and_wait(child, deadline=30)
    ok += s == 0
    if s != 0: print("child", i, "->", s)
stop = True; t.join(30)
f.read_into("t", out)
assert (out.view(np.uint32) == data).all()
print(f"children ok {ok}/@N@; parent ok")
'''.replace('@N@', str(4)), args=[str(path)], timeout=240)
    _check(r, 4)


def test_fork_while_another_thread_runs_a_kernel_on_the_native_pool() -> None:
    r = run_python(FORK_HELPERS + r'''
import threading, numpy as np, hf2q
from hf2q import ops, reference
x = np.random.default_rng(0).standard_normal(1 << 22).astype(np.float32)
want = reference.quantize_q8_0(x)
stop = False
def work():
    while not stop:
        ops.quantize_q8_0(x); ops.bf16_to_f32(np.zeros(1 << 22, np.uint16))
t = threading.Thread(target=work, daemon=True); t.start()
time.sleep(0.05)
def child():
    got = ops.quantize_q8_0(x)
    return bool(np.array_equal(got.view(np.uint8), np.asarray(want).view(np.uint8)))
ok = 0
for i in range(@N@):
    time.sleep(0.01 * (i % 3))
    s = fork_and_wait(child)
    ok += s == 0
    if s != 0: print("child", i, "->", s)
stop = True; t.join(30)
assert np.array_equal(ops.quantize_q8_0(x).view(np.uint8), np.asarray(want).view(np.uint8))
print(f"children ok {ok}/@N@; parent ok")
'''.replace('@N@', str(FORKS)), env={"HF2Q_NUM_THREADS": "4"}, timeout=180)
    _check(r)


def test_fork_while_another_thread_opens_a_device() -> None:
    # The Python lock around the per-kind native devices, held by another
    # thread at the fork, must not block the child's first Device().
    r = run_python(FORK_HELPERS + r'''
import threading, hf2q
from hf2q import device as d
held = threading.Event(); release = threading.Event()
def holder():
    with d._native_lock:
        held.set(); release.wait(30)
t = threading.Thread(target=holder, daemon=True); t.start(); held.wait(10)
def child():
    dev = hf2q.Device("host")
    return dev.alloc((16,), "f32").numel == 16
ok = fork_and_wait(child) == 0
release.set(); t.join(10)
hf2q.Device("host").alloc((16,), "f32")
print(f"children ok {int(ok)}/1; parent ok")
''', timeout=60)
    _check(r, 1)


def test_fork_while_another_thread_loads_through_a_batch_queue(tmp_path) -> None:
    """A GPU load's batches go through a queue with a native thread of its
    own (forced on the host here). A child forked while another thread loads
    that way loads through a queue of its own; a queue the parent made is
    refused in the child (its thread exists only in the parent), and letting
    it go there neither waits nor aborts."""
    r = run_python(FORK_HELPERS + r'''
import threading, gc, os, numpy as np, hf2q
from hf2q import loader, qwen35
from hf2q.testing import make_qwen35_moe_checkpoint
loader._OVERLAP = True
loader.GPU_BATCH_BYTES = loader.BATCH_BYTES = loader.GPU_FIRST_BATCH_BYTES = 64 << 10
path = make_qwen35_moe_checkpoint(sys.argv[1], "tiny", seed=3)
dev = hf2q.Device("host")
def load():
    m = qwen35.load(path, device=dev, progress=False, dense_dtype="q8_0")
    return {n: b.to_host().tobytes() for n, b in m.named_buffers()}
want = load()
parents_queue = dev._batch_queue()
stop = False
def churn():
    while not stop:
        load()
t = threading.Thread(target=churn, daemon=True); t.start()
time.sleep(0.05)
def child():
    global parents_queue
    b = dev.alloc((4,), "f32")
    fd = os.open(sys.argv[1] + "/config.json", os.O_RDONLY)
    for call in (lambda: parents_queue.submit(hf2q._core.NativeFileBatch([(b._native, [(0, fd, 0, 16)], "u8", False, None)])),
                 lambda: parents_queue.wait(1, 0.01), parents_queue.cancel):
        try:
            call()
            return False
        except RuntimeError as e:
            if "forked" not in str(e):
                return False
    del parents_queue  # let go in the child: neither waits for the parent's threads nor aborts
    gc.collect()
    return load() == want
ok = 0
for i in range(@N@):
    time.sleep(0.01 * (i % 3))
    s = fork_and_wait(child, deadline=60)
    ok += s == 0
    if s != 0: print("child", i, "->", s)
stop = True; t.join(30)
parents_queue.close()
assert load() == want
print(f"children ok {ok}/@N@; parent ok")
'''.replace('@N@', str(4)), args=[str(tmp_path / "ck")], env={"HF2Q_NUM_THREADS": "4"}, timeout=240)
    _check(r, 4)


def test_a_hung_child_is_killed_and_shows_where_it_waited() -> None:
    # The harness itself: a child that never exits is reported as a hang
    # (not as the sanitizer runtime's, whose lock it does not wait on),
    # killed, and its stack (gdb, where installed) is on stderr.
    r = run_python(FORK_HELPERS + r'''
import threading
def child():
    lock = threading.Lock(); lock.acquire(); lock.acquire()  # waits for itself
    return True
status = fork_and_wait(child, deadline=1.0)
print(f"status {status}")
''', timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "status hang", r.stdout + r.stderr
    assert "hung child" in r.stderr and "forked again" not in r.stderr
    import os
    import shutil

    try:  # gdb attaches as the child's sibling (the child allows any tracer: Yama's scope 1)
        scope = int(open("/proc/sys/kernel/yama/ptrace_scope").read())
    except OSError:
        scope = 0
    if shutil.which("gdb") is not None and (scope <= 1 or (scope == 2 and os.geteuid() == 0)):
        assert "#0 " in r.stderr, r.stderr[-3000:]


def test_a_hang_on_the_sanitizer_runtimes_lock_is_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stacks of a child CI's sanitizer run left hung (gdb, GCC 12's
    libasan; abridged): its main thread waits on the allocator's lock, taken
    by a thread of the parent at the fork. Recognized only under that run;
    a thread waiting on hf2q's or Python's own locks is not."""
    from _helpers import hung_in_sanitizer_runtime

    asan = """Thread 1 (Thread 0x7f0ce71247c0 (LWP 21592) "python"):
#0  0x00007f0ce6ad251e in __sanitizer::FutexWait (p=0x640000001488, cmp=0) at ../../../../src/libsanitizer/sanitizer_common/sanitizer_linux.cpp:672
#1  0x00007f0ce6ad4e0b in __sanitizer::Semaphore::Wait (this=0x640000001488) at ../../../../src/libsanitizer/sanitizer_common/sanitizer_mutex.cpp:35
#2  0x00007f0ce6a2ab6d in __sanitizer::Mutex::Lock (this=0x640000001480) at ../../../../src/libsanitizer/sanitizer_common/sanitizer_mutex.h:194
#3  __sanitizer::GenericScopedLock<__sanitizer::Mutex>::GenericScopedLock (mu=0x640000001480, this=<synthetic pointer>) at ../../../../src/libsanitizer/sanitizer_common/sanitizer_mutex.h:367
#4  __sanitizer::SizeClassAllocator64<__asan::AP64<__sanitizer::LocalAddressSpaceView> >::GetFromAllocator (this=this@entry=0x8, stat=stat@entry=0x7f0ce7113c40, class_id=class_id@entry=41, chunks=chunks@entry=0x7f0ce7110780, n_chunks=n_chunks@entry=3) at ../../../../src/libsanitizer/sanitizer_common/sanitizer_allocator_primary64.h:207
#10 0x00007f0ce6ab899f in __interceptor_malloc (size=17408) at ../../../../src/libsanitizer/asan/asan_malloc_linux.cpp:70
#11 0x00007f0ce3573ff8 in default_malloc () from numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so"""
    ours = """Thread 1 (Thread 0x7f0ce71247c0 (LWP 21592) "python"):
#0  __futex_abstimed_wait_common64 (private=0, cancel=true, abstime=0x0, op=393, expected=0, futex_word=0x6120001c434c) at ./nptl/futex-internal.c:57
#4  ___pthread_cond_wait (cond=0x6120001c4320, mutex=0x6120001c42f8) at ./nptl/pthread_cond_wait.c:618
#5  0x00007f0cdba3f097 in std::condition_variable::wait<hf2q::(anonymous namespace)::Pool::worker_main(uint64_t)::<lambda()> > (__p=..., __lock=..., this=0x6120001c4320) at /usr/include/c++/12/condition_variable:102
#6  0x00007f0cdba3f100 in std::mutex::lock (this=0x6120001c42f8) at /usr/include/c++/12/bits/std_mutex.h:100
#7  0x00007f0ce6101b57 in PyThread_acquire_lock_timed (lock=0x1, microseconds=-1, intr_flag=1) at Python/thread_pthread.h:510"""
    monkeypatch.setenv("HF2Q_UNDER_SANITIZER", "1")
    assert hung_in_sanitizer_runtime(asan)
    assert not hung_in_sanitizer_runtime(ours)
    monkeypatch.delenv("HF2Q_UNDER_SANITIZER")
    assert not hung_in_sanitizer_runtime(asan)  # the normal suite: glibc's malloc is fork-safe
