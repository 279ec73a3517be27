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


def test_family_loaders_take_a_recipe_alone(qwen: Path, tmp_path: Path) -> None:
    # Their dtype parameters default to None (the family's defaults), so a
    # recipe alone is not refused as if a dtype had been given beside it.
    from hf2q import gemma4, qwen35
    from hf2q.models import generic
    from hf2q.testing import make_gemma4_checkpoint

    host = hf2q.Device("host")
    m = qwen35.load(qwen, host, recipe="q4_k_m", progress=False)
    assert m.summary.extra["recipe"] == "q4_k_m"
    assert qwen35.inspect(qwen, recipe="q4_k_m")["planned_tensors"] == len(m)
    with pytest.raises(TypeError, match="replaces expert_dtype"):
        qwen35.load(qwen, host, expert_dtype="f32", recipe="q4_k_m", progress=False)
    assert qwen35.load(qwen, host, expert_dtype="bf16", progress=False)["blk.0.ffn_down_exps.weight"].dtype == "bf16"
    g = tmp_path / "gemma4"
    make_gemma4_checkpoint(g)
    assert gemma4.load(g, host, recipe="q4_k_m", progress=False).summary.extra["recipe"] == "q4_k_m"
    assert gemma4.inspect(g, recipe="q4_k_m")["planned_tensors"] > 0
    with pytest.raises(TypeError, match="replaces dense_dtype"):
        gemma4.load(g, host, dense_dtype="bf16", recipe="q4_k_m", progress=False)
    # (a recipe alone passes the option check: this checkpoint is not llama-like, which is the next rule)
    with pytest.raises(hf2q.ConfigError, match="decides each tensor's type by its llama.cpp name"):
        generic.load(qwen, host, recipe="q8_0", progress=False)
    with pytest.raises(TypeError, match="replaces dtype"):
        generic.load(qwen, host, dtype="f32", recipe="q8_0", progress=False)


def test_cli_convert_names_the_flags(qwen: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["convert", str(qwen), str(tmp_path / "x.gguf"), "--recipe", "q4_k_m", "--expert-dtype", "f32"])
    err = capsys.readouterr().err
    assert rc == 2 and "--recipe q4_k_m chooses every tensor's format: it replaces --expert-dtype" in err, err
    assert not (tmp_path / "x.gguf").exists()
