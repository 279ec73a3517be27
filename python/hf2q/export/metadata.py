"""The key/values llama.cpp's converter writes, from ``config.json``
(docs/CONVERT.md lists every key, its type and where its value comes from).

The rules are the converter's, restated: hyper-parameters are read from the
config's root merged with its ``text_config`` (the text model's keys win),
first-found among a list of accepted spellings, and written only when found
(a family adds its defaults). Value types are the converter's: counts and
lengths ``UINT32``; floats ``FLOAT32``; per-layer lists ``ARRAY`` of
``INT32`` (integers) or ``BOOL``; strings ``STRING``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from .gguf import KV, ValueType as T

__all__ = ["FILE_TYPES", "QUANTIZATION_VERSION", "KVList", "general", "text_model", "qwen35moe", "gemma4"]

#: ``general.file_type`` (llama.cpp's ``llama_ftype``) of each ``--outtype``.
FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}
#: ``general.quantization_version`` (ggml's GGML_QNT_VERSION), written by every converted file.
QUANTIZATION_VERSION = 2


class KVList:
    """Ordered key/values; setting a key again replaces its value in place
    (the converter's writer does the same: a later ``add_*`` of a key wins,
    keeping the first position)."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self._kv: dict[str, KV] = {}

    def set(self, key: str, t: T, value: Any, sub_type: T | None = None) -> None:
        key = key.format(arch=self.arch)
        self._kv[key] = KV(key, t, value, sub_type)

    def u32(self, key: str, value: Any) -> None:
        self.set(key, T.UINT32, _int(key, value))

    def f32(self, key: str, value: Any) -> None:
        self.set(key, T.FLOAT32, _float(key, value))

    def string(self, key: str, value: str) -> None:
        if value:  # the converter's writer drops empty strings
            self.set(key, T.STRING, value)

    def array(self, key: str, values: Sequence[Any]) -> None:
        """An array typed as the converter types it: by its first element
        (bool -> BOOL, int -> INT32, float -> FLOAT32, str -> STRING);
        empty arrays are not written."""
        values = list(values)
        if not values:
            return
        first = values[0]
        sub = (T.BOOL if isinstance(first, bool) else T.INT32 if isinstance(first, int)
               else T.FLOAT32 if isinstance(first, float) else T.STRING if isinstance(first, str) else None)
        if sub is None:
            raise ConfigError(f"{key.format(arch=self.arch)}: cannot write a list of {type(first).__name__}",
                              key=key)
        self.set(key, T.ARRAY, values, sub)

    def u32_or_array(self, key: str, value: Any) -> None:
        if isinstance(value, (list, tuple)):
            self.array(key, [_int(key, v) for v in value])
        else:
            self.u32(key, value)

    def remove(self, key: str) -> None:
        """Drop ``key`` where it is set (a later set appends it at the end)."""
        self._kv.pop(key.format(arch=self.arch), None)

    def __contains__(self, key: str) -> bool:
        return key.format(arch=self.arch) in self._kv

    def items(self) -> list[KV]:
        return list(self._kv.values())


def _int(key: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 32:
        raise ConfigError(f"config.json: {key} must be an integer in [0, 2**32), got {v!r}", key=key)
    return v


def _float(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"config.json: {key} must be a number, got {v!r}", key=key)
    return float(v)


def hparams(config: Mapping[str, Any]) -> dict[str, Any]:
    """The root merged with ``text_config`` (the text model's keys win)."""
    tc = config.get("text_config")
    return {**config, **tc} if isinstance(tc, Mapping) else dict(config)


def _find(h: Mapping[str, Any], keys: Sequence[str]) -> Any:
    """The value of the first of ``keys`` present (None if none; a key
    present with ``null`` is None too)."""
    for k in keys:
        if k in h:
            return h[k]
    return None


def rope_parameters(h: Mapping[str, Any]) -> dict[str, Any]:
    """``rope_parameters`` (or ``rope_scaling``), with the root's rope
    fields mirrored in where it has no per-attention-kind sub-dicts."""
    rp = h.get("rope_parameters", h.get("rope_scaling")) or {}
    rp = dict(rp) if isinstance(rp, Mapping) else {}
    if "full_attention" not in rp and "sliding_attention" not in rp:
        local = _find(h, ["local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta",
                          "rope_local_base_freq"])
        theta = _find(h, ["global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta",
                          "rotary_emb_base"])
        prf = _find(h, ["partial_rotary_factor", "rope_pct", "rope_percent"])
        omp = _find(h, ["original_max_position_embeddings"])
        if local is not None:
            rp["sliding_attention"] = {"rope_theta": local}
        if "rope_theta" not in rp and theta is not None:
            rp["rope_theta"] = theta
        if "rope_type" not in rp and rp.get("type") is not None:
            rp["rope_type"] = rp["type"]
        if "partial_rotary_factor" not in rp and prf is not None:
            rp["partial_rotary_factor"] = prf
        if "original_max_position_embeddings" not in rp and omp is not None:
            rp["original_max_position_embeddings"] = omp
    return rp


def general(kv: KVList, name: str) -> None:
    """``general.type`` and ``general.name`` (the converter's fallback name:
    the checkpoint directory's name, or the repo id)."""
    kv.string("general.type", "model")
    kv.string("general.name", name)


def text_model(kv: KVList, h: Mapping[str, Any], rp: Mapping[str, Any], block_count: int, outtype: str) -> None:
    """The hyper-parameters every text model writes (the converter's base
    class), in its order."""
    kv.u32("{arch}.block_count", block_count)
    if (v := _find(h, ["max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length",
                       "model_max_length"])) is not None:
        kv.u32("{arch}.context_length", v)
    if (v := _find(h, ["hidden_size", "n_embd", "dim"])) is not None:
        kv.u32("{arch}.embedding_length", v)
    if (v := _find(h, ["prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size", "n_inner",
                       "hidden_dim"])) is not None:
        kv.u32_or_array("{arch}.feed_forward_length", v)
    if (v := _find(h, ["num_attention_heads", "n_head", "n_heads"])) is not None:
        kv.u32_or_array("{arch}.attention.head_count", v)
    if (v := _find(h, ["num_key_value_heads", "n_kv_heads"])) is not None:
        kv.u32_or_array("{arch}.attention.head_count_kv", v)
    if h.get("is_causal") is False:
        kv.set("{arch}.attention.causal", T.BOOL, False)
    full = rp.get("full_attention", rp)
    full = full if isinstance(full, Mapping) else {}
    rope_type = full.get("rope_type")
    if rope_type is not None:
        factor = full.get("factor")
        if rope_type == "linear" and factor is not None:
            kv.string("{arch}.rope.scaling.type", "linear")
            kv.f32("{arch}.rope.scaling.factor", factor)
        elif rope_type == "yarn" and factor is not None:
            kv.string("{arch}.rope.scaling.type", "yarn")
            kv.f32("{arch}.rope.scaling.factor", factor)
            if "original_max_position_embeddings" not in full:
                raise ConfigError("config.json: yarn rope scaling without original_max_position_embeddings",
                                  key="original_max_position_embeddings")
            kv.u32("{arch}.rope.scaling.original_context_length", full["original_max_position_embeddings"])
            yarn = {"yarn_ext_factor": full.get("extrapolation_factor"),
                    "yarn_attn_factor": full.get("attention_factor", full.get("attn_factor")),
                    "yarn_beta_fast": full.get("beta_fast"), "yarn_beta_slow": full.get("beta_slow")}
            for dst, v in yarn.items():
                if v is not None:
                    kv.f32("{arch}.rope.scaling." + dst, v)
        elif rope_type in ("su", "longrope"):
            kv.string("{arch}.rope.scaling.type", "longrope")
    if "mrope_section" in rp:
        sec = list(rp["mrope_section"]) + [0] * max(0, 4 - len(rp["mrope_section"]))
        kv.array("{arch}.rope.dimension_sections", [_int("mrope_section", x) for x in sec[:4]])
    if full.get("rope_theta") is not None:
        kv.f32("{arch}.rope.freq_base", full["rope_theta"])
    sliding = rp.get("sliding_attention")
    if isinstance(sliding, Mapping) and sliding.get("rope_theta") is not None:
        kv.f32("{arch}.rope.freq_base_swa", sliding["rope_theta"])
    if (v := _find(h, ["rms_norm_eps", "norm_eps"])) is not None:
        kv.f32("{arch}.attention.layer_norm_rms_epsilon", v)
    if (v := _find(h, ["layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"])) is not None:
        kv.f32("{arch}.attention.layer_norm_epsilon", v)
    if (v := _find(h, ["num_local_experts", "num_experts", "n_routed_experts"])) is not None:
        kv.u32("{arch}.expert_count", v)
    if (v := _find(h, ["num_experts_per_tok", "num_experts_per_token", "top_k_experts"])) is not None:
        kv.u32("{arch}.expert_used_count", v)
    if (v := h.get("n_group")) is not None:
        kv.u32("{arch}.expert_group_count", v)
    if (v := h.get("topk_group")) is not None:
        kv.u32("{arch}.expert_group_used_count", v)
    if (v := _find(h, ["score_function", "scoring_func", "score_func", "moe_router_activation",
                       "moe_router_activation_func", "expert_selection_fn"])) is not None:
        gating = {"softmax": 1, "sigmoid": 2, "sqrtsoftplus": 4}.get(v)
        if gating is None:
            raise ConfigError(f"config.json: unsupported expert scoring function {v!r}", key="scoring_func")
        kv.u32("{arch}.expert_gating_func", gating)
    if (v := h.get("head_dim")) is not None:
        kv.u32("{arch}.attention.key_length", v)
        kv.u32("{arch}.attention.value_length", v)
    kv.u32("general.file_type", FILE_TYPES[outtype])


def qwen35moe(kv: KVList, config: Mapping[str, Any], cfg: Any, outtype: str) -> None:
    """``qwen35moe``: the base keys, then experts, MTP, the linear-attention
    (SSM) sizes, the recurrent layer pattern, the full-attention interval
    (always 4: see below), the rotary dimension and, where
    ``mrope_section`` is absent, the sections ``[11, 11, 10, 0]``.
    ``cfg`` is the plan's resolved :class:`~hf2q.models.qwen35.Qwen35Config`
    (its MTP layer count is the one the file's tensors give)."""
    # The converter reads the config through transformers (defaults filled
    # in); our parsed config carries the same defaults.
    h = hparams(config)
    h["layer_types"] = list(cfg.layer_types)
    rp = rope_parameters(h)
    rp.setdefault("rope_theta", cfg.rope_theta)
    n_mtp = cfg.mtp_num_hidden_layers
    n_layer = cfg.num_hidden_layers
    text_model(kv, h, rp, cfg.num_hidden_layers + n_mtp, outtype)
    if (v := h.get("moe_intermediate_size")) is not None:
        kv.u32("{arch}.expert_feed_forward_length", v)
    if (v := h.get("shared_expert_intermediate_size")) is not None:
        kv.u32("{arch}.expert_shared_feed_forward_length", v)
    if n_mtp:
        kv.u32("{arch}.nextn_predict_layers", n_mtp)
    kv.u32("{arch}.ssm.conv_kernel", cfg.linear_conv_kernel_dim)
    kv.u32("{arch}.ssm.state_size", cfg.linear_key_head_dim)
    kv.u32("{arch}.ssm.group_count", cfg.linear_num_key_heads)
    kv.u32("{arch}.ssm.time_step_rank", cfg.linear_num_value_heads)
    kv.u32("{arch}.ssm.inner_size", cfg.linear_value_head_dim * cfg.linear_num_value_heads)
    if h.get("layer_types") is not None:
        recurrent = [t == "linear_attention" for t in h["layer_types"]]
        if len(recurrent) != n_layer:
            raise ConfigError(f"config.json: layer_types has {len(recurrent)} entries, num_hidden_layers is "
                              f"{n_layer}", key="layer_types")
        kv.array("{arch}.attention.recurrent_layers", recurrent + [False] * n_mtp)
    # transformers keeps no full_attention_interval (layer_types carries the
    # pattern), so the converter always writes its default, 4, whatever the
    # file says; llama.cpp takes the pattern from recurrent_layers.
    kv.u32("{arch}.full_attention_interval", 4)
    kv.u32("{arch}.rope.dimension_count", cfg.rotary_dim)
    if "mrope_section" not in rp:
        kv.array("{arch}.rope.dimension_sections", [11, 11, 10, 0])


def gemma4(kv: KVList, config: Mapping[str, Any], cfg: Any, outtype: str) -> None:
    """``gemma4``: the base keys with Gemma's defaults, then KV sharing,
    per-layer inputs, the sliding pattern, full / sliding head sizes, expert
    size, double-wide MLP lengths, per-layer KV heads and rotary sizes.
    ``cfg`` is the parsed :class:`~hf2q.models.gemma4.Gemma4Config`."""
    # The converter reads the config through transformers (defaults filled
    # in, the last layer forced to full attention); our parsed config carries
    # the same values.
    h = hparams(config)
    h.update(max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
             num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
             head_dim=cfg.head_dim, sliding_window=cfg.sliding_window,
             final_logit_softcapping=cfg.final_logit_softcapping, num_kv_shared_layers=cfg.num_kv_shared_layers,
             hidden_size_per_layer_input=cfg.hidden_size_per_layer_input, layer_types=list(cfg.layer_types))
    rp = rope_parameters(h)
    full = rp.get("full_attention")
    if isinstance(full, Mapping):
        rp["full_attention"] = {**full, "rope_theta": cfg.rope_theta_full}
    else:
        rp["rope_theta"] = cfg.rope_theta_full
    sliding = rp.get("sliding_attention")
    rp["sliding_attention"] = {**(sliding if isinstance(sliding, Mapping) else {}), "rope_theta": cfg.rope_theta_sliding}
    text_model(kv, h, rp, cfg.num_hidden_layers, outtype)
    # Gemma's own defaults (written whether or not the file states them)
    kv.u32("{arch}.context_length", h.get("max_position_embeddings", 131072))
    kv.u32_or_array("{arch}.attention.head_count", h.get("num_attention_heads", 8))
    kv.f32("{arch}.attention.layer_norm_rms_epsilon", h.get("rms_norm_eps", 1e-6))
    kv.u32("{arch}.attention.key_length", h.get("head_dim", 256))
    kv.u32("{arch}.attention.value_length", h.get("head_dim", 256))
    full = rp.get("full_attention", rp)
    kv.f32("{arch}.rope.freq_base", (full if isinstance(full, Mapping) else {}).get("rope_theta", 1_000_000.0))
    if h.get("final_logit_softcapping"):
        kv.f32("{arch}.final_logit_softcapping", h["final_logit_softcapping"])
    if h.get("sliding_window_pattern") != 1:
        if "sliding_window" not in h:
            raise ConfigError("config.json: no sliding_window", key="sliding_window")
        kv.u32("{arch}.attention.sliding_window", h["sliding_window"])
    kv.u32_or_array("{arch}.attention.head_count_kv", h.get("num_key_value_heads", 4))
    if "num_kv_shared_layers" not in h:
        raise ConfigError("config.json: no num_kv_shared_layers", key="num_kv_shared_layers")
    n_shared = h["num_kv_shared_layers"]
    kv.u32("{arch}.attention.shared_kv_layers", n_shared)
    kv.u32("{arch}.embedding_length_per_layer_input", h.get("hidden_size_per_layer_input") or 0)
    layer_types = list(h.get("layer_types") or [])
    swa = [t == "sliding_attention" for t in layer_types]
    kv.array("{arch}.attention.sliding_window_pattern", swa)
    per_layer = h.get("per_layer_config")
    head_dim_full = h.get("global_head_dim")
    if head_dim_full is None and isinstance(per_layer, Mapping):
        head_dim_full = _per_layer_full(per_layer, layer_types, "head_dim")
    if head_dim_full is None:
        head_dim_full = cfg.full_head_dim
    head_dim_swa = h["head_dim"]
    kv.u32("{arch}.attention.key_length", head_dim_full)
    kv.u32("{arch}.attention.value_length", head_dim_full)
    kv.u32("{arch}.attention.key_length_swa", head_dim_swa)
    kv.u32("{arch}.attention.value_length_swa", head_dim_swa)
    if (v := _find(h, ["expert_intermediate_size", "moe_intermediate_size"])) is not None:
        kv.u32("{arch}.expert_feed_forward_length", v)
    if h.get("use_double_wide_mlp", False):
        n_ff = h["intermediate_size"]
        first_shared = cfg.num_hidden_layers - n_shared
        kv.array("{arch}.feed_forward_length",
                 [n_ff if i < first_shared else n_ff * 2 for i in range(cfg.num_hidden_layers)])
    kv_full = h.get("num_global_key_value_heads")
    if kv_full is None and isinstance(per_layer, Mapping):
        kv_full = _per_layer_full(per_layer, layer_types, "num_key_value_heads")
    kv_swa = h.get("num_key_value_heads")
    if kv_full is not None and kv_swa is not None:
        kv.array("{arch}.attention.head_count_kv", [kv_swa if s else kv_full for s in swa])
    prf_swa = rp.get("partial_rotary_factor", 1.0)
    kv.u32("{arch}.rope.dimension_count", int(head_dim_full))
    kv.u32("{arch}.rope.dimension_count_swa", int(head_dim_swa * prf_swa))


def _per_layer_full(per_layer: Mapping[str, Any], layer_types: list[str], key: str) -> Any:
    """``key`` of the first full-attention layer in ``per_layer_config`` that states it."""
    for idx, lc in per_layer.items():
        i = int(idx)
        if i < len(layer_types) and layer_types[i] == "full_attention" and isinstance(lc, Mapping) and key in lc:
            return lc[key]
    return None
