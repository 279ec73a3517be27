#!/usr/bin/env python3
"""Record llama.cpp's converter's whole GGUF file for the committed tiny
checkpoints: tests/data/gguf/<variant>.json (read by tests/test_convert_golden.py).

Not run in CI. For every checkpoint already committed under
``tests/data/golden/`` (Qwen3.5 MoE) and ``tests/data/gemma4/`` (Gemma 4),
and every ``--outtype`` of ``make_golden.OUTTYPES`` (``--outtypes f16`` adds
one to the files already there), the converter from the
pinned llama-cpp-python sdist (``make_golden.fetch_converter``) writes a
GGUF file, run in this process exactly as ``make_golden.py`` /
``make_golden_gemma4.py`` run it (vocabulary step stubbed: these checkpoints
carry no real tokenizer; Qwen3.5 variants written by transformers with
``--no-mtp``). What is kept of each file, read back with the converter's own
gguf-py:

- every key/value: key, value type, element type for arrays, value;
- every tensor info in file order: name, GGML type, numpy-order shape,
  offset in the data section, byte length, SHA-256 of its bytes;
- the alignment, the data section's offset and the file's size.

The tensor bytes themselves are already committed (``converted.npz``); the
hashes tie this file to them. Keys that depend on the tool or the path
(``general.name``, ``general.size_label``, ...) are recorded as written; the
test knows which of them may differ (docs/CONVERT.md).

Usage: the environment of make_golden.py (torch, transformers pinned)::

    python scripts/make_golden_gguf.py [--only VARIANT ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_golden as mg  # noqa: E402
import make_golden_gemma4 as mg4  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data" / "gguf"


def variants() -> dict[str, tuple[str, Path]]:
    """name -> (family, checkpoint directory)"""
    out: dict[str, tuple[str, Path]] = {}
    for d in sorted((REPO / "tests" / "data" / "golden").glob("qwen35moe_*")):
        if (d / "hf" / "config.json").is_file():
            out[d.name] = ("qwen35moe", d / "hf")
    for d in sorted((REPO / "tests" / "data" / "gemma4").glob("gemma4_*")):
        if (d / "hf" / "config.json").is_file() and any((d / "hf").glob("*.safetensors")):
            out[d.name] = ("gemma4", d / "hf")
    return out


def describe(path: Path) -> dict[str, Any]:
    import gguf  # the converter's gguf-py, on sys.path once a conversion ran
    import numpy as np

    r = gguf.GGUFReader(path)
    kvs = []
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue  # the reader's view of the header, not key/values
        t = f.types[0]
        sub = f.types[1] if t == gguf.GGUFValueType.ARRAY else None
        v = f.contents()
        if isinstance(v, np.ndarray):
            v = v.tolist()
        kvs.append({"key": key, "type": t.name, **({"sub_type": sub.name} if sub is not None else {}), "value": v})
    tensors = []
    for t in r.tensors:
        data = np.asarray(t.data).view(np.uint8).reshape(-1).tobytes()
        tensors.append({"name": t.name, "type": t.tensor_type.name,
                        "shape": [int(x) for x in reversed(t.shape.tolist())],
                        "offset": int(t.data_offset) - int(r.data_offset), "nbytes": int(t.n_bytes),
                        "sha256": hashlib.sha256(data).hexdigest()})
    return {"alignment": int(r.alignment), "data_offset": int(r.data_offset), "file_size": path.stat().st_size,
            "kv": kvs, "tensors": tensors}


# ----------------------------------------------------------------------------- a tiny Qwen3.5 tokenizer
#: Qwen3.5's split regex (its tokenizer.json's pre_tokenizer; llama.cpp's "qwen35").
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TOKENIZER_DIR = OUT / "qwen35_tokenizer"
TOKENIZER_BASE = "qwen35moe_causal_lm"  # its checkpoint (vocab_size 128) with this tokenizer


def make_qwen_tokenizer(out: Path) -> None:
    """A byte-level BPE tokenizer with Qwen3.5's pre-tokenizer and added
    tokens, small enough for a 128-row model: 74 byte symbols, 10 merges, 5
    added tokens right after them (as in Qwen's), ids 89..127 unused (the
    converter pads them, as it pads Qwen's 248,320-row embedding)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    def byte_chars() -> dict[int, str]:  # GPT-2's printable stand-in for every byte
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        return {b: chr(c) for b, c in zip(bs, cs)}

    bc = byte_chars()
    symbols = [bc[b] for b in sorted(set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,!?'\n<>|_-"))]
    vocab = {s_: i for i, s_ in enumerate(symbols)}
    merges = [("t", "h"), ("th", "e"), (bc[ord(" ")], "the"), ("i", "n"), ("in", "g"), ("e", "r"), ("a", "n"),
              ("o", "u"), (bc[ord(" ")], "a"), ("r", "e")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<think>", False),
                ("</think>", False)]
    for content, special in specials:
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    out.mkdir(parents=True, exist_ok=True)
    j = json.loads(tok.to_str())
    (out / "tokenizer.json").write_text(json.dumps(j, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    cfg = {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "errors": "replace", "model_max_length": 4096,
        "split_special_tokens": False, "clean_up_tokenization_spaces": False, "tokenizer_class": "Qwen2Tokenizer",
        "chat_template": "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
                         "message.content + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
                         "{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1) + "\n", encoding="utf-8")


GEMMA4_TOKENIZER_DIR = OUT / "gemma4_tokenizer"
GEMMA4_TOKENIZER_BASE = "gemma4_moe_causal_lm"  # its checkpoint (vocab_size 96) with this tokenizer


def make_gemma4_tokenizer(out: Path) -> None:
    """A Gemma 4 tokenizer as the family ships it, small enough for a 96-row
    model, written by transformers' own GemmaTokenizer (BPE with byte
    fallback, spaces as "▁", the ``TemplateProcessing`` that adds ``<bos>``):
    Gemma's special tokens first (pad 0, eos 1, bos 2, unk 3, mask 4, then
    turn / channel / tool / image / audio markers, as in Gemma 4's list),
    ten byte tokens, letters, merges; the multimodal markers named in
    tokenizer_config.json (``image_token``, ``boi_token``, ...), one listed
    extra special token, a special added token that transformers does not
    count as special (typed NORMAL by the converter), and two added tokens
    past the base vocabulary (one special, one not); chat template in
    ``chat_template.jinja``."""
    import shutil

    from tokenizers import AddedToken
    from transformers import GemmaTokenizer

    marks = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]", "<|turn>", "<turn|>", "<|channel>",
             "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>',
             "<|image>", "<image|>", "<|image|>", "<|audio>", "<audio|>", "<|audio|>"]
    vocab = {t: i for i, t in enumerate(marks)}
    for b in (0x09, 0x0A, 0x0D, 0x20, 0x21, 0x2C, 0x2E, 0x3F, 0xC3, 0xE2):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for c in "\u2581abcdefghijklmnopqrstuvwxyz":
        vocab[c] = len(vocab)
    merges = [("t", "h"), ("th", "e"), ("\u2581", "the"), ("i", "n"), ("in", "g"), ("e", "r"), ("a", "n"),
              ("\u2581", "a"), ("r", "e"), ("o", "u"), ("o", "n"), ("\u2581", "t"), ("\u2581", "i"), ("e", "n"),
              ("a", "t"), ("e", "s"), ("o", "r"), ("i", "s"), ("i", "t"), ("\u2581", "s"), ("\u2581", "w"),
              ("\u2581", "o"), ("\u2581", "r"), ("\u2581", "ring"), ("r", "ing"), ("\u2581", "th"),
              ("\u2581", "in"), ("\u2581", "an"), ("h", "e"), ("\u2581", "he"), ("l", "l"), ("a", "l"),
              ("o", "w"), ("\u2581", "b"), ("\u2581", "c"), ("\u2581", "f")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    assert len(vocab) == 94, len(vocab)
    tok = GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True,
                         extra_special_tokens={"image_token": "<|image|>", "boi_token": "<|image>",
                                               "eoi_token": "<image|>", "audio_token": "<|audio|>",
                                               "boa_token": "<|audio>", "eoa_token": "<audio|>"})
    # Gemma 4's turn / channel / tool markers are special added tokens
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in marks[5:15]])
    tok.add_special_tokens({"additional_special_tokens": ["<turn|>"]}, replace_extra_special_tokens=False)
    tok.add_tokens([AddedToken("<start_of_turn>", special=True, normalized=False), AddedToken("hf2q")])
    assert len(tok) == 96, len(tok)
    if out.exists():
        shutil.rmtree(out)
    tok.save_pretrained(out)
    (out / "chat_template.jinja").write_text(
        "{{ bos_token }}{%- for message in messages %}{{ '<|turn>' + message.role + '\\n' + message.content + "
        "'<turn|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|turn>model\\n' }}{%- endif %}",
        encoding="utf-8")


def tokenizer_variant(conv: Path, versions: dict[str, str]) -> None:
    """The converter's whole file for TOKENIZER_BASE's checkpoint with the
    tiny tokenizer, its real vocabulary step on. Its pre-tokenizer check
    hashes the tokenization of a fixed text, which names only published
    vocabularies: for this one it would stop; the name is recorded as
    "(unrecognised)" instead and the test checks ours separately."""
    for p_ in (str(conv / "gguf-py"), str(conv)):
        if p_ not in sys.path:
            sys.path.insert(0, p_)
    import conversion.base as base  # noqa: PLC0415 (the extracted converter)

    make_qwen_tokenizer(TOKENIZER_DIR)
    hf = REPO / "tests" / "data" / "golden" / TOKENIZER_BASE / "hf"
    rec: dict[str, Any] = {"variant": "qwen35_tokenizer", "family": "qwen35moe",
                           "checkpoint": str(hf.relative_to(REPO)),
                           "tokenizer": str(TOKENIZER_DIR.relative_to(REPO)),
                           "converter": f"llama.cpp convert_hf_to_gguf.py from llama-cpp-python {mg.LLAMA_CPP_PYTHON}",
                           "versions": versions, "outtypes": {}}
    orig_pre = base.TextModel.get_vocab_base_pre

    def pre(self: Any, tokenizer: Any) -> str:
        try:
            return orig_pre(self, tokenizer)
        except NotImplementedError:
            return "(unrecognised)"

    import logging

    seen: list[str] = []

    class Grab(logging.Handler):  # the converter logs its fingerprint ("chkhsh: ...") at debug level
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage()
            if msg.startswith("chkhsh: "):
                seen.append(msg.split()[1])

    grab = Grab(level=logging.DEBUG)
    conv_log = logging.getLogger("hf-to-gguf")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "qwen35_tokenizer"
        d.mkdir()
        for f in list(hf.iterdir()) + list(TOKENIZER_DIR.iterdir()):
            (d / f.name).symlink_to(f)
        g = Path(tmp) / "out.gguf"
        mg.convert(conv, hf, "q8_0", Path(tmp) / "warm.gguf", ["--no-mtp"])  # imports and patches the converter
        mg._reset_converter_state()
        base.TextModel.set_vocab = base.TextModel._set_vocab_gpt2  # the real vocabulary step
        base.TextModel.get_vocab_base_pre = pre
        old_level = conv_log.level
        conv_log.addHandler(grab)
        conv_log.setLevel(logging.DEBUG)
        argv = sys.argv
        sys.argv = ["convert_hf_to_gguf.py", str(d), "--outtype", "q8_0", "--outfile", str(g), "--no-mtp"]
        try:
            import convert_hf_to_gguf  # noqa: PLC0415

            convert_hf_to_gguf.main()
        finally:
            sys.argv = argv
            base.TextModel.get_vocab_base_pre = orig_pre
            conv_log.removeHandler(grab)
            conv_log.setLevel(old_level)
        mg._reset_converter_state()
        rec["outtypes"]["q8_0"] = describe(g)
    rec["converter_fingerprint"] = seen[-1] if seen else None
    (OUT / "qwen35_tokenizer.json").write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
    print("qwen35_tokenizer: done", file=sys.stderr)


_ORIGINAL: dict[str, Any] = {}


def remember_vocab_steps(conv: Path) -> None:
    """Keep the converter's real vocabulary steps before the whole-file
    variants stub them (make_golden*.convert replace set_vocab)."""
    for p_ in (str(conv / "gguf-py"), str(conv)):
        if p_ not in sys.path:
            sys.path.insert(0, p_)
    import conversion.gemma as gemma  # noqa: PLC0415 (the extracted converter)

    _ORIGINAL.setdefault("gemma4_set_vocab", gemma.Gemma4Model.set_vocab)


def gemma4_tokenizer_variant(conv: Path, versions: dict[str, str], outtypes: list[str]) -> None:
    """The converter's whole file for GEMMA4_TOKENIZER_BASE's checkpoint with
    the tiny Gemma 4 tokenizer, its real vocabulary step on (transformers
    reads the tokenizer)."""
    import conversion.gemma as gemma  # noqa: PLC0415

    make_gemma4_tokenizer(GEMMA4_TOKENIZER_DIR)
    hf = REPO / "tests" / "data" / "gemma4" / GEMMA4_TOKENIZER_BASE / "hf"
    rec: dict[str, Any] = {"variant": "gemma4_tokenizer", "family": "gemma4",
                           "checkpoint": str(hf.relative_to(REPO)),
                           "tokenizer": str(GEMMA4_TOKENIZER_DIR.relative_to(REPO)),
                           "converter": f"llama.cpp convert_hf_to_gguf.py from llama-cpp-python {mg.LLAMA_CPP_PYTHON}",
                           "versions": versions, "outtypes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "gemma4_tokenizer"
        d.mkdir()
        for f in list(hf.iterdir()) + list(GEMMA4_TOKENIZER_DIR.iterdir()):
            if not (d / f.name).exists():  # the tiny tokenizer's files win over the stub tokenizer.json
                (d / f.name).symlink_to(f)
            elif f.parent == GEMMA4_TOKENIZER_DIR:
                (d / f.name).unlink()
                (d / f.name).symlink_to(f)
        for ot in outtypes[:1]:
            g = Path(tmp) / f"{ot}.gguf"
            mg4.convert(conv, d, ot, Path(tmp) / "warm.gguf")  # imports the converter
            gemma.Gemma4Model.set_vocab = _ORIGINAL["gemma4_set_vocab"]
            argv = sys.argv
            sys.argv = ["convert_hf_to_gguf.py", str(d), "--outtype", ot, "--outfile", str(g)]
            try:
                import convert_hf_to_gguf  # noqa: PLC0415

                convert_hf_to_gguf.main()
            finally:
                sys.argv = argv
            rec["outtypes"][ot] = describe(g)
    (OUT / "gemma4_tokenizer.json").write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
    print("gemma4_tokenizer: done", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "hf2q-golden")
    ap.add_argument("--any-version", action="store_true")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--outtypes", nargs="*", default=list(mg.OUTTYPES),
                    help="outtypes to (re)make; others already in a variant's file are kept")
    args = ap.parse_args()
    versions = mg.check_versions(args.any_version)
    conv = mg.fetch_converter(args.cache)
    remember_vocab_steps(conv)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (fam, hf) in variants().items():
        if args.only and name not in args.only:
            continue
        rec: dict[str, Any] = {"variant": name, "family": fam, "checkpoint": str(hf.relative_to(REPO)),
                               "converter": f"llama.cpp convert_hf_to_gguf.py from llama-cpp-python "
                                            f"{mg.LLAMA_CPP_PYTHON}", "versions": versions, "outtypes": {}}
        if (OUT / f"{name}.json").is_file():
            rec["outtypes"] = json.loads((OUT / f"{name}.json").read_text())["outtypes"]
        for ot in args.outtypes:
            with tempfile.TemporaryDirectory() as tmp:
                g = Path(tmp) / f"{ot}.gguf"
                if fam == "qwen35moe":
                    mg.convert(conv, hf, ot, g, ["--no-mtp"] if name in mg.QWEN_VARIANTS else [])
                    mg._reset_converter_state()
                else:
                    mg4.convert(conv, hf, ot, g)
                rec["outtypes"][ot] = describe(g)
        (OUT / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n")
        print(f"{name}: {sum(len(o['tensors']) for o in rec['outtypes'].values())} tensors", file=sys.stderr)
    if not args.only or "qwen35_tokenizer" in args.only:
        tokenizer_variant(conv, versions)
    if not args.only or "gemma4_tokenizer" in args.only:
        gemma4_tokenizer_variant(conv, versions, ["q8_0"])


if __name__ == "__main__":
    main()
