"""A recipe chooses every tensor's format: a dtype option given beside it is
refused (never silently dropped), in Python (TypeError) and on the command
line (usage error), and the load summary says which formats the recipe chose
rather than the dtype options the plan was made with."""

from __future__ import annotations

from pathlib import Path

import pytest

import hf2q
from hf2q.cli import main
from hf2q.testing import make_qwen35_moe_checkpoint


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("q") / "qwen"
    make_qwen35_moe_checkpoint(d)
    return d


def test_python_refuses_dtype_options_beside_a_recipe(qwen: Path) -> None:
    with pytest.raises(TypeError, match=r"recipe 'q4_k_m' chooses every tensor's format: it replaces "
                                        r"expert_dtype and dense_dtype; give one or the other"):
        hf2q.load(qwen, hf2q.Device("host"), recipe="q4_k_m", expert_dtype="f32", dense_dtype="q8_0", progress=False)
    with pytest.raises(TypeError, match="replaces dense_dtype"):
        hf2q.load(qwen, hf2q.Device("host"), recipe="q4_k_m", dense_dtype="q8_0", progress=False)


def test_summary_names_the_recipes_formats(qwen: Path) -> None:
    m = hf2q.load(qwen, hf2q.Device("host"), recipe="q4_k_m", progress=False)
    extra = m.summary.extra
    assert "expert_dtype" not in extra and "dense_dtype" not in extra
    assert extra["recipe"] == "q4_k_m"
    counts: dict[str, int] = {}
    for name in m.buffers_by_name():
        counts[m[name].dtype] = counts.get(m[name].dtype, 0) + 1
    assert extra["formats"] == ", ".join(f"{n} {d}" for d, n in sorted(counts.items()))
    assert "q5_0" in counts or "q4_k" in counts  # the recipe's, not the BF16 file's


def test_cli_refuses_dtype_flags_beside_a_recipe(qwen: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in ("load", "inspect"):
        rc = main([cmd, str(qwen), "--recipe", "q4_k_m", "--expert-dtype", "f32", "--device", "host"][
                  : None if cmd == "load" else -2])
        err = capsys.readouterr().err
        assert rc == 2, err
        assert "--recipe q4_k_m chooses every tensor's format: it replaces --expert-dtype" in err
    rc = main(["load", str(qwen), "--recipe", "q4_k_m", "--device", "host"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "expert dtype" not in out and "recipe" in out
