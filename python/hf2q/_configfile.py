"""Reading a model's ``config.json``: bounded file reads and a bounded JSON
parse, every failure a :class:`~hf2q.ConfigError` naming the file (the
errors themselves are data in :mod:`hf2q.errors`; the I/O is here)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import _files
from .errors import ConfigError

__all__ = ["read_config_text", "parse_config_json", "json_type_name", "CONFIG_MAX_DEPTH", "CONFIG_MAX_INT_DIGITS"]

#: Deepest nesting of arrays/objects a config.json may have (real ones: 3).
CONFIG_MAX_DEPTH = 64
#: Most digits an integer in a config.json may have (u64 has 20).
CONFIG_MAX_INT_DIGITS = 40


def read_config_text(path: str | os.PathLike[str]) -> tuple[Path, str]:
    """The text of a model's ``config.json`` (``path``: the file or its
    directory), or :class:`ConfigError` naming the file. Opened without
    blocking, regular files only, at most ``CONFIG_MAX_BYTES``."""
    p = Path(os.fspath(path))
    try:
        if p.is_dir():
            p = p / "config.json"
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config: {e.strerror or e}") from None

    def error(reason: str, e: OSError | None) -> ConfigError:
        if isinstance(e, FileNotFoundError):
            return ConfigError(f"{p}: config file not found")
        return ConfigError(f"{p}: config file {reason}")

    raw = _files.read_capped(str(p), _files.CONFIG_MAX_BYTES, "config.json", error)
    try:
        return p, raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: cannot read config: {e}") from None


def _config_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > CONFIG_MAX_INT_DIGITS:
        raise ValueError(f"integer with {digits} digits (at most {CONFIG_MAX_INT_DIGITS})")
    return int(text)


def json_type_name(v: Any) -> str:
    """The JSON name of a parsed config value's type (for "must be X, got Y")."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, (list, tuple)):
        return "array"
    if isinstance(v, Mapping):
        return "object"
    return type(v).__name__


def parse_config_json(text: str | bytes, source: str = "config") -> Any:
    """``json.loads`` for config files, with every failure a
    :class:`ConfigError`: invalid JSON, nesting deeper than
    ``CONFIG_MAX_DEPTH`` (checked before parsing, so no RecursionError
    anywhere later), integers of more than ``CONFIG_MAX_INT_DIGITS`` digits."""
    import json

    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{source} is not valid UTF-8: {e}") from None
    depth = _max_nesting(text)
    if depth > CONFIG_MAX_DEPTH:
        raise ConfigError(f"{source} nests arrays/objects {depth} levels deep (at most {CONFIG_MAX_DEPTH})")
    try:
        return json.loads(text, parse_int=_config_int)
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"{source}: invalid JSON: {e}") from None


def _max_nesting(text: str) -> int:
    """Deepest [ / { nesting outside strings (linear scan; an upper bound
    for invalid JSON, which the parser then refuses anyway)."""
    import re

    depth = best = 0
    # Strings (with escapes) are skipped whole; brackets counted elsewhere.
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[{\]}]', text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > best:
                best = depth
        elif c in "]}":
            depth -= 1
    return best
