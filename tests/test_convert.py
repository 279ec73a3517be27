"""hf2q.convert / ``hf2q convert``: output handling (temporary name, rename,
--force), refused inputs, the CLI's report, and bounded memory (the in-flight
bytes never pass the budget; a batch per tensor writes the same file)."""

from __future__ import annotations

import errno
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
    with pytest.raises(ConvertError, match="free on its file system") as e:
        hf2q.convert(QWEN, tmp_path / "m.gguf")
    # The machine's limit, not bad input: a system failure (the CLI's exit 1), as ENOSPC mid-write.
    assert e.value.system_failure and e.value.system_errno == errno.ENOSPC
    monkeypatch.undo()
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(ConvertError, match="cannot create"):
            hf2q.convert(QWEN, ro / "m.gguf")
    assert [p.name for p in tmp_path.iterdir()] in ([], ["ro"])


@pytest.mark.parametrize("batch", [1, 4096, 64 << 20])
@pytest.mark.parametrize("outtype", ["q8_0", "f16"])
def test_direct_and_page_cache_output_write_the_same_file(tmp_path, monkeypatch, batch, outtype) -> None:
    """O_DIRECT output and the page cache give the same bytes, whatever the
    windows (one tensor each: many windows share a page with the next; or
    all in one); the report says which path ran. f16 rounds F32 buffers
    into the window."""
    ref = tmp_path / "ref.gguf"
    monkeypatch.setattr(export, "OUTPUT_DIRECT", False)
    s = hf2q.convert(QWEN, ref, outtype)
    assert s.extra["output_io"] == "page cache"
    monkeypatch.setattr(export, "OUTPUT_DIRECT", True)
    monkeypatch.setattr(export, "BATCH_BYTES", batch)
    out = tmp_path / "d.gguf"
    s = hf2q.convert(QWEN, out, outtype)
    assert out.read_bytes() == ref.read_bytes() and out.stat().st_size == s.bytes
    assert _leftovers(tmp_path) == []
    if hasattr(os, "O_DIRECT") and s.extra["output_io"] != "O_DIRECT":
        pytest.skip(f"this file system refuses O_DIRECT ({tmp_path}); the page cache wrote it")


def test_direct_output_refused_with_einval_goes_through_the_page_cache(tmp_path, monkeypatch) -> None:
    """A file system that takes O_DIRECT at open but refuses a write's
    alignment (EINVAL): the same write is done through the page cache, and
    every later one; the file is the same."""
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT here")
    import fcntl

    ref = tmp_path / "ref.gguf"
    monkeypatch.setattr(export, "OUTPUT_DIRECT", False)
    hf2q.convert(QWEN, ref, "f32")
    monkeypatch.setattr(export, "OUTPUT_DIRECT", True)
    monkeypatch.setattr(export, "BATCH_BYTES", 8192)
    real = os.pwrite
    refused = []

    def pwrite(fd, data, off):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(off)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, off)

    monkeypatch.setattr(os, "pwrite", pwrite)
    out = tmp_path / "m.gguf"
    s = hf2q.convert(QWEN, out, "f32")
    assert out.read_bytes() == ref.read_bytes() and s.extra["output_io"] == "page cache"
    assert 1 <= len(refused) <= export.DIRECT_DEPTH


@pytest.mark.parametrize("direct", [True, False])
def test_write_failure_is_a_typed_error_and_leaves_nothing(tmp_path, monkeypatch, direct) -> None:
    """ENOSPC (or EIO) from a write midway: ConvertError naming the output,
    no output and no temporary file, whichever path wrote; the writes
    queued after it are not done."""
    monkeypatch.setattr(export, "OUTPUT_DIRECT", direct)
    monkeypatch.setattr(export, "BATCH_BYTES", 4096)
    calls = {"n": 0}
    real = os.pwrite

    def failing(*a):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a)

    monkeypatch.setattr(os, "pwrite", failing)
    out = tmp_path / "m.gguf"
    with pytest.raises(ConvertError, match="No space left") as e:
        hf2q.convert(QWEN, out, "f32")
    assert e.value.path == str(out) and calls["n"] >= 3
    assert e.value.system_failure and e.value.system_errno == errno.ENOSPC  # the CLI's exit 1
    assert not out.exists() and _leftovers(tmp_path) == []


@pytest.mark.parametrize("src,outtype", [(QWEN, "q8_0"), (QWEN, "f16"), (GEMMA, "bf16"), (GEMMA, "q8_0")])
def test_unzeroed_windows_write_every_byte(tmp_path, monkeypatch, src, outtype) -> None:
    """Windows are not zero-filled (a reused range keeps its old bytes):
    with every window's memory poisoned before the loader runs, the file is
    the same as from zero-filled windows, whatever the batches (padding,
    page tails and the header's page are all written)."""
    from hf2q.device import Device

    ref = tmp_path / "ref.gguf"
    monkeypatch.setattr(export, "WINDOW_UNZEROED", False)
    hf2q.convert(src, ref, outtype)
    real = Device._alloc_window
    windows = []

    def poisoned(self, length, specs, *, zero=True):
        assert not zero
        w, bufs = real(self, length, specs, zero=zero)
        w._storage_bytes(0, w.alloc_len)[:] = 0xA5
        windows.append(length)
        return w, bufs

    monkeypatch.setattr(Device, "_alloc_window", poisoned)
    monkeypatch.setattr(export, "WINDOW_UNZEROED", True)
    for batch in (1, 5000, 64 << 20):
        monkeypatch.setattr(export, "BATCH_BYTES", batch)
        out = tmp_path / f"{batch}.gguf"
        hf2q.convert(src, out, outtype)
        assert out.read_bytes() == ref.read_bytes(), batch
    assert len(windows) > 10


def test_a_buffer_its_pieces_do_not_cover_is_zeroed() -> None:
    """_fully_written: pieces that leave a gap (or stop short) are not
    trusted to write the whole buffer; _unwritten zeroes such a buffer and
    the padding after each tensor, not the header."""
    from hf2q.plan import Piece, TensorPlan

    whole = TensorPlan("a", (4, 32), "f32", (Piece("s", "F32", (4, 32)),))
    halves = TensorPlan("b", (4, 32), "f32", (Piece("s", "F32", (2, 32)), Piece("t", "F32", (2, 32), dest_offset=64)))
    gap = TensorPlan("c", (4, 32), "f32", (Piece("s", "F32", (1, 32)), Piece("t", "F32", (2, 32), dest_offset=64)))
    short = TensorPlan("d", (4, 32), "f32", (Piece("s", "F32", (3, 32)),))
    assert export._fully_written(whole) and export._fully_written(halves)
    assert not export._fully_written(gap) and not export._fully_written(short)
    u = export._layout([[whole, gap]], set(), 100)[0]
    assert u.offsets == [100, 640] and u.end == 1152 and u.last  # each tensor padded to 32 bytes
    ws, we = u.window(4096)
    assert (ws, we) == (0, 4096)
    assert export._unwritten(u, ws, we - ws, 100, set()) == [(612, 4096)]  # whole's padding on, gap, tail
    u = export._layout([[gap, whole]], set(), 100)[0]
    assert export._unwritten(u, 0, 4096, 100, set()) == [(100, 640), (1152, 4096)]


def test_qwen_convert_reads_bf16_as_bits_and_imports_no_ml_dtypes(tmp_path) -> None:
    """The Qwen3.5 transforms take BF16 sources as raw bits (raw_bf16):
    a conversion imports no ml_dtypes (about 0.6 s of CPU), and its file is
    the one the typed path (check_finite reads bfloat16 arrays) writes."""
    import subprocess
    import sys

    out = tmp_path / "m.gguf"
    code = ("import sys, hf2q; hf2q.convert(sys.argv[1], sys.argv[2], 'q8_0'); "
            "print('ml_dtypes' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code, str(QWEN), str(out)], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False", r.stdout + r.stderr
    import hf2q.loader as loader

    ref = tmp_path / "typed.gguf"
    real = loader.execute

    def typed(*a, **k):
        return real(*a, **{**k, "check_finite": True})

    with pytest.MonkeyPatch.context() as m:
        m.setattr(loader, "execute", typed)
        hf2q.convert(QWEN, ref, "q8_0")
    assert out.read_bytes() == ref.read_bytes()


def test_any_failed_output_write_is_a_system_failure(tmp_path, monkeypatch) -> None:
    # EROFS (a disk remounted read-only), not in the errno list of the input side: the output's
    # write failed after its input was read and converted, so it is the machine's (exit 1).
    monkeypatch.setattr(export, "BATCH_BYTES", 4096)

    def refused(*a):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "pwrite", refused)
    with pytest.raises(ConvertError, match="Read-only") as e:
        hf2q.convert(QWEN, tmp_path / "m.gguf", "f32")
    assert e.value.system_failure and e.value.system_errno == errno.EROFS
    assert _leftovers(tmp_path) == []


def test_writer_threads_that_cannot_start_leave_no_file(tmp_path, monkeypatch) -> None:
    import threading

    real = threading.Thread.start

    def start(self):
        if self.name == "hf2q-convert-io-1":
            raise RuntimeError("can't start new thread")
        return real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(RuntimeError, match="can't start"):
        hf2q.convert(QWEN, tmp_path / "m.gguf", "f32")
    assert _leftovers(tmp_path) == [] and not (tmp_path / "m.gguf").exists()
    assert not [t for t in threading.enumerate() if t.name.startswith("hf2q-convert-io")]


def test_the_output_is_never_a_file_of_the_checkpoint(tmp_path, capsys) -> None:
    """--force replaces an existing output, never the checkpoint being read:
    a shard, the index, config.json or a tokenizer file as OUT (by name, by
    another path or through a link) is refused before anything is written,
    and the checkpoint stays as it was. A GGUF file beside it is replaced."""
    import shutil

    src = tmp_path / "ckpt"
    shutil.copytree(QWEN, src)
    (src / "tokenizer.json").write_text("{}")
    (src / "chat_template.jinja").write_text("{{ messages }}")
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    shard = next(src.glob("*.safetensors"))
    link = tmp_path / "link.gguf"
    link.symlink_to(shard)
    for out in (shard, src / "config.json", src / "tokenizer.json", src / "chat_template.jinja",
                src / ".." / "ckpt" / shard.name, link):
        with pytest.raises(ConvertError, match="of the checkpoint being converted"):
            hf2q.convert(src, out, "q8_0", force=True)
        assert cli.main(["convert", str(src), str(out), "--force", "--no-progress"]) == 2  # the arguments' fault
        assert "of the checkpoint being converted (the GGUF file would replace it)" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before
    assert not [p for p in tmp_path.rglob(".*") if p.is_file()]  # no temporary file left
    (src / "tokenizer.json").unlink()  # (not a real tokenizer)
    (src / "chat_template.jinja").unlink()
    old = src / "old.gguf"
    old.write_bytes(b"an earlier conversion")
    hf2q.convert(src, old, "q8_0", force=True)
    assert old.read_bytes()[:4] == b"GGUF"
    # a directory as OUT: named as such, without suggesting --force
    with pytest.raises(ConvertError, match="is a directory; name the GGUF file") as e:
        hf2q.convert(src, tmp_path, "q8_0")
    assert "--force" not in str(e.value)
