"""The ``hf2q`` command line: --version, inspect, load, demo (on the tiny
drafter only), exit codes and messages, and architecture detection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import hf2q
import hf2q.testing
from hf2q import cli
from hf2q.cli import detect_architecture, main
from hf2q.dflash import TINY_DRAFTER_CONFIG, DFlashConfig, expected_resident_bytes, expected_total_data_bytes
from hf2q.errors import ConfigError
from hf2q.testing import make_dflash_checkpoint
from safetensors.numpy import save_file

TINY = DFlashConfig.from_dict(TINY_DRAFTER_CONFIG)
TOTAL = expected_total_data_bytes(TINY)  # 164,736
RESIDENT = expected_resident_bytes(TINY)  # 165,632
ENV = {**os.environ, "HF2Q_NUM_THREADS": "2"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dflash_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=5)


@pytest.fixture(scope="module")
def tiny_sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dflash_checkpoint(tmp_path_factory.mktemp("tiny_sh"), "tiny", seed=5, sharded=True)


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A safetensors file with no config.json beside it."""
    d = tmp_path_factory.mktemp("bare")
    save_file(
        {
            "a.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
            "b.bias": np.zeros(5, ml_dtypes.bfloat16),
            "c.idx": np.arange(2, dtype=np.int64),
        },
        str(d / "weights.safetensors"),
    )
    return d / "weights.safetensors"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def run_module(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hf2q", *argv], capture_output=True, text=True, timeout=120,
                          env=env or ENV)


# --------------------------------------------------------------------------- version / help


def test_version_module() -> None:
    p = run_module("--version")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"hf2q {hf2q.__version__}"


def test_version_main(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"hf2q {hf2q.__version__}"


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys)  # argparse's convention: usage on stderr, status 2
    assert rc == 2 and out == "" and err.startswith("usage: hf2q") and "a command is required" in err
    assert "inspect" in err and "load" in err and "demo" in err and "--config" not in err


def test_verbose_alone_says_it_goes_with_version(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "--verbose")
    assert rc == 2 and out == "" and "--verbose goes with --version" in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["frobnicate"], ["load"], ["load", "x", "--device", "tpu"]):
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert "usage:" in err and "hf2q: error: argument COMMAND: invalid choice: 'frobnicate'" in err
    assert "hf2q load: error: the following arguments are required: PATH_OR_REPO" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["load", "x", "--devcie", "host"], ["inspect", "x", "--verify"], ["load", "a", "b"],
                                  ["convert", "a", "b.gguf", "--dtype", "f32"]])
def test_a_mistyped_option_shows_its_commands_usage(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """argparse's top-level parser reports the leftovers of a command's
    line: the usage shown is that command's (its options), not hf2q's."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: hf2q {argv[0]} [-h]"), err
    assert f"hf2q {argv[0]}: error: unrecognized arguments: " in err


# --------------------------------------------------------------------------- inspect


def test_inspect_text(capsys: pytest.CaptureFixture[str], tiny: Path) -> None:
    rc, out, err = run(capsys, "inspect", str(tiny))
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith(f"{tiny}: dflash, 25 tensors in 1 file, {TOTAL:,} data bytes")
    assert lines[1] == f"resident bytes: {RESIDENT:,} (166 kB)"
    rows = {ln.split()[0]: ln.split() for ln in lines[2:]}
    assert len(rows) == 25
    assert rows["fc.weight"][1] == "BF16" and rows["fc.weight"][-1] == "bf16" and "16,384" in rows["fc.weight"]
    assert rows["norm.weight"][-1] == "f32" and rows["layers.1.self_attn.q_norm.weight"][-1] == "f32"
    assert rows["layers.0.mlp.down_proj.weight"][-1] == "bf16"


def test_inspect_json(capsys: pytest.CaptureFixture[str], tiny: Path) -> None:
    rc, out, _ = run(capsys, "inspect", "--json", str(tiny))
    assert rc == 0
    d = json.loads(out)
    assert d["architecture"] == "dflash" and d["path"] == str(tiny)
    assert d["files"] == [str(tiny / "model.safetensors")]
    assert d["tensors"] == 25 and d["data_bytes"] == TOTAL and d["resident_bytes"] == RESIDENT
    rows = {r["name"]: r for r in d["tensor_list"]}
    assert len(rows) == 25 and sum(r["bytes"] for r in rows.values()) == TOTAL
    assert rows["fc.weight"] == {"name": "fc.weight", "dtype": "BF16", "shape": [64, 128], "bytes": 16384,
                                 "device_dtype": "bf16"}
    norms = [n for n, r in rows.items() if r["device_dtype"] == "f32"]
    assert len(norms) == 2 + 4 * 2 and all(rows[n]["dtype"] == "BF16" for n in norms)


def test_inspect_sharded_and_file_path(capsys: pytest.CaptureFixture[str], tiny: Path, tiny_sharded: Path) -> None:
    rc, out, _ = run(capsys, "inspect", "--json", str(tiny_sharded))
    d = json.loads(out)
    assert rc == 0 and d["architecture"] == "dflash" and len(d["files"]) == 2 and d["tensors"] == 25
    rc, out, _ = run(capsys, "inspect", "--json", str(tiny / "model.safetensors"))
    d = json.loads(out)
    assert rc == 0 and d["architecture"] == "dflash" and d["resident_bytes"] == RESIDENT


def test_inspect_bare_safetensors(capsys: pytest.CaptureFixture[str], bare: Path) -> None:
    rc, out, _ = run(capsys, "inspect", "--json", str(bare))
    assert rc == 0
    d = json.loads(out)
    assert d["architecture"] == "generic" and d["tensors"] == 3 and d["files"] == [str(bare)]
    # generic family, --dtype keep: I64 has no device format and is listed, not counted
    assert d["data_bytes"] == 48 + 10 + 16 and d["resident_bytes"] == 48 + 10
    assert d["unloadable"] == ["c.idx"] and d["dtype"] == "keep"
    rows = {r["name"]: r for r in d["tensor_list"]}
    assert rows["a.weight"] == {"name": "a.weight", "dtype": "F32", "shape": [3, 4], "bytes": 48,
                                "device_dtype": "f32"}
    assert rows["c.idx"]["device_dtype"] is None
    assert rows["b.bias"]["dtype"] == "BF16" and rows["c.idx"]["dtype"] == "I64"
    rc, out, _ = run(capsys, "inspect", str(bare))
    assert rc == 0
    assert out.splitlines()[0] == f"{bare}: generic, 3 tensors in 1 file, 74 data bytes (74 B)"
    assert "a.weight" in out and "-> f32" in out
    # its directory is not a checkpoint: no model.safetensors or index there
    rc, out, err = run(capsys, "inspect", str(bare.parent))
    assert rc == 2 and out == "" and "hf2q inspect: error:" in err


def test_inspect_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, err = run(capsys, "inspect", str(tmp_path / "missing.safetensors"))
    assert rc == 2 and out == "" and err.startswith("hf2q inspect: error:") and "missing.safetensors" in err
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{}")
    rc, _, err = run(capsys, "inspect", str(bad))
    assert rc == 2 and "bad.safetensors" in err and "Traceback" not in err


# --------------------------------------------------------------------------- load


def test_load_json_verify(capsys: pytest.CaptureFixture[str], tiny: Path) -> None:
    rc, out, err = run(capsys, "load", "--device", "host", "--json", "--verify", str(tiny))
    assert rc == 0 and err == ""  # --json: no progress bar
    d = json.loads(out)
    assert d["model"] == "dflash" and d["device"] == "host" and d["tensors"] == 25
    assert d["resident_bytes"] == RESIDENT and d["data_bytes"] == TOTAL
    assert d["layers"] == 2 and d["hidden_size"] == 64
    # the model's own residency, not the whole device's
    assert d["residency"]["enabled"] is True and d["residency"]["buffers"] == 25
    assert d["residency"]["allocated_bytes"] >= RESIDENT and d["residency"]["unwired_bytes"] == 0
    assert d["seconds"] == round(d["seconds"], 3)
    assert d["verify"]["buffers"] == 25 and d["verify"]["groups"] > 0


def test_load_module_subprocess(tiny_sharded: Path) -> None:
    p = run_module("load", "--device", "host", "--json", "--verify", str(tiny_sharded))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["tensors"] == 25 and d["residency"]["buffers"] == 25 and d["verify"]["buffers"] == 25


def test_load_text(capsys: pytest.CaptureFixture[str], tiny: Path) -> None:
    rc, out, err = run(capsys, "load", "--device", "host", "--no-progress", "--verify", str(tiny))
    assert rc == 0 and err == ""
    assert "model:            dflash" in out and "device:           host" in out
    assert f"resident bytes:   {RESIDENT:,}" in out and "device tensors:   25" in out
    assert "residency:" in out and "verify:           25 buffers" in out
    rc, out, err = run(capsys, "load", "--device", "host", str(tiny))
    assert rc == 0 and err == ""  # stderr is not a terminal: no progress bar


def _bad_checkpoint(d: Path) -> Path:
    make_dflash_checkpoint(d, "tiny")
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    cfg["layer_types"] = None
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_load_bad_checkpoint(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    d = _bad_checkpoint(tmp_path / "bad")
    rc, out, err = run(capsys, "load", "--device", "host", "--json", str(d))
    assert rc == 2 and err == ""  # --json: the error is a JSON object on stdout
    e = json.loads(out)["error"]
    assert e["type"] == "MissingTensorError" and "11 problem(s)" in e["message"]
    assert {p["tensor"] for p in e["problems"]} >= {"layers.2.self_attn.q_proj.weight"}
    assert all(p["kind"] == "missing" for p in e["problems"]) and len(e["problems"]) == 11
    rc, out, err = run(capsys, "load", "--device", "host", str(d))
    assert rc == 2 and out == ""
    assert err.startswith("hf2q load: error:") and "Traceback" not in err
    assert "11 problem(s)" in err and "layers.2.self_attn.q_proj.weight" in err and "missing tensor" in err


def test_load_bad_checkpoint_module(tmp_path: Path) -> None:
    d = _bad_checkpoint(tmp_path / "bad")
    p = run_module("load", "--device", "host", str(d))
    assert p.returncode == 2 and "hf2q load: error:" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda c: c.update(block_size=1), "rule 3"),
        (lambda c: c.pop("hidden_size"), "'hidden_size'"),
        (lambda c: c["dflash_config"].update(target_layer_ids=[3, 1]), "strictly increasing"),
    ],
)
def test_load_bad_config(capsys: pytest.CaptureFixture[str], tmp_path: Path, edit: Any, needle: str) -> None:
    d = make_dflash_checkpoint(tmp_path / "ck", "tiny")
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    rc, _, err = run(capsys, "load", "--device", "host", str(d))
    assert rc == 2 and needle in err and "config.json" in err


def test_load_truncated_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    d = make_dflash_checkpoint(tmp_path / "ck", "tiny")
    f = d / "model.safetensors"
    os.truncate(f, f.stat().st_size - 3)
    rc, _, err = run(capsys, "load", "--device", "host", str(d))
    assert rc == 2 and "MetadataIncompleteBuffer" not in err and str(f) in err
    rc2, _, err2 = run(capsys, "inspect", str(d))
    assert rc2 == 2 and err2.replace("hf2q inspect:", "hf2q load:") == err  # worded the same


def test_load_without_config_or_path(capsys: pytest.CaptureFixture[str], bare: Path, tmp_path: Path) -> None:
    rc, _, err = run(capsys, "load", "--device", "host", str(bare))
    assert rc == 2 and "c.idx" in err and "I64" in err  # generic: no device format holds I64
    rc, _, err = run(capsys, "load", "--device", "host", str(tmp_path / "nope"))
    assert rc == 2 and "no such file or directory" in err


@pytest.mark.skipif(sys.platform == "darwin", reason="Metal may exist on macOS")
def test_load_metal_on_linux(capsys: pytest.CaptureFixture[str], tiny: Path) -> None:
    rc, out, err = run(capsys, "load", "--device", "metal", str(tiny))
    assert rc == 1 and out == "" and "use --device host" in err  # a device that cannot be opened: status 1
    assert err.startswith("hf2q load: error:") and "Metal" in err and "Traceback" not in err


def test_load_interrupted(capsys: pytest.CaptureFixture[str], tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hf2q.models import dflash

    def interrupted(*a: Any, **kw: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(dflash.FAMILY, "load_checkpoint", interrupted)  # the family's loader, as the registry calls it
    rc, _, err = run(capsys, "load", "--device", "host", str(tiny))
    assert rc == 130 and "hf2q load: interrupted" in err


# --------------------------------------------------------------------------- demo


def test_demo_tiny_then_cached(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    rc, out, err = run(capsys, "demo", "--device", "host", "--cache-dir", str(cache), "--json", "--config", "tiny")
    assert rc == 0, err
    target = cache / "demo-tiny-dflash"
    assert "writing the synthetic tiny DFlash drafter" in err and str(target) in err
    d = json.loads(out)
    assert d["model"] == "dflash" and d["tensors"] == 25 and d["resident_bytes"] == RESIDENT
    assert d["verify"]["buffers"] == 25
    assert sorted(os.listdir(cache)) == ["demo-tiny-dflash"]  # no temporary folder left
    assert sorted(os.listdir(target)) == [".complete", "config.json", "model.safetensors"]
    stamp = (target / "model.safetensors").stat().st_mtime_ns

    rc, out, err = run(capsys, "demo", "--device", "host", "--cache-dir", str(cache), "--json", "--config", "tiny",
                       "--no-verify")
    assert rc == 0
    assert "using the cached synthetic drafter" in err and "writing" not in err
    d2 = json.loads(out)
    assert d2["tensors"] == 25 and "verify" not in d2
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp


def test_demo_env_config_and_default_cache(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF2Q_DEMO_CONFIG", "tiny")
    monkeypatch.setenv("HF2Q_CACHE", str(tmp_path / "hc"))
    rc, out, err = run(capsys, "demo", "--device", "host", "--json")
    assert rc == 0, err
    assert (tmp_path / "hc" / "demo-tiny-dflash" / ".complete").is_file()
    assert json.loads(out)["tensors"] == 25


def test_demo_default_config_monkeypatched(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The default (859 MB) drafter path, with the writer swapped for the tiny one."""
    monkeypatch.delenv("HF2Q_DEMO_CONFIG", raising=False)
    calls: list[Any] = []

    def fake(directory: Any, config: Any = None, *a: Any, **kw: Any) -> Path:
        calls.append(config)
        return make_dflash_checkpoint(directory, "tiny")

    monkeypatch.setattr(hf2q.testing, "make_dflash_checkpoint", fake)
    rc, out, err = run(capsys, "demo", "--device", "host", "--cache-dir", str(tmp_path), "--json", "--no-verify")
    assert rc == 0, err
    assert calls == [None]
    assert "859 MB" in err and (tmp_path / "demo-gemma-4-26B-A4B-dflash" / ".complete").is_file()
    rc, _, err = run(capsys, "demo", "--device", "host", "--cache-dir", str(tmp_path), "--json", "--no-verify")
    assert rc == 0 and calls == [None] and "using the cached" in err


def test_demo_keeps_other_files_and_rebuilds_incomplete(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("user data")
    stale = tmp_path / "demo-tiny-dflash"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")  # an interrupted earlier run: no .complete
    rc, _, err = run(capsys, "demo", "--device", "host", "--cache-dir", str(tmp_path), "--json", "--config", "tiny")
    assert rc == 0, err
    assert (tmp_path / "mine.txt").read_text() == "user data"
    assert (stale / ".complete").is_file() and (stale / "model.safetensors").stat().st_size > 1000


def test_demo_unknown_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = run(capsys, "demo", "--cache-dir", str(tmp_path), "--config", "nope")
    assert rc == 2 and "unknown demo config 'nope'" in err and "tiny" in err
    assert os.listdir(tmp_path) == []


def test_demo_module_subprocess(tmp_path: Path) -> None:
    env = {**ENV, "HF2Q_DEMO_CONFIG": "tiny"}
    p = run_module("demo", "--device", "host", "--cache-dir", str(tmp_path), "--json", env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["verify"]["buffers"] == 25


# --------------------------------------------------------------------------- architecture detection


def _cfg_dir(tmp_path: Path, cfg: Any, name: str = "m") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return d


def test_detect_dflash(tmp_path: Path, tiny: Path) -> None:
    assert detect_architecture(tiny) == "dflash"
    assert detect_architecture(tiny / "model.safetensors") == "dflash"  # config.json beside the file
    assert detect_architecture(_cfg_dir(tmp_path, {"architectures": ["DFlashDraftModel"]}, "a")) == "dflash"
    # dflash_config alone (architectures absent or generic)
    assert detect_architecture(_cfg_dir(tmp_path, {"model_type": "qwen3", "dflash_config": {}}, "b")) == "dflash"
    assert detect_architecture(_cfg_dir(tmp_path, {"architectures": "DFlashDraftModel"}, "c")) == "dflash"


@pytest.mark.parametrize(
    "cfg",
    [
        {"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text"},
        {"model_type": "qwen3_5_moe"},
        {"model_type": "qwen3_5_moe_text"},
        {"architectures": ["Qwen3_5MoeForConditionalGeneration"]},
        # multimodal wrapper: the text model type only under text_config
        {"architectures": ["SomethingElse"], "model_type": "wrapper", "text_config": {"model_type": "qwen3_5_moe_text"}},
        {"text_config": {"model_type": "qwen3_5_moe"}},
    ],
)
def test_detect_qwen35moe(tmp_path: Path, cfg: dict[str, Any]) -> None:
    assert detect_architecture(_cfg_dir(tmp_path, cfg)) == "qwen35moe"


def test_detect_qwen35moe_from_testing_configs(tmp_path: Path) -> None:
    qc = pytest.importorskip("hf2q.testing.qwen35_checkpoint")
    if not hasattr(qc, "qwen35_config_dict"):
        pytest.skip("no qwen35_config_dict")
    assert detect_architecture(_cfg_dir(tmp_path, qc.qwen35_config_dict("tiny"), "text")) == "qwen35moe"
    wrapped = qc.qwen35_config_dict("tiny", multimodal=True)
    assert "text_config" in wrapped
    assert detect_architecture(_cfg_dir(tmp_path, wrapped, "mm")) == "qwen35moe"


@pytest.mark.parametrize(
    "cfg,needle",
    [
        ("[1, 2]", "not a JSON object"),
        ("{not json", "cannot read config.json"),
    ],
)
def test_detect_unknown(tmp_path: Path, cfg: Any, needle: str) -> None:
    d = _cfg_dir(tmp_path, cfg)
    with pytest.raises(ConfigError, match=needle) as ei:
        detect_architecture(d)
    assert "config.json" in str(ei.value)


@pytest.mark.parametrize(
    "cfg",
    [
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
        {"model_type": "qwen3_moe"},
        {},
        {"architectures": 5, "model_type": ["x"]},  # malformed fields: nothing recognised
        {"text_config": "qwen3_5_moe"},
    ],
)
def test_detect_unknown_is_generic(tmp_path: Path, cfg: Any) -> None:
    assert detect_architecture(_cfg_dir(tmp_path, cfg)) == "generic"


def test_detect_no_config(tmp_path: Path, bare: Path) -> None:
    assert detect_architecture(bare) == "generic"
    assert detect_architecture(tmp_path) == "generic"


def test_unknown_architecture_loads_generically(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                               tiny: Path) -> None:
    d = tmp_path / "llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (d / "model.safetensors").write_bytes((tiny / "model.safetensors").read_bytes())
    rc, out, err = run(capsys, "inspect", "--json", str(d))
    assert rc == 0 and json.loads(out)["architecture"] == "generic"
    rc, out, err = run(capsys, "load", "--device", "host", "--json", "--verify", str(d))
    s = json.loads(out)
    assert rc == 0 and s["model"] == "generic" and s["architecture"] == "LlamaForCausalLM"
    assert s["tensors"] == 25 and s["dtype"] == "keep" and s["verify"]["buffers"] == 25


def test_demo_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF2Q_CACHE", str(tmp_path / "x"))
    assert cli.demo_cache_dir() == tmp_path / "x"
    monkeypatch.delenv("HF2Q_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cli.demo_cache_dir() == tmp_path / "xdg" / "hf2q"
