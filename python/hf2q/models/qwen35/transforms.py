"""Numpy reference transforms for Qwen3.5/3.6 MoE tensors (docs/QWEN35MOE.md).

Each function turns source arrays into the final *logical* array of one
planned tensor (before the device dtype is applied). They are the readable
reference: the streaming loader reuses them for small tensors and must match
them bit for bit when it streams experts straight into device buffers.

Dtypes: permutations, splits, squeezes and stacks keep the source dtype (BF16
stays exact); ``A_log -> ssm_a`` and the ``+1`` norms widen to float32 first.
Arrays are numpy arrays of ``ml_dtypes.bfloat16``, ``float16`` or ``float32``;
raw ``uint16`` BF16/F16 bits are accepted where the planned source dtype says
which.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import numpy as np
else:  # numpy on first use (hf2q._lazy)
    from ..._lazy import numpy as np

from ... import formats
from ..._arrays import F16, F32, U16, bf16, is_bf16
from .names import Transform as T  # noqa: N817
from .names import DEVICE_DTYPES, SOURCE_DTYPES

if TYPE_CHECKING:
    from .config import Qwen35Config
    from .plan import PlannedTensor

__all__ = [
    "reorder_v_heads",
    "reorder_in_proj_qkv",
    "reorder_in_proj_z",
    "reorder_in_proj_ab",
    "reorder_per_head",
    "reorder_conv1d",
    "reorder_out_proj",
    "a_log_to_ssm_a",
    "norm_plus_one",
    "squeeze_conv1d",
    "split_gate_up",
    "stack_experts_reference",
    "as_source_array",
    "transform_tensor",
    "to_device_dtype",
    "convert_reference",
    "device_nbytes",
]



# --------------------------------------------------------------------------- V-head reorder
def reorder_v_heads(x: np.ndarray, axis: int, num_k_heads: int, num_v_per_k: int, head_dim: int, *,
                    in_place: bool = False) -> np.ndarray:
    """Grouped -> tiled V-head order along ``axis`` (llama.cpp ``_reorder_v_heads``).

    The axis holds ``num_k_heads * num_v_per_k`` blocks of ``head_dim``; block
    ``k * r + j`` (grouped by key head) moves to ``j * nk + k`` (tiled). A pure
    permutation: the dtype is kept. Returns a new C-contiguous array; with
    ``in_place=True`` the blocks of ``x`` (a writeable array) are moved where
    they are, with one block of scratch, and ``x`` is returned.
    """
    x = np.asarray(x)
    if axis < 0:
        axis += x.ndim
    n = num_k_heads * num_v_per_k * head_dim
    if not 0 <= axis < x.ndim or x.shape[axis] != n:
        raise ValueError(
            f"V-head reorder: axis {axis} of shape {x.shape} must hold {num_k_heads} x {num_v_per_k} "
            f"heads of {head_dim} = {n}"
        )
    if in_place:
        if not x.flags.writeable:
            raise ValueError("V-head reorder in place: the array is read-only")
        _permute_blocks(x, axis, num_k_heads, num_v_per_k, head_dim)
        return x
    shape = x.shape
    y = x.reshape(shape[:axis] + (num_k_heads, num_v_per_k, head_dim) + shape[axis + 1:])
    return np.ascontiguousarray(np.swapaxes(y, axis, axis + 1)).reshape(shape)


#: Scratch of the in-place reorder along a later axis: a few leading rows at a time, a size that stays in cache.
_SCRATCH_BYTES = 512 << 10


def _permute_blocks(x: np.ndarray, axis: int, nk: int, r: int, hd: int) -> None:
    """:func:`reorder_v_heads` in place: position ``j * nk + k`` receives block
    ``k * r + j``. Along axis 0 the blocks are contiguous: the permutation is
    followed cycle by cycle, each block copied once, a cycle's first block
    into scratch. Along a later axis the blocks are strided: a few leading
    rows at a time are reordered into a small scratch array and copied back
    (both in cache; moving strided blocks one by one is slower, and so is one
    copy of the whole array into new memory)."""
    if axis == 0:
        def block(p: int) -> slice:
            return slice(p * hd, (p + 1) * hd)

        n = nk * r
        source = [(p % nk) * r + p // nk for p in range(n)]  # p = j * nk + k  <-  k * r + j
        done = [False] * n
        for start in range(n):
            if done[start]:
                continue
            done[start] = True
            if source[start] == start:
                continue
            first = x[block(start)].copy()
            p = start
            while source[p] != start:
                x[block(p)] = x[block(source[p])]
                p = source[p]
                done[p] = True
            x[block(p)] = first
        return
    shape = x.shape
    grouped = shape[1:axis] + (nk, r, hd) + shape[axis + 1:]
    tiled = shape[1:axis] + (r, nk, hd) + shape[axis + 1:]
    step = max(1, _SCRATCH_BYTES // max(1, x[:1].nbytes))
    scratch = np.empty((min(step, shape[0]),) + shape[1:], x.dtype)
    for s in range(0, shape[0], step):
        rows = x[s:s + step]
        n = rows.shape[0]
        np.copyto(scratch[:n].reshape((n,) + tiled), np.swapaxes(rows.reshape((n,) + grouped), axis, axis + 1))
        rows[...] = scratch[:n]


def _r(nk: int, nv: int) -> int:
    if nv % nk:
        raise ValueError(f"linear_num_value_heads {nv} is not a multiple of linear_num_key_heads {nk}")
    return nv // nk


def _reorder_rows_after(x: np.ndarray, qk: int, nk: int, r: int, dv: int) -> np.ndarray:
    """``x`` [qk + nk*r*dv, ...] with its rows after ``qk`` in tiled V-head order
    (:func:`reorder_v_heads` on axis 0 of ``x[qk:]``), written once into one
    new array: the Q and K rows copied, the V rows permuted on the way (not a
    reordered copy of the V rows concatenated after the Q and K rows, which
    moves the V rows twice; ``in_proj_qkv`` is 32 MiB at the real shapes)."""
    # The dtype np.concatenate of the two parts had: x's, in native byte order.
    out = np.empty(x.shape, np.result_type(x.dtype))
    out[:qk] = x[:qk]
    rest = x.shape[1:]
    # out's V rows as [r, nk, dv, ...]: block j * nk + k; x's as [nk, r, dv, ...]: block k * r + j.
    np.copyto(out[qk:].reshape((r, nk, dv) + rest), np.swapaxes(x[qk:].reshape((nk, r, dv) + rest), 0, 1))
    return out


def _reorder_v_after_qk(x: np.ndarray, what: str, expected: str, nk: int, nv: int, dk: int, dv: int,
                        in_place: bool) -> np.ndarray:
    """A [C, X] tensor whose first ``2*nk*dk`` rows are Q and K (kept) and
    whose V rows after them are reordered, dv rows per head. ``expected``:
    the shape for the error message, ``{}`` standing for C."""
    qk = 2 * nk * dk
    if x.ndim != 2 or x.shape[0] != qk + nv * dv:
        raise ValueError(f"{what} of shape {x.shape}: expected {expected.format(qk + nv * dv)}")
    if in_place:
        reorder_v_heads(x[qk:], 0, nk, _r(nk, nv), dv, in_place=True)
        return x
    return _reorder_rows_after(x, qk, nk, _r(nk, nv), dv)


def reorder_in_proj_qkv(x: np.ndarray, nk: int, nv: int, dk: int, dv: int, *, in_place: bool = False) -> np.ndarray:
    """``in_proj_qkv`` [C, H]: only the V rows (after ``2*nk*dk``) are reordered, dv rows per head.
    Returns a new C-contiguous array of ``x``'s dtype (native byte order), or
    ``x`` with its V rows moved where they are (``in_place``, a writeable array)."""
    return _reorder_v_after_qk(x, "in_proj_qkv", "[{}, H]", nk, nv, dk, dv, in_place)


def reorder_in_proj_z(x: np.ndarray, nk: int, nv: int, dv: int, *, in_place: bool = False) -> np.ndarray:
    """``in_proj_z`` [nv*dv, H]: rows, dv per head."""
    return reorder_v_heads(x, 0, nk, _r(nk, nv), dv, in_place=in_place)


def reorder_in_proj_ab(x: np.ndarray, nk: int, nv: int, *, in_place: bool = False) -> np.ndarray:
    """``in_proj_a`` / ``in_proj_b`` [nv, H]: rows, one per head."""
    return reorder_v_heads(x, 0, nk, _r(nk, nv), 1, in_place=in_place)


def reorder_per_head(x: np.ndarray, nk: int, nv: int, *, in_place: bool = False) -> np.ndarray:
    """``A_log`` / ``dt_bias`` [nv]: one element per head (along the last axis)."""
    return reorder_v_heads(x, -1, nk, _r(nk, nv), 1, in_place=in_place)


def reorder_conv1d(x: np.ndarray, nk: int, nv: int, dk: int, dv: int, *, in_place: bool = False) -> np.ndarray:
    """Squeezed ``conv1d`` [C, K]: only the V channels (after ``2*nk*dk``), dv per head.
    Returns a new C-contiguous array of ``x``'s dtype (native byte order), or
    ``x`` with its V channels moved where they are (``in_place``, a writeable array)."""
    return _reorder_v_after_qk(x, "conv1d", "squeezed [{}, K]", nk, nv, dk, dv, in_place)


def reorder_out_proj(x: np.ndarray, nk: int, nv: int, dv: int, *, in_place: bool = False) -> np.ndarray:
    """``out_proj`` [H, nv*dv]: columns, dv per head."""
    return reorder_v_heads(x, 1, nk, _r(nk, nv), dv, in_place=in_place)


# --------------------------------------------------------------------------- value transforms
def _widen(x: np.ndarray) -> np.ndarray:
    """BF16/F16/F32 -> float32, exactly (BF16: bits << 16; F16: IEEE)."""
    x = np.asarray(x)
    if x.dtype not in (F16, F32) and not is_bf16(x.dtype):
        raise TypeError(f"expected a bfloat16, float16 or float32 array, got {x.dtype}")
    return x.astype(F32)


def a_log_to_ssm_a(x: np.ndarray) -> np.ndarray:
    """``ssm_a = -exp(A_log)`` in float32.

    The source is widened exactly to float32; ``exp`` is evaluated in float64
    and rounded once to float32, i.e. the correctly rounded float32 result
    (llama.cpp uses torch's float32 ``exp``; docs/QWEN35MOE.md allows 1 ULP between them).
    """
    a = _widen(x).astype(np.float64)
    return np.negative(np.exp(a).astype(F32))


def norm_plus_one(x: np.ndarray) -> np.ndarray:
    """Zero-centred RMSNorm weight -> ``w + 1``: widen to float32, add ``1.0f`` in float32."""
    return np.add(_widen(x), np.float32(1.0), dtype=F32)


def squeeze_conv1d(x: np.ndarray) -> np.ndarray:
    """``conv1d.weight`` [C, 1, K] -> [C, K] (a 2-D [C, K] passes through)."""
    x = np.asarray(x)
    if x.ndim == 2:
        return x
    if x.ndim != 3 or x.shape[1] != 1:
        raise ValueError(f"conv1d weight of shape {x.shape}: expected [C, 1, K]")
    return x.reshape(x.shape[0], x.shape[2])


def split_gate_up(x: np.ndarray, half: Literal["gate", "up"]) -> np.ndarray:
    """Fused ``experts.gate_up_proj`` [E, 2I, H] -> gate ``[:, :I, :]`` (first half) or up ``[:, I:, :]``."""
    x = np.asarray(x)
    if x.ndim != 3 or x.shape[1] % 2:
        raise ValueError(f"experts.gate_up_proj of shape {x.shape}: expected [E, 2*I, H]")
    n = x.shape[1] // 2
    if half == "gate":
        return np.ascontiguousarray(x[:, :n, :])
    if half == "up":
        return np.ascontiguousarray(x[:, n:, :])
    raise ValueError(f"half must be 'gate' or 'up', got {half!r}")


def stack_experts_reference(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Stack per-expert matrices (expert 0 first) on a new axis 0: [E, rows, cols].

    All experts must share shape and dtype (the dtype is kept).
    """
    if len(arrays) == 0:
        raise ValueError("no experts to stack")
    arrs = [np.asarray(a) for a in arrays]
    first = arrs[0]
    for e, a in enumerate(arrs):
        if a.shape != first.shape:
            raise ValueError(f"expert {e} has shape {a.shape}, expert 0 has {first.shape}")
        if a.dtype != first.dtype:
            raise ValueError(f"expert {e} has dtype {a.dtype}, expert 0 has {first.dtype}")
    return np.stack(arrs, axis=0)


# --------------------------------------------------------------------------- planned tensors
def as_source_array(arr: np.ndarray, dtype: str, *, raw_bf16: bool = False) -> np.ndarray:
    """View a source array as its checkpoint dtype (``"BF16"``/``"F16"``/``"F32"``):
    raw ``uint16`` bits become bfloat16/float16, typed arrays must match.
    ``raw_bf16``: BF16 bits stay ``uint16`` (no ml_dtypes import)."""
    if dtype not in SOURCE_DTYPES:
        raise TypeError(f"unsupported source dtype {dtype!r}")
    a = np.asarray(arr)
    if raw_bf16 and dtype == "BF16" and a.dtype == U16:
        return a
    if dtype == "BF16" and is_bf16(a.dtype):  # (without looking up the storage dtype: no import)
        return a
    want = formats.from_safetensors(dtype).storage_dtype
    if a.dtype == want:
        return a
    if a.dtype == U16 and want.itemsize == 2:
        return a.view(want)
    raise TypeError(f"source array has dtype {a.dtype}, the checkpoint says {dtype}")


def _bits_to_f32(x: np.ndarray) -> np.ndarray:
    """BF16 bits (uint16) -> float32, exactly (``bits << 16``, as ml_dtypes' cast)."""
    return (x.astype(np.uint32) << 16).view(F32)


def transform_tensor(pt: PlannedTensor, arrays: Sequence[np.ndarray], cfg: Qwen35Config, *,
                     consume: bool = False, raw_bf16: bool = False) -> np.ndarray:
    """The final logical array of ``pt`` from its sources' arrays (in ``pt.sources`` order).

    Applies ``pt.transforms`` in order and checks the result has ``pt.shape``.
    The result keeps the source dtype unless a transform widens it to float32
    (``norm_plus_one``, ``neg_exp``); :func:`to_device_dtype` does the rest.

    ``consume=True``: the arrays are handed over (the loader's own reads,
    dropped after the call), so the V-head reorders move the blocks of a
    writeable source where they are instead of into a copy: the same result,
    without a second array of the tensor's size (``in_proj_qkv``,
    ``in_proj_z`` and ``out_proj`` are 16-32 MiB at the real shapes).

    ``raw_bf16=True``: BF16 sources given as uint16 bits stay bits (the
    loader's reads: no ml_dtypes import); the reorders move them as they
    are, the widening transforms read them exactly, and a result that is
    still uint16 holds BF16 bits.
    """
    if len(arrays) != len(pt.sources):
        raise ValueError(f"{pt.gguf_name}: {len(pt.sources)} sources, got {len(arrays)} arrays")
    srcs = []
    for piece, a in zip(pt.sources, arrays):
        # A scaled FP8 source arrives decoded (weight times scale, float32: docs/FP8.md).
        a = as_source_array(a, "F32" if getattr(piece, "scale", None) is not None else piece.dtype,
                            raw_bf16=raw_bf16)
        if tuple(a.shape) != tuple(piece.shape):
            raise ValueError(f"{pt.gguf_name}: source {piece.name} has shape {a.shape}, planned {piece.shape}")
        srcs.append(a)

    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    x: np.ndarray | None = srcs[0] if len(srcs) == 1 else None
    for tag in pt.transforms:
        if tag == T.FUSED_SPLIT:
            half = pt.sources[0].half
            assert half is not None
            x = split_gate_up(srcs[0], half)
        elif tag == T.STACK_EXPERTS:
            order = sorted(range(len(srcs)), key=lambda i: pt.sources[i].expert)  # type: ignore[arg-type, return-value]
            x = stack_experts_reference([srcs[i] for i in order])
        elif tag == T.NORM_PLUS_ONE:
            x = norm_plus_one(_bits_to_f32(x) if raw_bf16 and x.dtype == U16 else x)
        elif tag == T.SQUEEZE_CONV1D:
            x = squeeze_conv1d(x)
        elif tag == T.REORDER_V_QKV:
            x = reorder_in_proj_qkv(x, nk, nv, dk, dv, in_place=_own(x, consume))
        elif tag == T.REORDER_V_ROWS:
            x = reorder_in_proj_z(x, nk, nv, dv, in_place=_own(x, consume))
        elif tag == T.REORDER_V_HEADS:
            here = _own(x, consume)
            x = reorder_per_head(x, nk, nv, in_place=here) if x.ndim == 1 else reorder_in_proj_ab(x, nk, nv, in_place=here)
        elif tag == T.REORDER_V_CONV1D:
            x = reorder_conv1d(x, nk, nv, dk, dv, in_place=_own(x, consume))
        elif tag == T.REORDER_V_COLS:
            x = reorder_out_proj(x, nk, nv, dv, in_place=_own(x, consume))
        elif tag == T.NEG_EXP:
            x = a_log_to_ssm_a(_bits_to_f32(x) if raw_bf16 and x.dtype == U16 else x)
        else:  # pragma: no cover - the plan only emits known tags
            raise ValueError(f"{pt.gguf_name}: unknown transform {tag!r}")
    assert x is not None
    if tuple(x.shape) != tuple(pt.shape):
        raise ValueError(f"{pt.gguf_name}: transforms produced shape {x.shape}, planned {pt.shape}")
    return np.ascontiguousarray(x)


def _own(x: np.ndarray | None, consume: bool) -> bool:
    """Whether a reorder may move ``x``'s blocks in place: only when the caller
    handed its arrays over (``x`` may be one of them, or a view of one, as a
    squeezed conv1d is) and ``x`` is writeable."""
    return consume and x is not None and x.flags.writeable


def to_device_dtype(x: np.ndarray, dtype: str, *, name: str | None = None) -> np.ndarray:
    """Logical array -> device representation: ``"f32"`` float32 (exact widening),
    ``"bf16"`` bfloat16 (exact from BF16; round-to-nearest-even from F16/F32),
    ``"f16"`` float16 (from the float32 value, nearest even: the converter's
    ``--outtype f16`` cast), ``"q8_0"`` ggml Q8_0 bytes (uint8, gguf-py layout
    :func:`hf2q.formats.storage_shape`)."""
    x = np.asarray(x)
    if dtype == "f32":
        return _widen(x) if x.dtype != F32 else np.ascontiguousarray(x)
    if dtype == "bf16":
        return np.ascontiguousarray(x if is_bf16(x.dtype) else _widen(x).astype(bf16()))
    if dtype == "f16":
        with np.errstate(over="ignore"):  # beyond 65504: inf, as numpy's cast in the converter
            return np.ascontiguousarray(_widen(x).astype(np.float16))
    if dtype == "q8_0":
        from ... import ops

        return ops.quantize_q8_0(np.ascontiguousarray(x), name=name)
    raise ValueError(f"unknown device dtype {dtype!r}")


def convert_reference(pt: PlannedTensor, arrays: Sequence[np.ndarray], cfg: Qwen35Config) -> np.ndarray:
    """Reference end-to-end conversion of one planned tensor: transforms, then ``pt.dtype``."""
    return to_device_dtype(transform_tensor(pt, arrays, cfg), pt.dtype, name=pt.gguf_name)


def device_nbytes(shape: Sequence[int], dtype: str) -> int:
    """Bytes a tensor of logical ``shape`` takes in device ``dtype`` (:func:`hf2q.formats.nbytes`)."""
    if dtype not in DEVICE_DTYPES:
        raise ValueError(f"unknown device dtype {dtype!r}")
    return formats.nbytes(shape, dtype)
