"""Fuzz target: the safetensors header parser (hf2q.safetensors.open).

The input is the whole file. Oracle:

* only :class:`hf2q.SafetensorsError` may escape ``open`` (with a ``code``);
* an accepted file is consistent: tensors tile the data section exactly,
  ``read_bytes`` returns exactly the file's slice, ``read_array`` works for
  every dtype numpy can hold (``TypeError`` only for the sub-byte F4/F6);
* differential, against the reference Rust ``safetensors`` crate: a file hf2q
  accepts, the crate accepts too, with the same names, dtypes, shapes and
  bytes; a file the crate accepts, hf2q accepts unless it is one of hf2q's
  documented extra rules (duplicate JSON keys).

Run: ``python fuzz/fuzz_safetensors.py [libFuzzer flags] CORPUS_DIR...``
(see scripts/run_fuzz.sh).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import OracleFailure, hf2q, run, scratch_dir  # noqa: E402

import numpy as np  # noqa: E402

try:  # the reference implementation (a test dependency of hf2q)
    from safetensors import deserialize as _reference_deserialize
except ImportError:  # pragma: no cover
    _reference_deserialize = None

SUB_BYTE = {"F4", "F6_E2M3", "F6_E3M2"}
# Codes for rules hf2q adds on top of the reference crate.
HF2Q_ONLY_CODES = {"DuplicateKey"}

_DIR = scratch_dir("st")
_PATH = _DIR / "f.safetensors"


def _reference(data: bytes):
    if _reference_deserialize is None:
        return None
    try:
        return {name: (d["dtype"], tuple(d["shape"]), bytes(d["data"])) for name, d in _reference_deserialize(data)}
    except Exception:  # noqa: BLE001 - any refusal of the reference crate
        return None


def test_one_input(data: bytes) -> None:
    with open(_PATH, "wb") as fh:
        fh.write(data)
    ref = _reference(data)
    try:
        f = hf2q.safetensors.open(_PATH)
    except hf2q.SafetensorsError as e:
        if not e.code:
            raise OracleFailure(f"SafetensorsError without a code: {e}") from e
        if ref is not None and e.code not in HF2Q_ONLY_CODES:
            raise OracleFailure(f"hf2q refuses ({e.code}: {e}) a file the reference crate accepts") from e
        return
    with f:
        n = f.header_size
        if f.data_offset != 8 + n or f.file_size != len(data) or f.total_data_bytes() != len(data) - 8 - n:
            raise OracleFailure("inconsistent sizes")
        _ = f.metadata, repr(f), len(f), list(f)
        infos = sorted(f.tensors(), key=lambda t: (t.offset, t.end, t.name))
        pos = f.data_offset
        for info in infos:
            if info.offset != pos or info.end < info.offset or info.end > len(data):
                raise OracleFailure(f"tensor {info.name!r} at [{info.offset}, {info.end}) does not tile the data")
            pos = info.end
            got = f.read_bytes(info.name)
            if bytes(got) != data[info.offset : info.end]:
                raise OracleFailure(f"read_bytes({info.name!r}) differs from the file's bytes")
            try:
                arr = f.read_array(info.name)
            except TypeError:
                if info.dtype not in SUB_BYTE:
                    raise
            except hf2q.SafetensorsError as e:
                # The one typed rule for shapes numpy cannot hold: only zero-element tensors can have them
                # (a tensor with bytes fits in the file, so numpy can hold its shape).
                if e.code != "NotRepresentable" or info.nbytes != 0:
                    raise OracleFailure(f"read_array({info.name!r}) refused a valid tensor: {e}") from e
            else:
                if arr.shape != info.shape or arr.nbytes != info.nbytes:
                    raise OracleFailure(f"read_array({info.name!r}) has shape {arr.shape}, nbytes {arr.nbytes}")
                if arr.nbytes and np.asarray(arr).reshape(-1).view(np.uint8).tobytes() != bytes(got):
                    raise OracleFailure(f"read_array({info.name!r}) bytes differ")
        if pos != len(data):
            raise OracleFailure("tensors do not cover the data section")
        if _reference_deserialize is not None:
            if ref is None:
                raise OracleFailure("hf2q accepts a file the reference crate refuses")
            mine = {t.name: (t.dtype, t.shape, data[t.offset : t.end]) for t in infos}
            if mine != ref:
                raise OracleFailure("hf2q and the reference crate disagree on the tensors")


if __name__ == "__main__":
    run(test_one_input)
