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


@pytest.mark.parametrize("how", ["bf16", "q8_0", "f32", "recipe q4_k_m", "qwen bf16", "gpu path bf16"])
def test_fp8_and_recipe_loads_do_not_import_ml_dtypes(how: str) -> None:
    """Scaled FP8 weights and BF16 scales are read as bytes, decoded into
    the buffer's bits, and a recipe's BF16 rounding is done without
    ml_dtypes: its import (0.5-1.3 s) was counted in the load's seconds."""
    data = Path(__file__).parent / "data" / "fp8"
    r = _run("""
import json, sys
import hf2q
how = sys.argv[2]
if how.startswith("gpu path"):  # the GPU's load path forced on the host
    from hf2q import loader
    loader._SCALED_ON_DEVICE = loader._OVERLAP = True
dtype = how.split()[-1]
if how.startswith("qwen"):
    m = hf2q.qwen35.load(sys.argv[3], device="host", dense_dtype=dtype, expert_dtype=dtype, progress=False)
elif how.startswith("recipe"):
    m = hf2q.load(sys.argv[1], device="host", recipe=dtype, progress=False)
else:
    m = hf2q.load(sys.argv[1], device="host", dtype=dtype, progress=False)
print(json.dumps({"ml_dtypes": "ml_dtypes" in sys.modules, "tensors": len(m.names()) > 0}))
""", str(data / "qwen3_fp8_deepseek" / "hf"), how, str(data / "qwen35moe_fp8_block128" / "hf"))
    assert r == {"ml_dtypes": False, "tensors": True}


def test_an_mxfp4_load_with_e8m0_scales_does_not_import_ml_dtypes(tmp_path: Path) -> None:
    """gpt-oss MXFP4 whose ``_scales`` are typed F8_E8M0 (not U8): read as bytes."""
    import shutil

    import ml_dtypes

    import hf2q
    from hf2q.safetensors import open_checkpoint
    from hf2q.testing.fp8_checkpoint import write_safetensors

    src = Path(__file__).parent / "data" / "fp8" / "gptoss_mxfp4" / "hf"
    d = tmp_path / "e8m0"
    d.mkdir()
    with open_checkpoint(src) as c:
        arrays = {n: c.read_array(n) for n in c.keys()}
    arrays = {n: (a.view(ml_dtypes.float8_e8m0fnu) if n.endswith("_scales") else a) for n, a in arrays.items()}
    write_safetensors(d / "model.safetensors", arrays)
    shutil.copy(src / "config.json", d / "config.json")
    r = _run("""
import json, sys
import hf2q
m = hf2q.load(sys.argv[1], device="host", dtype="f32", progress=False)
k = hf2q.load(sys.argv[1], device="host", dtype="keep", progress=False)
print(json.dumps({"ml_dtypes": "ml_dtypes" in sys.modules, "kept": k["model.layers.0.mlp.experts.down_proj"].dtype}))
""", str(d))
    assert r == {"ml_dtypes": False, "kept": "mxfp4"}
    u8 = hf2q.load(src, device="host", dtype="f32", progress=False)
    e8 = hf2q.load(d, device="host", dtype="f32", progress=False)
    assert all(u8[n].numpy().tobytes() == e8[n].numpy().tobytes() for n in u8.names())


def test_import_and_host_device_do_not_import_numpy() -> None:
    r = _run("""
import json, sys
import hf2q
dev = hf2q.Device("host")
before = sorted(m for m in ("numpy", "ml_dtypes", "hf2q.reference", "hf2q._arrays") if m in sys.modules)
buf = dev.alloc((2, 32), "f32")                 # plain ints: checked without numpy
after_alloc = "numpy" in sys.modules
import numpy as np
x = np.arange(64, dtype=np.float32).reshape(2, 32)
b = dev.upload(x, to="q8_0")
print(json.dumps({"before": before, "after_alloc": after_alloc, "after": "numpy" in sys.modules, "q8": b.byte_len,
                  "view": buf.numpy().dtype.name, "ok": dev.verify(b).ok,
                  "fmt": hf2q.formats.get("f32").numpy_dtype.name}))
""")
    assert r == {"before": [], "after_alloc": False, "after": True, "q8": 68, "view": "float32", "ok": True,
                 "fmt": "float32"}


def test_a_drafter_load_does_not_import_numpy(tmp_path: Path) -> None:
    # numpy's import is 70 ms of a whole-process load here, and its BLAS thread
    # spins beside the reads (README, "Whole processes"): a load whose tensors
    # are all read or converted natively does without it, through either entry.
    d = make_dflash_checkpoint(tmp_path / "tiny", "tiny")
    r = _run("""
import json, sys
import hf2q
dev = hf2q.Device("host")
m = hf2q.dflash.load(sys.argv[1], dev, progress=False)
first = "numpy" in sys.modules
n = hf2q.load(sys.argv[1], dev, progress=False)
second = "numpy" in sys.modules
import numpy as np
same = all(bool((m[k].numpy() == n[k].numpy()).all()) for k in m.state_dict())
print(json.dumps({"dflash.load": first, "hf2q.load": second, "same": same, "tensors": len(m.state_dict())}))
""", str(d))
    assert r["dflash.load"] is False and r["hf2q.load"] is False
    assert r["same"] is True and r["tensors"] > 0


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


def test_f32_to_bf16_bits_is_ml_dtypes_cast() -> None:
    """The loader's cast to BF16 (no ml_dtypes) gives ml_dtypes' bits: every
    BF16 upper half with the rounding-relevant lower halves, NaNs of every
    payload and sign, overflow to +-Inf, subnormals, and float16 inputs."""
    import ml_dtypes
    import numpy as np

    from hf2q._arrays import f32_to_bf16_bits

    hi = np.arange(65536, dtype=np.uint32) << 16
    lows = [0, 1, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF]
    u = np.concatenate([hi | np.uint32(low) for low in lows]
                       + [np.random.default_rng(7).integers(0, 2**32, 1 << 20, dtype=np.uint32)])
    f = u.view(np.float32)
    with np.errstate(invalid="ignore"):
        want = f.astype(ml_dtypes.bfloat16).view(np.uint16)
        h = np.arange(65536, dtype=np.uint16).view(np.float16)
        want16 = h.astype(ml_dtypes.bfloat16).view(np.uint16)
    got = f32_to_bf16_bits(f)
    assert got.dtype == np.uint16 and np.array_equal(got, want)
    assert np.array_equal(f32_to_bf16_bits(h.astype(np.float32)), want16)


def test_a_load_to_bf16_from_f32_does_not_import_ml_dtypes(tmp_path: Path) -> None:
    """F32 tensors loaded as BF16 (the host cannot convert f32 -> bf16
    natively, so the loader rounds them): the values ml_dtypes' cast gives,
    without importing it; under check_finite an overflow to Inf is the
    conversion's error."""
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 96)).astype(np.float32)
    w[0, :6] = [np.nan, -np.nan, np.inf, -np.inf, 1.0000001, 3e38]  # NaNs, Infs, a tie, an overflow to Inf
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    save_file({"model.w.weight": w, "model.v.weight": rng.standard_normal((3, 32)).astype(np.float32)},
              str(tmp_path / "a" / "model.safetensors"))
    big = np.ones((2, 32), np.float32)
    big[1, 7] = 3.4e38  # finite in F32, past the midpoint above the largest BF16: +Inf after rounding
    save_file({"model.o.weight": big}, str(tmp_path / "b" / "model.safetensors"))
    r = _run("""
import json, sys
import hf2q
dev = hf2q.Device("host")
m = hf2q.load(sys.argv[1], dev, dtype="bf16", progress=False)
out = {"ml_dtypes": "ml_dtypes" in sys.modules}  # before the read-back (a bfloat16 view imports it)
out.update({n: m[n].to_host().tobytes().hex() for n in ("model.w.weight", "model.v.weight")})
out["dtypes"] = [m[n].dtype for n in ("model.w.weight", "model.v.weight")]
try:
    hf2q.load(sys.argv[2], dev, dtype="bf16", progress=False, check_finite=True)
except hf2q.NonFiniteError as e:
    out["error"] = [e.tensor, e.step]
print(json.dumps(out))
""", str(tmp_path / "a"), str(tmp_path / "b"))
    assert r["ml_dtypes"] is False and r["dtypes"] == ["bf16", "bf16"]
    with np.errstate(invalid="ignore", over="ignore"):
        want_w = w.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert bytes.fromhex(r["model.w.weight"]) == want_w.tobytes()
    assert r["error"] == ["model.o.weight", "conversion f32->bf16"]
    v = np.frombuffer(bytes.fromhex(r["model.v.weight"]), dtype=np.uint16)
    assert v.size == 96 and v.any()
