"""``hf2q.convert`` against llama.cpp's converter's whole GGUF file
(tests/data/gguf/<variant>.json, made by scripts/make_golden_gguf.py from the
committed tiny checkpoints): read back through gguf-py's reader, every tensor
(order, name, type, shape, offset, bytes) and every key/value (type, element
type, value, order) equal, but the keys that name the tool's guess of the
model (docs/CONVERT.md: ``general.name``, ``general.size_label``, ...).
Needs neither torch nor transformers."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hf2q

gguf = pytest.importorskip("gguf")

DATA = Path(__file__).parent / "data"
GGUF_GOLDEN = DATA / "gguf"
TOKENIZER_VARIANT = "qwen35_tokenizer"  # checkpoints with a tokenizer: their own tests below
GEMMA4_TOKENIZER_VARIANT = "gemma4_tokenizer"
VARIANTS = sorted(p.stem for p in GGUF_GOLDEN.glob("*.json")
                  if p.stem not in (TOKENIZER_VARIANT, GEMMA4_TOKENIZER_VARIANT))
#: Keys whose values the converter derives from the folder name or a model
#: card, not from the model (docs/CONVERT.md): present in both, values free.
NAMING_KEYS = {"general.name"}
#: Keys the converter may write and hf2q does not (docs/CONVERT.md).
CONVERTER_ONLY = {"general.size_label", "general.basename", "general.finetune", "general.version",
                  "general.organization", "general.license", "general.tags", "general.languages",
                  "general.base_model.count", "general.quantized_by", "general.repo_url", "general.url"}


@lru_cache(maxsize=None)
def golden(variant: str) -> dict[str, Any]:
    return json.loads((GGUF_GOLDEN / f"{variant}.json").read_text())


def _blobs(variant: str, outtype: str) -> dict[str, bytes]:
    """The converter's tensor bytes by name (converted.npz beside the checkpoint)."""
    ck = DATA / golden(variant)["checkpoint"].removeprefix("tests/data/")
    meta = json.loads((ck.parent / "converted.json").read_text())
    with np.load(ck.parent / "converted.npz") as z:
        return {t["name"]: z[t["blob"]].tobytes() for t in meta["outtypes"][outtype]["tensors"]}


def _kv(reader: Any) -> dict[str, dict[str, Any]]:
    out = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        v = f.contents()
        out[key] = {"type": f.types[0].name, "sub_type": f.types[1].name if len(f.types) > 1 else None,
                    "value": v.tolist() if isinstance(v, np.ndarray) else v}
    return out


def test_golden_present_and_small() -> None:
    assert len(VARIANTS) >= 7
    assert sum(p.stat().st_size for p in GGUF_GOLDEN.glob("*.json")) < 2 << 20


#: every (variant, outtype) the converter's file was recorded for (f16 for three of them)
CASES = [(v, o) for v in VARIANTS for o in json.loads((GGUF_GOLDEN / f"{v}.json").read_text())["outtypes"]]


def test_cases_cover_every_outtype() -> None:
    assert {o for _, o in CASES} == {"q8_0", "f32", "bf16", "f16"}
    assert all(sum(1 for v2, _ in CASES if v2 == v) >= 3 for v in VARIANTS)


@pytest.mark.parametrize("variant, outtype", CASES)
def test_convert_equals_converter_file(tmp_path, variant, outtype) -> None:
    g = golden(variant)
    ck = DATA / g["checkpoint"].removeprefix("tests/data/")
    _check(tmp_path, ck, variant, outtype)


def test_tokenizer_equals_converter(tmp_path) -> None:
    """A Qwen3.5 checkpoint with a (tiny) byte-level BPE tokenizer: tokens,
    token types (normal, control, user-defined, unused padding), merges,
    special ids, add-bos/eos flags and chat template as the converter wrote
    them. The converter could not name this vocabulary's pre-tokenizer (its
    hash check knows only published vocabularies); hf2q names it from the
    tokenizer's own regex: qwen35."""
    g = golden(TOKENIZER_VARIANT)
    d = tmp_path / "ck"
    d.mkdir()
    for f in [*(DATA / g["checkpoint"].removeprefix("tests/data/")).iterdir(),
              *(DATA / g["tokenizer"].removeprefix("tests/data/")).iterdir()]:
        (d / f.name).symlink_to(f.resolve())
    theirs = {kv["key"]: kv["value"] for kv in g["outtypes"]["q8_0"]["kv"]}
    assert theirs["tokenizer.ggml.pre"] == "(unrecognised)"
    assert len(theirs["tokenizer.ggml.tokens"]) == 128 and len(theirs["tokenizer.ggml.merges"]) == 10
    assert {3, 4, 5, 1} <= set(theirs["tokenizer.ggml.token_type"])  # control, user-defined, unused, normal
    ours = _check(tmp_path, d, TOKENIZER_VARIANT, "q8_0", skip_values={"tokenizer.ggml.pre"})
    assert ours["tokenizer.ggml.pre"]["value"] == "qwen35"


def test_gemma4_tokenizer_equals_converter(tmp_path) -> None:
    """A Gemma 4 checkpoint with a (tiny) tokenizer as the family ships it
    (transformers' GemmaTokenizer: BPE with byte fallback, a TemplateProcessing
    adding <bos>, multimodal markers named in tokenizer_config.json, special
    added tokens transformers does and does not count as special, added
    tokens past the base vocabulary, chat_template.jinja): tokens, scores,
    types, merges, special ids, add-bos/sep flags, space prefix and chat
    template as the converter wrote them (its vocabulary read through
    transformers; ours without it)."""
    g = golden(GEMMA4_TOKENIZER_VARIANT)
    d = tmp_path / "ck"
    d.mkdir()
    tok_dir = DATA / g["tokenizer"].removeprefix("tests/data/")
    for f in [*(DATA / g["checkpoint"].removeprefix("tests/data/")).iterdir(), *tok_dir.iterdir()]:
        if not (d / f.name).exists():
            (d / f.name).symlink_to(f.resolve())
    for f in tok_dir.iterdir():  # the tokenizer's files win over the checkpoint's stub tokenizer.json
        (d / f.name).unlink()
        (d / f.name).symlink_to(f.resolve())
    theirs = {kv["key"]: kv["value"] for kv in g["outtypes"]["q8_0"]["kv"]}
    assert theirs["tokenizer.ggml.model"] == "gemma4" and len(theirs["tokenizer.ggml.tokens"]) == 96
    assert {1, 3, 4, 6} <= set(theirs["tokenizer.ggml.token_type"])  # normal, control, user-defined, byte
    _check(tmp_path, d, GEMMA4_TOKENIZER_VARIANT, "q8_0", blobs_variant="gemma4_moe_causal_lm")


def _check(tmp_path: Path, ck: Path, variant: str, outtype: str, skip_values: set[str] = set(),
           blobs_variant: str | None = None) -> dict[str, Any]:
    want = golden(variant)["outtypes"][outtype]
    out = tmp_path / "out.gguf"
    summary = hf2q.convert(ck, out, outtype)
    assert summary.tensors == len(want["tensors"]) and summary.bytes == out.stat().st_size
    r = gguf.GGUFReader(out)

    # tensors: the converter's order, names, types, shapes, offsets, bytes
    assert int(r.alignment) == want["alignment"]
    assert [t.name for t in r.tensors] == [t["name"] for t in want["tensors"]]
    # (no npz for f16; its F32 tensors, ssm_a among them, are the f32 file's)
    blobs = _blobs(blobs_variant or variant, "f32" if outtype == "f16" else outtype)
    for t, w in zip(r.tensors, want["tensors"]):
        assert t.tensor_type.name == w["type"], t.name
        assert [int(x) for x in reversed(t.shape.tolist())] == w["shape"], t.name
        assert int(t.data_offset) - int(r.data_offset) == w["offset"], t.name
        assert int(t.n_bytes) == w["nbytes"], t.name
        data = np.asarray(t.data).view(np.uint8).reshape(-1).tobytes()
        if t.name.endswith(".ssm_a"):  # -exp(A_log): the last bit may differ (tests/test_golden_converter.py)
            a = np.frombuffer(data, "<i4").astype(np.int64)
            b = np.frombuffer(blobs[t.name], "<i4").astype(np.int64)
            assert int(np.max(np.abs(a - b))) <= 1, t.name
        else:
            assert hashlib.sha256(data).hexdigest() == w["sha256"], f"{t.name}: bytes differ from the converter's"
    assert out.stat().st_size - int(r.data_offset) == want["file_size"] - want["data_offset"]

    # key/values: every one the converter wrote, same type and value, same order
    ours = _kv(r)
    theirs = {kv["key"]: kv for kv in want["kv"]}
    missing = set(theirs) - set(ours) - CONVERTER_ONLY
    extra = set(ours) - set(theirs)
    assert not missing and not extra, f"missing {sorted(missing)}, extra {sorted(extra)}"
    for key, kv in theirs.items():
        if key in CONVERTER_ONLY and key not in ours:
            continue
        o = ours[key]
        assert o["type"] == kv["type"] and o["sub_type"] == kv.get("sub_type"), key
        if key in NAMING_KEYS or key in skip_values:
            continue
        if kv["type"] == "FLOAT32" or kv.get("sub_type") == "FLOAT32":
            np.testing.assert_array_equal(np.float32(o["value"]), np.float32(kv["value"]), err_msg=key)
        else:
            assert o["value"] == kv["value"], key
    assert [k for k in ours] == [k for k in theirs if k in ours], "key order differs from the converter's"
    return ours


def test_pre_tokenizer_named_from_its_definition() -> None:
    from hf2q.export.vocab import PRE_TOKENIZERS, TokenizerError, identify_pre

    tok = json.loads((GGUF_GOLDEN / TOKENIZER_VARIANT / "tokenizer.json").read_text(encoding="utf-8"))
    assert identify_pre(tok) == "qwen35"
    split = tok["pre_tokenizer"]["pretokenizers"][0]
    qwen2 = next(r for r, n in PRE_TOKENIZERS.items() if n == "qwen2")
    split["pattern"]["Regex"] = qwen2
    assert identify_pre(tok) == "qwen2"
    split["pattern"]["Regex"] = qwen2 + "|x"  # any other regex: refused, not guessed
    with pytest.raises(TokenizerError, match="pre-tokenizer not recognised"):
        identify_pre(tok)
    split["pattern"]["Regex"] = qwen2
    split["behavior"] = "Removed"
    with pytest.raises(TokenizerError):
        identify_pre(tok)


def test_fingerprint_is_the_converters_and_only_cross_checks(monkeypatch) -> None:
    """Our fingerprint of the tiny tokenizer is the one the converter
    computed (and could not name): a vocabulary outside its table is named by
    the regex alone; one whose fingerprint names another pre-tokenizer is
    refused."""
    pytest.importorskip("tokenizers")
    from hf2q.export import vocab

    tj = GGUF_GOLDEN / TOKENIZER_VARIANT / "tokenizer.json"
    h = vocab.fingerprint(tj)
    assert h == golden(TOKENIZER_VARIANT)["converter_fingerprint"]
    assert vocab.cross_check(tj, "qwen35") == "unknown"
    monkeypatch.setitem(vocab.KNOWN_FINGERPRINTS, h, "qwen35")
    assert vocab.cross_check(tj, "qwen35") == "matched"
    monkeypatch.setitem(vocab.KNOWN_FINGERPRINTS, h, "qwen2")
    with pytest.raises(vocab.TokenizerError, match="fingerprint"):
        vocab.cross_check(tj, "qwen35")


def test_template_processing_flags() -> None:
    """The converter's reading of a TemplateProcessing post-processor: BOS
    before $A, EOS after it, a separator between $A and $B; a trailing
    special token that is not the EOS token is refused, not guessed."""
    from hf2q.export.vocab import TokenizerError, _template

    def tp(single: list[str], pair: list[str]) -> dict:
        def steps(xs: list[str]) -> list[dict]:
            return [{"Sequence": {"id": x}} if x in ("A", "B") else {"SpecialToken": {"id": x}} for x in xs]
        return {"type": "TemplateProcessing", "single": steps(single), "pair": steps(pair)}

    add: dict = {}
    cfg = {"bos_token": "<s>", "eos_token": "</s>"}
    _template(add, tp(["<s>", "A"], ["<s>", "A", "<s>", "B"]), cfg, Path("t"))
    assert add == {"bos": True, "sep": False}
    add = {}
    cfg = {"cls_token": "[CLS]", "sep_token": "[SEP]", "eos_token": "[SEP]"}
    _template(add, tp(["[CLS]", "A", "[SEP]"], ["[CLS]", "A", "[SEP]", "B", "[SEP]"]), cfg, Path("t"))
    assert add == {"bos": True, "eos": True, "sep": False}
    add = {}
    cfg = {"bos_token": "<s>", "eos_token": "</s>"}
    _template(add, tp(["<s>", "A"], ["<s>", "A", "</s>", "B"]), cfg, Path("t"))
    assert add == {"bos": True, "sep": True} and cfg["sep_token"] == "</s>"  # the converter names it too
    with pytest.raises(TokenizerError, match="not the EOS token"):
        _template({}, tp(["<s>", "A", "<eot>"], []), {"bos_token": "<s>", "eos_token": "</s>"}, Path("t"))


def test_gemma_special_tokens_rules(tmp_path) -> None:
    """transformers' GemmaTokenizer special tokens: Gemma's defaults where the
    config is silent, none where it says null, other *_token strings, the
    extra list, and a legacy special_tokens_map.json over them."""
    from hf2q.export.vocab import gemma_special_tokens

    got = gemma_special_tokens(tmp_path, {"pad_token": None, "image_token": "<img>",
                                          "extra_special_tokens": ["<x>"], "add_bos_token": True})
    assert got == ["<bos>", "<eos>", "<unk>", "<mask>", "<img>", "<x>"]
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"eos_token": {"content": "<end>"},
                                                                  "extra_special_tokens": ["<y>"]}))
    got = gemma_special_tokens(tmp_path, {"extra_special_tokens": ["<x>"]})
    assert got == ["<bos>", "<end>", "<unk>", "<pad>", "<mask>", "<x>", "<y>"]
    assert gemma_special_tokens(tmp_path, {"added_tokens_decoder": {}})[1] == "<eos>"  # the map is legacy only
