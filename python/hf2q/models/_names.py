"""Facts every family that writes llama.cpp's names shares (docs/ARCHITECTURE.md):

- the Hugging Face -> GGUF tensor names common to the decoder families
  (one map, as gguf-py's ``TensorNameMap`` is one map for every
  architecture); a family adds its own with :func:`with_additions`;
- llama.cpp's text-model filter: the names of a multimodal wrapper's towers
  and projectors, which a text model skips (``TextModel.filter_tensors`` of
  ``convert_hf_to_gguf.py``), with a family's additions.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["GLOBAL_NAMES", "LAYER_NAMES", "with_additions", "MULTIMODAL_PREFIXES", "MULTIMODAL_PARTS",
           "multimodal_filter"]

#: Whole-model tensors: HF name -> GGUF name.
GLOBAL_NAMES: Mapping[str, str] = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}

#: Per-layer tensors: suffix after ``model.layers.{b}.`` -> suffix after ``blk.{b}.``.
LAYER_NAMES: Mapping[str, str] = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def with_additions(shared: Mapping[str, str], additions: Mapping[str, str], *,
                   renames: Mapping[str, str] | None = None) -> dict[str, str]:
    """``shared`` plus a family's own names; a family never renames a shared
    one in ``additions`` (that would be a second source for the same fact).
    ``renames``: the shared names a family's converter class calls
    differently, said once and explicitly (each must be a shared name that
    the rename changes)."""
    clash = sorted(k for k in additions if k in shared and additions[k] != shared[k])
    if clash:
        raise ValueError(f"a family renames shared tensor names: {', '.join(clash)}")
    renames = dict(renames or {})
    stray = sorted(k for k in renames if k not in shared or renames[k] == shared[k])
    if stray:
        raise ValueError(f"renames of names the shared map does not hold, or holds already: {', '.join(stray)}")
    return {**shared, **additions, **renames}


#: llama.cpp's text-model filter: a name starting with one of these ...
MULTIMODAL_PREFIXES: tuple[str, ...] = (
    "mlp", "vit.", "vpm.", "siglip2.", "conformer.", "merger.", "resampler.", "sound_encoder.", "sound_projection.",
    "speech_embeddings.")
#: ... or holding one of these is not the text model's.
MULTIMODAL_PARTS: tuple[str, ...] = (
    "visual.", "vision.", "audio.", "talker.", "vision_", "audio_", "token2wav.", "code2wav.", "projector.",
    "pre_mm_projector_norm", "image_newline", "view_seperator", "patch_embed", "patch_embedding", "patch_merger.",
    "model.connector.")


def multimodal_filter(extra_parts: tuple[str, ...] = ()) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(prefixes, parts)`` of the text-model filter with a family's
    ``extra_parts`` (the filter as the converter of that family has it)."""
    return MULTIMODAL_PREFIXES, MULTIMODAL_PARTS + tuple(p for p in extra_parts if p not in MULTIMODAL_PARTS)
