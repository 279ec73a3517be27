"""Zero-element tensors (issue 26): legal in safetensors; they load as empty
buffers under every dtype option, inspect and verify; sizes with a zero
factor never overflow; a shape no numpy array (so no buffer view) can hold
is refused by one typed rule (SafetensorsError NotRepresentable)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import hf2q
from hf2q import safetensors as st
from hf2q.device import Device
from hf2q.testing import make_dflash_checkpoint

ZERO = {
    "empty.bias": np.zeros((0,), np.float32),
    "blk.0.a.weight": np.zeros((0, 64), np.float16),
    "blk.0.b.weight": np.zeros((64, 0), ml_dtypes.bfloat16),
    "blk.1.c.weight": np.zeros((3, 0, 5), np.float32),
    "blk.1.ids": np.zeros((0,), np.int32),
    "blk.1.mask": np.zeros((0, 2), np.uint8),
    "blk.2.real.weight": np.arange(2 * 64, dtype=np.float32).reshape(2, 64),
    "blk.3.f8.weight": np.zeros((0, 256), ml_dtypes.float8_e4m3fn),  # FP8 kept (keep) / decoded (the others)
    "blk.3.k.weight": np.zeros((0, 256), np.float32),  # whole 256-blocks: the k-quants apply
}
#: every dtype option of the generic family (hf2q.plan.CONVERT_DTYPES and keep)
POLICIES = ["keep", "f32", "bf16", "f16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"]


def raw_file(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> Path:
    """A safetensors file written by hand (shapes the safetensors library cannot make): name -> (dtype,
    shape, nbytes)."""
    header: dict[str, object] = {}
    off = 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + nbytes]}
        off += nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(len(h).to_bytes(8, "little") + h + b"\x01" * off)
    return path


@pytest.fixture(scope="module")
def zero_ck(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("zero")
    save_file(ZERO, str(d / "model.safetensors"))
    (d / "config.json").write_text("{}")
    return d


def test_the_options_are_the_familys() -> None:
    from hf2q.models import family

    assert tuple(POLICIES) == family("generic").impl().options[0].choices


@pytest.mark.parametrize("policy", POLICIES)
def test_generic_load_of_zero_element_tensors(policy: str, zero_ck: Path) -> None:
    """`ValueError: cannot allocate a zero-size buffer` traceback before."""
    dev = Device._isolated("host")
    m = hf2q.load(zero_ck, dev, dtype=policy, progress=False)
    _, config = hf2q.models.read_config(zero_ck)
    with hf2q.safetensors.open_checkpoint(zero_ck) as ckpt:
        _, rep = hf2q.models.inspect(ckpt, config, dtype=policy)
    assert rep["unloadable"] == []
    for name, x in ZERO.items():
        b = m[name]
        assert b.shape == x.shape, name
        assert b.dtype == rep["device_dtypes"][name], name  # inspect says what load makes
        if x.size == 0:
            assert b.byte_len == 0 and b.numpy().size == 0 and b.to_host().size == 0
    if policy == "keep":
        assert m["blk.3.f8.weight"].dtype == "f8_e4m3"  # FP8 kept as it is
    if policy in ("q4_k", "q5_k", "q6_k", "q4_0", "q8_0"):
        assert m["blk.3.k.weight"].dtype == policy  # rows of whole blocks: the option's format
    real = m["blk.2.real.weight"]
    if not hf2q.formats.get(real.dtype).is_block:  # (0..127 are exact in bf16 too)
        assert np.array_equal(real.numpy().astype(np.float32), ZERO["blk.2.real.weight"])
    v = m.verify()
    assert v["buffers"] == len(ZERO)
    m2 = hf2q.load(zero_ck, dev, dtype=policy, progress=False, check_finite=True)
    assert m2["empty.bias"].byte_len == 0
    del m, m2


def test_cli_inspect_and_load_of_zero_element_tensors(zero_ck: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "hf2q", "inspect", str(zero_ck), "--json"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    rows = {r["name"]: r for r in json.loads(p.stdout)["tensor_list"]}
    assert rows["blk.1.c.weight"]["shape"] == [3, 0, 5] and rows["blk.1.c.weight"]["bytes"] == 0
    p = subprocess.run([sys.executable, "-m", "hf2q", "load", str(zero_ck), "--device", "host", "--verify", "--json",
                        "--dtype", "bf16"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["verify"]["buffers"] == len(ZERO)


def test_device_zero_sizes_never_overflow() -> None:
    dev = Device._isolated("host")
    for shape in [(0,), (0, 4), (2**62, 2**62, 0), (0, 2**63 - 1), (5, 0, 2**40)]:
        b = dev.alloc(shape, "u8")
        assert b.byte_len == 0 and b.shape == shape
    b = dev.upload(np.zeros((0, 64), np.float32), to="q8_0")
    assert b.byte_len == 0 and b.shape == (0, 64)
    b = dev.upload(np.zeros((0,), ml_dtypes.bfloat16), to="f32")
    assert b.byte_len == 0
    with pytest.raises(OverflowError):
        dev.alloc((2**62, 2**62), "u8")  # without a zero, the same numbers do overflow


def test_read_array_of_zero_element_shapes(tmp_path: Path) -> None:
    f = raw_file(tmp_path / "z.safetensors", {
        "huge_dim": ("F32", [0, 2**64 - 1], 0),
        "too_big_for_numpy": ("F32", [0, 2**62], 0),
        "bytes_ok": ("U8", [0, 2**62], 0),
        "plain": ("F32", [0, 3], 0),
        "x": ("U8", [4], 4),
    })
    with st.open(f) as sf:
        for name in ("huge_dim", "too_big_for_numpy"):
            with pytest.raises(hf2q.SafetensorsError) as ei:
                sf.read_array(name)
            assert ei.value.code == "NotRepresentable" and ei.value.tensor == name
        assert sf.read_array("bytes_ok").shape == (0, 2**62)  # numpy holds it: no element, no byte
        assert sf.read_array("plain").shape == (0, 3)
        assert sf["huge_dim"].nbytes == 0
        assert bytes(sf.read_bytes("huge_dim")) == b""


def test_load_of_an_unrepresentable_zero_element_shape_is_refused_typed(tmp_path: Path) -> None:
    """`OverflowError` traceback before; now the same rule as read_array, before anything is allocated."""
    d = tmp_path / "g"
    d.mkdir()
    raw_file(d / "model.safetensors", {"a": ("F32", [0, 2**64 - 1], 0), "b": ("U8", [4], 4)})
    (d / "config.json").write_text("{}")
    dev = Device._isolated("host")
    for policy in POLICIES:
        with pytest.raises(hf2q.SafetensorsError) as ei:
            hf2q.load(d, dev, dtype=policy, progress=False)
        assert ei.value.code == "NotRepresentable" and ei.value.tensor == "a" and "[0, 18446744073709551615]" in str(
            ei.value)
    assert dev.residency.count == 0 if hasattr(dev, "residency") and hasattr(dev.residency, "count") else True
    p = subprocess.run([sys.executable, "-m", "hf2q", "load", str(d), "--device", "host", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and json.loads(p.stdout)["error"]["code"] == "NotRepresentable"
    for policy in POLICIES:  # inspect agrees with load: listed, with no device dtype, as unloadable
        p = subprocess.run([sys.executable, "-m", "hf2q", "inspect", str(d), "--json", "--dtype", policy],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr  # headers only: the shape is listed as it is
        rep = json.loads(p.stdout)
        assert rep["tensor_list"][0]["shape"] == [0, 2**64 - 1]
        assert rep["tensor_list"][0]["device_dtype"] is None and rep["unloadable"] == ["a"], policy
        assert rep["tensor_list"][1]["device_dtype"] == "u8" and rep["resident_bytes"] == 4
    p = subprocess.run([sys.executable, "-m", "hf2q", "inspect", str(d)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "-> unloadable" in p.stdout.splitlines()[-2], p.stdout


def test_model_families_refuse_zero_element_tensors_by_their_manifest(tmp_path: Path) -> None:
    """A model family checks each tensor against its config: a zero-element tensor is a typed manifest
    error (here an extra tensor in a DFlash drafter), never a crash."""
    from safetensors.numpy import load_file

    d = make_dflash_checkpoint(tmp_path / "d", "tiny", seed=1)
    t = load_file(str(d / "model.safetensors"))
    t["extra.weight"] = np.zeros((0, 8), np.float32)
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(hf2q.ManifestError, match="extra.weight"):
        hf2q.dflash.load(d, Device._isolated("host"), progress=False)


def test_gemma4_tokenizer_without_tokens(tmp_path: Path) -> None:
    """The converter keeps as many embedding rows as the tokenizer has tokens: none here, so a 0-row
    embedding (and tied head); a ValueError traceback before, an empty buffer now, inspect and verify
    included."""
    import shutil

    src = Path(__file__).parent / "data" / "gemma4" / "gemma4_moe_causal_lm" / "hf"
    d = tmp_path / "gem"
    shutil.copytree(src, d)
    tok = json.loads((d / "tokenizer.json").read_text())
    tok["model"]["vocab"] = {} if isinstance(tok["model"]["vocab"], dict) else []
    tok["added_tokens"] = []
    (d / "tokenizer.json").write_text(json.dumps(tok))
    dev = Device._isolated("host")
    for dense in ("f32", "bf16", "f16", "q8_0"):
        m = hf2q.gemma4.load(d, dev, dense_dtype=dense, progress=False)
        assert m.embed_tokens.shape[0] == 0 and m.embed_tokens.byte_len == 0
        assert m.verify()["buffers"] == len(m)
        del m
    p = subprocess.run([sys.executable, "-m", "hf2q", "inspect", str(d), "--json"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
