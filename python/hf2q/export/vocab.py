"""The tokenizer key/values of a byte-level BPE (``gpt2``) vocabulary, read
from ``tokenizer.json`` / ``tokenizer_config.json`` / ``config.json`` the
way llama.cpp's converter writes them (docs/CONVERT.md, "Tokenizer").

The pre-tokenizer's name (``tokenizer.ggml.pre``) comes from the
tokenizer's own definition: its split regex, matched against the regexes
llama.cpp implements for each name. (The converter instead hashes the
tokenization of a fixed text, which only identifies complete published
vocabularies.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import _files
from .._configfile import parse_config_json
from ..errors import ConfigError
from .gguf import ValueType as T
from .metadata import KVList

__all__ = ["PRE_TOKENIZERS", "identify_pre", "gpt2_vocab", "gemma4_vocab", "TokenizerError"]

# llama_token_type values (gguf TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

#: split regex of a ``Sequence[Split(Isolated), ByteLevel]`` pre-tokenizer
#: -> llama.cpp's name for it (src/llama-vocab.cpp implements each).
PRE_TOKENIZERS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
        "qwen2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+": "qwen35",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)"
    r"|\s+": "llama-bpe",
}

#: The text llama.cpp's converter tokenizes to fingerprint a pre-tokenizer:
#: the SHA-256 of ``str(token ids)`` names a published vocabulary's
#: pre-tokenizer in its table. Used here only as a cross-check.
FINGERPRINT_TEXT = (
    '\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ '
    '(multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 '
    '33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់ត'
    'ែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо'
    ' на Български \'\'\'\'\'\'```````""""......!!!!!!?????? '
    "I've been 'told he's there, 'RE you sure? 'M not s"
    "ure I'll make it, 'D you like some tea? We'Ve a'lL"
)

#: Fingerprints of published vocabularies, for the names hf2q identifies
#: (from the converter's table of llama-cpp-python 0.3.36): Qwen1.5-7B and
#: Qwen3-Embedding-0.6B (qwen2), Qwen3.5-9B-Instruct and MiniCPM-V-4_6 (qwen35), Meta-Llama-3-8B
#: (llama-bpe).
KNOWN_FINGERPRINTS = {
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",
    "d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4": "qwen35",
    "1444df51289cfa8063b96f0e62b1125440111bc79a52003ea14b6eac7016fd5f": "qwen35",
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # Meta-Llama-3-8B
}


def fingerprint(tokenizer_json: Path) -> str | None:
    """The converter's fingerprint of a tokenizer (None without the
    ``tokenizers`` package, which encodes the text as transformers' fast
    tokenizer does)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    import hashlib

    ids = Tokenizer.from_file(str(tokenizer_json)).encode(FINGERPRINT_TEXT).ids
    return hashlib.sha256(str(list(ids)).encode()).hexdigest()


def cross_check(tokenizer_json: Path, name: str) -> str:
    """``"matched"`` when the fingerprint names a published vocabulary with
    the same pre-tokenizer, ``"unknown"`` when it names none (a vocabulary
    the converter's table does not list: the regex alone decides),
    ``"unavailable"`` without ``tokenizers``; a :class:`TokenizerError` when
    it names another pre-tokenizer."""
    h = fingerprint(tokenizer_json)
    if h is None:
        return "unavailable"
    other = KNOWN_FINGERPRINTS.get(h)
    if other is None:
        return "unknown"
    if other != name:
        raise TokenizerError(f"{tokenizer_json}: the pre-tokenizer's regex is {name!r}'s, but the vocabulary's "
                             f"fingerprint is that of a published {other!r} vocabulary", key="pre_tokenizer")
    return "matched"


class TokenizerError(ConfigError):
    """A tokenizer file hf2q cannot turn into the converter's vocabulary."""


#: A tokenizer file read whole: a published tokenizer.json is 7 to 35 MB.
TOKENIZER_MAX_BYTES = 256 << 20


def _read_json(path: Path) -> Any:
    """A tokenizer / config JSON file: regular files only, size-capped,
    every failure a :class:`TokenizerError` naming the file."""
    def error(reason: str, e: OSError | None) -> TokenizerError:
        return TokenizerError(f"{path}: {reason}")

    raw = _files.read_capped(str(path), TOKENIZER_MAX_BYTES, path.name, error)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenizerError(f"{path}: not UTF-8 ({e.reason})") from None
    try:
        return parse_config_json(text, str(path))
    except ConfigError as e:
        raise TokenizerError(str(e)) from None


def identify_pre(tokenizer: Mapping[str, Any], where: str = "tokenizer.json") -> str:
    """llama.cpp's pre-tokenizer name for ``tokenizer.json``'s
    ``pre_tokenizer``; a :class:`TokenizerError` for one it has no name for."""
    pre = tokenizer.get("pre_tokenizer")
    steps = pre.get("pretokenizers") if isinstance(pre, Mapping) and pre.get("type") == "Sequence" else None
    if isinstance(steps, list) and len(steps) == 2:
        split, bl = steps
        pattern = split.get("pattern") if isinstance(split, Mapping) else None
        regex = pattern.get("Regex") if isinstance(pattern, Mapping) else None
        if (isinstance(split, Mapping) and split.get("type") == "Split" and split.get("behavior") == "Isolated"
                and not split.get("invert") and isinstance(bl, Mapping) and bl.get("type") == "ByteLevel"
                and not bl.get("use_regex", True) and isinstance(regex, str) and regex in PRE_TOKENIZERS):
            return PRE_TOKENIZERS[regex]
    raise TokenizerError(f"{where}: pre-tokenizer not recognised (hf2q knows "
                         f"{', '.join(sorted(set(PRE_TOKENIZERS.values())))}): {json.dumps(pre)[:300]}",
                         key="pre_tokenizer")


def _looks_special(text: str) -> bool:
    """The converter's rule for added tokens that should be control tokens."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>")) or (text.startswith("<unused") and text.endswith(">")))


def gpt2_vocab(kv: KVList, directory: Path, vocab_size: int) -> str:
    """Write the ``tokenizer.*`` keys of the byte-level BPE tokenizer in
    ``directory`` (``tokenizer.json`` required) for a model of
    ``vocab_size`` rows: ids the tokenizer lacks are ``[PAD<id>]`` (UNUSED).
    Returns the fingerprint cross-check's outcome (:func:`cross_check`)."""
    tj = directory / "tokenizer.json"
    tok = _read_json(tj)
    model = tok.get("model") if isinstance(tok, Mapping) else None
    if not isinstance(model, Mapping) or model.get("type") != "BPE" or not isinstance(model.get("vocab"), Mapping):
        raise TokenizerError(f"{tj}: not a BPE tokenizer", key="model")
    pre = identify_pre(tok, str(tj))
    _check_normalizer(tok.get("normalizer"), tj)
    checked = cross_check(tj, pre)
    added = [a for a in tok.get("added_tokens") or [] if isinstance(a, Mapping)]
    by_id: dict[int, str] = {}
    for t, i in model["vocab"].items():
        by_id[int(i)] = t
    added_by_id: dict[int, Mapping[str, Any]] = {}
    for a in added:
        if isinstance(a.get("id"), int) and isinstance(a.get("content"), str):
            by_id[a["id"]] = a["content"]
            added_by_id[a["id"]] = a
    if by_id and max(by_id) >= vocab_size:
        raise TokenizerError(f"{tj}: token id {max(by_id)} is not below the model's vocab_size {vocab_size}",
                             key="vocab_size")
    tokens: list[str] = []
    types: list[int] = []
    for i in range(vocab_size):
        t = by_id.get(i)
        if t is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif i in added_by_id:
            a = added_by_id[i]
            if a.get("special") or _looks_special(t):
                types.append(CONTROL)
            else:
                t = t.replace("\u2581", " ")  # user-defined tokens pre-normalized, as the converter does
                types.append(USER_DEFINED)
            tokens.append(t)
        else:
            tokens.append(t)
            types.append(NORMAL)
    kv.string("tokenizer.ggml.model", "gpt2")
    kv.string("tokenizer.ggml.pre", pre)
    kv.array("tokenizer.ggml.tokens", tokens)
    kv.set("tokenizer.ggml.token_type", T.ARRAY, types, T.INT32)
    _special(kv, directory, tok, added)
    return checked


_ID_KEYS = {"bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
            "unk": "tokenizer.ggml.unknown_token_id", "sep": "tokenizer.ggml.seperator_token_id",
            "pad": "tokenizer.ggml.padding_token_id", "cls": "",
            "mask": "tokenizer.ggml.mask_token_id"}
_ADD_KEYS = {"bos": "tokenizer.ggml.add_bos_token", "eos": "tokenizer.ggml.add_eos_token",
             "sep": "tokenizer.ggml.add_sep_token"}


def _special(kv: KVList, directory: Path, tok: Mapping[str, Any], added: list[Mapping[str, Any]]) -> None:
    """Merges, special token ids, add-bos/eos flags, chat template."""
    merges = (tok.get("model") or {}).get("merges")
    if isinstance(merges, list) and merges:
        if all(isinstance(m, str) for m in merges):
            kv.array("tokenizer.ggml.merges", merges)
        elif all(isinstance(m, list) and len(m) == 2 and all(isinstance(s, str) for s in m) for m in merges):
            # pairs: a space inside a part is written as U+0120 + ... (the converter's chr(ord(" ") + 256))
            kv.array("tokenizer.ggml.merges", [" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in part)
                                                         for part in pair) for pair in merges])
        else:
            raise TokenizerError(f"{directory / 'tokenizer.json'}: merges in an unknown form", key="merges")
    cfg_path = directory / "tokenizer_config.json"
    tcfg = _read_json(cfg_path) if cfg_path.is_file() else None
    if tcfg is not None and not isinstance(tcfg, Mapping):
        raise TokenizerError(f"{cfg_path}: not a JSON object")
    add: dict[str, bool] = {}
    tcfg = dict(tcfg) if tcfg else tcfg  # the converter edits its copy: later lookups see the edits
    if tcfg and not tcfg.get("bos_token") and tcfg.get("cls_token"):
        tcfg["bos_token"] = tcfg["cls_token"]
    if tcfg and not tcfg.get("eos_token") and tcfg.get("sep_token"):
        tcfg["eos_token"] = tcfg["sep_token"]
    pp = tok.get("post_processor")
    if pp:
        procs = pp.get("processors", [pp]) if isinstance(pp, Mapping) else None
        for p in procs or []:
            ptype = p.get("type") if isinstance(p, Mapping) else None
            if ptype == "ByteLevel":
                add.setdefault("bos", False)
                add.setdefault("eos", False)
            elif ptype == "TemplateProcessing":
                _template(add, p, tcfg, directory / "tokenizer.json")
            else:
                raise TokenizerError(f"{directory / 'tokenizer.json'}: post-processor {ptype!r} not supported "
                                     "(hf2q reads ByteLevel and simple TemplateProcessing post-processors)",
                                     key="post_processor")
    ids: dict[str, int] = {}

    def set_id(typ: str, tid: Any) -> None:
        if isinstance(tid, int) and not isinstance(tid, bool) and typ not in ids:
            if tid < 0:
                raise TokenizerError(f"special token {typ}: invalid id {tid}", key=f"{typ}_token_id")
            ids[typ] = tid

    template: Any = None
    if tcfg:
        alt = None
        jinja = directory / "chat_template.jinja"
        cjson = directory / "chat_template.json"
        if jinja.is_file():
            if (directory / "additional_chat_templates").is_dir():
                raise TokenizerError(f"{directory}: additional chat templates are not supported", key="chat_template")
            alt = jinja.read_text(encoding="utf-8")
        elif cjson.is_file():
            alt = (_read_json(cjson) or {}).get("chat_template")
        template = tcfg.get("chat_template", alt)
        for typ in _ID_KEYS:
            flag = tcfg.get(f"add_{typ}_token")
            if isinstance(flag, bool) and typ not in add:
                add[typ] = flag
            entry = tcfg.get(f"{typ}_token")
            content = entry if isinstance(entry, str) else entry.get("content") if isinstance(entry, Mapping) else None
            if isinstance(content, str):
                set_id(typ, next((a.get("id") for a in added if a.get("content") == content), None))
    cfg_path = directory / "config.json"
    if cfg_path.is_file():
        cfg = _read_json(cfg_path)
        if isinstance(cfg, Mapping):
            tc = cfg.get("text_config") if isinstance(cfg.get("text_config"), Mapping) else {}
            for typ in _ID_KEYS:
                tid = cfg.get(f"{typ}_token_id")
                if tid is None:
                    tid = tc.get(f"{typ}_token_id")
                set_id(typ, tid)
    for typ, tid in ids.items():
        if typ != "cls":  # GGUF has no cls key; the converter drops it
            kv.u32(_ID_KEYS[typ], tid)
    for typ, flag in add.items():
        if typ in _ADD_KEYS:
            kv.set(_ADD_KEYS[typ], T.BOOL, flag)
    if template is not None:
        if not isinstance(template, str):
            raise TokenizerError(f"{directory}: a list of named chat templates is not supported", key="chat_template")
        kv.string("tokenizer.chat_template", template)


def _special_id(step: Any) -> Any:
    return (step.get("SpecialToken") or {}).get("id") if isinstance(step, Mapping) else None


def _template(add: dict[str, bool], proc: Mapping[str, Any], tcfg: dict[str, Any] | None, where: Path) -> None:
    """The add-bos / add-eos / add-sep flags the converter reads from a
    ``TemplateProcessing`` post-processor: a special token before the
    single-sequence template's ``$A`` is BOS (added when it is the BOS or
    CLS token), one after it EOS; a special token between ``$A`` and ``$B``
    in the pair template is a separator. ``tcfg`` (tokenizer_config.json)
    gains a BOS / CLS / SEP token where it names none, as the converter's
    does. A trailing special token that is not the EOS token is refused
    (the converter turns the EOS token into an end-of-turn token then)."""
    single = proc.get("single") or []
    pair = proc.get("pair") or []
    bos = (tcfg or {}).get("bos_token")
    cls = (tcfg or {}).get("cls_token")
    eos = (tcfg or {}).get("eos_token")
    sep = (tcfg or {}).get("sep_token")
    first = last = None
    if len(single) > 1:
        if first := _special_id(single[0]):
            if not tcfg:
                bos = first
            elif first not in (bos, cls):
                if not bos:
                    tcfg["bos_token"] = bos = first
                if not cls:
                    tcfg["cls_token"] = cls = first
            add["bos"] = first in (bos, cls)
        if last := _special_id(single[-1]):
            if not tcfg:
                eos = last
            elif last != eos:
                raise TokenizerError(f"{where}: the post-processor ends a sequence with {last!r}, not the EOS token "
                                     f"{eos!r} (not supported)", key="post_processor")
            add["eos"] = True
    if pair:
        start = 1 if first and _special_id(pair[0]) == first else 0
        stop = -1 if last and _special_id(pair[-1]) == last else None
        mid = pair[start:stop]
        if mid:
            a = ((mid[0] or {}).get("Sequence") or {}).get("id") if isinstance(mid[0], Mapping) else None
            b = ((mid[-1] or {}).get("Sequence") or {}).get("id") if isinstance(mid[-1], Mapping) else None
            if a == "A" and b == "B" and (mid := mid[1:-1]):
                add_sep = False
                e = _special_id(mid[0])
                if e and e in (sep, eos) and not last:
                    add_sep = True
                if len(mid) == 2 and (e2 := _special_id(mid[1])) and e2 in (sep, eos):
                    add_sep = True
                add["sep"] = add_sep
                if add_sep and not sep and tcfg:
                    tcfg["sep_token"] = eos


# ----------------------------------------------------------------------------- Gemma 4 (gemma4)
#: Added tokens the converter always types USER_DEFINED for Gemma 4 (rendered
#: in the output, so that llama.cpp's chat parser sees them).
GEMMA4_VISIBLE = frozenset({"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                            "<tool_response|>", '<|"|>'})
#: GemmaTokenizer's own special tokens where tokenizer_config.json does not name them.
_GEMMA_DEFAULTS = {"unk_token": "<unk>", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                   "mask_token": "<mask>"}
_NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _token_text(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, Mapping) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def gemma_special_tokens(directory: Path, tcfg: Mapping[str, Any]) -> list[str]:
    """The special tokens transformers' ``GemmaTokenizer`` reports
    (``all_special_tokens``): its named ones (BOS, EOS, UNK, SEP, PAD, CLS,
    MASK; Gemma's defaults where tokenizer_config.json does not state them,
    none where it states ``null``), the model's own named ones (any other
    ``*_token`` string, ``extra_special_tokens`` as a mapping), then the
    extra ones (``extra_special_tokens`` / ``additional_special_tokens`` as a
    list). A legacy ``special_tokens_map.json`` overrides these where
    tokenizer_config.json has no ``added_tokens_decoder``, as transformers
    reads it."""
    cfg = dict(tcfg)
    if "additional_special_tokens" in cfg and "extra_special_tokens" not in cfg:
        cfg["extra_special_tokens"] = cfg.pop("additional_special_tokens")
    stm = directory / "special_tokens_map.json"
    if "added_tokens_decoder" not in cfg and stm.is_file():
        m = _read_json(stm)
        if not isinstance(m, Mapping):
            raise TokenizerError(f"{stm}: not a JSON object")
        for k, v in m.items():
            if k == "extra_special_tokens" and isinstance(v, list):
                have = list(cfg.get("extra_special_tokens") or [])
                cfg[k] = have + [t for t in v if _token_text(t) not in {_token_text(h) for h in have}]
            else:
                cfg[k] = v
    named: dict[str, str | None] = {k: _GEMMA_DEFAULTS.get(k) for k in _NAMED}
    extra: list[str] = []
    for k, v in cfg.items():
        if k in _NAMED:
            named[k] = _token_text(v) if v is not None else None
        elif k == "extra_special_tokens":
            if isinstance(v, Mapping):
                named.update({str(n): _token_text(t) for n, t in v.items()})
            elif isinstance(v, (list, tuple)):
                extra = [t for t in (_token_text(x) for x in v) if t is not None]
            elif v is not None:
                raise TokenizerError(f"{directory / 'tokenizer_config.json'}: extra_special_tokens is neither a "
                                     "list nor a mapping", key="extra_special_tokens")
        elif k.endswith("_token") and isinstance(v, str):
            named[k] = v
    out: list[str] = []
    for t in [*named.values(), *extra]:
        if t is not None and t not in out:
            out.append(t)
    return out


def gemma4_vocab(kv: KVList, directory: Path) -> None:
    """Write the ``tokenizer.*`` keys of a Gemma 4 tokenizer (BPE with byte
    fallback, ``tokenizer.json`` and ``tokenizer_config.json`` required) as
    the converter writes them: model ``gemma4``; every token of the base
    vocabulary by id, then the added tokens beyond it; scores all -1000;
    types BYTE (``<0xXX>``), CONTROL (transformers' special tokens), NORMAL,
    added tokens beyond the base USER_DEFINED (or CONTROL when special), the
    tokens of :data:`GEMMA4_VISIBLE` USER_DEFINED; then merges, special ids,
    add-bos/eos/sep flags and chat template (as for Qwen); no space prefix;
    add-bos true."""
    tj = directory / "tokenizer.json"
    tok = _read_json(tj)
    model = tok.get("model") if isinstance(tok, Mapping) else None
    if not isinstance(model, Mapping) or not isinstance(model.get("vocab"), Mapping):
        raise TokenizerError(f"{tj}: no model vocabulary", key="model")
    if model.get("type") != "BPE" or not model.get("byte_fallback", False) \
            or (tok.get("decoder") or {}).get("type") != "Sequence":
        raise TokenizerError(f"{tj}: not a BPE tokenizer with byte fallback (Gemma's)", key="model")
    if model.get("ignore_merges", False) and not model.get("byte_fallback", True):
        raise TokenizerError(f"{tj}: a Llama 3 style tokenizer, not Gemma's", key="model")
    cfg_path = directory / "tokenizer_config.json"
    if not cfg_path.is_file():
        raise TokenizerError(f"{cfg_path}: missing (Gemma 4's tokenizer is read through it)", key="tokenizer_class")
    tcfg = _read_json(cfg_path)
    if not isinstance(tcfg, Mapping):
        raise TokenizerError(f"{cfg_path}: not a JSON object")
    if tcfg.get("tokenizer_class") not in ("GemmaTokenizer", "GemmaTokenizerFast"):
        raise TokenizerError(f"{cfg_path}: tokenizer_class {tcfg.get('tokenizer_class')!r}; hf2q reads Gemma 4's "
                             "GemmaTokenizer", key="tokenizer_class")
    _check_normalizer(tok.get("normalizer"), tj)
    base: dict[int, str] = {}
    for t, i in model["vocab"].items():
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise TokenizerError(f"{tj}: token {t!r} has id {i!r}", key="vocab")
        base[i] = t
    n_base = len(base)  # the tokenizers library's base vocabulary size (without added tokens)
    by_id = dict(base)
    added = [a for a in tok.get("added_tokens") or [] if isinstance(a, Mapping)]
    for a in added:
        if isinstance(a.get("id"), int) and isinstance(a.get("content"), str):
            by_id[a["id"]] = a["content"]
    missing = [i for i in range(n_base) if i not in by_id]
    if missing:
        raise TokenizerError(f"{tj}: the vocabulary has no token with id {missing[0]}", key="vocab")
    ids = {t: i for i, t in sorted(by_id.items())}  # text -> id (the last id of a repeated text, as a dict)
    specials = gemma_special_tokens(directory, tcfg)
    special_ids = {ids[t] for t in specials if t in ids}
    beyond = sorted(i for i in by_id if i >= n_base)
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n_base):
        t = by_id[i]
        tokens.append(t)
        types.append(BYTE if _BYTE_TOKEN.fullmatch(t) else CONTROL if i in special_ids else NORMAL)
    for i in beyond:  # in id order, whatever the ids (the converter's list)
        t = by_id[i]
        tokens.append(t)
        types.append(CONTROL if t in specials else USER_DEFINED)
    types = [USER_DEFINED if t in GEMMA4_VISIBLE else ty for t, ty in zip(tokens, types)]
    kv.string("tokenizer.ggml.model", "gemma4")
    kv.array("tokenizer.ggml.tokens", tokens)
    kv.set("tokenizer.ggml.scores", T.ARRAY, [-1000.0] * len(tokens), T.FLOAT32)
    kv.set("tokenizer.ggml.token_type", T.ARRAY, types, T.INT32)
    _special(kv, directory, tok, added)
    kv.set("tokenizer.ggml.add_space_prefix", T.BOOL, False)
    kv.set("tokenizer.ggml.add_bos_token", T.BOOL, True)


def _check_normalizer(norm: Any, where: Path) -> None:
    """The converter writes lowercase / strip-accents flags for these
    normalizers; hf2q does not (yet): refused rather than left out."""
    if not isinstance(norm, Mapping):
        return
    if norm.get("type") in ("Lowercase", "StripAccents", "BertNormalizer"):
        raise TokenizerError(f"{where}: normalizer {norm.get('type')} not supported", key="normalizer")
    if norm.get("type") == "Sequence":
        for n in norm.get("normalizers") or []:
            _check_normalizer(n, where)
