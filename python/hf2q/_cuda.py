"""Where the CUDA backend finds NVRTC and keeps its compiled kernels.

The native backend loads the NVIDIA driver (``libcuda.so.1``) and NVRTC at
run time; nothing CUDA is needed to build or import hf2q. NVRTC is looked for
first in the ``nvidia-cuda-nvrtc`` wheel (``pip install "hf2q[cuda]"``), then
under the system's library names. Compiled kernels are cached per GPU
architecture in ``$HF2Q_CACHE_DIR/cuda`` (default: ``$XDG_CACHE_HOME/hf2q`` or
``~/.cache/hf2q``); ``HF2Q_CACHE_DIR=""`` disables the cache.
"""

from __future__ import annotations

import glob
import os
import re
import threading

from . import _core

_lock = threading.Lock()
_done = False


def nvrtc_candidates() -> list[str]:
    """NVRTC libraries shipped in ``nvidia-*`` wheels, newest major first."""
    try:
        import nvidia  # namespace package of the nvidia-* wheels
    except ImportError:
        return []
    found: list[str] = []
    for root in list(getattr(nvidia, "__path__", [])):
        # cu13 wheels: nvidia/cu13/lib; cu12 and older: nvidia/cuda_nvrtc/lib
        for path in glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so.*")):
            if re.fullmatch(r"libnvrtc\.so\.\d+(\.\d+)*", os.path.basename(path)):
                found.append(path)

    def major(p: str) -> int:
        m = re.search(r"\.so\.(\d+)", p)
        return int(m.group(1)) if m else 0

    return sorted(set(found), key=major, reverse=True)


def cache_dir() -> str:
    base = os.environ.get("HF2Q_CACHE_DIR")
    if base is None:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "hf2q")
    return os.path.join(base, "cuda") if base else ""


def prepare() -> None:
    """Tell the native backend where NVRTC and the cache are (once)."""
    global _done
    with _lock:
        if not _done:
            _core.cuda_configure(nvrtc_candidates(), cache_dir())
            _done = True


def _new_lock_in_child() -> None:
    # A child forked while another thread was inside prepare() (a device
    # opened on a helper thread while a load plans, hf2q.device.DeviceOpening)
    # inherits the lock held by a thread it does not have: a new one. The
    # native configuration it guards is the parent's, copied whole or not
    # begun (cuda_configure runs under the native side's own lock).
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)
