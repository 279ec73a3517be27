"""docs/API.md is what scripts/gen_api_docs.py writes from the docstrings of
the installed package: a docstring or signature changed without re-running
the script fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gen_api_docs.py"


def _render() -> str:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gen_api_docs
    finally:
        sys.path.pop(0)
    return str(gen_api_docs.render())


def test_api_reference_is_in_sync_with_the_docstrings() -> None:
    page = (ROOT / "docs" / "API.md").read_text()
    assert page == _render(), "docs/API.md is stale: run python scripts/gen_api_docs.py"


def test_api_reference_covers_the_public_api() -> None:
    import hf2q

    page = (ROOT / "docs" / "API.md").read_text()
    for name in ("load", "Device", "Buffer", "open_checkpoint", "set_num_threads"):
        assert f"`hf2q.{name}" in page, name
    for text in ("### `hf2q.dflash.load(", "### `hf2q.qwen35.load(", "### `hf2q.gemma4.load(",
                 "**`named_buffers(self) -> Iterator[tuple[str, Buffer]]`**", "### `hf2q.ops.quantize_q8_0("):
        assert text in page, text
    assert hf2q.load.__doc__.split("\n")[0].strip() in page  # type: ignore[union-attr]


def test_check_mode_fails_on_a_stale_page(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    stale = tmp_path / "API.md"  # a copy: the real page stays as it is for tests running beside this one
    stale.write_text((ROOT / "docs" / "API.md").read_text().replace("Load any checkpoint", "Load some checkpoint", 1))
    p = subprocess.run([sys.executable, str(SCRIPT), "--check", "--out", str(stale)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 1 and "stale" in p.stderr
