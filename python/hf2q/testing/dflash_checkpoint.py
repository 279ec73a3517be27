"""Synthetic DFlash drafter checkpoints: a ``config.json`` and real-shaped
random BF16 weights with HF names, written in the ``safetensors`` format.

Small files are written by the ``safetensors`` package itself
(``safetensors.numpy.save_file``). Files too large to hold in memory at once
(the full-size drafters) are streamed tensor by tensor by :func:`write_bf16_safetensors`,
which produces the same bytes as the package's writer (header layout, tensor
order and padding; a test pins this), so peak memory stays at a few MiB.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import ml_dtypes
import numpy as np

from ..errors import ConfigError
from ..models.dflash import (
    DRAFTER_CONFIGS,
    GEMMA4_26B_A4B_DRAFTER_CONFIG,
    TINY_DRAFTER_CONFIG,
    DFlashConfig,
    ManifestEntry,
    expected_manifest,
)

__all__ = ["PACKAGE_WRITER_LIMIT", "make_dflash_checkpoint", "tensor_bits", "write_bf16_safetensors"]

PathLike = Union[str, "os.PathLike[str]"]

#: Files up to this many data bytes are written by ``safetensors.numpy.save_file``;
#: larger ones are streamed.
PACKAGE_WRITER_LIMIT = 64 << 20
#: Random bits are generated in chunks of this many elements (also fixes the
#: random stream, so a tensor's values do not depend on how it is written).
_GEN_CHUNK = 1 << 22
_STREAM_METADATA = {"format": "pt"}
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")


def tensor_bits(entry: ManifestEntry, seed: int, index: int) -> Iterable[np.ndarray]:
    """The tensor's BF16 bit patterns (uint16), in chunks, from ``(seed, index)``.

    Weights: random sign and mantissa, magnitudes in [2^-9, 2^-5) (about
    0.002 to 0.03, like ``normal * 0.02``). Norms: positive, in [0.5, 2)."""
    rng = np.random.default_rng([seed, index])
    n = entry.numel
    for start in range(0, n, _GEN_CHUNK):
        r = rng.integers(0, 1 << 16, size=min(_GEN_CHUNK, n - start), dtype=np.uint16)
        if entry.is_norm:
            bits = ((np.uint16(126) + ((r >> np.uint16(7)) & np.uint16(1))) << np.uint16(7)) | (r & np.uint16(0x7F))
        else:
            exponent = (np.uint16(118) + ((r >> np.uint16(7)) & np.uint16(3))) << np.uint16(7)
            bits = (r & np.uint16(0x807F)) | exponent
        yield bits


def _tensor_array(entry: ManifestEntry, seed: int, index: int) -> np.ndarray:
    flat = np.empty(entry.numel, dtype=np.uint16)
    pos = 0
    for chunk in tensor_bits(entry, seed, index):
        flat[pos : pos + chunk.size] = chunk
        pos += chunk.size
    return flat.view(ml_dtypes.bfloat16).reshape(entry.shape)


def write_bf16_safetensors(
    path: PathLike,
    tensors: Sequence[tuple[str, tuple[int, ...]]],
    chunks: Callable[[int], Iterable[np.ndarray]],
    metadata: Mapping[str, str] | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> int:
    """Stream a BF16-only safetensors file laid out exactly as the reference
    writer does: tensors sorted by name, compact JSON header with
    ``__metadata__`` first, padded with spaces to a multiple of 8.
    ``chunks(i)`` yields the uint16 bits of ``tensors[i]`` in order.
    ``on_bytes(n)`` is called after each chunk of ``n`` data bytes (progress).
    Returns the number of data bytes written."""
    order = sorted(range(len(tensors)), key=lambda i: tensors[i][0])
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    pos = 0
    for i in order:
        name, shape = tensors[i]
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [pos, pos + 2 * n]}
        pos += 2 * n
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(len(text).to_bytes(8, "little"))
        fh.write(text)
        for i in order:
            want = header[tensors[i][0]]["data_offsets"]
            written = 0
            for chunk in chunks(i):
                data = np.ascontiguousarray(chunk, dtype="<u2")
                fh.write(data.tobytes())
                written += data.nbytes
                if on_bytes is not None:
                    on_bytes(data.nbytes)
            if written != want[1] - want[0]:
                raise ValueError(f"tensor {tensors[i][0]!r}: wrote {written} bytes, expected {want[1] - want[0]}")
    return pos


def _resolve_config(config: str | Mapping[str, Any] | None) -> dict[str, Any]:
    if config is None:
        return copy.deepcopy(GEMMA4_26B_A4B_DRAFTER_CONFIG)
    if isinstance(config, str):
        if config == "tiny":
            return copy.deepcopy(TINY_DRAFTER_CONFIG)
        if config in DRAFTER_CONFIGS:
            return copy.deepcopy(DRAFTER_CONFIGS[config])
        raise ConfigError(f"unknown drafter config name {config!r}; known: {sorted(DRAFTER_CONFIGS)}")
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    raise TypeError(f"config must be None, a name or a mapping, got {type(config).__name__}")


def _split(manifest: list[ManifestEntry], n: int) -> list[list[int]]:
    """Split manifest indices into ``n`` contiguous, non-empty, byte-balanced groups."""
    n = max(1, min(n, len(manifest)))
    total = sum(e.disk_nbytes for e in manifest)
    groups: list[list[int]] = [[]]
    acc = 0
    for i, e in enumerate(manifest):
        groups_left = n - len(groups)
        if groups[-1] and groups_left > 0 and (
            len(manifest) - i == groups_left or acc * n >= len(groups) * total
        ):
            groups.append([])
        groups[-1].append(i)
        acc += e.disk_nbytes
    return groups


def make_dflash_checkpoint(
    directory: PathLike,
    config: str | Mapping[str, Any] | None = None,
    seed: int = 0,
    sharded: bool = False,
    *,
    num_shards: int | None = None,
    progress: bool = False,
) -> Path:
    """Write a drafter checkpoint into ``directory`` (created if needed) and
    return its path.

    ``config``: None for the full gemma-4-26B-A4B drafter of docs/DFLASH.md
    (859,378,176 data bytes, streamed with a few MiB of memory), ``"tiny"`` for
    a small valid drafter, another name from
    :data:`hf2q.models.dflash.DRAFTER_CONFIGS`, or a config mapping (it must be
    a valid drafter config; it is written verbatim). Weights are random BF16 from
    ``seed`` (a tensor's values depend only on ``seed`` and its manifest index,
    not on sharding). ``sharded=True`` writes ``model.safetensors.index.json``
    and ``num_shards`` (default 2) shards ``model-0000i-of-0000n.safetensors``;
    else one ``model.safetensors``. ``progress=True`` draws a byte bar on a
    terminal (see :mod:`hf2q._progress`). Stale checkpoint files of the other layout
    in ``directory`` are removed so that the directory opens unambiguously.
    """
    out = Path(os.fspath(directory))
    cfg_dict = _resolve_config(config)
    cfg = DFlashConfig.from_dict(cfg_dict)
    manifest = expected_manifest(cfg)
    if sharded and (2 if num_shards is None else int(num_shards)) < 2:
        raise ValueError(f"a sharded checkpoint needs num_shards >= 2, got {num_shards}")
    out.mkdir(parents=True, exist_ok=True)  # only once the arguments are known good: no empty folder left

    (out / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n", encoding="utf-8")

    for stale in out.iterdir():
        if stale.name in ("model.safetensors", "model.safetensors.index.json") or _SHARD_RE.match(stale.name):
            stale.unlink()

    if sharded:
        n = 2 if num_shards is None else int(num_shards)
        groups = _split(manifest, n)
        names = [f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors" for k in range(len(groups))]
    else:
        groups = [list(range(len(manifest)))]
        names = ["model.safetensors"]

    from .._progress import progress_bar

    bar = progress_bar(sum(e.disk_nbytes for e in manifest), "hf2q writing", progress)
    try:
        for fname, group in zip(names, groups):
            _write_file(out / fname, [(manifest[i], i) for i in group], seed, bar.update)
    finally:
        bar.close()

    if sharded:
        weight_map = {}
        for fname, group in zip(names, groups):
            for i in group:
                weight_map[manifest[i].name] = fname
        index = {
            "metadata": {"total_size": sum(e.disk_nbytes for e in manifest)},
            "weight_map": dict(sorted(weight_map.items())),
        }
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return out


def _write_file(path: Path, items: list[tuple[ManifestEntry, int]], seed: int,
                on_bytes: Callable[[int], None] | None = None) -> None:
    nbytes = sum(e.disk_nbytes for e, _ in items)
    if nbytes <= PACKAGE_WRITER_LIMIT:
        from safetensors.numpy import save_file

        save_file({e.name: _tensor_array(e, seed, i) for e, i in items}, str(path), metadata=dict(_STREAM_METADATA))
        if on_bytes is not None:
            on_bytes(nbytes)
        return
    write_bf16_safetensors(
        path,
        [(e.name, e.shape) for e, _ in items],
        lambda k: tensor_bits(items[k][0], seed, items[k][1]),
        metadata=_STREAM_METADATA,
        on_bytes=on_bytes,
    )
