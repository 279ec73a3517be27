"""hf2q's environment variables: read with one rule each, and a bad value
warned about once per process, saying what is used instead.

=====================  ==========================================================
``HF2Q_NUM_THREADS``   kernel threads, an integer 1..1024 (read by the native
                       core when its thread pool starts); otherwise the CPUs this
                       process may run on
``HF2Q_NO_RESIDENCY``  ``1``: no residency sets / no ``mlock``; ``0`` or unset: on
``HF2Q_FORCE_SCALAR``  ``1``: scalar kernels only (same bytes as SIMD)
``HF2Q_NO_PROGRESS``   ``1``: no progress bars (also ``HF_HUB_DISABLE_PROGRESS_BARS``)
``HF2Q_CACHE``         folder for ``hf2q demo``'s synthetic checkpoint
``HF2Q_HUGEPAGES``     host buffers: ``1`` always ask for transparent huge pages,
                       ``0`` never; unset: where the kernel's THP settings say
                       it cannot stall and no free page reporting hands 2 MiB
                       blocks to a hypervisor (docs/RESIDENCY.md, "Huge pages")
=====================  ==========================================================

``HF2Q_CUDA_STAGING_MIB`` and ``HF2Q_CUDA_SLOT_MIB`` set the size of the CUDA
staging ring and of its slots in MiB (default 128 and 4; slots 1, 2, 4, 8, 16 or 32),
for benchmarks (docs/CUDA.md); the native core reads them, ignoring any other
value. ``HF2Q_CUDA_TRACE=1`` makes each CUDA upload pipeline print one line
on stderr (where its threads' time went, on average per thread), for
benchmarks.

The switches take exactly ``1`` or ``0`` (the native core reads
``HF2Q_NO_RESIDENCY``, ``HF2Q_FORCE_SCALAR``, ``HF2Q_HUGEPAGES`` and
``HF2Q_CUDA_TRACE`` that way); an empty value is the same as unset.
"""

from __future__ import annotations

import os
import re
import warnings

__all__ = ["EnvVarWarning", "check_environment", "env_flag", "default_num_threads", "THREADS_MAX"]

THREADS_MAX = 1024
#: What the native core's strtol accepts as a whole value.
_INT = re.compile(r"^[ \t\n\v\f\r]*[+-]?[0-9]+$")

#: flag -> what stays in effect when its value is neither 1 nor 0.
FLAGS: dict[str, str] = {
    "HF2Q_NO_RESIDENCY": "residency stays on (HF2Q_NO_RESIDENCY=1 turns it off)",
    "HF2Q_FORCE_SCALAR": "the SIMD kernels stay on (HF2Q_FORCE_SCALAR=1 forces the scalar ones)",
    "HF2Q_NO_PROGRESS": "progress bars stay on (HF2Q_NO_PROGRESS=1 turns them off)",
    "HF2Q_HUGEPAGES": "the kernel's transparent huge page settings decide (docs/RESIDENCY.md)",
    "HF2Q_CUDA_TRACE": "no CUDA pipeline trace (HF2Q_CUDA_TRACE=1 prints one line per upload pipeline)",
}

_warned: set[str] = set()
_registry: dict = {}


class EnvVarWarning(UserWarning):
    """An hf2q environment variable has a value hf2q does not accept; the
    message says what is used instead."""


def _warn_once(name: str, message: str) -> None:
    if name in _warned:
        return
    _warned.add(name)
    # One line, "hf2q:0: EnvVarWarning: ...": the cause is the environment,
    # not a line of anyone's code, so no source location is shown.
    warnings.warn_explicit(message, EnvVarWarning, filename="hf2q", lineno=0, module="hf2q", registry=_registry)


def default_num_threads() -> int:
    """The CPUs this process may run on (the native core's default)."""
    try:
        n = len(os.sched_getaffinity(0))  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, n)


def env_flag(name: str) -> bool:
    """A ``1``/``0`` switch; any other non-empty value warns once and counts as 0."""
    raw = os.environ.get(name)
    if raw is None or raw == "" or raw == "0":
        return False
    if raw == "1":
        return True
    what = FLAGS.get(name, f"it stays off ({name}=1 turns it on)")
    _warn_once(name, f"{name}={raw!r} is not 1 or 0; {what}")
    return False


def check_num_threads() -> None:
    raw = os.environ.get("HF2Q_NUM_THREADS")
    if raw is None or raw == "":
        return
    n = default_num_threads()
    used = f"using {n} thread{'s' if n != 1 else ''} (the CPUs this process may run on)"
    if not _INT.match(raw):
        _warn_once("HF2Q_NUM_THREADS", f"HF2Q_NUM_THREADS={raw!r} is not an integer; {used}")
    elif not 1 <= int(raw) <= THREADS_MAX:
        _warn_once("HF2Q_NUM_THREADS", f"HF2Q_NUM_THREADS={raw!r} is outside 1..{THREADS_MAX}; {used}")


def check_environment() -> None:
    """Warn once about each hf2q variable whose value is not accepted."""
    check_num_threads()
    for name in FLAGS:
        env_flag(name)
