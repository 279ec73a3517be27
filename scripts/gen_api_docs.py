#!/usr/bin/env python3
"""Write docs/API.md, the Python API reference, from the installed package's
docstrings and signatures (the docstrings are the one source; this page is
generated from them and never edited by hand).

    python scripts/gen_api_docs.py            # rewrite docs/API.md
    python scripts/gen_api_docs.py --check    # exit 1 if docs/API.md is stale

tests/test_api_docs.py regenerates the page and compares, so a docstring or
signature changed without re-running this script fails the suite.

What is listed: each module of :data:`MODULES`, its ``__all__`` in order
(classes with their public methods and properties, functions, constants by
name), each with its signature and its docstring as written.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "API.md"

#: The modules a user imports, in the order the page lists them.
MODULES = [
    "hf2q",
    "hf2q.ops",
    "hf2q.dflash",
    "hf2q.qwen35",
    "hf2q.gemma4",
    "hf2q.models",
    "hf2q.model",
    "hf2q.pairs",
    "hf2q.safetensors",
    "hf2q.hub",
    "hf2q.formats",
    "hf2q.reference",
    "hf2q.testing",
]


def _doc(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.strip()


def _own_doc(obj: Any) -> str:
    """The object's own docstring, not one inherited from a base or type (a
    constant's ``int.__doc__``, say)."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) else ""


class _Written:
    """An annotation shown as written in the source (postponed annotations
    are strings; ``inspect`` would quote them)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _written(annotation: Any) -> Any:
    return _Written(annotation.strip("'\"")) if isinstance(annotation, str) else annotation


def _signature(obj: Any) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    params = [p.replace(annotation=_written(p.annotation)) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=_written(sig.return_annotation)))


def _quote(doc: str) -> list[str]:
    return [doc, ""] if doc else []


def _members(cls: type) -> list[tuple[str, Any]]:
    """Public methods and properties defined on ``cls`` itself (inherited
    ones are listed under their own class), in definition order."""
    out = []
    for name, value in cls.__dict__.items():
        if name.startswith("_") and name not in ("__init__", "__getitem__", "__iter__", "__len__", "__contains__"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = getattr(cls, name)  # bound: no cls in the signature
        if isinstance(value, property) or inspect.isfunction(value) or inspect.ismethod(value):
            out.append((name, value))
    return out


def _class(qualname: str, cls: type) -> list[str]:
    bases = [b.__name__ for b in cls.__bases__ if b is not object]
    head = f"### class `{qualname}`" + (f" ({', '.join(bases)})" if bases else "")
    lines = [head, ""]
    if "__init__" in cls.__dict__:
        lines += [f"`{cls.__name__}{_signature(cls)}`", ""]
    lines += _quote(_own_doc(cls))
    for name, member in _members(cls):
        if name == "__init__":
            continue
        if isinstance(member, property):
            lines += [f"- **`{name}`** (property)" + (f": {_one_paragraph(_doc(member))}" if _doc(member) else "")]
        else:
            doc = _doc(member)
            lines += [f"- **`{name}{_signature(member)}`**" + (f": {_one_paragraph(doc)}" if doc else "")]
    if lines[-1] != "":
        lines.append("")
    return lines


def _one_paragraph(doc: str) -> str:
    """A member's docstring on one list line (its paragraphs joined)."""
    return " ".join(doc.split())


def _module(name: str) -> list[str]:
    mod = importlib.import_module(name)
    lines = [f"## `{name}`", ""] + _quote(_doc(mod))
    names = list(getattr(mod, "__all__", []))
    constants = []
    for attr in names:
        obj = getattr(mod, attr)
        where = getattr(obj, "__module__", None)
        if inspect.ismodule(obj):
            lines += [f"- module `{name}.{attr}`: see `{obj.__name__}`" if obj.__name__ != f"{name}.{attr}"
                      else f"- module `{obj.__name__}` (below)", ""]
        elif inspect.isclass(obj):
            if where and where != name and not where.startswith(name + "."):
                lines += [f"- class `{attr}`: see `{where}.{obj.__qualname__}`", ""]
            else:
                lines += _class(f"{name}.{attr}", obj)
        elif callable(obj):
            lines += [f"### `{name}.{attr}{_signature(obj)}`", ""] + _quote(_doc(obj))
        else:
            constants.append(attr)
    if constants:
        lines += ["Constants: " + ", ".join(f"`{c}`" for c in constants), ""]
    return lines


def render() -> str:
    lines = [
        "# hf2q Python API",
        "",
        "Generated from the docstrings by `scripts/gen_api_docs.py` (do not edit by hand; "
        "`tests/test_api_docs.py` fails when this page is stale). Each module lists its `__all__`; "
        "a name another module defines points there.",
        "",
    ]
    for name in MODULES:
        lines += _module(name)
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(line.rstrip() for line in lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page differs from the docstrings")
    ap.add_argument("--out", type=Path, default=OUT, help="the page (default docs/API.md)")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not args.out.is_file() or args.out.read_text() != text:
            print(f"{args.out} is stale: run python scripts/gen_api_docs.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
