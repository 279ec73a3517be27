"""hf2q.convert / ``hf2q convert``: output handling (temporary name, rename,
--force), refused inputs, the CLI's report, and bounded memory (the in-flight
bytes never pass the budget; a batch per tensor writes the same file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import hf2q
from hf2q import cli, export
from hf2q.export import ConvertError, OutputExistsError, UnsupportedModelError

DATA = Path(__file__).parent / "data"
QWEN = DATA / "golden" / "qwen35moe_causal_lm" / "hf"
GEMMA = DATA / "gemma4" / "gemma4_moe_causal_lm" / "hf"


def _leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".partial"))


def test_writes_and_refuses_to_overwrite(tmp_path) -> None:
    out = tmp_path / "m.gguf"
    s = hf2q.convert(QWEN, out, "bf16")
    assert out.stat().st_size == s.bytes and s.tensors == 76 and s.gb_per_s > 0
    before = out.read_bytes()
    with pytest.raises(OutputExistsError, match="exists") as e:
        hf2q.convert(QWEN, out, "q8_0")
    assert isinstance(e.value, FileExistsError) and isinstance(e.value, hf2q.Hf2qError)
    assert out.read_bytes() == before
    hf2q.convert(QWEN, out, "q8_0", force=True)
    assert out.read_bytes() != before and _leftovers(tmp_path) == []


def test_unsupported_family_and_outtype(tmp_path) -> None:
    with pytest.raises(UnsupportedModelError, match="dflash"):
        hf2q.convert(DATA / "golden" / "dflash_new" / "hf", tmp_path / "d.gguf")
    with pytest.raises(UnsupportedModelError, match="outtype"):
        hf2q.convert(QWEN, tmp_path / "x.gguf", "q4_k")
    with pytest.raises(TypeError, match="takes no option"):
        hf2q.convert(GEMMA, tmp_path / "x.gguf", mtp=False)
    with pytest.raises(ConvertError, match="no such directory"):
        hf2q.convert(QWEN, tmp_path / "nope" / "x.gguf")
    assert list(tmp_path.iterdir()) == []


def test_failure_midway_leaves_nothing(tmp_path, monkeypatch) -> None:
    """A read that fails after some tensors were written: no output, no
    temporary file, the error is the loader's typed one."""
    import hf2q.loader as loader

    calls = {"n": 0}
    real = loader.execute

    def failing(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise hf2q.SafetensorsError("injected", code="Io")
        return real(*a, **k)

    monkeypatch.setattr(loader, "execute", failing)
    monkeypatch.setattr(export, "BATCH_BYTES", 1)  # one tensor per batch
    out = tmp_path / "m.gguf"
    with pytest.raises(hf2q.SafetensorsError, match="injected"):
        hf2q.convert(QWEN, out, "f32")
    assert not out.exists() and _leftovers(tmp_path) == []


def test_truncated_checkpoint_is_a_typed_error(tmp_path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    for f in QWEN.iterdir():
        (ck / f.name).write_bytes(f.read_bytes())
    st = next(ck.glob("*.safetensors"))
    os.truncate(st, st.stat().st_size - 1000)
    with pytest.raises(hf2q.SafetensorsError):
        hf2q.convert(ck, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists() and _leftovers(tmp_path) == []


def test_budget_bounds_in_flight_bytes_and_batches_do_not_change_the_file(tmp_path, monkeypatch) -> None:
    ref = tmp_path / "ref.gguf"
    hf2q.convert(GEMMA, ref, "f32")
    seen: list[int] = []
    real_reserve = export._Writer.reserve

    def reserve(self, nbytes, budget):
        real_reserve(self, nbytes, budget)
        seen.append((self.inflight, budget))

    monkeypatch.setattr(export._Writer, "reserve", reserve)
    monkeypatch.setattr(export, "BATCH_BYTES", 4096)
    monkeypatch.setattr(export, "MEMORY_BUDGET", 8192)
    out = tmp_path / "small.gguf"
    hf2q.convert(GEMMA, out, "f32")
    assert out.read_bytes() == ref.read_bytes()
    assert len(seen) > 5
    for inflight, budget in seen:
        assert inflight <= budget


def test_cli_convert_json(tmp_path, capsys) -> None:
    out = tmp_path / "m.gguf"
    assert cli.main(["convert", str(GEMMA), str(out), "--outtype", "bf16", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["architecture"] == "gemma4" and rep["outtype"] == "bf16" and rep["bytes"] == out.stat().st_size
    assert {"tensors", "bytes", "seconds", "gb_per_s"} <= set(rep)
    # again: exists -> typed error as JSON, exit status 2
    assert cli.main(["convert", str(GEMMA), str(out), "--json"]) == 2
    err = json.loads(capsys.readouterr().out)["error"]
    assert err["type"] == "OutputExistsError" and err["path"] == str(out)
    # an option the family does not take: a usage error
    assert cli.main(["convert", str(GEMMA), str(tmp_path / "y.gguf"), "--no-mtp"]) == 2
    assert "takes no option" in capsys.readouterr().err


def test_cli_human_output_and_force(tmp_path, capsys) -> None:
    out = tmp_path / "m.gguf"
    out.write_bytes(b"old")
    assert cli.main(["convert", str(QWEN), str(out), "--force", "--no-progress", "--dense-dtype", "f32"]) == 0
    text = capsys.readouterr().out
    assert "qwen35moe (q8_0)" in text and "tensors" in text
    import gguf

    r = gguf.GGUFReader(out)
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.0.ffn_up_exps.weight"] == "Q8_0" and types["blk.0.attn_qkv.weight"] == "F32"


def test_cli_convert_offers_what_the_families_declare(tmp_path, capsys) -> None:
    """convert's family flags are the families' Options (choices, labels), as
    far as each family's conversion takes them: what hf2q.convert accepts the
    command line accepts (--expert-dtype q4_k was refused, exit 2)."""
    from hf2q import models
    from hf2q.plan import CONVERT_DTYPES

    parser = cli.build_parser()
    conv = next(a for a in parser._subparsers._group_actions[0].choices.values()  # type: ignore[union-attr]
                if a.prog.endswith(" convert"))
    flags = {a.dest: a for a in conv._actions}
    for name in ("expert_dtype", "dense_dtype"):
        assert tuple(flags[name].choices) == CONVERT_DTYPES
        assert "Qwen3.5/3.6 MoE, Gemma 4 only" in flags[name].help and "(default --outtype)" in flags[name].help
    from hf2q.recipes import RECIPES

    assert tuple(flags["recipe"].choices) == tuple(RECIPES)
    assert flags["mtp"].option_strings == ["--no-mtp"] and "Qwen3.5/3.6 MoE only" in flags["mtp"].help
    assert "dtype" not in flags  # the generic family's conversion takes no option
    for fam in models.FAMILIES:  # every offered option is one a family declares
        for o in fam.impl().options:
            if o.name in flags and o.choices is not None and o.name != "mtp":
                assert set(flags[o.name].choices) == set(o.choices), (fam.name, o.name)
    out = tmp_path / "q.gguf"
    assert cli.main(["convert", str(QWEN), str(out), "--expert-dtype", "q4_k", "--dense-dtype", "q6_k",
                     "--no-progress"]) == 0
    import gguf

    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}
    capsys.readouterr()
    api = tmp_path / "api.gguf"
    hf2q.convert(QWEN, api, expert_dtype="q4_k", dense_dtype="q6_k")
    assert out.read_bytes() == api.read_bytes()
    # the tiny experts' rows (64) take llama-quantize's fallback for Q4_K
    assert types["blk.0.ffn_up_exps.weight"] == "Q5_0" and types["blk.0.attn_qkv.weight"] == "Q8_0"
    generic = DATA / "gguf" / "generic" / "llama3"
    assert cli.main(["convert", str(generic), str(tmp_path / "g.gguf"), "--expert-dtype", "q4_k"]) == 2
    assert "the generic family takes no option(s) expert_dtype" in capsys.readouterr().err


def test_a_file_appearing_meanwhile_is_kept(tmp_path, monkeypatch) -> None:
    """Without --force, a file created at OUT while converting is not
    replaced; the finished temporary file is removed."""
    import hf2q.loader as loader

    out = tmp_path / "m.gguf"
    real = loader.execute

    def racing(*a, **k):
        if not out.exists():
            out.write_bytes(b"someone else's")
        return real(*a, **k)

    monkeypatch.setattr(loader, "execute", racing)
    with pytest.raises(OutputExistsError):
        hf2q.convert(QWEN, out, "f32")
    assert out.read_bytes() == b"someone else's" and _leftovers(tmp_path) == []


def test_no_space_and_unwritable_folder_are_typed_errors(tmp_path, monkeypatch) -> None:
    class Tiny:
        f_bavail, f_frsize = 10, 4096

    monkeypatch.setattr(os, "statvfs", lambda p: Tiny())
    with pytest.raises(ConvertError, match="free on its file system"):
        hf2q.convert(QWEN, tmp_path / "m.gguf")
    monkeypatch.undo()
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(ConvertError, match="cannot create"):
            hf2q.convert(QWEN, ro / "m.gguf")
    assert [p.name for p in tmp_path.iterdir()] in ([], ["ro"])
