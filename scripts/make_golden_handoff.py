#!/usr/bin/env python3
"""Regenerate the hand-off fixtures under tests/data/handoff/.

Each is a tiny checkpoint written by transformers' own ``save_pretrained``
(weights, ``config.json`` and ``generation_config.json`` exactly as written),
random weights from a fixed seed:

- ``llama_tied``: a two-layer Llama with tied embeddings (the checkpoint has
  no ``lm_head.weight``: transformers ties it on load);
- ``qwen3_moe``: a two-layer Qwen3-MoE, which transformers 5 holds with its
  experts stacked (``mlp.experts.gate_up_proj``) and saves one tensor per
  expert (``mlp.experts.<e>.gate_proj.weight``): loading it takes the
  conversion mapping (per-expert tensors merged, gate and up concatenated).

The Qwen3.5 MoE and Gemma 4 checkpoints the hand-off tests also use are the
golden ones of scripts/make_golden.py and scripts/make_golden_gemma4.py
(tests/data/golden/qwen35moe_*/hf, tests/data/gemma4/gemma4_*/hf), written by
the same ``save_pretrained``.

The tests compare against transformers' ``from_pretrained`` at test time, so
nothing here is an expected output. Not run in CI.

Pinned as the test extra pins them: torch 2.13.0 (CPU), transformers 5.24.0.

Usage::

    python scripts/make_golden_handoff.py            # writes tests/data/handoff/
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
import transformers

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data" / "handoff"
PINNED = "5.24.0"

LLAMA = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256, tie_word_embeddings=True,
             rms_norm_eps=1e-5, rope_theta=10000.0)
QWEN3_MOE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
                 num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
                 max_position_embeddings=256, tie_word_embeddings=False)


def _save(name: str, config: transformers.PretrainedConfig, cls: type, seed: int) -> Path:
    torch.manual_seed(seed)
    model = cls(config).to(torch.bfloat16)  # a bf16 checkpoint, as published ones are
    with torch.no_grad():
        for p in model.parameters():  # larger than the init's 0.02 std: logits that differ where weights do
            p.normal_(0.0, 0.2)
    out = OUT / name
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out)
    return out


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    if transformers.__version__ != PINNED:
        raise SystemExit(f"transformers {PINNED} expected (found {transformers.__version__})")
    _save("llama_tied", transformers.LlamaConfig(**LLAMA), transformers.LlamaForCausalLM, 1)
    _save("qwen3_moe", transformers.Qwen3MoeConfig(**QWEN3_MOE), transformers.Qwen3MoeForCausalLM, 2)
    for d in sorted(OUT.iterdir()):
        print(d.name, sorted(p.name for p in d.iterdir()))


if __name__ == "__main__":
    main()
