"""Typed errors everywhere (issue 11, row "untyped errors"): each input that
raised RecursionError, ValueError, PermissionError or a numpy ValueError is an
Hf2qError subclass, and the CLI prints one line and exits 2 for each (before:
a traceback and exit 1)."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from _hardening import run_python

import hf2q
from hf2q import dflash, qwen35
from hf2q.device import Device
from hf2q.errors import ConfigError, ExtraTensorError, Hf2qError, SafetensorsError
from hf2q.testing import make_dflash_checkpoint, make_qwen35_moe_checkpoint

CLI = "import sys; from hf2q.cli import main; sys.exit(main(sys.argv[1:]))"


def _cli(*args: str, prelude: str = "") -> tuple[int, str, str]:
    r = run_python(prelude + "\n" + CLI, args=list(args), timeout=120)
    return r.returncode, r.stdout, r.stderr


def _assert_one_line_exit_2(rc: int, out: str, err: str, needle: str) -> None:
    assert rc == 2, (rc, err[-3000:])
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err[-3000:]
    assert needle in err, err


@pytest.fixture(scope="module")
def dflash_ck(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dflash_checkpoint(tmp_path_factory.mktemp("errors") / "d", "tiny", seed=4)


@pytest.fixture(scope="module")
def qwen_ck(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_qwen35_moe_checkpoint(tmp_path_factory.mktemp("errors") / "q", "tiny", seed=4)


@pytest.mark.parametrize("command", ["inspect", "load"])
@pytest.mark.parametrize("case", ["deep-config", "deep-rope", "huge-int"])
def test_config_cases_exit_2(case: str, command: str, dflash_ck: Path, tmp_path: Path) -> None:
    d = tmp_path / "ck"
    shutil.copytree(dflash_ck, d)
    cfg = json.loads((d / "config.json").read_text())
    if case == "deep-config":
        text = "[" * 100_000 + "]" * 100_000
    elif case == "deep-rope":
        text = json.dumps(cfg)[:-1] + ', "rope_parameters": ' + '{"a": ' * 800 + "1" + "}" * 800 + "}"
    else:
        text = json.dumps(cfg).replace('"vocab_size": 256', '"vocab_size": ' + "7" * 5000)
    (d / "config.json").write_text(text)
    with pytest.raises(ConfigError):
        dflash.load(d, Device._isolated("host"), progress=False)
    _assert_one_line_exit_2(*_cli(command, str(d)), "config")


def _add_tensor(ck: Path, name: str) -> None:
    import numpy as np
    from safetensors.numpy import load_file, save_file

    f = ck / "model.safetensors"
    tensors = load_file(str(f))
    tensors[name] = np.zeros((2,), dtype=np.float32)
    save_file(tensors, str(f))


@pytest.mark.parametrize("name", [
    "model.layers." + "9" * 5000 + ".mlp.gate.weight",
    "model.layers.0.mlp.experts." + "9" * 5000 + ".gate_proj.weight",
    "mtp.layers." + "9" * 5000 + ".mlp.gate.weight",
])
def test_huge_index_in_a_tensor_name(name: str, qwen_ck: Path, tmp_path: Path) -> None:
    d = tmp_path / "ck"
    shutil.copytree(qwen_ck, d)
    _add_tensor(d, name)
    with pytest.raises(ExtraTensorError) as ei:
        qwen35.load(d, Device._isolated("host"), progress=False)
    assert name[:20] in str(ei.value)
    rc, out, err = _cli("load", str(d))
    assert rc == 2 and "Traceback" not in err, err[-3000:]


def test_unreadable_checkpoint_directory(dflash_ck: Path, tmp_path: Path) -> None:
    d = tmp_path / "ck"
    shutil.copytree(dflash_ck, d)
    if os.geteuid() != 0:
        os.chmod(d, 0)
        prelude = ""
    else:  # root ignores the mode bits: refuse the directory's entries as the kernel would
        prelude = (
            "import os, sys; _real = os.stat; d = sys.argv[-1]\n"
            "def _stat(p, *a, **k):\n"
            "    if os.fspath(p).startswith(d + '/'): raise PermissionError(13, 'Permission denied', os.fspath(p))\n"
            "    return _real(p, *a, **k)\n"
            "os.stat = _stat\n"
        )
    try:
        for command in ("inspect", "load"):
            rc, out, err = _cli(command, str(d), prelude=prelude)
            _assert_one_line_exit_2(rc, out, err, "ermission denied")
        if os.geteuid() != 0:
            with pytest.raises(Hf2qError):
                hf2q.open_checkpoint(d)
    finally:
        os.chmod(d, 0o755)


def test_open_checkpoint_maps_oserror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "ck"
    d.mkdir()

    def refuse(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "exists", refuse)
    with pytest.raises(SafetensorsError) as ei:
        hf2q.open_checkpoint(d)
    assert ei.value.code == "Io" and "Permission denied" in str(ei.value)


def test_zero_element_tensor_numpy_cannot_hold(tmp_path: Path) -> None:
    header = json.dumps({"t": {"dtype": "F32", "shape": [0, 2**64 - 1], "data_offsets": [0, 0]}}).encode()
    p = tmp_path / "z.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header)
    with hf2q.safetensors.open(p) as f:
        assert f["t"].numel == 0
        assert f.read_bytes("t") == bytearray()
        with pytest.raises(SafetensorsError) as ei:
            f.read_array("t")
    assert ei.value.code == "NotRepresentable" and ei.value.tensor == "t"
    rc, out, err = _cli("inspect", str(p))
    assert rc == 0, err
