"""What a new user meets first (issue 27): the command line run as a user
runs it (a subprocess of ``python -m hf2q``), the testing presets, and the
package as type checkers and ``dir()`` see it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hf2q
from hf2q.testing import make_dflash_checkpoint, make_gemma4_checkpoint, make_qwen35_moe_checkpoint

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
ENV = {**os.environ, "HF2Q_NUM_THREADS": "2"}


def hf2q_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hf2q", *argv], capture_output=True, text=True, timeout=120,
                          env=env or ENV)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_qwen35_moe_checkpoint(tmp_path_factory.mktemp("qwen") / "q", "tiny", fused_gate_up=True)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_gemma4_checkpoint(tmp_path_factory.mktemp("gemma") / "g", "tiny", tokenizer_tokens=96)


# --------------------------------------------------------------------------- inspect: device dtypes, GGUF names


def test_inspect_json_qwen35_has_device_dtype_and_gguf_names(qwen: Path) -> None:
    p = hf2q_cli("inspect", "--json", str(qwen))
    assert p.returncode == 0 and p.stderr == "", p.stderr
    report = json.loads(p.stdout)
    rows = {r["name"]: r for r in report["tensor_list"]}
    assert all("device_dtype" in r for r in rows.values())  # the README promises it for every family
    planned = {g["name"]: g["dtype"] for g in report["gguf_tensors"]}
    for r in rows.values():  # each row's GGUF tensors are in the plan, with the row's device dtype
        assert r["gguf_names"], r["name"]
        assert {planned[g] for g in r["gguf_names"]} == {r["device_dtype"]}, r
    fused = rows["model.layers.0.mlp.experts.gate_up_proj"]
    assert fused["device_dtype"] == "q8_0"
    assert fused["gguf_names"] == ["blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight"]  # both halves
    assert rows["model.embed_tokens.weight"]["gguf_names"] == ["token_embd.weight"]
    p = hf2q_cli("inspect", "--json", "--expert-dtype", "bf16", str(qwen))
    rows = {r["name"]: r for r in json.loads(p.stdout)["tensor_list"]}
    assert rows["model.layers.0.mlp.experts.gate_up_proj"]["device_dtype"] == "bf16"


def test_inspect_text_lists_device_dtype_and_gguf_names_for_every_model_family(qwen: Path, gemma: Path,
                                                                                 tmp_path: Path) -> None:
    drafter = make_dflash_checkpoint(tmp_path / "d", "tiny")
    for path, name, line in [
        (qwen, "model.layers.1.mlp.experts.down_proj", r"-> q8_0\s+blk\.1\.ffn_down_exps\.weight$"),
        (qwen, "model.layers.0.mlp.experts.gate_up_proj",
         r"-> q8_0\s+blk\.0\.ffn_gate_exps\.weight, blk\.0\.ffn_up_exps\.weight$"),
        (gemma, "model.embed_tokens.weight", r"-> f32\s+token_embd\.weight$"),
        (drafter, "fc.weight", r"-> bf16$"),
    ]:
        p = hf2q_cli("inspect", str(path))
        assert p.returncode == 0, p.stderr
        rows = [ln for ln in p.stdout.splitlines() if ln.strip().startswith(name + " ")]
        assert len(rows) == 1 and re.search(line, rows[0]), (name, rows)
        listed = p.stdout.splitlines()[2:]  # after the two header lines: one row per tensor, each with its column
        assert listed and all(" -> " in ln for ln in listed), path


# --------------------------------------------------------------------------- load summary, --download help


def test_load_summary_values_in_one_column(gemma: Path) -> None:
    p = hf2q_cli("load", "--device", "host", str(gemma))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert any(ln.startswith("embedding rows from:") for ln in lines)
    columns = {len(m.group(1)) for ln in lines if (m := re.match(r"^([a-z ]+: +)\S", ln))}
    assert len(columns) == 1 and len(lines) >= 10, lines  # every value starts in the same column


def test_download_help_says_what_the_code_fetches() -> None:
    from hf2q.hub import DOWNLOAD_PATTERNS

    for command in ("inspect", "load"):
        p = hf2q_cli(command, "--help")
        text = " ".join(p.stdout.split())
        helptext = text.split("--download repo ids:", 1)[1].split("--json")[0]
        assert all(pat in helptext for pat in DOWNLOAD_PATTERNS), text
    row = next(ln for ln in README.splitlines() if ln.startswith("| `--download`"))
    assert all(f"`{pat}`" in row for pat in DOWNLOAD_PATTERNS), row


# --------------------------------------------------------------------------- no command, devices, demo errors


def test_no_command_prints_usage_on_stderr_and_exits_2() -> None:
    p = hf2q_cli()
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("usage: hf2q") and "hf2q: error: a command is required" in p.stderr
    p = hf2q_cli("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"hf2q {hf2q.__version__}"


@pytest.mark.parametrize("kind,name", [("cuda", "CUDA"), ("metal", "Metal")])
def test_missing_device_hints_at_host_and_exits_1(tmp_path: Path, kind: str, name: str) -> None:
    try:
        hf2q.Device(kind)
        pytest.skip(f"this machine has {name}")
    except hf2q.DeviceError:
        pass
    drafter = make_dflash_checkpoint(tmp_path / "d", "tiny")
    p = hf2q_cli("load", "--device", kind, str(drafter))
    assert p.returncode == 1 and p.stdout == "" and name in p.stderr and "use --device host" in p.stderr
    p = hf2q_cli("load", "--json", "--device", kind, str(drafter))
    e = json.loads(p.stdout)["error"]
    assert p.returncode == 1 and p.stderr == "" and e["type"] == "DeviceError" and "--device host" in e["hint"]
    assert re.search(r"device that cannot be opened[^.]*\b1\b", " ".join(README.split()))  # the README says so


def test_demo_json_failure_is_silent_on_stderr_and_names_the_users_folder(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    env = {**ENV, "HF2Q_CACHE": str(blocker / "hf2q"), "HF2Q_DEMO_CONFIG": "tiny"}
    p = hf2q_cli("demo", "--json", "--device", "host", env=env)
    assert p.returncode == 1 and p.stderr == "", p.stderr  # README: nothing on stderr with --json on failure
    e = json.loads(p.stdout)["error"]
    assert e["path"] == str(blocker / "hf2q") and f"{blocker} is a file" in e["message"]
    assert "HF2Q_CACHE" in e["message"] and "--cache-dir" in e["hint"] and ".tmp" not in p.stdout
    p = hf2q_cli("demo", "--device", "host", env=env)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert f"hf2q demo: error: cannot write the demo checkpoint in {blocker / 'hf2q'}" in p.stderr
    # success with --json: the notes for people come on stderr after the work, the report on stdout
    env["HF2Q_CACHE"] = str(tmp_path / "cache")
    p = hf2q_cli("demo", "--json", "--device", "host", env=env)
    assert p.returncode == 0 and json.loads(p.stdout)["tensors"] == 25
    assert "writing the synthetic tiny DFlash drafter" in p.stderr and "remove it with" in p.stderr


# --------------------------------------------------------------------------- hf2q.testing


def test_gemma4_tiny_preset_loads(gemma: Path) -> None:
    model = hf2q.load(gemma, hf2q.Device("host"), progress=False)
    assert model.family == "gemma4" and len(model) == 46
    assert model["blk.0.ffn_down_exps.weight"].dtype == "q8_0"


@pytest.mark.parametrize("maker,bad,error", [
    (make_gemma4_checkpoint, "nope", ValueError),
    (make_gemma4_checkpoint, {"hidden_size": -1}, hf2q.ConfigError),
    (make_qwen35_moe_checkpoint, "nope", ValueError),
    (make_qwen35_moe_checkpoint, {"hidden_size": -1}, hf2q.ConfigError),  # was a raw KeyError
    (make_qwen35_moe_checkpoint, {"num_hidden_layers": 2}, hf2q.ConfigError),
    (make_dflash_checkpoint, "nope", ValueError),
    (make_dflash_checkpoint, {"hidden_size": 0}, hf2q.ConfigError),
])
def test_a_bad_config_leaves_no_folder(tmp_path: Path, maker, bad, error) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error):
        maker(tmp_path / "new" / "ckpt", bad)
    assert not (tmp_path / "new").exists()


# --------------------------------------------------------------------------- the package as users see it


def test_dir_hf2q_is_the_public_api() -> None:
    names = dir(hf2q)
    for helper in ("os", "Any", "TYPE_CHECKING", "annotations", "importlib", "check_environment"):
        assert helper not in names
    assert set(hf2q.__all__) <= set(names)
    for mod in (hf2q.dflash, hf2q.qwen35, hf2q.gemma4):
        assert "annotations" not in dir(mod) and set(mod.__all__) <= set(dir(mod))


USER_CODE = '''
import hf2q
from hf2q.testing import make_dflash_checkpoint, make_gemma4_checkpoint

dev = hf2q.Device("host")
drafter = make_dflash_checkpoint("d", "tiny")
m = hf2q.dflash.load(drafter, dev)
layers: int = len(m.layers)
q = hf2q.qwen35.load("q", dev, expert_dtype="q8_0")
g = hf2q.gemma4.load(make_gemma4_checkpoint("g", "tiny"), dev)
any_model = hf2q.load(drafter, dev)
resident: int = any_model.gpu_resident_bytes()
threads: int = hf2q.get_num_threads()
reveal_type(hf2q.load)
reveal_type(hf2q.dflash.load)
reveal_type(hf2q.torch.tensor)
reveal_type(hf2q.transformers.from_pretrained)
reveal_type(make_dflash_checkpoint)
reveal_type(hf2q.testing.make_qwen35_moe_checkpoint)
'''

#: What mypy --strict must refuse: a misspelt lazy name is no Any, the makers have signatures.
USER_ERRORS = '''
import hf2q
from hf2q.testing import make_gemma4_checkpoint

hf2q.lod("x")
make_gemma4_checkpoint()
hf2q.testing.make_nothing("d")
'''


@pytest.mark.host_tools
@pytest.mark.slow
def test_mypy_sees_the_lazy_api(tmp_path: Path) -> None:
    """A user's code type-checks under ``mypy --strict`` against the
    installed package (py.typed): the lazy attributes are visible and
    ``hf2q.load`` returns a LoadedModel."""
    pytest.importorskip("mypy")
    (tmp_path / "user.py").write_text(USER_CODE)
    (tmp_path / "user_errors.py").write_text(USER_ERRORS)
    p = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--cache-dir",
                        str(tmp_path / ".mypy_cache"), "user.py", "user_errors.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    errors = [ln for ln in out.splitlines() if ": error:" in ln]
    assert [ln for ln in errors if ln.startswith("user.py")] == [], out
    assert re.search(r'Revealed type is "def \(path:.*-> hf2q\.model\.LoadedModel"', out), out
    assert re.search(r'Revealed type is "def \(path:.*-> hf2q\.models\.dflash\.model\.DFlashModelTensors"', out), out
    # hf2q.torch / hf2q.transformers and the hf2q.testing makers are typed, not Any
    assert re.search(r'Revealed type is "def \(buf: hf2q\.device\.Buffer\) -> torch\.', out), out
    assert re.search(r'Revealed type is "def \(path_or_repo: .*"', out), out
    assert re.search(r'Revealed type is "def \(directory: .*-> pathlib\.Path"', out), out
    assert re.search(r'Revealed type is "def \(dir: .*-> pathlib\.Path"', out), out
    want = ['user_errors.py:5: error: Module has no attribute "lod"',
            'user_errors.py:6: error: Missing positional argument "directory" in call to "make_gemma4_checkpoint"',
            'user_errors.py:7: error: Module has no attribute "make_nothing"']
    for w in want:
        assert any(ln.startswith(w) for ln in errors), (w, out)
    assert len(errors) == len(want), out


def test_typing_helpers_stay_out_of_dir_and_imports_stay_lazy() -> None:
    """dir(hf2q.testing) shows the makers, not ``Any`` / ``annotations``; a misspelt
    name is an AttributeError at run time; ``import hf2q`` (and hf2q.testing)
    imports neither torch nor transformers."""
    names = dir(hf2q.testing)
    assert {"make_dflash_checkpoint", "make_qwen35_moe_checkpoint", "make_gemma4_checkpoint"} <= set(names)
    for helper in ("Any", "annotations", "TYPE_CHECKING", "_typing"):
        assert helper not in names
    with pytest.raises(AttributeError, match="has no attribute 'make_nothing'"):
        hf2q.testing.make_nothing  # noqa: B018
    with pytest.raises(AttributeError, match="module 'hf2q' has no attribute 'lod'"):
        hf2q.lod  # type: ignore[attr-defined]  # noqa: B018
    code = ("import sys, hf2q, hf2q.testing; hf2q.testing.make_dflash_checkpoint; "
            "print(sorted(m for m in ('torch', 'transformers', 'hf2q.torch', 'hf2q.transformers') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


# --------------------------------------------------------------------------- folders that are not what we expect


def test_folder_with_pickles_or_other_safetensors_says_what_to_do(tmp_path: Path) -> None:
    drafter = make_dflash_checkpoint(tmp_path / "d", "tiny")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x02")
    p = hf2q_cli("load", "--device", "host", str(pickled))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "it has pytorch_model.bin, but PyTorch pickle weights (.bin, .pt, .pth) are not supported" in p.stderr
    mistral = tmp_path / "mistral"
    mistral.mkdir()
    (drafter / "model.safetensors").rename(mistral / "consolidated.safetensors")
    p = hf2q_cli("inspect", "--json", str(mistral))
    e = json.loads(p.stdout)["error"]
    assert p.returncode == 2 and e["code"] == "NoCheckpoint"
    assert f"it has consolidated.safetensors: pass the file's path instead (e.g. {mistral / 'consolidated.safetensors'})" \
        in e["message"]
    p = hf2q_cli("inspect", "--json", str(mistral / "consolidated.safetensors"))  # ... and that works
    assert p.returncode == 0 and json.loads(p.stdout)["tensors"] == 25


def test_truncated_file_says_re_download(tmp_path: Path) -> None:
    drafter = make_dflash_checkpoint(tmp_path / "d", "tiny")
    f = drafter / "model.safetensors"
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size - 1000)
    p = hf2q_cli("load", "--device", "host", str(drafter))
    assert p.returncode == 2 and "but the file is" in p.stderr and p.stderr.rstrip().endswith("re-download it")


# --------------------------------------------------------------------------- non-finite weights


def test_check_finite_flag(tmp_path: Path) -> None:
    drafter = make_dflash_checkpoint(tmp_path / "d", "tiny")
    with hf2q.open_checkpoint(drafter) as ck:
        t = ck["hidden_norm.weight"]  # BF16, decoded to F32 at load: kept as it is by default
        where = t.offset + 2 * 5
    with open(t.path, "r+b") as f:
        f.seek(where)
        f.write((0x7FC0).to_bytes(2, "little"))  # a BF16 NaN
    p = hf2q_cli("load", "--device", "host", "--json", str(drafter))
    assert p.returncode == 0, p.stdout  # the default: the file's bytes
    p = hf2q_cli("load", "--device", "host", "--json", "--check-finite", str(drafter))
    e = json.loads(p.stdout)["error"]
    assert p.returncode == 2 and e["type"] == "NonFiniteError" and e["tensor"] == "hidden_norm.weight", e
    assert "--check-finite" in README and "check_finite=True" in README


# --------------------------------------------------------------------------- --version --verbose, hf2q cache


def test_version_verbose() -> None:
    from hf2q import _core, ops

    p = hf2q_cli("--version", "--verbose")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    lines = dict(ln.split(":", 1) for ln in p.stdout.splitlines()[1:])
    assert p.stdout.startswith(f"hf2q {hf2q.__version__}\n")
    assert lines["SIMD"].split()[0] == ops.simd_isa() and f"best on this CPU: {ops.best_isa()}" in lines["SIMD"]
    for kind in _core.backend_kinds():
        assert lines[f"backend {kind}"].strip().startswith(("available", "unavailable: "))
    assert lines["backend host"].strip() == "available"
    import numpy

    assert f"numpy {numpy.__version__}" in lines["dependencies"]
    p = hf2q_cli("--version", "--verbose", "--json")
    r = json.loads(p.stdout)
    assert r["version"] == hf2q.__version__ and r["backends"]["host"] == "available"
    assert set(r["dependencies"]) == {"numpy", "ml_dtypes", "safetensors", "tqdm", "huggingface_hub"}
    assert all(r["dependencies"].values())  # installed, so each has a version
    p = hf2q_cli("--version", "--verbose", env={**ENV, "HF2Q_FORCE_SCALAR": "1"})
    assert "scalar (best on this CPU" in p.stdout and "HF2Q_FORCE_SCALAR=1" in p.stdout


def test_cache_lists_and_clears_only_hf2qs_folders(tmp_path: Path) -> None:
    env = {**ENV, "HF2Q_CACHE": str(tmp_path / "demo"), "HF2Q_CACHE_DIR": str(tmp_path / "kc"),
           "HF2Q_DEMO_CONFIG": "tiny"}
    p = hf2q_cli("cache", env=env)
    assert p.returncode == 0 and p.stdout == "nothing cached\n"
    assert hf2q_cli("demo", "--device", "host", "--no-verify", env=env).returncode == 0
    (tmp_path / "kc" / "cuda").mkdir(parents=True)
    (tmp_path / "kc" / "cuda" / "sm_90.cubin").write_bytes(b"k" * 1000)
    (tmp_path / "kc" / "mine.txt").write_text("not hf2q's")
    (tmp_path / "demo" / "notes.txt").write_text("not hf2q's")
    p = hf2q_cli("cache", "--json", env=env)
    entries = json.loads(p.stdout)["entries"]
    assert [(e["what"], e["path"]) for e in entries] == [
        ("demo checkpoint", str(tmp_path / "demo" / "demo-tiny-dflash")), ("CUDA kernels", str(tmp_path / "kc" / "cuda"))]
    assert entries[1]["bytes"] == 1000
    p = hf2q_cli("cache", "--clear", env=env)
    assert p.returncode == 0 and "removed CUDA kernels: " + str(tmp_path / "kc" / "cuda") in p.stdout
    assert sorted(os.listdir(tmp_path / "kc")) == ["mine.txt"] and sorted(os.listdir(tmp_path / "demo")) == ["notes.txt"]
    assert "hf2q cache --clear" in README


# --------------------------------------------------------------------------- named_buffers as torch has it


def test_named_buffers_yields_pairs_like_torch(tmp_path: Path) -> None:
    from collections.abc import Iterator

    dev = hf2q.Device("host")
    drafter = hf2q.dflash.load(make_dflash_checkpoint(tmp_path / "d", "tiny"), dev, progress=False)
    qwen = hf2q.qwen35.load(make_qwen35_moe_checkpoint(tmp_path / "q", "tiny"), dev, progress=False)
    for model in (drafter, qwen):
        pairs = model.named_buffers()
        assert isinstance(pairs, Iterator)
        listed = list(pairs)
        assert all(isinstance(n, str) and isinstance(b, hf2q.Buffer) for n, b in listed)
        by_name = model.buffers_by_name()
        assert listed == list(by_name.items()) and [n for n, _ in listed] == model.names()
        by_name.clear()  # a copy: the model keeps its buffers
        assert len(model) == len(listed)
    drafter.layers[0].q_proj = drafter.layers[1].q_proj  # a family view: reassigned fields are what it yields
    assert dict(drafter.named_buffers())["layers.0.self_attn.q_proj.weight"] is drafter.layers[1].q_proj


# --------------------------------------------------------------------------- the load line, the progress bar


def test_load_summary_says_what_the_time_went_on(tmp_path: Path) -> None:
    drafter = make_dflash_checkpoint(tmp_path / "d", "tiny")
    p = hf2q_cli("load", "--device", "host", "--json", str(drafter))
    d = json.loads(p.stdout)
    assert d["cpu_seconds"] >= d["system_seconds"] >= 0 and d["page_faults"] >= 0
    p = hf2q_cli("load", "--device", "host", str(drafter))
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("time spent:"))
    assert re.search(r"CPU \d+\.\d\d s over all threads \(\d+\.\d\d s in the kernel: .*[\d,]+ page faults\)", line)


def test_progress_bar_moves_during_a_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a bar is drawn, batches end every BAR_BATCH_BYTES, so the bar is
    updated during the read, not once when one batch of the whole model is
    done (a batch updates the bar when it ends)."""
    from hf2q import loader
    from hf2q.device import Device

    events: list[str] = []

    class Bar:
        def update(self, n: int) -> None:
            events.append("update")

        def close(self) -> None:
            events.append("close")

    real_batch = Device._finish_file_batch  # where every batch of file jobs is read (or waited for)

    def batch(self, prepared):  # type: ignore[no-untyped-def]
        events.append(f"batch{len(prepared.planned)}")
        return real_batch(self, prepared)

    monkeypatch.setattr(Device, "_finish_file_batch", batch)
    monkeypatch.setattr(loader, "progress_bar", lambda *a, **k: Bar())
    drafter = make_dflash_checkpoint(tmp_path / "d", "tiny")
    dev = hf2q.Device("host")
    hf2q.dflash.load(drafter, dev, progress=False)  # no bar: one batch for the whole model
    assert [e for e in events if e.startswith("batch")] == ["batch25"]
    events.clear()
    monkeypatch.setattr(loader, "progress_enabled", lambda *a, **k: True)
    monkeypatch.setattr(loader, "BAR_BATCH_BYTES", 20_000)
    hf2q.dflash.load(drafter, dev, progress=True)
    batches = [i for i, e in enumerate(events) if e.startswith("batch")]
    assert len(batches) >= 5  # 164,736 bytes in batches of about 20 kB
    assert all("update" in events[a:b] for a, b in zip(batches, batches[1:]))  # the bar moves between batches


# --------------------------------------------------------------------------- the suite's own output


def test_one_skip_summary_line_per_reason(tmp_path: Path) -> None:
    """tests/conftest.py folds skips of one reason into one ``-ra`` line (the
    module-level CUDA skip gave one line per test)."""
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "pytestmark = pytest.mark.skipif(True, reason='no such device here')\n"
        + "".join(f"def test_{i}():\n    pass\n\n" for i in range(5))
        + "@pytest.mark.skipif(True, reason='another reason')\ndef test_other():\n    pass\n")
    p = subprocess.run([sys.executable, "-m", "pytest", "-ra", "-p", "no:cacheprovider", "-p", "no:randomly",
                        str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    skipped = [ln for ln in p.stdout.splitlines() if ln.startswith("SKIPPED")]
    assert skipped == ["SKIPPED [5] test_x.py: no such device here", "SKIPPED [1] test_x.py: another reason"], p.stdout


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_one_skip_summary_line_per_reason_across_files(workers: list[str], tmp_path: Path) -> None:
    """The same reason in several files is one ``-ra`` line too, with the
    total count and every file (``pytest -ra tests/test_cuda.py
    tests/test_fp8_cuda.py tests/test_kquants_cuda.py`` printed the long CUDA
    reason three times), with pytest-xdist's workers as without."""
    if workers:
        pytest.importorskip("xdist")
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    module_skip = "import pytest\npytestmark = pytest.mark.skipif(True, reason='no such device here')\n"
    for name, n in (("test_a.py", 3), ("test_b.py", 2), ("test_c.py", 4)):
        (tmp_path / name).write_text(module_skip + "".join(f"def test_{i}():\n    pass\n\n" for i in range(n)))
    (tmp_path / "test_d.py").write_text(
        "import pytest\n\ndef test_ok():\n    pass\n\n"
        "def test_inside():\n    pytest.skip('no such device here')\n\n"
        "@pytest.mark.skipif(True, reason='another reason')\ndef test_other():\n    pass\n")
    p = subprocess.run([sys.executable, "-m", "pytest", "-ra", "-p", "no:cacheprovider", "-p", "no:randomly",
                        *workers, str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    skipped = sorted(ln for ln in p.stdout.splitlines() if ln.startswith("SKIPPED"))
    assert skipped == sorted(["SKIPPED [1] test_d.py: another reason",
                              "SKIPPED [10] test_a.py, test_b.py, test_c.py, test_d.py: no such device here"]), p.stdout
