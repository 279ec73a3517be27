"""benchmarks/bench_fp8.py --load writes its FP8 checkpoint with a fast tiled
writer: the same layout (names, dtypes, shapes, shards' index, config) as
hf2q.testing's make_qwen35_moe_checkpoint(fp8_block=(128, 128), mtp=False),
finite values, and qwen35.load reads it (docs/FP8.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import hf2q
from hf2q import ops, qwen35
from hf2q.safetensors import open_checkpoint
from hf2q.testing.qwen35_checkpoint import TINY_TEXT_CONFIG, make_qwen35_moe_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_fp8  # noqa: E402


def _layout(d: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    with open_checkpoint(d) as ckpt:
        return {n: (ckpt[n].dtype, tuple(ckpt[n].shape)) for n in ckpt.keys()}


def test_fast_writer_has_the_generators_layout_and_loads(tmp_path) -> None:
    text = dict(TINY_TEXT_CONFIG, mtp_num_hidden_layers=0, hidden_size=256, vocab_size=384)
    slow = make_qwen35_moe_checkpoint(tmp_path / "slow", text, mtp=False, sharded=True, fp8_block=(128, 128))
    fast = tmp_path / "fast"
    bench_fp8.write_fp8_checkpoint(fast, text, threads=2)
    assert _layout(fast) == _layout(slow)
    assert any(dt == "F8_E4M3" for dt, _ in _layout(fast).values())
    assert json.loads((fast / "config.json").read_text()) == json.loads((slow / "config.json").read_text())
    index = json.loads((fast / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(_layout(fast))
    m = qwen35.load(fast, device=hf2q.Device._isolated("host"), expert_dtype="q8_0", dense_dtype="bf16",
                    progress=False)
    dtypes = set()
    for name in m.names():  # every decoded value finite
        b = m[name]
        dtypes.add(b.dtype)
        x = ops.dequantize(b.numpy(), "q8_0") if b.dtype == "q8_0" else b.numpy().astype(np.float32)
        assert np.isfinite(x).all(), name
    assert "q8_0" in dtypes
