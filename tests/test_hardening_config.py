"""Cost bounded by the checkpoint (issue 11, row "config-driven cost"):
unreasonable config numbers are refused at parse time with a message naming
the key; the work that follows a config (manifest, plan) is linear; error
messages list a bounded number of problems plus the total count; nesting and
integer sizes in config.json are bounded (no RecursionError/ValueError)."""

from __future__ import annotations

import copy
import json
import os
import time
import tracemalloc
from pathlib import Path

import pytest

import hf2q
from hf2q import dflash, qwen35
from hf2q.device import Device
MAX_LISTED_PROBLEMS = 50  # hf2q.models.dflash.MAX_LISTED_PROBLEMS
from hf2q.errors import ConfigError, Hf2qError, ManifestError, MissingTensorError
from hf2q.testing import make_dflash_checkpoint, make_qwen35_moe_checkpoint
from hf2q.testing.qwen35_checkpoint import TINY_TEXT_CONFIG

TINY = dflash.DRAFTER_CONFIGS["tiny"]


# The time budget guards against super-linear work (a quadratic pass over 11,000
# problems takes minutes), not speed: it is process CPU time, so other load on the
# machine does not count, and ASan's instrumentation (3-5x) gets its own factor.
_CPU_FACTOR = 5.0 if os.environ.get("HF2Q_UNDER_SANITIZER") == "1" else 1.0


def _bounded(fn, seconds: float = 3.0, mib: float = 64.0) -> BaseException:
    """Run fn, which must raise an Hf2qError, within a CPU-time and memory budget."""
    tracemalloc.start()
    t0 = time.process_time()
    try:
        with pytest.raises(Hf2qError) as ei:
            fn()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    took = time.process_time() - t0
    assert took < seconds * _CPU_FACTOR, f"took {took:.2f} s of CPU"
    assert peak < mib * (1 << 20), f"peak {peak / (1 << 20):.1f} MiB"
    return ei.value


@pytest.mark.parametrize("layers", [10**9, 2 * 10**4, 1025])
def test_dflash_huge_layer_count_refused_at_parse(layers: int) -> None:
    d = dict(copy.deepcopy(TINY), num_hidden_layers=layers)
    d.pop("layer_types")
    d.pop("sliding_window")
    e = _bounded(lambda: dflash.DFlashConfig.from_dict(d))
    assert isinstance(e, ConfigError) and e.key == "num_hidden_layers"
    assert "num_hidden_layers" in str(e) and "limit" in str(e) and len(str(e)) < 500


def test_dflash_manifest_error_message_is_bounded(tmp_path: Path) -> None:
    ck = make_dflash_checkpoint(tmp_path / "ck", "tiny", seed=1)
    cfg = json.loads((ck / "config.json").read_text())
    cfg["num_hidden_layers"] = 1024
    cfg.pop("layer_types")
    cfg.pop("sliding_window")
    (ck / "config.json").write_text(json.dumps(cfg))
    e = _bounded(lambda: dflash.load(ck, Device._isolated("host"), progress=False), mib=128)
    assert isinstance(e, ManifestError)
    total = len(e.problems)
    assert total > 10_000  # 11 per missing layer
    msg = str(e)
    assert len(msg) < 20_000, len(msg)
    assert f"({total} problem(s))" in msg and f"... and {total - MAX_LISTED_PROBLEMS} more" in msg


def _qwen_cfg(**over: object) -> dict:
    d = dict(copy.deepcopy(TINY_TEXT_CONFIG), **over)
    return d


@pytest.mark.parametrize("key,value", [("num_hidden_layers", 10**5), ("num_experts", 10**6),
                                       ("hidden_size", 10**12), ("mtp_num_hidden_layers", 10**6)])
def test_qwen35_unreasonable_numbers_refused_at_parse(key: str, value: int) -> None:
    d = _qwen_cfg(**{key: value})
    d.pop("layer_types")
    e = _bounded(lambda: qwen35.Qwen35Config.from_dict(d))
    assert isinstance(e, ConfigError) and key in str(e) and "limit" in str(e)


def test_qwen35_plan_linear_in_layers_without_layer_types(tmp_path: Path) -> None:
    ck = make_qwen35_moe_checkpoint(tmp_path / "ck", "tiny", seed=1)
    cfg = json.loads((ck / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    text.pop("layer_types")
    text["num_hidden_layers"] = 1024
    (ck / "config.json").write_text(json.dumps(cfg))
    c = qwen35.Qwen35Config.from_file(ck)
    assert c.layer_kinds is c.layer_kinds  # computed once, not per call
    e = _bounded(lambda: qwen35.load(ck, Device._isolated("host"), progress=False), seconds=5.0, mib=128)
    assert isinstance(e, MissingTensorError) and len(str(e)) < 20_000


def test_qwen35_many_experts_in_config_cost_follows_the_checkpoint(tmp_path: Path) -> None:
    ck = make_qwen35_moe_checkpoint(tmp_path / "ck", "tiny", seed=1)
    cfg = json.loads((ck / "config.json").read_text())
    cfg.get("text_config", cfg)["num_experts"] = 16384
    (ck / "config.json").write_text(json.dumps(cfg))
    e = _bounded(lambda: qwen35.load(ck, Device._isolated("host"), progress=False), seconds=5.0)
    assert isinstance(e, MissingTensorError)
    assert len(str(e)) < 20_000 and "more experts" in str(e)
    assert len(e.names) < 200  # type: ignore[attr-defined]


def test_deeply_nested_config_is_a_config_error(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    for text in (deep, '{"rope_scaling": ' + "{\"a\": " * 500 + "1" + "}" * 500 + "}"):
        (tmp_path / "config.json").write_text(text)
        for reader in (dflash.DFlashConfig.from_file, qwen35.Qwen35Config.from_file):
            with pytest.raises(ConfigError, match="levels deep"):
                reader(tmp_path)
        with pytest.raises(ConfigError, match="levels deep"):
            dflash.DFlashConfig.from_json_str(text)
    # A Python mapping nested past the recursion limit, given to from_dict.
    d = copy.deepcopy(TINY)
    inner: dict = {}
    d["rope_scaling"] = inner
    for _ in range(5000):
        inner["x"] = {}
        inner = inner["x"]
    with pytest.raises(ConfigError, match="rope_scaling"):
        dflash.DFlashConfig.from_dict(d)


@pytest.mark.parametrize("digits", [41, 5000])
def test_huge_integer_in_config_is_a_config_error(tmp_path: Path, digits: int) -> None:
    for base in (TINY, TINY_TEXT_CONFIG):
        text = json.dumps(base).replace('"num_hidden_layers": ', '"num_hidden_layers": ' + "9" * digits + ", \"x\": ", 1)
        (tmp_path / "config.json").write_text(text)
        for reader in (dflash.DFlashConfig.from_file, qwen35.Qwen35Config.from_file):
            with pytest.raises(ConfigError, match=f"integer with {digits} digits"):
                reader(tmp_path)
