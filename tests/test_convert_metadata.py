"""The key/values hf2q.convert writes for configs with keys left out, nulled
or moved (tests/data/golden/config_variants.json and
tests/data/gemma4/config_variants.json: what llama.cpp's converter wrote for
each): every architecture key and general.file_type equal, none missing,
none extra."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hf2q
from hf2q.export import metadata as md
from hf2q.models.gemma4 import Gemma4Config
from hf2q.models.qwen35 import Qwen35Config, plan_qwen35_moe

DATA = Path(__file__).parent / "data"
QWEN = [v for v in json.loads((DATA / "golden" / "config_variants.json").read_text())["variants"]
        if v["base"].startswith("qwen35moe")]
GEMMA = json.loads((DATA / "gemma4" / "config_variants.json").read_text())["variants"]


def _ours(kv: md.KVList) -> dict[str, Any]:
    return {k.key: k.value for k in kv.items()}


def _compare(ours: dict[str, Any], theirs: dict[str, Any], arch: str, where: str) -> None:
    pick = lambda d: {k: v for k, v in d.items() if k.startswith(arch + ".") or k == "general.file_type"}  # noqa: E731
    a, b = pick(ours), pick(theirs)
    assert set(a) == set(b), f"{where}: missing {sorted(set(b) - set(a))}, extra {sorted(set(a) - set(b))}"
    for k, v in b.items():
        if isinstance(v, float) or (isinstance(v, list) and v and isinstance(v[0], float)):
            np.testing.assert_array_equal(np.float32(a[k]), np.float32(v), err_msg=f"{where}: {k}")
        else:
            assert a[k] == v, f"{where}: {k} = {a[k]!r}, converter {v!r}"


@pytest.mark.parametrize("v", QWEN, ids=[v["name"] for v in QWEN])
def test_qwen_config_variant(v) -> None:
    with hf2q.open_checkpoint(DATA / "golden" / v["base"] / "hf") as ck:
        cfg = plan_qwen35_moe(ck, Qwen35Config.from_dict(v["config"])).config
    kv = md.KVList("qwen35moe")
    md.qwen35moe(kv, v["config"], cfg, "f32")
    _compare(_ours(kv), v["converter"]["metadata"], "qwen35moe", v["name"])


@pytest.mark.parametrize("v", GEMMA, ids=[v["name"] for v in GEMMA])
def test_gemma4_config_variant(v) -> None:
    kv = md.KVList("gemma4")
    md.gemma4(kv, v["config"], Gemma4Config.from_dict(v["config"]), "f32")
    _compare(_ours(kv), v["metadata"], "gemma4", v["name"])
