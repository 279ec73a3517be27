"""What people read: CLI messages without internal tags, the same failure
worded the same by inspect and load, help for every option, --json errors
as JSON objects, numbers that are the model's own, one unit convention."""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hf2q
from hf2q import cli
from hf2q._progress import format_bytes
from hf2q.cli import build_parser, main
from hf2q.testing import make_dflash_checkpoint, make_qwen35_moe_checkpoint

#: every SafetensorsError code: none may lead a message
CODES = ["HeaderTooSmall", "HeaderTooLarge", "InvalidHeaderLength", "InvalidHeader", "InvalidHeaderDeserialization",
         "InvalidOffset", "ValidationOverflow", "MisalignedSlice", "TensorInvalidInfo", "MetadataIncompleteBuffer",
         "DuplicateKey", "InvalidIndex", "InvalidShardName", "MissingShard", "TensorNotInShard", "TensorNotInIndex",
         "DuplicateTensor", "NoCheckpoint", "Io", "FileTruncated", "NotAFile"]
TAG = re.compile(r"(^|: )(" + "|".join(CODES) + r"):")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dflash_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=3)


def _bad_inputs(tmp: Path, tiny: Path) -> dict[str, Path]:
    cases: dict[str, Path] = {}
    cases["missing"] = tmp / "missing"
    text = tmp / "text" / "notes.safetensors"
    text.parent.mkdir()
    text.write_text("# not a checkpoint, just some text that is long enough\n")
    cases["text"] = text
    trunc = tmp / "trunc"
    make_dflash_checkpoint(trunc, "tiny")
    f = trunc / "model.safetensors"
    os.truncate(f, f.stat().st_size - 3)
    cases["truncated"] = trunc
    empty = tmp / "empty"
    empty.mkdir()
    cases["empty dir"] = empty
    tiny_head = tmp / "tiny_head"
    make_dflash_checkpoint(tiny_head, "tiny")
    (tiny_head / "model.safetensors").write_bytes(b"\x01\x00")
    cases["2-byte file"] = tiny_head
    cases["config.json"] = tiny / "config.json"
    return cases


def test_inspect_and_load_word_failures_the_same(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                 tiny: Path) -> None:
    for what, path in _bad_inputs(tmp_path, tiny).items():
        rc_i, out_i, err_i = run(capsys, "inspect", str(path))
        rc_l, out_l, err_l = run(capsys, "load", "--device", "host", str(path))
        assert rc_i == rc_l == 2 and out_i == out_l == "", what
        assert err_i.startswith("hf2q inspect: error: ") and err_l.startswith("hf2q load: error: "), what
        msg_i, msg_l = err_i.split(": error: ", 1)[1], err_l.split(": error: ", 1)[1]
        assert msg_i == msg_l, what
        assert not TAG.search(msg_i), (what, msg_i)
        assert "Traceback" not in msg_i and str(path) in msg_i


def test_specific_messages(capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny: Path) -> None:
    cases = _bad_inputs(tmp_path, tiny)
    _, _, err = run(capsys, "inspect", str(cases["text"]))
    assert "not a safetensors file" in err
    _, _, err = run(capsys, "load", str(cases["config.json"]))
    assert f"this is the model's config; pass its folder: {tiny}" in err
    _, _, err = run(capsys, "load", str(cases["missing"]))
    assert err == f"hf2q load: error: {cases['missing']}: no such file or directory\n"
    _, _, err = run(capsys, "load", str(cases["truncated"]))
    assert "header + tensors end at byte" in err


def test_python_api_messages_have_no_tags(tmp_path: Path) -> None:
    p = tmp_path / "x.safetensors"
    p.write_bytes(b"\xff" * 64)
    with pytest.raises(hf2q.SafetensorsError) as ei:
        hf2q.open_checkpoint(p)
    assert ei.value.code == "HeaderTooLarge" and not TAG.search(str(ei.value))
    assert str(ei.value).startswith(f"{p}: not a safetensors file")
    with pytest.raises(hf2q.SafetensorsError) as ei:
        hf2q.open_checkpoint(tmp_path)
    assert ei.value.code == "NoCheckpoint" and not TAG.search(str(ei.value))


def test_dflash_load_on_a_qwen_checkpoint(tmp_path: Path) -> None:
    q = make_qwen35_moe_checkpoint(tmp_path / "qwen", "tiny")
    with pytest.raises(hf2q.ConfigError) as ei:
        hf2q.dflash.load(q, hf2q.Device("host"))
    msg = str(ei.value)
    assert "not a DFlash drafter" in msg and "qwen3_5_moe" in msg and "intermediate_size" not in msg


def test_load_rejects_qwen_options_for_a_drafter(capsys: pytest.CaptureFixture[str], tiny: Path) -> None:
    rc, _, err = run(capsys, "load", str(tiny), "--expert-dtype", "bf16")
    assert rc == 2 and "--expert-dtype does not apply to" in err and "the dflash family takes no options" in err


def _options(parser: argparse.ArgumentParser) -> dict[str, list[argparse.Action]]:
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: p._actions for name, p in subs.choices.items()} | {"": parser._actions}


def test_every_option_has_help() -> None:
    for cmd, actions in _options(build_parser()).items():
        for a in actions:
            if a.help == argparse.SUPPRESS or isinstance(a, argparse._SubParsersAction):
                continue
            assert a.help and len(a.help) > 10, (cmd, a.option_strings or a.dest)


def test_load_help_matches_what_load_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["load", "--help"])
    out = capsys.readouterr().out
    for opt in ("--revision", "--download", "--device", "--json", "--verify", "--no-progress", "--expert-dtype",
                "--dense-dtype", "--dtype", "--drafter"):
        assert opt in out
    out = " ".join(out.split())
    assert "Hugging Face repo id" in out and "config.json" in out and "Gemma 4 only" in out and "generic" in out


def test_readme_lists_every_option() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for cmd, actions in _options(build_parser()).items():
        for a in actions:
            if a.help == argparse.SUPPRESS:
                continue
            for opt in a.option_strings:
                if opt not in ("-h", "--help"):
                    assert opt in readme, (cmd, opt)
        if cmd:
            assert f"hf2q {cmd}" in readme


def test_help_lists_every_environment_variable_of_the_readme(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    env_section = readme.split("## Environment", 1)[1].split("\n## ", 1)[0]
    names = set(re.findall(r"`((?:HF2Q|HF)_[A-Z_]+)", env_section))
    assert {"HF2Q_NUM_THREADS", "HF2Q_NO_RESIDENCY", "HF2Q_NO_PROGRESS", "HF_HUB_CACHE"} <= names
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for n in names:
        assert n in out, n


@pytest.mark.parametrize("kind,name", [("metal", "Metal"), ("cuda", "CUDA")])
def test_demo_on_a_missing_device_fails_before_writing(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                       kind: str, name: str) -> None:
    try:
        hf2q.Device(kind)
        pytest.skip(f"this machine has {name}")
    except hf2q.DeviceError:
        pass
    rc, out, err = run(capsys, "demo", "--device", kind, "--cache-dir", str(tmp_path))
    # a device that cannot be opened is the machine's failure: status 1, with the way out
    assert rc == 1 and out == "" and name in err and "writing" not in err and "--device host" in err
    assert os.listdir(tmp_path) == []


def test_json_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, err = run(capsys, "inspect", "--json", str(tmp_path / "missing"))
    assert rc == 2 and err == ""
    e = json.loads(out)["error"]
    assert e == {"type": "SafetensorsError", "message": f"{tmp_path / 'missing'}: no such file or directory",
                 "code": "Io", "path": str(tmp_path / "missing")}
    rc, out, err = run(capsys, "load", "--json", "--device", "tpu", str(tmp_path))
    assert rc == 2 and err == ""
    e = json.loads(out)["error"]
    assert e["type"] == "UsageError" and "invalid choice: 'tpu'" in e["message"]
    rc, out, err = run(capsys, "demo", "--json", "--device", "host", "--config", "nope", "--cache-dir", str(tmp_path))
    assert rc == 2 and json.loads(out)["error"]["type"] == "ConfigError"


def test_os_error_is_reported_not_raised(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc, out, err = run(capsys, "demo", "--device", "host", "--config", "tiny", "--cache-dir", str(blocker / "sub"))
    assert rc == 1 and "hf2q demo: error:" in err and "Traceback" not in err
    rc, out, err = run(capsys, "demo", "--json", "--device", "host", "--config", "tiny", "--cache-dir",
                       str(blocker / "sub"))
    e = json.loads(out)["error"]
    assert rc == 1 and err == "" and e["type"] == "DemoCacheError" and e["path"] == str(blocker / "sub")
    assert f"{blocker} is a file" in e["message"] and "--cache-dir" in e["hint"] and "HF2Q_CACHE" in e["hint"]
    assert ".tmp" not in out  # the user's folder, not the temporary one inside it


def test_demo_says_where_its_cache_is_and_removes_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = run(capsys, "demo", "--device", "host", "--config", "tiny", "--cache-dir", str(tmp_path), "--json")
    target = tmp_path / "demo-tiny-dflash"
    assert rc == 0 and f"cached in {target}; remove it with: hf2q demo --remove --cache-dir {tmp_path}" in err
    rc, _, err = run(capsys, "demo", "--device", "host", "--config", "tiny", "--cache-dir", str(tmp_path), "--json")
    assert rc == 0 and f"in {target}; remove it with: hf2q demo --remove" in err
    (tmp_path / "keep.txt").write_text("mine")
    rc, out, _ = run(capsys, "demo", "--remove", "--config", "tiny", "--cache-dir", str(tmp_path), "--json")
    assert rc == 0 and json.loads(out) == {"path": str(target), "removed": True, "existed": True, "symlink": False,
                                           "temporaries_removed": [], "did": f"removed {target}"}
    assert sorted(os.listdir(tmp_path)) == ["keep.txt"]
    rc, _, err = run(capsys, "demo", "--remove", "--config", "tiny", "--cache-dir", str(tmp_path))
    assert rc == 0 and "nothing to remove" in err
    rc, out, _ = run(capsys, "demo", "--remove", "--config", "tiny", "--cache-dir", str(tmp_path), "--json")
    d = json.loads(out)
    assert rc == 0 and d["removed"] is False and d["existed"] is False and d["path"] == str(target)


# --------------------------------------------------------------------------- numbers


def test_residency_is_the_models_own(capsys: pytest.CaptureFixture[str], tiny: Path) -> None:
    dev = hf2q.Device("host")
    others = [dev.upload(np.zeros(4096, np.float32)) for _ in range(3)]  # other buffers on the same device
    rc, out, _ = run(capsys, "load", "--device", "host", "--json", str(tiny))
    d = json.loads(out)
    assert rc == 0 and dev.residency.count >= 3
    assert d["residency"]["buffers"] == d["tensors"] == 25
    page = dev.page_size
    assert d["residency"]["allocated_bytes"] == sum(-(-b // page) * page for b in _byte_lens(tiny))
    assert set(d["residency"]) == {"enabled", "buffers", "allocated_bytes", "locked_bytes", "unwired_bytes"}
    del others


def _byte_lens(tiny: Path) -> list[int]:
    m = hf2q.dflash.load(tiny, hf2q.Device._isolated("host"), progress=False)
    return [b.byte_len for b in m.buffers_by_name().values()]


def test_one_unit_convention() -> None:
    assert format_bytes(859_378_176) == "859 MB"
    assert format_bytes(165_632) == "166 kB" and format_bytes(74) == "74 B" and format_bytes(999) == "999 B"
    assert format_bytes(1_067_638_784) == "1.07 GB" and format_bytes(999_600) == "1.00 MB"
    from tqdm import tqdm

    # the bars count the same way (tqdm's decimal scale, unit "B")
    for n in (859_378_176, 165_632, 1_067_638_784, 3_390_000_000, 12_345):
        assert tqdm.format_sizeof(n, "B", 1000) == format_bytes(n).replace(" ", "")


def test_summary_text_units_and_seconds(capsys: pytest.CaptureFixture[str], tiny: Path) -> None:
    rc, out, _ = run(capsys, "load", "--device", "host", "--verify", str(tiny))
    assert rc == 0
    assert re.search(r"^load time: +\d+\.\d\d s \(\d+\.\d\d GB/s of checkpoint data, 165 kB\)$", out, re.M), out
    assert re.search(r"^residency: +25 of the model's buffers in the residency set, [\d.]+ kB allocated", out, re.M)
    assert re.search(r"^verify: .*\(\d+\.\d\d s\)$", out, re.M)
    assert "MiB" not in out and "KiB" not in out


def test_closed_pipe_is_quiet(tmp_path: Path) -> None:
    import subprocess
    import sys

    from safetensors.numpy import save_file

    f = tmp_path / "many.safetensors"  # enough tensors that the listing overflows the pipe
    save_file({f"t{i:05d}.weight": np.zeros(1, np.float32) for i in range(4000)}, str(f))
    p = subprocess.run(f"'{sys.executable}' -m hf2q inspect '{f}' | head -1", shell=True, capture_output=True,
                       text=True, timeout=120)
    assert p.stdout.startswith(str(f)) and p.stderr == ""
