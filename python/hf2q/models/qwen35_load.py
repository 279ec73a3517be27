"""Qwen3.5/3.6 MoE: the in-memory loader (spec qwen35moe.md).

Every planned tensor goes straight into its own device buffer: expert stacks
are streamed expert by expert from the file into their slice of the
destination (quantized to Q8_0 on the way, no whole-stack staging copy),
plain tensors are ``pread`` and converted in native code, and only the small
transformed tensors (norms +1, linear-attention reorders, ``A_log``) pass
through numpy. No GGUF file is written.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Union

import numpy as np

from ..device import Buffer, Device, FileReadError
from ..errors import Hf2qError
from ..safetensors import Checkpoint, open_checkpoint
from ._loading import LoadSummary, detached, file_read_error, progress_bar, residency_state
from .qwen35_config import FULL_ATTENTION, Qwen35Config
from .qwen35_plan import PlannedTensor, Qwen35Plan, Transform, plan_qwen35_moe
from .qwen35_transforms import to_device_dtype, transform_tensor

__all__ = ["Qwen35Layer", "Qwen35Model", "load", "inspect"]

PathLike = Union[str, "os.PathLike[str]"]
_SRC = {"BF16": "bf16", "F16": "f16", "F32": "f32"}
_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4}
_STREAMABLE = {Transform.FUSED_SPLIT, Transform.STACK_EXPERTS}


def _native_conversion(src_dtype: str, dst: str) -> bool:
    s = _SRC.get(src_dtype)
    return s is not None and (s == dst or dst == "q8_0" or (dst == "f32" and s in ("bf16", "f16")))


@dataclass
class Qwen35Layer:
    """One block's buffers by GGUF suffix (``attn_q``, ``ffn_gate_exps``, ...)."""

    index: int
    kind: str  # "full_attention" | "linear_attention" (MTP blocks: full attention)
    tensors: dict[str, Buffer] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Buffer:
        tensors = self.__dict__.get("tensors", {})
        for key in (f"{name}.weight", name, f"{name}.bias"):
            if key in tensors:
                return tensors[key]
        raise AttributeError(f"block {self.index} has no tensor {name!r}; it has {sorted(tensors)}")

    @property
    def is_full_attention(self) -> bool:
        return self.kind == FULL_ATTENTION

    @property
    def moe(self) -> dict[str, Buffer]:
        """The MoE FFN: router, experts, shared expert and its gate."""
        keys = {
            "router": "ffn_gate_inp.weight",
            "gate_exps": "ffn_gate_exps.weight",
            "up_exps": "ffn_up_exps.weight",
            "down_exps": "ffn_down_exps.weight",
            "gate_shexp": "ffn_gate_shexp.weight",
            "up_shexp": "ffn_up_shexp.weight",
            "down_shexp": "ffn_down_shexp.weight",
            "shexp_gate": "ffn_gate_inp_shexp.weight",
        }
        return {k: self.tensors[v] for k, v in keys.items() if v in self.tensors}


class Qwen35Model:
    """Inference-ready Qwen3.5/3.6 MoE weights on a device, addressable by
    GGUF name (``model["blk.3.ffn_down_exps.weight"]``). Shapes are logical
    numpy shapes (the reverse of GGUF's ``ne``)."""

    def __init__(self, device: Device, config: Qwen35Config, plan: Qwen35Plan, buffers: dict[str, Buffer]) -> None:
        self.device = device
        self.config = config
        self.plan = plan
        self._buffers = buffers
        self.summary: LoadSummary | None = None
        n_blocks = plan.n_blocks
        self.layers: list[Qwen35Layer] = []
        for b in range(n_blocks):
            kind = config.layer_types[b] if b < config.num_hidden_layers else FULL_ATTENTION
            layer = Qwen35Layer(b, kind)
            prefix = f"blk.{b}."
            layer.tensors.update({n[len(prefix):]: buf for n, buf in buffers.items() if n.startswith(prefix)})
            self.layers.append(layer)
        # Always-on invariant: every buffer has its planned dtype and shape.
        bad = [f"{pt.gguf_name}: expected {pt.dtype} {tuple(pt.shape)}, found "
               f"{buffers[pt.gguf_name].dtype} {buffers[pt.gguf_name].shape}"
               for pt in plan
               if buffers[pt.gguf_name].dtype != pt.dtype or buffers[pt.gguf_name].shape != tuple(pt.shape)]
        if bad:
            raise Hf2qError("Qwen3.5 device buffers break the planned layout:\n  " + "\n  ".join(bad))

    def names(self) -> list[str]:
        return list(self._buffers)

    def __getitem__(self, gguf_name: str) -> Buffer:
        try:
            return self._buffers[gguf_name]
        except KeyError:
            raise KeyError(f"{gguf_name!r} is not a tensor of this model") from None

    def __contains__(self, name: object) -> bool:
        return name in self._buffers

    def __iter__(self) -> Iterator[str]:
        return iter(self._buffers)

    def __len__(self) -> int:
        return len(self._buffers)

    def gpu_resident_bytes(self) -> int:
        """Sum of logical buffer lengths."""
        return sum(b.byte_len for b in self._buffers.values())

    def verify(self) -> dict[str, Any]:
        """Read every buffer back through the device (see :meth:`hf2q.Device.verify`)."""
        t0 = time.perf_counter()
        groups = sum(self.device.verify(b).groups for b in self._buffers.values())
        return {"buffers": len(self._buffers), "groups": groups, "seconds": time.perf_counter() - t0}

    def __repr__(self) -> str:
        return (f"<hf2q.qwen35.Qwen35Model {len(self)} tensors, {self.gpu_resident_bytes():,} resident bytes "
                f"on {self.device.kind}>")


def _stream(device: Device, ckpt: Checkpoint, pt: PlannedTensor, buf: Buffer) -> None:
    """Fill ``buf`` from the file: whole tensors, per-expert slices, or the
    gate/up halves of a fused ``gate_up_proj``. The pieces that come from one
    file in one dtype go to the device in one call (one pipeline of staged
    copies on a GPU, instead of a round trip per expert)."""
    groups: dict[tuple[int, str], list[tuple[int, int, int, str, Any]]] = {}
    for piece in pt.sources:
        info = ckpt[piece.name]
        fd = ckpt.file_for(piece.name).fileno()
        src = _SRC[piece.dtype]
        esize = _ITEMSIZE[piece.dtype]
        segs = groups.setdefault((fd, src), [])
        if piece.half is not None:  # fused [E, 2I, H] -> rows [:I] or [I:] of each expert
            n_exp, two_i = piece.shape[0], piece.shape[1]
            rows, row_elems = two_i // 2, int(np.prod(piece.shape[2:], dtype=np.int64))
            first_row = 0 if piece.half == "gate" else rows
            per_expert = rows * row_elems
            for e in range(n_exp):
                off = info.offset + (e * two_i + first_row) * row_elems * esize
                segs.append((e * per_expert, off, per_expert * esize, piece.name, info))
        else:
            offset = 0 if piece.expert is None else piece.expert * int(np.prod(piece.shape, dtype=np.int64))
            segs.append((offset, info.offset, info.nbytes, piece.name, info))
    for (fd, src), segs in groups.items():
        try:
            device.write_from_file_segments(buf, fd, [s[:3] for s in segs], src, name=pt.gguf_name)
        except FileReadError as e:
            # Name the first piece the file no longer holds (truncated), else the first.
            size = os.fstat(fd).st_size
            bad = next((s for s in segs if s[1] + s[2] > size), segs[0])
            raise file_read_error(e, bad[4].path, bad[3]) from None


def _materialize(device: Device, ckpt: Checkpoint, cfg: Qwen35Config, pt: PlannedTensor) -> Buffer:
    arrays = [ckpt.read_array(p.name) for p in pt.sources]
    x = transform_tensor(pt, arrays, cfg)
    if _native_conversion({"float32": "F32", "float16": "F16", "bfloat16": "BF16"}.get(x.dtype.name, "?"), pt.dtype):
        return device.upload(x, to=pt.dtype, name=pt.gguf_name)
    y = to_device_dtype(x, pt.dtype, name=pt.gguf_name)
    if pt.dtype == "q8_0":
        return device.upload(y, to="q8_0", src_dtype="q8_0", shape=pt.shape, name=pt.gguf_name)
    return device.upload(y, to=pt.dtype, name=pt.gguf_name)


def load(path: PathLike, device: Device | None = None, expert_dtype: str = "q8_0", dense_dtype: str = "f32",
         progress: bool = True, mtp: bool | None = None, *, revision: str | None = None,
         download: bool = False) -> Qwen35Model:
    """Load a Qwen3.5/3.6 MoE checkpoint (directory with ``config.json``,
    single-file or sharded) into inference-ready device buffers.

    ``expert_dtype`` (default ``"q8_0"``) applies to the expert stacks,
    ``dense_dtype`` (``"f32"``, ``"bf16"`` or ``"q8_0"``; with ``"q8_0"`` the
    same tensors are quantized as by ``convert_hf_to_gguf.py --outtype q8_0``)
    to the other matrices; norms, ``ssm_*`` and routers stay F32. ``mtp``:
    keep (None: when present), require (True) or drop (False) the MTP block.
    On any failure every buffer allocated so far is freed. ``path`` may be a
    Hugging Face repo id in the local cache (``revision``, ``download``: see
    :func:`hf2q.hub.resolve`)."""
    from ..hub import resolve

    path = resolve(path, revision, download=download)
    dev = device if device is not None else Device.default()
    t0 = time.perf_counter()
    with open_checkpoint(path) as ckpt:
        cfg = Qwen35Config.from_file(ckpt.directory / "config.json")
        plan = plan_qwen35_moe(ckpt, cfg, dense_dtype=dense_dtype, expert_dtype=expert_dtype, mtp=mtp)
        cfg = plan.config  # the plan resolves what the file leaves out (mtp_num_hidden_layers)
        bufs: dict[str, Buffer] = {}
        bar = progress_bar(sum(pt.source_nbytes for pt in plan), "hf2q load", progress)
        last_layer: int | None = None
        try:
            for pt in plan:
                if pt.layer != last_layer:
                    dev.residency.commit()  # one commit per block
                    last_layer = pt.layer
                streamable = set(pt.transforms) <= _STREAMABLE and all(
                    _native_conversion(p.dtype, pt.dtype) for p in pt.sources
                )
                if streamable:
                    buf = dev.alloc(pt.shape, pt.dtype)
                    bufs[pt.gguf_name] = buf
                    _stream(dev, ckpt, pt, buf)
                else:
                    bufs[pt.gguf_name] = _materialize(dev, ckpt, cfg, pt)
                bar.update(pt.source_nbytes)
            dev.residency.commit()
            model = Qwen35Model(dev, cfg, plan, bufs)
        except BaseException as e:
            bufs.clear()
            buf = None  # the loop variable would keep the last buffer alive
            bar.close()
            raise detached(e)
        bar.close()
    model.summary = LoadSummary(
        model="qwen35moe", device=dev.kind, tensors=len(bufs), resident_bytes=model.gpu_resident_bytes(),
        data_bytes=sum(pt.source_nbytes for pt in plan), seconds=time.perf_counter() - t0,
        residency=residency_state(dev, bufs.values()),
        extra={"blocks": plan.n_blocks, "experts": cfg.num_experts, "expert_dtype": expert_dtype,
               "dense_dtype": dense_dtype, "skipped_tensors": len(plan.skipped)},
    )
    return model


def inspect(path: PathLike, dense_dtype: str = "f32", expert_dtype: str = "q8_0", *,
            revision: str | None = None) -> dict[str, Any]:
    """The load plan of a checkpoint (or cached Hugging Face repo id), without
    reading tensor bytes."""
    from ..hub import resolve

    with open_checkpoint(resolve(path, revision)) as ckpt:
        cfg = Qwen35Config.from_file(ckpt.directory / "config.json")
        plan = plan_qwen35_moe(ckpt, cfg, dense_dtype=dense_dtype, expert_dtype=expert_dtype)
    return {
        "planned_tensors": len(plan),
        "gpu_resident_bytes": plan.nbytes,
        "resident_bytes_by_kind": plan.nbytes_by_kind(),
        "skipped": list(plan.skipped),
        "gguf_tensors": [{"name": pt.gguf_name, "shape": list(pt.shape), "dtype": pt.dtype, "kind": pt.kind}
                         for pt in plan],
    }
