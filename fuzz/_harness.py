"""Shared pieces of the atheris fuzz targets (see docs/RELIABILITY.md).

The oracle: a target's input may make hf2q raise, but only

* :class:`hf2q.Hf2qError` (and its subclasses) for bad *data* (file bytes,
  values), and
* ``TypeError`` / ``ValueError`` / ``OverflowError`` for API misuse (wrong
  argument types, sizes, dtypes, read-only outputs), where the target says
  the call could be misuse.

Anything else escaping hf2q (``KeyError``, ``IndexError``, ``AttributeError``,
``AssertionError``, ``MemoryError``, ``RecursionError``, ``OSError`` not wrapped
in an hf2q error, ...) propagates out of ``TestOneInput`` and atheris reports
it as a crash, as it does for a native crash or a sanitizer report.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

import atheris

with atheris.instrument_imports(include=["hf2q"]):
    import hf2q
    import hf2q.device
    import hf2q.dflash
    import hf2q.ops
    import hf2q.qwen35
    import hf2q.reference
    import hf2q.safetensors

MISUSE = (TypeError, ValueError, OverflowError)

# Scale overflows are reported as warnings by design; they are not failures.
warnings.simplefilter("ignore", hf2q.ScaleOverflowWarning)


class OracleFailure(AssertionError):
    """A property the target checks did not hold (wrong result, leaked buffer,
    unexpected exception type)."""


def allowed(e: BaseException, *, misuse: bool) -> bool:
    if isinstance(e, hf2q.Hf2qError):
        return True
    return misuse and isinstance(e, MISUSE)


def expect(e: BaseException, *, misuse: bool, what: str) -> None:
    """Swallow `e` if the oracle allows it, else fail the input with it chained."""
    if not allowed(e, misuse=misuse):
        raise OracleFailure(f"{what}: unexpected {type(e).__module__}.{type(e).__qualname__}: {e}") from e


def scratch_dir(name: str) -> Path:
    """A per-process scratch directory (tmpfs when there is one)."""
    base = os.environ.get("HF2Q_FUZZ_TMP") or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    d = Path(tempfile.mkdtemp(prefix=f"hf2q-fuzz-{name}-", dir=base))
    import atexit
    import shutil

    atexit.register(shutil.rmtree, d, True)
    return d


def check_no_buffers(dev: hf2q.Device, baseline: int, what: str) -> None:
    """Every buffer of a failed or dropped load is gone: immediately, or at the
    latest after a gc pass (the loaders promise 'immediately'; a cycle is a bug
    too, reported separately)."""
    count = dev.residency.count
    if count == baseline:
        return
    gc.collect()
    count = dev.residency.count
    if count != baseline:
        raise OracleFailure(f"{what}: {count - baseline} buffer(s) left behind")
    raise OracleFailure(f"{what}: buffers were only freed by the cycle collector (a reference cycle holds them)")


def run(test_one_input: Callable[[bytes], Any]) -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
