"""Every file a doc names exists: a path in backticks in ``README.md`` or
``docs/*.md`` (one with a folder and a file suffix, or ending in ``/``) is
found from the repository root, ``python/`` or ``python/hf2q/``. Templates
(``<family>``, ``*``, ``{a,b}``) are left out; a doc that names a file the
code no longer has misleads the next reader."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASES = (ROOT, ROOT / "python", ROOT / "python" / "hf2q", ROOT / "csrc", ROOT / "csrc" / "device")
#: Folders docs name that are not the repository's: build outputs and the
#: Hugging Face cache's own layout (docs/HUB.md-style explanations).
NOT_OURS = ("build/", "refs/", "blobs/", "snapshots/")
_PATH = re.compile(r"`([A-Za-z0-9_.\-/]+/[A-Za-z0-9_.\-/]*)`")
_SUFFIX = re.compile(r"\.(py|pyi|md|cpp|h|cu|mm|metal|json|toml|txt|cmake|sh|yml|yaml|safetensors)$")


def _named_paths(text: str) -> list[str]:
    out = []
    for m in _PATH.finditer(text):
        p = m.group(1)
        if "://" in p or p.startswith(("/", "~", "..", *NOT_OURS)):
            continue  # URLs and machine paths, not the repository's
        if p.endswith("/") or _SUFFIX.search(p):
            out.append(p)
    return out


def _exists(p: str) -> bool:
    return any((b / p).exists() for b in BASES)


def test_docs_name_only_files_that_exist() -> None:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = [f"{d.relative_to(ROOT)}: {p}" for d in docs for p in _named_paths(d.read_text()) if not _exists(p)]
    assert not missing, "\n".join(missing)


def test_the_check_sees_paths() -> None:
    text = "see `python/hf2q/plan.py`, `hf2q/loader.py`, `models/` and `csrc/kernels/<format>.cpp`, `a.b`"
    assert _named_paths(text) == ["python/hf2q/plan.py", "hf2q/loader.py", "models/"]
    assert _exists("hf2q/loader.py") and not _exists("hf2q/pairs_gone.py")
