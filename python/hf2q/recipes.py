"""llama-quantize's file-type recipes: each tensor's format, chosen as
``llama-quantize <in> <out> Q4_K_M`` chooses it without an importance matrix
(docs/KQUANTS.md, "Recipes").

llama-quantize decides by GGUF tensor name, shape and a few model facts (the
block count, the expert count, whether a LLaMA has 70B's shape); so does
:func:`recipe_types`, over a list of ``(GGUF name, numpy shape, format)``.
:func:`apply_recipe` applies it to a family's :class:`~hf2q.plan.LoadPlan`
made as the converter's ``--outtype bf16`` file (the input llama-quantize
would read): the tensors llama-quantize leaves alone keep their format, the
others get the recipe's. The families expose it as their ``recipe`` option.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
else:  # numpy on first use (hf2q._lazy)
    from ._lazy import numpy as np

from . import formats
from .plan import LoadPlan, TensorPlan

__all__ = ["RECIPES", "DTYPE_OPTIONS", "replaced_by_recipe", "FILE_TYPES", "ModelFacts", "recipe_types", "apply_recipe",
           "allows_quantization", "category", "generic_facts"]

#: The recipes (llama-quantize's file types without an importance matrix)
#: and each one's default tensor format.
RECIPES: dict[str, str] = {"q4_k_m": "q4_k", "q4_k_s": "q4_k", "q5_k_m": "q5_k", "q6_k": "q6_k", "q8_0": "q8_0"}
#: ``general.file_type`` llama-quantize writes for each (llama.h's ``llama_ftype``).
FILE_TYPES: dict[str, int] = {"q4_k_m": 15, "q4_k_s": 14, "q5_k_m": 17, "q6_k": 18, "q8_0": 7}

# A row its block does not divide takes llama-quantize's fallback (formats.for_row:
# the one copy of ``tensor_type_fallback``); block sizes come from the format table.

# Substrings that keep a tensor out of quantization (tensor_allows_quantization;
# the architecture-specific ones of architectures hf2q does not load are left out).
_NEVER = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
          "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
          "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
          "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
          "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
          "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
          "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
          "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd")
_NEVER_EXACT = ("position_embd.weight", "token_types.weight")

_BLK = re.compile(r"blk\.(-?\d+)\.")


@dataclass(frozen=True)
class ModelFacts:
    """What llama-quantize reads from the model besides tensor names:
    ``n_layer`` (GGUF ``block_count``, MTP blocks included), ``n_expert``
    (``expert_count``, 0 for a dense model) and ``llama_70b`` (a LLaMA of 80
    layers with grouped-query attention: llama.cpp's 70B, whose ``attn_v``
    gets Q5_K for Q4_K)."""

    n_layer: int
    n_expert: int = 0
    llama_70b: bool = False


def ggml_n_dims(shape: Sequence[int]) -> int:
    """ggml's dimension count of a numpy-order shape: its leading 1s (ggml's
    trailing) do not count; at least 1."""
    ne = list(reversed([int(d) for d in shape]))
    for i in range(len(ne) - 1, 0, -1):
        if ne[i] != 1:
            return i + 1
    return 1


def allows_quantization(name: str, shape: Sequence[int]) -> bool:
    """Whether llama-quantize quantizes tensor ``name`` (a GGUF name): 2-D or
    3-D weights, not norms, routers, position tables and a few small kinds."""
    if ggml_n_dims(shape) < 2 or not name.endswith("weight"):
        return False
    if name in _NEVER_EXACT:
        return False
    return not any(s in name for s in _NEVER)


def category(name: str) -> str:
    """llama-quantize's category of a GGUF tensor name (``tensor_get_category``)."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for sub, cat in (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_kv_b"),
                     ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
                     ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                     ("ffn_down", "ffn_down")):
        if sub in name:
            return cat
    return "other"


def _use_more_bits(i: int, n: int) -> bool:
    # C integer arithmetic: n // 8 truncates (n >= 0); the modulo is reached only for i >= n // 8.
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _layer_key(name: str) -> tuple[int, str]:
    """llama.cpp's tensor order (the model loader's map): by block (names
    without one first), then by name."""
    m = _BLK.match(name)
    return (int(m.group(1)) if m else -1, name)


def recipe_types(tensors: Iterable[tuple[str, Sequence[int], str]], recipe: str,
                 facts: ModelFacts) -> dict[str, str]:
    """name -> format under ``recipe`` for ``tensors`` (GGUF name, numpy
    shape, format in the input file), as llama-quantize chooses for that file
    type without an importance matrix (``llama_tensor_get_type``)."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(RECIPES)}, got {recipe!r}")
    default = RECIPES[recipe]
    items = sorted(((n, tuple(int(d) for d in s), f) for n, s, f in tensors), key=lambda t: _layer_key(t[0]))
    cats = {n: category(n) for n, _, _ in items}
    n_wv = sum(c in ("attn_v", "attn_qkv", "attn_kv_b") for c in cats.values())
    tied = "output" not in cats.values()
    n_layer = int(facts.n_layer)
    i_wv = i_down = 0
    out: dict[str, str] = {}
    for name, shape, fmt in items:
        if not allows_quantization(name, shape):
            out[name] = fmt
            continue
        cat = cats[name]
        ncols = shape[-1]
        new = default
        if cat == "output" or (tied and cat == "token_embd"):
            if ncols % formats.get(default).block_elems != 0:
                new = "q8_0"
            elif new != "q8_0":
                new = "q6_k"
        elif cat == "token_embd":
            pass
        elif cat in ("attn_v", "attn_qkv", "attn_kv_b"):
            if recipe in ("q4_k_m", "q5_k_m") and _use_more_bits(i_wv, n_wv):
                new = "q6_k"
            elif recipe == "q4_k_s" and i_wv < 4:
                new = "q5_k"
            if facts.llama_70b and new == "q4_k":
                new = "q5_k"
            if facts.n_expert == 8:
                new = "q8_0"
            i_wv += 1
        elif cat == "attn_k":
            if facts.n_expert == 8:
                new = "q8_0"
        elif cat == "ffn_down":
            i_layer = i_down
            if facts.n_expert > 1:
                m = _BLK.match(name)
                if m is None or not 0 <= int(m.group(1)) < n_layer:
                    raise ValueError(f"{name}: no block index below the model's {n_layer} blocks "
                                     "(llama-quantize: 'Failed to determine layer' / 'Bad layer')")
                i_layer = int(m.group(1))
            if recipe in ("q4_k_m", "q5_k_m") and _use_more_bits(i_layer, n_layer):
                new = "q6_k"
            elif recipe == "q4_k_s" and i_layer < n_layer // 8:
                new = "q5_k"
            i_down += 1
        elif cat == "attn_output":
            if facts.n_expert == 8 and recipe in ("q4_k_m", "q4_k_s"):
                new = "q5_k"
        out[name] = formats.for_row(new, ncols)
    return out


def generic_facts(names: Mapping[str, str], plan: LoadPlan, model_type: str | None) -> ModelFacts:
    """A llama-like checkpoint's :class:`ModelFacts` from its tensors' GGUF
    ``names`` (entry name -> GGUF name) and shapes: blocks (the largest
    block index + 1), experts (distinct expert indices of a block) and
    llama.cpp's 70B rule (``llama`` with 80 blocks and fewer K than Q rows:
    grouped-query attention; ``qwen2`` with 80 blocks)."""
    blocks = [int(m.group(1)) for g in names.values() if (m := _BLK.match(g))]
    n_layer = max(blocks) + 1 if blocks else 0
    experts: dict[str, set[str]] = {}
    for g in names.values():
        m = re.fullmatch(r"(blk\.\d+\.ffn_\w+_exps)\.(\d+)\.weight", g)
        if m:
            experts.setdefault(m.group(1), set()).add(m.group(2))
    n_expert = max((len(v) for v in experts.values()), default=0)
    rows = {g: e.shape[0] for e in plan if e.shape for g in [names[e.name]]}
    gqa = rows.get("blk.0.attn_k.weight", 0) < rows.get("blk.0.attn_q.weight", 0)
    is_70b = n_layer == 80 and ((model_type == "llama" and gqa) or model_type == "qwen2")
    return ModelFacts(n_layer, n_expert, is_70b)


def _via_bf16(transform: Callable[[list[np.ndarray]], np.ndarray]) -> Callable[[list[np.ndarray]], np.ndarray]:
    """A transform whose result the converter's BF16 file stores rounded to
    BF16 (what llama-quantize then reads): round it the same way first."""

    def step(arrays: list[np.ndarray]) -> np.ndarray:
        return _round_bf16(np.asarray(transform(arrays)))

    return step


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """F32 / F16 values rounded to BF16 (nearest even), as the BF16 file
    holds them: float32 values whose low 16 bits are zero (exactly the BF16
    values; ml_dtypes' cast bit for bit, without importing it inside a load)."""
    from ._arrays import f32_to_bf16_bits, is_bf16  # (numpy: not at this module's import)

    if is_bf16(x.dtype):
        return x
    with np.errstate(over="ignore", invalid="ignore"):
        bits = f32_to_bf16_bits(x)
    return (bits.astype(np.uint32) << 16).view(np.float32).reshape(np.shape(x))


def _gather_bf16(entry: TensorPlan) -> Callable[[list[np.ndarray]], np.ndarray]:
    """A transform that assembles ``entry`` from its whole sources (row
    slices cut, each piece at its element offset) and rounds it to BF16: the
    BF16 file's values of a tensor cut out of an F32 / F16 fused one."""
    pieces = entry.sources
    shape = tuple(entry.shape)

    def step(arrays: list[np.ndarray]) -> np.ndarray:
        out = np.empty(int(np.prod(shape, dtype=np.int64)), dtype=np.float32)
        for p, a in zip(pieces, arrays):
            a = np.asarray(a)
            if p.rows is not None:
                a = a[:, p.rows[0]:p.rows[1]]
            flat = a.reshape(-1)
            out[p.dest_offset:p.dest_offset + flat.size] = flat
        return _round_bf16(out.reshape(shape))

    return step


#: The options a recipe replaces (refused beside one: :func:`replaced_by_recipe`).
DTYPE_OPTIONS = ("dtype", "expert_dtype", "dense_dtype")


def replaced_by_recipe(options: Mapping[str, Any]) -> list[str]:
    """The dtype options given (not None) beside a ``recipe`` in ``options``,
    which it would replace ([] without a recipe): the families refuse them
    (a TypeError), the command line names their flags."""
    if options.get("recipe") is None:
        return []
    return [k for k in DTYPE_OPTIONS if options.get(k) is not None]


def apply_recipe(plan: LoadPlan, recipe: str, facts: ModelFacts,
                 names: Mapping[str, str] | None = None) -> LoadPlan:
    """``plan`` (made as the converter's ``--outtype bf16`` file) with each
    entry's format chosen by :func:`recipe_types`; ``names``: entry name ->
    GGUF name where they differ (the generic family's checkpoint names).
    A BF16 entry computed by a transform, or read from an F32 / F16
    checkpoint, is rounded to BF16 before it is quantized, as llama-quantize
    reads it from the BF16 file. Returns a plan
    of the same class; ``extra["recipe"]`` names the recipe."""
    gguf = {e.name: (names or {}).get(e.name, e.name) for e in plan}
    types = recipe_types(((gguf[e.name], e.shape, e.dtype) for e in plan), recipe, facts)
    entries: list[TensorPlan] = []
    for e in plan:
        new = types[gguf[e.name]]
        if new == e.dtype:
            entries.append(e)
            continue
        if not formats.get(new).is_device:  # pragma: no cover - every recipe format is a device format
            raise ValueError(f"{e.name}: recipe {recipe} chose {new}, which hf2q cannot store")
        changes: dict[str, Any] = {"dtype": new}
        if e.transform is not None and e.dtype == "bf16":
            changes["transform"] = _via_bf16(e.transform)
        elif e.dtype == "bf16" and e.elementwise is None and any(p.dtype.lower() != "bf16" for p in e.sources):
            # An F32 / F16 checkpoint: the BF16 file rounds it first; stage it the same way
            # (a row slice of a fused tensor cannot be staged: read whole, cut, round).
            if all(p.rows is None for p in e.sources):
                changes["elementwise"] = _round_bf16
            else:
                changes["transform"] = _gather_bf16(e)
        entries.append(dataclasses.replace(e, **changes))
    # The dtype options the plan was made with (the BF16 file's) say nothing
    # of what is loaded: the formats the recipe chose, counted, instead.
    counts: dict[str, int] = {}
    for e in entries:
        counts[e.dtype] = counts.get(e.dtype, 0) + 1
    extra = {k: v for k, v in plan.extra.items() if k not in DTYPE_OPTIONS}
    extra |= {"recipe": recipe, "formats": ", ".join(f"{n} {d}" for d, n in sorted(counts.items()))}
    return dataclasses.replace(plan, entries=entries, extra=extra)
