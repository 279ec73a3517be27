"""The README runs as written: every ```python block, in order, as one script
in a fresh process (so later blocks may use what earlier ones made); a
``# prints: TEXT`` comment is checked against the output (TEXT up to a
`` (`` that starts an explanation). The ```json examples of ``--json`` have
exactly the keys that hf2q prints."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hf2q.cli import main
from hf2q.testing import make_dflash_checkpoint

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S)


def expected_prints(code: str) -> list[str]:
    out = []
    for line in code.splitlines():
        m = re.search(r"#\s*prints:\s*(.*)$", line)
        if m:
            out.append(re.split(r" \((?=[=a-z])", m.group(1), maxsplit=1)[0].strip())
    return out


def test_readme_has_python_blocks() -> None:
    assert len(blocks("python")) >= 3


@pytest.mark.slow
def test_readme_python_blocks_run(tmp_path: Path) -> None:
    code = "\n\n".join(blocks("python"))
    script = tmp_path / "readme_blocks.py"
    script.write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF2Q_")}
    env["HF2Q_NUM_THREADS"] = "2"
    env["TMPDIR"] = str(tmp_path)  # the README's tempfile.mkdtemp() lands here
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=env)
    assert p.returncode == 0, p.stderr
    want = expected_prints(code)
    assert want, "no '# prints:' comments"
    got = p.stdout.splitlines()
    pos = 0
    for w in want:  # in order, each an output line
        while pos < len(got) and got[pos].strip() != w:
            pos += 1
        assert pos < len(got), f"README says it prints {w!r}; output was:\n{p.stdout}"
        pos += 1


def _keys(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _keys(v) for k, v in d.items()}
    return None


def test_readme_json_examples_match(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    examples = [json.loads(b) for b in blocks("json")]
    success = next(e for e in examples if "model" in e)
    failure = next(e for e in examples if "error" in e)
    tiny = make_dflash_checkpoint(tmp_path / "tiny", "tiny")
    assert main(["load", "--device", "host", "--json", "--verify", str(tiny)]) == 0
    real = json.loads(capsys.readouterr().out)
    assert _keys(real) == _keys(success)
    for k in ("model", "tensors", "resident_bytes", "data_bytes", "layers", "hidden_size"):
        assert real[k] == success[k], k
    assert real["residency"]["buffers"] == success["residency"]["buffers"]
    assert real["verify"]["buffers"] == success["verify"]["buffers"]
    assert real["verify"]["groups"] == success["verify"]["groups"]
    notes = tmp_path / "notes.safetensors"
    notes.write_text("# not a checkpoint, just some text\n")  # the README's example file
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", "--json", "notes.safetensors"]) == 2
    real_err = json.loads(capsys.readouterr().out)
    assert real_err == failure
