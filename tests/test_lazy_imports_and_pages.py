"""What a load process pays for: ``import hf2q; Device("host")`` imports no
numpy (hf2q._lazy), ``ml_dtypes`` is imported only where a
caller asks for a bfloat16 numpy view, and host buffers ask for transparent
huge pages only where the kernel's THP settings cannot stall in compaction
(docs/RESIDENCY.md, "Huge pages"). Each case runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf2q.testing import make_dflash_checkpoint

THP = Path("/sys/kernel/mm/transparent_hugepage")


def _run(code: str, *args: str, **env: str) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("HF2Q_")}
    e.update(env)
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=e, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_load_does_not_import_ml_dtypes(tmp_path: Path) -> None:
    d = make_dflash_checkpoint(tmp_path / "tiny", "tiny")
    r = _run("""
import json, sys
import numpy as np
import hf2q
dev = hf2q.Device("host")
m = hf2q.dflash.load(sys.argv[1], dev, progress=False)
b = dev.upload(np.arange(64, dtype=np.float32), to="q8_0")
after_load = "ml_dtypes" in sys.modules
view = dev.alloc((64,), "bf16").numpy()  # a caller asks for a bfloat16 view
print(json.dumps({"after_load": after_load, "after_view": "ml_dtypes" in sys.modules, "dtype": str(view.dtype)}))
""", str(d))
    assert r == {"after_load": False, "after_view": True, "dtype": "bfloat16"}


def test_import_and_host_device_do_not_import_numpy() -> None:
    r = _run("""
import json, sys
import hf2q
dev = hf2q.Device("host")
before = sorted(m for m in ("numpy", "ml_dtypes", "hf2q.reference", "hf2q._arrays") if m in sys.modules)
buf = dev.alloc((2, 32), "f32")                 # the first array-facing call brings numpy in
import numpy as np
x = np.arange(64, dtype=np.float32).reshape(2, 32)
b = dev.upload(x, to="q8_0")
print(json.dumps({"before": before, "after": "numpy" in sys.modules, "q8": b.byte_len,
                  "view": buf.numpy().dtype.name, "ok": dev.verify(b).ok,
                  "fmt": hf2q.formats.get("f32").numpy_dtype.name}))
""")
    assert r == {"before": [], "after": True, "q8": 68, "view": "float32", "ok": True, "fmt": "float32"}


def test_lazy_numpy_stand_in_is_numpy_once_used() -> None:
    from hf2q import _lazy, device, formats

    import numpy as np

    assert device.np.ndarray is np.ndarray and formats.np.dtype is np.dtype
    assert _lazy.numpy.float32 is np.float32 and _lazy.numpy.linalg is np.linalg
    with pytest.raises(AttributeError):
        _lazy.numpy.no_such_numpy_name


def test_bfloat16_arrays_still_convert_once_ml_dtypes_is_there() -> None:
    r = _run("""
import json
import numpy as np, ml_dtypes
import hf2q
dev = hf2q.Device("host")
x = (np.arange(64, dtype=np.float32) / 7).astype(ml_dtypes.bfloat16)
b = dev.upload(x, to="f32")
q = hf2q.ops.quantize_q8_0(x.reshape(2, 32))
print(json.dumps({"dtype": b.dtype, "equal": bool((b.numpy() == x.astype(np.float32)).all()), "q": list(q.shape)}))
""")
    assert r == {"dtype": "f32", "equal": True, "q": [2, 34]}


_FLAGS = """
import json
import hf2q
dev = hf2q.Device("host")
buf = dev.alloc((4 << 20,), "u8")
addr = buf.address
flags = None
with open("/proc/self/smaps") as f:
    inside = False
    for line in f:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and line.startswith("VmFlags:"):
            flags = line.split()[1:]
            break
print(json.dumps({"hg": "hg" in flags, "aligned": addr % (2 << 20) == 0}))
"""


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc/self/smaps")
def test_huge_page_advice_follows_the_thp_settings() -> None:
    assert _run(_FLAGS, HF2Q_HUGEPAGES="1") == {"hg": True, "aligned": True}
    assert _run(_FLAGS, HF2Q_HUGEPAGES="0") == {"hg": False, "aligned": True}

    def choice(name: str) -> str:
        try:
            text = (THP / name).read_text()
        except OSError:
            return ""
        return text[text.index("[") + 1:text.index("]")] if "[" in text else ""

    def reports_huge_blocks() -> bool:  # virtio free page reporting of 2 MiB blocks (docs/RESIDENCY.md)
        try:
            return int(Path("/sys/module/page_reporting/parameters/page_reporting_order").read_text()) <= 9
        except (OSError, ValueError):
            return False

    want = choice("enabled") == "madvise" and choice("defrag") in ("defer", "never") and not reports_huge_blocks()
    assert _run(_FLAGS) == {"hg": want, "aligned": True}
