#!/usr/bin/env python3
"""Tiny llama-like checkpoints of the generic family and llama.cpp's
converter's whole GGUF file for each: tests/data/gguf/generic/<name>/ (the
checkpoint, written by transformers' own ``save_pretrained``, with its
tokenizer) and tests/data/gguf/generic/<name>.json (read by
tests/test_convert_generic.py, as scripts/make_golden_gguf.py records the
families' files: every key/value, every tensor info and the SHA-256 of its
bytes, for q8_0, bf16 and f32).

- ``llama3``: a two-layer Llama with tied embeddings (no ``lm_head``), Q/K
  heads permuted by the converter, a Llama-3-style byte-level BPE tokenizer
  (``llama-bpe`` pre-tokenizer regex, ``<|begin_of_text|>`` added by a
  TemplateProcessing after ByteLevel, as Meta's tokenizer.json has them);
- ``mistral``: a two-layer Mistral with its own ``lm_head`` and rows of 48
  values (not whole Q8_0 blocks: the converter's F16 fallback); no
  tokenizer (Mistral ships SentencePiece, which hf2q does not write yet;
  the converter's vocabulary step is stubbed for it);
- ``qwen3``: a two-layer Qwen3 (Q/K norms, tied embeddings) with a
  Qwen-style tokenizer (``qwen2`` regex);
- ``qwen3_moe``: a two-layer Qwen3-MoE (4 experts, transformers 5 saves one
  tensor per expert) with the same tokenizer.

The converter (pinned llama-cpp-python sdist, make_golden.fetch_converter)
runs in this process; it cannot name the tiny vocabularies' pre-tokenizers
from its hash of a fixed text (only published vocabularies are in its
table), so the name is recorded as "(unrecognised)" and the test checks
ours (from the regex) separately. Not run in CI.

    python scripts/make_golden_generic_gguf.py [--cache DIR] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_golden as mg  # noqa: E402
from make_golden_gguf import describe  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data" / "gguf" / "generic"

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
CHECKPOINTS: dict[str, dict[str, Any]] = {
    "llama3": {"cls": "LlamaForCausalLM", "config": "LlamaConfig",
               "kw": dict(COMMON, tie_word_embeddings=True, rms_norm_eps=1e-5, bos_token_id=120, eos_token_id=121),
               "tokenizer": "llama3"},
    "mistral": {"cls": "MistralForCausalLM", "config": "MistralConfig",
                "kw": dict(COMMON, intermediate_size=48, tie_word_embeddings=False, sliding_window=None),
                "tokenizer": None},
    "qwen3": {"cls": "Qwen3ForCausalLM", "config": "Qwen3Config",
              "kw": dict(COMMON, tie_word_embeddings=True, eos_token_id=90), "tokenizer": "qwen"},
    "qwen3_moe": {"cls": "Qwen3MoeForCausalLM", "config": "Qwen3MoeConfig",
                  "kw": dict(COMMON, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                             decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
                             tie_word_embeddings=False, eos_token_id=90),
                  "tokenizer": "qwen"},
}


def byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in for every byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def make_tokenizer(kind: str, out: Path) -> None:
    """A byte-level BPE tokenizer of 128 ids or fewer: Llama-3 style (its
    regex, ignore_merges, <|begin_of_text|> / <|end_of_text|> / <|eot_id|>
    and reserved special tokens from id 120, a TemplateProcessing adding the
    BOS token) or Qwen style (its regex, <|endoftext|> / <|im_start|> /
    <|im_end|> special, <think> added not special, ByteLevel post-processor)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    bc = byte_chars()
    symbols = [bc[b] for b in sorted(set(b"abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\n<>|_-"))]
    vocab = {s: i for i, s in enumerate(symbols)}
    sp = bc[ord(" ")]
    merges = [("t", "h"), ("th", "e"), (sp, "the"), ("i", "n"), ("in", "g"), ("e", "r"), ("a", "n"), ("o", "u"),
              (sp, "a"), ("r", "e"), (sp, "t"), ("o", "n")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    llama = kind == "llama3"
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=llama))
    regex = LLAMA3_REGEX if llama else QWEN2_REGEX
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    if llama:
        pad_to = 120
        while len(vocab) < pad_to:  # Llama 3's special tokens sit after the whole BPE vocabulary
            vocab[f"{sp}{len(vocab)}"] = len(vocab)
        tok.model = models.BPE(vocab=vocab, merges=merges, ignore_merges=True)
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                    "<|reserved_special_token_1|>", "<|start_header_id|>", "<|end_header_id|>",
                    "<|reserved_special_token_2|>", "<|eot_id|>"]
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                          special_tokens=[("<|begin_of_text|>", 120)])])
        cfg = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "clean_up_tokenization_spaces": True,
               "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 131072,
               "tokenizer_class": "PreTrainedTokenizerFast",
               "chat_template": "{{- bos_token }}{%- for m in messages %}{{- '<|start_header_id|>' + m.role + "
                                "'<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}{%- endfor %}"}
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        for content, special in [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                                 ("<think>", False), ("</think>", False)]:
            tok.add_tokens([AddedToken(content, special=special, normalized=False)])
        cfg = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>", "unk_token": None, "errors": "replace", "model_max_length": 4096,
               "split_special_tokens": False, "clean_up_tokenization_spaces": False,
               "tokenizer_class": "Qwen2Tokenizer",
               "chat_template": "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
                                "message.content + '<|im_end|>\\n' }}{%- endfor %}"}
    j = json.loads(tok.to_str())
    (out / "tokenizer.json").write_text(json.dumps(j, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1) + "\n", encoding="utf-8")


def make_checkpoint(name: str, out: Path, seed: int) -> None:
    import torch
    import transformers

    spec = CHECKPOINTS[name]
    torch.manual_seed(seed)
    config = getattr(transformers, spec["config"])(**spec["kw"])
    model = getattr(transformers, spec["cls"])(config).to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():  # larger than the init's 0.02 std: greedy tokens that depend on the weights
            p.normal_(0.0, 0.2)
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out)
    if spec["tokenizer"]:
        make_tokenizer(spec["tokenizer"], out)


def convert(conv: Path, d: Path, outtype: str, outfile: Path, with_vocab: bool, seen: list[str]) -> None:
    """convert_hf_to_gguf.main() in this process; its real vocabulary step
    (the pre-tokenizer name "(unrecognised)" where its hash table has none)
    or none."""
    for p_ in (str(conv / "gguf-py"), str(conv)):
        if p_ not in sys.path:
            sys.path.insert(0, p_)
    import conversion.base as base  # noqa: PLC0415 (the extracted converter)
    import convert_hf_to_gguf  # noqa: PLC0415

    orig = {"set_vocab": base.TextModel.__dict__.get("_hf2q_set_vocab", base.TextModel.set_vocab),
            "pre": base.TextModel.__dict__.get("_hf2q_pre", base.TextModel.get_vocab_base_pre)}
    base.TextModel._hf2q_set_vocab = orig["set_vocab"]
    base.TextModel._hf2q_pre = orig["pre"]

    def pre(self: Any, tokenizer: Any) -> str:
        try:
            return orig["pre"](self, tokenizer)
        except NotImplementedError:
            return "(unrecognised)"

    class Grab(logging.Handler):  # the converter logs its fingerprint ("chkhsh: ...") at debug level
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage()
            if msg.startswith("chkhsh: "):
                seen.append(msg.split()[1])

    import conversion.llama as llama  # noqa: PLC0415
    import conversion.qwen as qwen  # noqa: PLC0415

    classes = (llama.LlamaModel, qwen.Qwen2Model, qwen.Qwen3Model, qwen.Qwen3MoeModel, qwen.Qwen2MoeModel)
    saved = {c: c.__dict__.get("set_vocab") for c in classes}
    if not with_vocab:
        for c in classes:
            if "set_vocab" in c.__dict__:
                c.set_vocab = lambda self: None
        base.TextModel.set_vocab = lambda self: None
    base.TextModel.get_vocab_base_pre = pre
    spm = base.TextModel.__dict__.get("_hf2q_spm", base.TextModel._create_vocab_sentencepiece)
    base.TextModel._hf2q_spm = spm

    def create_spm(self: Any) -> Any:  # fail on the missing file, as with the sentencepiece package installed
        if not (self.dir_model / "tokenizer.model").is_file():
            raise FileNotFoundError(self.dir_model / "tokenizer.model")
        return spm(self)

    base.TextModel._create_vocab_sentencepiece = create_spm
    log = logging.getLogger("hf-to-gguf")
    grab = Grab(level=logging.DEBUG)
    old = log.level
    log.addHandler(grab)
    log.setLevel(logging.DEBUG)
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(d), "--outtype", outtype, "--outfile", str(outfile)]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv
        log.removeHandler(grab)
        log.setLevel(old)
        base.TextModel.set_vocab = orig["set_vocab"]
        base.TextModel.get_vocab_base_pre = orig["pre"]
        for c, f in saved.items():
            if f is not None:
                c.set_vocab = f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "hf2q-golden")
    ap.add_argument("--any-version", action="store_true")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    versions = mg.check_versions(args.any_version)
    conv = mg.fetch_converter(args.cache)
    OUT.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(CHECKPOINTS):
        if args.only and name not in args.only:
            continue
        d = OUT / name
        make_checkpoint(name, d, seed=11 + i)
        rec: dict[str, Any] = {"variant": name, "checkpoint": str(d.relative_to(REPO)),
                               "architecture": CHECKPOINTS[name]["cls"],
                               "converter": f"llama.cpp convert_hf_to_gguf.py from llama-cpp-python "
                                            f"{mg.LLAMA_CPP_PYTHON}", "versions": versions, "outtypes": {}}
        seen: list[str] = []
        for ot in ("q8_0", "bf16", "f32"):
            with tempfile.TemporaryDirectory() as tmp:
                g = Path(tmp) / f"{ot}.gguf"
                convert(conv, d, ot, g, bool(CHECKPOINTS[name]["tokenizer"]), seen)
                rec["outtypes"][ot] = describe(g)
        rec["converter_fingerprint"] = seen[-1] if seen else None
        (OUT / f"{name}.json").write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
        print(f"{name}: {len(rec['outtypes']['q8_0']['tensors'])} tensors", file=sys.stderr)


if __name__ == "__main__":
    main()
