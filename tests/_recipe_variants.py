"""The checkpoints of the recipe golden data (scripts/make_recipe_golden.py
writes tests/data/kquants/recipes.json from them; tests/test_recipes.py
compares hf2q's plans against it): the committed tiny checkpoints, and two
synthetic ones written by hf2q.testing from a fixed config and seed (rows of
256 and more, so that the k-quants themselves are chosen)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

#: hf2q recipe -> llama-quantize's type argument.
RECIPES_FTYPE = {"q4_k_m": "Q4_K_M", "q4_k_s": "Q4_K_S", "q5_k_m": "Q5_K_M", "q6_k": "Q6_K", "q8_0": "Q8_0"}

_QWEN_WIDE = {
    "model_type": "qwen3_5_moe_text", "attn_output_gate": True, "full_attention_interval": 4, "head_dim": 256,
    "hidden_act": "silu", "hidden_size": 256,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_value_head_dim": 128, "max_position_embeddings": 4096,
    "moe_intermediate_size": 256, "mtp_num_hidden_layers": 1, "num_attention_heads": 1, "num_experts": 4,
    "num_experts_per_tok": 2, "num_hidden_layers": 4, "num_key_value_heads": 1, "rms_norm_eps": 1e-06,
    "shared_expert_intermediate_size": 256, "tie_word_embeddings": False, "vocab_size": 256,
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "default",
                        "rope_theta": 10000000, "partial_rotary_factor": 0.25},
}

_GEMMA_WIDE = {
    "model_type": "gemma4_text", "hidden_size": 256, "num_hidden_layers": 4, "vocab_size": 96,
    "intermediate_size": 256, "moe_intermediate_size": 256, "num_experts": 8, "top_k_experts": 2,
    "enable_moe_block": True, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 256,
    "global_head_dim": 512, "num_global_key_value_heads": 1, "attention_k_eq_v": True, "sliding_window": 64,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "final_logit_softcapping": 30.0, "tie_word_embeddings": True, "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0, "use_double_wide_mlp": False, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096, "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False,
    "dtype": "bfloat16",
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                           "rope_theta": 1000000.0}},
}

#: name -> how to get the checkpoint: a committed folder, or a generator, its config and seed.
VARIANTS: dict[str, dict[str, Any]] = {
    "qwen35moe_causal_lm": {"family": "qwen35moe", "checkpoint": "tests/data/golden/qwen35moe_causal_lm/hf"},
    "gemma4_moe_causal_lm": {"family": "gemma4", "checkpoint": "tests/data/gemma4/gemma4_moe_causal_lm/hf"},
    "gemma4_dense_ple": {"family": "gemma4", "checkpoint": "tests/data/gemma4/gemma4_dense_ple/hf"},
    "gemma4_dense_f32_source": {"family": "gemma4",
                                "checkpoint": "tests/data/gemma4/gemma4_dense_f32_source/hf"},
    # FP8 checkpoints (scripts/make_golden_fp8.py): llama-quantize reads the converter's BF16 file,
    # in which each weight times its scale is rounded to BF16.
    "qwen35moe_fp8_block128": {"family": "qwen35moe", "checkpoint": "tests/data/fp8/qwen35moe_fp8_block128/hf"},
    "qwen35moe_fp8_fused": {"family": "qwen35moe", "checkpoint": "tests/data/fp8/qwen35moe_fp8_fused/hf"},
    "gemma4_moe_fp8_ct_channel": {"family": "gemma4",
                                  "checkpoint": "tests/data/fp8/gemma4_moe_fp8_ct_channel/hf"},
    "qwen35moe_wide": {"family": "qwen35moe", "generator": "make_qwen35_moe_checkpoint", "config": _QWEN_WIDE,
                       "seed": 11},
    "gemma4_moe_wide": {"family": "gemma4", "generator": "make_gemma4_checkpoint", "config": _GEMMA_WIDE,
                        "seed": 12},
}


def materialize(name: str, scratch: Path) -> Path:
    """The variant's checkpoint folder (a generated one is written under ``scratch``)."""
    v = VARIANTS[name]
    if "checkpoint" in v:
        return REPO / v["checkpoint"]
    from hf2q import testing

    return getattr(testing, v["generator"])(scratch, v["config"], seed=v["seed"])


# ----------------------------------------------------------------------------- full size, types only
#: Published configs (their text part, as hf2q.testing states them): the
#: plans are made from tensor headers alone (no bytes), and llama-quantize
#: --dry-run decides the types from a header-only BF16 file.
FULL_SIZE = ("qwen36_35b_a3b", "gemma4_26b_a4b")


class _Info:
    def __init__(self, dtype: str, shape: tuple[int, ...]) -> None:
        self.dtype, self.shape = dtype, tuple(shape)


class HeaderCheckpoint:
    """What a family's plan reads of a checkpoint (names, dtypes, shapes,
    its folder), without any file."""

    def __init__(self, specs: dict[str, tuple[str, tuple[int, ...]]], directory: Path) -> None:
        self._specs = specs
        self.directory = directory

    def keys(self) -> list[str]:
        return list(self._specs)

    def __iter__(self):
        return iter(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __getitem__(self, name: str) -> _Info:
        return _Info(*self._specs[name])


def full_size_plan(name: str, recipe: str | None, scratch: Path) -> tuple[Any, dict[str, Any], Any]:
    """(the family's plan under ``recipe`` (None: the converter's BF16 file),
    config.json as a dict, the family) of a published config, from headers."""
    import json

    from hf2q.models import family

    if name == "qwen36_35b_a3b":
        from hf2q.testing.qwen35_checkpoint import QWEN36_35B_A3B_TEXT_CONFIG, checkpoint_tensor_specs, \
            qwen35_config_dict

        config = qwen35_config_dict(QWEN36_35B_A3B_TEXT_CONFIG)
        specs = checkpoint_tensor_specs(QWEN36_35B_A3B_TEXT_CONFIG, fused_gate_up=True)
        fam = family("qwen35moe").impl()
    else:
        from hf2q.testing.gemma4_checkpoint import GEMMA4_26B_A4B_TEXT_CONFIG, gemma4_config_dict, \
            gemma4_tensor_shapes

        config = gemma4_config_dict(GEMMA4_26B_A4B_TEXT_CONFIG)
        specs = {n: ("BF16", s) for n, s in gemma4_tensor_shapes(GEMMA4_26B_A4B_TEXT_CONFIG).items()}
        fam = family("gemma4").impl()
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "config.json").write_text(json.dumps(config))
    ckpt = HeaderCheckpoint(specs, scratch)
    opts = {"recipe": recipe} if recipe else {"expert_dtype": "bf16", "dense_dtype": "bf16"}
    return fam.plan_checkpoint(ckpt, config=config, **opts), config, fam


#: llama-like shapes for the generic family (types only, from headers):
#: a LLaMA of 80 blocks with grouped-query attention (llama.cpp's 70B rule)
#: and a Mixtral-like model with 8 experts (the 8-expert rules).
GENERIC_FULL: dict[str, dict[str, Any]] = {
    "llama_70b": {"model_type": "llama", "layers": 80, "hidden": 8192, "ffn": 28672, "heads": 64, "kv_heads": 8,
                  "vocab": 128256, "experts": 0},
    "mixtral_8x7b": {"model_type": "mixtral", "layers": 32, "hidden": 4096, "ffn": 14336, "heads": 32,
                     "kv_heads": 8, "vocab": 32000, "experts": 8},
}


def generic_specs(name: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Hugging Face tensor name -> (dtype, shape) of a llama-like checkpoint."""
    c = GENERIC_FULL[name]
    H, F, V, hd = c["hidden"], c["ffn"], c["vocab"], c["hidden"] // c["heads"]
    out: dict[str, tuple[str, tuple[int, ...]]] = {"model.embed_tokens.weight": ("BF16", (V, H))}
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = ("BF16", (H,))
        out[p + "self_attn.q_proj.weight"] = ("BF16", (H, H))
        out[p + "self_attn.k_proj.weight"] = ("BF16", (c["kv_heads"] * hd, H))
        out[p + "self_attn.v_proj.weight"] = ("BF16", (c["kv_heads"] * hd, H))
        out[p + "self_attn.o_proj.weight"] = ("BF16", (H, H))
        out[p + "post_attention_layernorm.weight"] = ("BF16", (H,))
        if c["experts"]:
            out[p + "block_sparse_moe.gate.weight"] = ("BF16", (c["experts"], H))
            for e in range(c["experts"]):
                q = f"{p}block_sparse_moe.experts.{e}."
                out[q + "w1.weight"] = ("BF16", (F, H))
                out[q + "w2.weight"] = ("BF16", (H, F))
                out[q + "w3.weight"] = ("BF16", (F, H))
        else:
            out[p + "mlp.gate_proj.weight"] = ("BF16", (F, H))
            out[p + "mlp.up_proj.weight"] = ("BF16", (F, H))
            out[p + "mlp.down_proj.weight"] = ("BF16", (H, F))
    out["model.norm.weight"] = ("BF16", (H,))
    out["lm_head.weight"] = ("BF16", (V, H))
    return out


def generic_full_size_plan(name: str, recipe: str | None, scratch: Path) -> Any:
    """The generic family's plan of a llama-like checkpoint from headers
    (``recipe`` None: its ``dtype="bf16"`` plan)."""
    import json

    from hf2q.models import family

    c = GENERIC_FULL[name]
    arch = "MixtralForCausalLM" if c["experts"] else "LlamaForCausalLM"
    config = {"architectures": [arch], "model_type": c["model_type"]}
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "config.json").write_text(json.dumps(config))
    ckpt = HeaderCheckpoint(generic_specs(name), scratch)
    opts = {"recipe": recipe} if recipe else {"dtype": "bf16"}
    return family("generic").impl().plan_checkpoint(ckpt, config=config, **opts)


# ----------------------------------------------------------------------------- hf2q convert --recipe, whole files
#: llama-like checkpoints of the generic family whose GGUF file ``hf2q convert
#: --recipe`` writes: the committed tiny ones of tests/data/gguf/generic (rows
#: of 32 to 64 values: llama-quantize's fallbacks; three with tokenizers),
#: a committed FP8 one, and two synthetic ones with rows of 256 and more (the
#: k-quants themselves; Qwen3-MoE with 8 experts, llama.cpp's 8-expert rules,
#: and tied embeddings).
_LLAMA_WIDE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
               "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
               "num_hidden_layers": 4, "vocab_size": 256, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
               "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
_QWEN3_MOE_WIDE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
                   "intermediate_size": 512, "moe_intermediate_size": 256, "num_attention_heads": 2,
                   "num_key_value_heads": 1, "head_dim": 128, "num_hidden_layers": 2, "num_experts": 8,
                   "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
                   "vocab_size": 256, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                   "tie_word_embeddings": True, "torch_dtype": "bfloat16"}

GENERIC_CONVERT: dict[str, dict[str, Any]] = {
    "llama3": {"checkpoint": "tests/data/gguf/generic/llama3"},
    "mistral": {"checkpoint": "tests/data/gguf/generic/mistral"},
    "qwen3": {"checkpoint": "tests/data/gguf/generic/qwen3"},
    "qwen3_moe": {"checkpoint": "tests/data/gguf/generic/qwen3_moe"},
    "qwen3_fp8_deepseek": {"checkpoint": "tests/data/fp8/qwen3_fp8_deepseek/hf"},
    "llama_wide": {"config": _LLAMA_WIDE, "seed": 21},
    "qwen3_moe_wide": {"config": _QWEN3_MOE_WIDE, "seed": 22},
}


def llama_like_tensors(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name -> shape of a Llama / Qwen3 / Qwen3-MoE checkpoint of ``config``."""
    H, V, L = config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]
    hd = config.get("head_dim", H // config["num_attention_heads"])
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    qwen = config["model_type"].startswith("qwen3")
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not config.get("tie_word_embeddings"):
        out["lm_head.weight"] = (V, H)
    for i in range(L):
        p = f"model.layers.{i}."
        out |= {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                p + "self_attn.q_proj.weight": (q, H), p + "self_attn.k_proj.weight": (kv, H),
                p + "self_attn.v_proj.weight": (kv, H), p + "self_attn.o_proj.weight": (H, q)}
        if qwen:
            out |= {p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}
        if config.get("num_experts"):
            F = config["moe_intermediate_size"]
            out[p + "mlp.gate.weight"] = (config["num_experts"], H)
            for e in range(config["num_experts"]):
                x = f"{p}mlp.experts.{e}."
                out |= {x + "gate_proj.weight": (F, H), x + "up_proj.weight": (F, H), x + "down_proj.weight": (H, F)}
        else:
            F = config["intermediate_size"]
            out |= {p + "mlp.gate_proj.weight": (F, H), p + "mlp.up_proj.weight": (F, H),
                    p + "mlp.down_proj.weight": (H, F)}
    return out


def make_llama_like(dst: Path, config: dict[str, Any], seed: int) -> Path:
    """A BF16 checkpoint of ``config`` in ``dst`` (its folder name is the
    file's ``general.name``): weights ~ N(0, 0.02), norms ~ 1 + N(0, 0.1),
    from ``seed``; no tokenizer."""
    import json

    import ml_dtypes
    import numpy as np

    from hf2q.testing.fp8_checkpoint import write_safetensors

    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in llama_like_tensors(config).items():
        x = rng.standard_normal(shape, dtype=np.float32)
        x = 1 + 0.1 * x if len(shape) == 1 else 0.02 * x
        arrays[name] = x.astype(ml_dtypes.bfloat16)
    dst.mkdir(parents=True, exist_ok=True)
    write_safetensors(dst / "model.safetensors", arrays)
    (dst / "config.json").write_text(json.dumps(config, indent=1))
    return dst


def materialize_generic(name: str, scratch: Path) -> Path:
    """The checkpoint folder of a :data:`GENERIC_CONVERT` variant (a synthetic
    one is written to ``scratch / name``: the folder's name is the file's
    ``general.name``)."""
    v = GENERIC_CONVERT[name]
    if "checkpoint" in v:
        return REPO / v["checkpoint"]
    return make_llama_like(scratch / name, v["config"], v["seed"])
