"""The converter's tensor order (docs/CONVERT.md).

llama.cpp's converter walks the checkpoint's tensors once: shard files by
sorted file name, within a shard the tensor names sorted (its safetensors
reader sorts them), and emits each GGUF tensor as soon as the last of its
sources has been seen (an expert stack when its last expert arrives; a
generated tensor, e.g. Gemma 4's ``rope_freqs``, before everything else).
Tensors made from the same last source come in the family's own order, which
is the plan's order. So: a stable sort of the plan by the position of each
entry's last source in the checkpoint's sorted walk (``Checkpoint.keys()``
is that walk), sourceless entries first.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..plan import TensorPlan

__all__ = ["converter_order"]


def converter_order(entries: Sequence[TensorPlan], walk: Sequence[str]) -> list[TensorPlan]:
    """``entries`` in the order the converter writes them, ``walk`` being
    the checkpoint's tensor names in the converter's reading order."""
    pos = {name: i for i, name in enumerate(walk)}
    keyed = []
    for i, e in enumerate(entries):
        last = max((pos[p.tensor] for p in e.sources), default=-1)
        keyed.append((last, i, e))
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [e for _, _, e in keyed]
