"""Fuzz target: the checkpoint opener and the model loaders on it.

The input encodes a directory (fuzz/_ckpt_codec.py: config.json, an index
json, shards with fuzzed headers and generated data, truncations). Every
exception must be an :class:`hf2q.Hf2qError`: the whole input is file data,
so even ``ValueError``/``TypeError`` would be a bug here. Oracle:

* ``hf2q.safetensors.open_checkpoint(dir)``: every tensor is in exactly one
  shard, ``read_bytes`` equals the bytes of that shard file;
* when there is a config.json: ``hf2q.dflash.load`` and ``hf2q.qwen35.load``
  onto a private host device either succeed (then ``verify()`` must pass) or
  raise an hf2q error; either way no device buffer is left once the model
  or the exception is gone;
* special entries (FIFO, directory, /dev/zero, sparse oversized files) must
  be refused at once with an hf2q error (a hang is a libFuzzer timeout);
* an in-place rewrite after validation: every read of a tensor of the
  rewritten shard raises ``SafetensorsError`` with code ``FileChanged``; loads
  on it raise an hf2q error or succeed with buffers that verify.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _ckpt_codec import decode, rewrite_in_place, write  # noqa: E402
from _harness import OracleFailure, check_no_buffers, expect, hf2q, run, scratch_dir  # noqa: E402

_DIR = scratch_dir("ckpt")
_DEV = hf2q.Device._isolated("host")


def _rewrite(files: dict) -> None:
    for name in files.get("REWRITES", ()):
        if isinstance(files.get(name), bytes):
            rewrite_in_place(_DIR / name)


def _check_checkpoint(files: dict) -> None:
    try:
        ck = hf2q.safetensors.open_checkpoint(_DIR)
    except BaseException as e:  # noqa: BLE001 - the oracle decides
        expect(e, misuse=False, what="open_checkpoint")
        return
    rewritten = {n for n in files.get("REWRITES", ()) if isinstance(files.get(n), bytes)}
    if rewritten:
        _rewrite(files)  # after validation: reads must refuse (FileChanged), never return other bytes
    with ck:
        if rewritten:
            for name in ck.keys():
                if ck.file_for(name).path.name in rewritten and ck[name].nbytes:
                    try:
                        ck.read_bytes(name)
                    except BaseException as e:  # noqa: BLE001 - the oracle decides
                        expect(e, misuse=False, what="read after an in-place rewrite")
                        if getattr(e, "code", None) != "FileChanged":
                            raise OracleFailure(f"read after an in-place rewrite: {e!r}") from None
                        continue
                    raise OracleFailure(f"read_bytes({name!r}) succeeded after its shard was rewritten in place")
            return
        names = ck.keys()
        if len(set(names)) != len(names) or len(ck) != len(names):
            raise OracleFailure("duplicate tensor names in keys()")
        for name in names:
            info = ck[name]
            shard = ck.file_for(name)
            body = files.get(shard.path.name)
            if body is None or info.path is None or info.path.name != shard.path.name:
                raise OracleFailure(f"tensor {name!r} maps to an unknown shard {shard.path}")
            if bytes(ck.read_bytes(name)) != body[info.offset : info.end]:
                raise OracleFailure(f"read_bytes({name!r}) differs from the shard's bytes")
        _ = ck.metadata, ck.files, ck.total_data_bytes(), repr(ck)
    if not ck.closed:
        raise OracleFailure("checkpoint not closed after 'with'")


def _check_load(loader, what: str, files: dict, **kwargs) -> None:
    baseline = _DEV.residency.count
    if files.get("REWRITES"):
        real = hf2q.safetensors.open_checkpoint

        def open_then_rewrite(path):  # the loader validates, then the files change under it
            ck = real(path)
            _rewrite(files)
            return ck

        mod = sys.modules["hf2q.models.dflash.manifest" if "dflash" in what else "hf2q.models.qwen35.load"]
        mod.open_checkpoint = open_then_rewrite
    try:
        model = loader(_DIR, device=_DEV, progress=False, **kwargs)
    except BaseException as e:  # noqa: BLE001 - the oracle decides
        expect(e, misuse=False, what=what)
        del e
        check_no_buffers(_DEV, baseline, f"{what} (failed)")
        return
    finally:
        if files.get("REWRITES"):
            mod.open_checkpoint = real
    try:
        model.verify()
    finally:
        del model
    check_no_buffers(_DEV, baseline, f"{what} (model dropped)")


def test_one_input(data: bytes) -> None:
    files = decode(data)
    write(files, _DIR)
    _check_checkpoint(files)
    if "config.json" in files:
        if files.get("REWRITES"):
            write(files, _DIR)  # the rewrite above changed the files: start again from the input
        _check_load(hf2q.dflash.load, "hf2q.dflash.load", files)
        if files.get("REWRITES"):
            write(files, _DIR)
        dense = ("f32", "bf16", "q8_0")[len(data) % 3]  # every dense dtype path, chosen by the input
        _check_load(hf2q.qwen35.load, "hf2q.qwen35.load", files, dense_dtype=dense)


if __name__ == "__main__":
    run(test_one_input)
