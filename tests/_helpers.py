"""Helpers shared by test modules (pytest puts tests/ on sys.path)."""

from __future__ import annotations


class InterruptingBar:
    """A progress bar stand-in whose update raises KeyboardInterrupt after
    `after` updates: a Ctrl-C arriving in the middle of a load."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.updates = 0
        self.closed = False

    def update(self, n: int) -> None:
        self.updates += 1
        if self.updates > self.after:
            raise KeyboardInterrupt

    def close(self) -> None:
        self.closed = True

    def set_postfix_str(self, s: str) -> None:
        pass


def why_no_cuda() -> str:
    """Why ``Device("cuda")`` cannot be opened here ("" when it can): the
    reason the CUDA tests' skip line prints."""
    from hf2q.device import Device
    from hf2q.errors import DeviceError

    try:
        Device("cuda")
    except DeviceError as e:
        return str(e)
    return ""


#: GGUF keys that differ from the converter's by design (docs/CONVERT.md): its guess of a
#: name from the folder, and the labels it reads from a model card.
NAMING_KEYS = {"general.name"}
CONVERTER_ONLY = {"general.size_label", "general.basename", "general.finetune", "general.version",
                  "general.organization", "general.license", "general.tags", "general.languages"}


def assert_gguf_equals_record(path, want, pre=None) -> None:
    """The GGUF file at ``path`` against a record of the converter's whole file
    (alignment; each tensor's name, type, shape, offset and SHA-256; every
    key's types, value and order, but NAMING_KEYS' values and CONVERTER_ONLY
    keys). ``pre``: our ``tokenizer.ggml.pre`` where the record has the
    converter's "(unrecognised)"."""
    import hashlib

    import gguf
    import numpy as np

    r = gguf.GGUFReader(path)
    assert int(r.alignment) == want["alignment"]
    assert [t.name for t in r.tensors] == [t["name"] for t in want["tensors"]]
    for t, w in zip(r.tensors, want["tensors"]):
        assert t.tensor_type.name == w["type"], t.name
        assert [int(x) for x in reversed(t.shape.tolist())] == w["shape"], t.name
        assert int(t.data_offset) - int(r.data_offset) == w["offset"], t.name
        data = np.asarray(t.data).view(np.uint8).reshape(-1).tobytes()
        assert hashlib.sha256(data).hexdigest() == w["sha256"], f"{t.name}: bytes differ from the converter's"
    ours = {}
    for key, f in r.fields.items():
        if not key.startswith("GGUF."):
            v = f.contents()
            ours[key] = (f.types[0].name, f.types[1].name if len(f.types) > 1 else None,
                         v.tolist() if isinstance(v, np.ndarray) else v)
    theirs = {kv["key"]: (kv["type"], kv.get("sub_type"), kv["value"]) for kv in want["kv"]}
    missing = set(theirs) - set(ours) - CONVERTER_ONLY
    extra = set(ours) - set(theirs)
    assert not missing and not extra, f"missing {sorted(missing)}, extra {sorted(extra)}"
    for key in ours:
        t, sub, v = theirs[key]
        assert ours[key][:2] == (t, sub), key
        if key in NAMING_KEYS:
            continue
        if key == "tokenizer.ggml.pre" and v == "(unrecognised)" and pre is not None:
            assert ours[key][2] == pre
        elif t == "FLOAT32" or sub == "FLOAT32":
            np.testing.assert_array_equal(np.float32(ours[key][2]), np.float32(v), err_msg=key)
        else:
            assert ours[key][2] == v, key
    assert list(ours) == [k for k in theirs if k in ours], "key order differs from the converter's"


def build_cuda_emulator(out_dir):
    """tests/native/cuda_kquants_emu.cpp compiled into ``out_dir`` (the CUDA
    kernels run on the CPU; None where there is no C++ compiler)."""
    import shutil
    import subprocess
    from pathlib import Path

    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        return None
    src = Path(__file__).resolve().parent / "native" / "cuda_kquants_emu.cpp"
    out = Path(out_dir) / "cuda_kquants_emu"
    subprocess.run([cxx, "-std=c++20", "-O1", "-ffp-contract=off", "-pthread", "-w", str(src), "-o", str(out)],
                   check=True)
    return out


def hung_in_sanitizer_runtime(stacks: str) -> bool:
    """Whether a hung child's threads' stacks (gdb's backtraces) show one
    of them waiting on a lock of the sanitizer runtime itself
    (``__sanitizer::Mutex::Lock``, ``StaticSpinMutex::LockSlow``, ...), and
    only under the sanitizer run (``HF2Q_UNDER_SANITIZER=1``): see
    :func:`wait_child`."""
    import os
    import re

    return (os.environ.get("HF2Q_UNDER_SANITIZER") == "1"
            and re.search(r"\b__sanitizer::\w*(Mutex|Lock)\w*::Lock(Slow)?\s*\(", stacks) is not None)


def wait_child(pid: int, end: float) -> int | str:
    """A forked child's exit code (``os.waitstatus_to_exitcode``), or
    ``"hang"`` once ``time.monotonic()`` passes ``end`` (the child killed):
    a child that never exits fails its test instead of stalling the suite.

    Before a hung child is killed, every thread's native stack (gdb, where
    installed) goes to stderr, so the failure shows where it waited. Under
    the sanitizer run (``HF2Q_UNDER_SANITIZER=1``) a child with a thread stuck
    on a lock of the sanitizer runtime itself (:func:`hung_in_sanitizer_runtime`)
    returns ``"hang in the sanitizer runtime"``: the preloaded libasan
    (GCC 12's) takes no lock around ``fork()``, so a child forked while
    another thread of the parent held one of its locks (its allocator's,
    seen in CI) waits for it forever (LLVM's runtime locks them across a
    fork since 18, llvm/llvm-project#75290). glibc's malloc, which the
    normal suite runs, is fork-safe. gdb attaches to the child as a
    sibling: where Yama restricts ptrace to ancestors, the child must allow
    it (``fork_and_wait`` does, ``PR_SET_PTRACER``); else no stacks, and a
    plain ``"hang"``."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time

    while True:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got == pid:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > end:
            stacks = ""  # (gdb without the sanitizer run's preloaded runtime: it is not built for one)
            gdb = shutil.which("gdb")
            if gdb is not None:
                try:
                    stacks = subprocess.run(
                        [gdb, "-nx", "-batch", "-p", str(pid), "-iex", "set debuginfod enabled off",
                         "-ex", "thread apply all bt 24"],
                        capture_output=True, text=True, timeout=90,
                        env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}).stdout
                except (OSError, subprocess.TimeoutExpired):
                    pass
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            frames = "\n".join(line for line in stacks.splitlines() if line.startswith(("#", "Thread ")))
            sys.stderr.write(f"hung child {pid}, its threads' stacks:\n{frames or '(gdb gave none)'}\n")
            if hung_in_sanitizer_runtime(frames):
                return "hang in the sanitizer runtime"
            return "hang"
        time.sleep(0.005)


class QueueSpy:
    """A stand-in for a load's batch queue (``Device._batch_queue``: patch
    it with :meth:`install`) around the real one: records each submission's
    thread, and holds back each submission made while ``hold`` is true (the
    loader's ``_start_batch`` patched to set it for one batch) by
    ``seconds`` (a GPU's copy engine still busy) on a thread of its own, the
    submissions staying in order, while the loading thread goes on as it
    would."""

    def __init__(self, real, seconds: float = 0.3) -> None:
        import queue
        import threading

        self.real, self.seconds = real, seconds
        self.hold = False
        self.threads: list[str] = []
        self.tickets: dict[int, object] = {}  # our ticket -> the real one, once submitted (or the error)
        self.lock = threading.Condition()
        self.todo: "queue.Queue[tuple[int, object, int, list, bool] | None]" = queue.Queue()
        self.next = 1
        self.worker = threading.Thread(target=self._submit_in_order, name="queue-spy", daemon=True)
        self.worker.start()

    @classmethod
    def install(cls, monkeypatch, seconds: float = 0.3) -> list["QueueSpy"]:
        """Every queue a load makes from now on is a spy; returns them as made."""
        from hf2q.device import Device

        made: list[QueueSpy] = []
        real = Device._batch_queue

        def batch_queue(self):
            made.append(cls(real(self), seconds))
            return made[-1]

        monkeypatch.setattr(Device, "_batch_queue", batch_queue)
        return made

    def _submit_in_order(self) -> None:
        import time

        while (item := self.todo.get()) is not None:
            ticket, batch, after, transposes, hold = item
            if hold:
                time.sleep(self.seconds)
            with self.lock:
                real_after = self.tickets.get(after, 0) if after else 0
            try:
                got: object = self.real.submit(batch, real_after if isinstance(real_after, int) else 0, transposes)
            except BaseException as e:  # raised by wait
                got = e
            with self.lock:
                self.tickets[ticket] = got
                self.lock.notify_all()

    def submit(self, batch, after: int = 0, transposes=()) -> int:
        import threading

        self.threads.append(threading.current_thread().name)
        ticket, self.next = self.next, self.next + 1
        self.todo.put((ticket, batch, after, list(transposes), self.hold))
        return ticket

    def wait(self, ticket: int, timeout: float):
        with self.lock:
            if not self.lock.wait_for(lambda: ticket in self.tickets, timeout):
                return None
            got = self.tickets[ticket]
        if isinstance(got, BaseException):
            raise got
        return self.real.wait(got, timeout)

    def close(self) -> None:
        self.todo.put(None)
        self.worker.join()
        self.real.close()
