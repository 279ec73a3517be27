"""The generic family: any safetensors checkpoint loads under its own names,
kept or converted by --dtype keep|f32|bf16|q8_0, compared with what others
produce (the safetensors package's arrays, ml_dtypes casts, gguf-py's Q8_0
quantizer) and with llama.cpp's --outtype rules; the registry, hf2q.load and
the CLI dispatch through it."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import hf2q
from hf2q import models
from hf2q.cli import main
from hf2q.errors import DtypeMismatchError, SafetensorsError
from hf2q.models import generic
from hf2q.models.generic import device_dtype

H, V, I = 64, 96, 128
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H}


def _llama_tensors(seed: int = 0, dtype: object = ml_dtypes.bfloat16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.05).astype(dtype)

    t = {"model.embed_tokens.weight": w(V, H), "model.norm.weight": w(H), "lm_head.weight": w(V, H)}
    for i in range(2):
        p = f"model.layers.{i}."
        t.update({
            p + "input_layernorm.weight": w(H),
            p + "post_attention_layernorm.weight": w(H),
            p + "self_attn.q_proj.weight": w(H, H),
            p + "self_attn.q_proj.bias": w(H),
            p + "self_attn.k_proj.weight": w(32, H),
            p + "self_attn.q_norm.weight": w(16),
            p + "mlp.gate_proj.weight": w(I, H),
            p + "mlp.down_proj.weight": w(H, I),
            p + "mlp.odd_proj.weight": w(8, 40),  # rows of 40: not whole Q8_0 blocks
            p + "mlp.router.weight": w(1, H),  # 1-D once squeezed
        })
    return t


@pytest.fixture(scope="module", params=["bf16", "f32"])
def llama(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    dtype = ml_dtypes.bfloat16 if request.param == "bf16" else np.float32
    d = tmp_path_factory.mktemp(f"llama_{request.param}")
    tensors = _llama_tensors(1, dtype)
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(LLAMA))
    return d, tensors


def test_registry_order_and_detection(tmp_path: Path) -> None:
    assert [f.name for f in models.FAMILIES] == ["dflash", "qwen35moe", "gemma4", "generic"]
    assert models.detect(None).name == "generic"
    assert models.detect(LLAMA).name == "generic"
    assert models.detect({"architectures": ["DFlashDraftModel"]}).name == "dflash"
    assert models.detect({"model_type": "qwen3_5_moe"}).name == "qwen35moe"
    assert models.family("generic").options == ("dtype", "recipe")
    with pytest.raises(ValueError, match="unknown model family"):
        models.family("llama")


@pytest.mark.parametrize(
    "name,src,shape,policy,want",
    [
        ("x.weight", "bf16", (64, 64), "keep", "bf16"),
        ("x.weight", "f16", (64, 64), "f32", "f32"),
        ("x.weight", "f32", (64, 64), "bf16", "bf16"),
        ("x.weight", "bf16", (64, 64), "q8_0", "q8_0"),
        ("x.weight", "bf16", (4, 64, 64), "q8_0", "q8_0"),  # stacked experts are quantized too
        ("x.weight", "bf16", (8, 40), "q8_0", "f16"),  # llama.cpp: falling back to F16
        ("x.weight", "bf16", (64,), "q8_0", "f32"),  # 1-D
        ("x.weight", "bf16", (1, 64), "q8_0", "f32"),  # 1-D after squeeze
        ("x.weight", "bf16", (1, 64), "bf16", "f32"),
        ("x.bias", "bf16", (64, 64), "q8_0", "f32"),  # not a .weight
        ("blk.q_norm.weight", "bf16", (64, 64), "q8_0", "f32"),  # *_norm.weight
        ("x.weight", "i32", (64, 64), "q8_0", "i32"),  # integers keep their dtype
        ("x.weight", "i8", (4,), "keep", "i32"),  # widened losslessly
        ("x.weight", "bool", (4,), "keep", "u8"),
        ("x.weight", "i64", (4,), "keep", None),
        ("x.weight", "f64", (64, 64), "keep", None),
        ("x.weight", "f64", (64, 64), "q8_0", "q8_0"),
        ("x.weight", "f8_e4m3", (64, 64), "bf16", "bf16"),
    ],
)
def test_dtype_policy_follows_llama_cpp(name: str, src: str, shape: tuple, policy: str, want: str | None) -> None:
    assert device_dtype(name, src, shape, policy) == want


def test_keep_is_byte_exact(llama: tuple[Path, dict]) -> None:
    d, tensors = llama
    model = hf2q.load(d, hf2q.Device("host"), progress=False)
    assert isinstance(model, generic.GenericModel) and model.summary.model == "generic"
    assert model.names() == sorted(tensors)  # the checkpoint's order
    for name, arr in tensors.items():
        buf = model[name]
        assert buf.shape == arr.shape and buf.dtype == ("bf16" if arr.dtype == ml_dtypes.bfloat16 else "f32")
        assert buf.numpy().tobytes() == arr.tobytes(), name
    assert model.gpu_resident_bytes() == sum(a.nbytes for a in tensors.values())
    assert model.verify()["buffers"] == len(tensors)


def test_f32_and_bf16_policies(llama: tuple[Path, dict]) -> None:
    d, tensors = llama
    dev = hf2q.Device("host")
    m32 = hf2q.load(d, dev, dtype="f32", progress=False)
    mbf = hf2q.load(d, dev, dtype="bf16", progress=False)
    for name, arr in tensors.items():
        f32 = arr.astype(np.float32)
        assert m32[name].dtype == "f32" and np.array_equal(m32[name].numpy(), f32)
        want = device_dtype(name, "f32", arr.shape, "bf16")
        assert mbf[name].dtype == want
        expect = f32.astype(ml_dtypes.bfloat16) if want == "bf16" else f32  # round to nearest even
        assert mbf[name].numpy().tobytes() == expect.tobytes(), name


def test_q8_0_policy_matches_gguf_py(llama: tuple[Path, dict]) -> None:
    from gguf import GGMLQuantizationType, quants

    d, tensors = llama
    model = hf2q.load(d, hf2q.Device("host"), dtype="q8_0", progress=False)
    kinds = set()
    for name, arr in tensors.items():
        f32 = arr.astype(np.float32)
        buf = model[name]
        kinds.add(buf.dtype)
        if buf.dtype == "q8_0":
            want = quants.quantize(f32, GGMLQuantizationType.Q8_0)
        elif buf.dtype == "f16":
            want = f32.astype(np.float16)
        else:
            assert buf.dtype == "f32"
            want = f32
        assert buf.numpy().tobytes() == want.tobytes(), name
    assert kinds == {"q8_0", "f16", "f32"}
    assert model["model.layers.0.mlp.odd_proj.weight"].dtype == "f16"
    assert model["model.layers.0.mlp.router.weight"].dtype == "f32"
    assert model["model.layers.0.self_attn.q_proj.bias"].dtype == "f32"


def test_staged_conversion_is_bounded(llama: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    """f32 -> bf16 runs through the staging buffer a few rows at a time."""
    from hf2q import loader

    d, tensors = llama
    monkeypatch.setattr(loader, "STAGING_BYTES", 1024)
    model = hf2q.load(d, hf2q.Device("host"), dtype="bf16", progress=False)
    name = "model.embed_tokens.weight"
    assert model[name].numpy().tobytes() == tensors[name].astype(np.float32).astype(ml_dtypes.bfloat16).tobytes()


def test_integers_and_refusals(tmp_path: Path) -> None:
    d = tmp_path / "ints"
    d.mkdir()
    save_file({"a.idx": np.arange(5, dtype=np.int8) - 2, "b.mask": np.array([True, False, True]),
               "c.w": np.arange(6, dtype=np.int32).reshape(2, 3)}, str(d / "model.safetensors"))
    model = hf2q.load(d, hf2q.Device("host"), progress=False)
    assert model["a.idx"].dtype == "i32" and model["a.idx"].numpy().tolist() == [-2, -1, 0, 1, 2]
    assert model["b.mask"].dtype == "u8" and model["b.mask"].numpy().tolist() == [1, 0, 1]
    assert model["c.w"].numpy().tolist() == [[0, 1, 2], [3, 4, 5]]
    save_file({"x.pos": np.arange(4, dtype=np.int64), "y.w": np.zeros((2, 2), np.float64)},
              str(d / "model.safetensors"))
    with pytest.raises(DtypeMismatchError) as ei:
        hf2q.load(d, hf2q.Device("host"), progress=False)
    assert [p.tensor for p in ei.value.problems] == ["x.pos", "y.w"] and "I64" in str(ei.value)
    # f64 floats load once a policy converts them; the i64 is still refused
    with pytest.raises(DtypeMismatchError, match="x.pos"):
        hf2q.load(d, hf2q.Device("host"), dtype="f32", progress=False)


def test_options_are_checked(llama: tuple[Path, dict]) -> None:
    d, _ = llama
    with pytest.raises(TypeError, match="takes no option"):
        hf2q.load(d, hf2q.Device("host"), expert_dtype="q8_0")
    with pytest.raises(ValueError, match="dtype must be one of"):
        hf2q.load(d, hf2q.Device("host"), dtype="q3_k")


def test_load_dispatches_every_family(tmp_path: Path) -> None:
    from hf2q.testing import make_dflash_checkpoint, make_qwen35_moe_checkpoint

    dev = hf2q.Device("host")
    drafter = hf2q.load(make_dflash_checkpoint(tmp_path / "d", "tiny"), dev, progress=False)
    assert type(drafter).__name__ == "DFlashModelTensors" and drafter.summary.model == "dflash"
    qwen = hf2q.load(make_qwen35_moe_checkpoint(tmp_path / "q", "tiny"), dev, progress=False, dense_dtype="bf16")
    assert type(qwen).__name__ == "Qwen35Model" and qwen.summary.model == "qwen35moe"
    # the drafter's tensors, forced through the generic family
    g = hf2q.load(tmp_path / "d", dev, family="generic", progress=False)
    assert isinstance(g, generic.GenericModel) and g.names() == sorted(drafter.names())
    assert all(g[n].dtype == "bf16" for n in g)
    # sharded: every shard read through the same plan, bytes equal the single-file load
    sharded = make_dflash_checkpoint(tmp_path / "s", "tiny", sharded=True)
    gs = hf2q.load(sharded, dev, family="generic", progress=False)
    assert gs.names() == g.names()
    assert all(gs[n].numpy().tobytes() == g[n].numpy().tobytes() for n in g)


def test_failure_frees_everything(llama: tuple[Path, dict], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The file shrinks after the headers were validated: a typed error naming
    the tensor, and every buffer allocated so far is gone."""
    import os

    d, _ = llama
    bad = tmp_path / "trunc"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(LLAMA))
    data = (d / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data)
    real = generic.plan_generic

    def plan_then_truncate(*a: object, **kw: object) -> object:
        p = real(*a, **kw)
        os.truncate(bad / "model.safetensors", len(data) // 2)
        return p

    monkeypatch.setattr(generic, "plan_generic", plan_then_truncate)
    dev = hf2q.Device("host")
    before = dev.residency.count
    with pytest.raises(SafetensorsError) as ei:
        hf2q.load(bad, dev, progress=False)
    assert ei.value.code == "FileTruncated" and "model.safetensors" in str(ei.value)
    assert dev.residency.count == before


def test_cli_load_and_inspect(capsys: pytest.CaptureFixture[str], llama: tuple[Path, dict]) -> None:
    d, tensors = llama
    rc = main(["load", "--device", "host", "--json", "--dtype", "q8_0", "--verify", str(d)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["model"] == "generic" and out["architecture"] == "LlamaForCausalLM"
    assert out["tensors"] == len(tensors) and out["dtype"] == "q8_0" and out["verify"]["buffers"] == len(tensors)
    rc = main(["inspect", "--json", "--dtype", "q8_0", str(d)])
    rep = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in rep["tensor_list"]}
    assert rc == 0 and rep["architecture"] == "generic" and rep["unloadable"] == []
    assert rows["lm_head.weight"]["device_dtype"] == "q8_0" and rows["model.norm.weight"]["device_dtype"] == "f32"
    assert rep["resident_bytes"] == out["resident_bytes"]


@pytest.mark.parametrize("cmd", ["inspect", "load"])
def test_cli_reads_config_once_and_headers_once(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch, cmd: str) -> None:
    from hf2q import safetensors as st
    from hf2q.testing import make_dflash_checkpoint, make_qwen35_moe_checkpoint

    for d in (make_dflash_checkpoint(tmp_path / "d", "tiny", sharded=True),
              make_qwen35_moe_checkpoint(tmp_path / "q", "tiny")):
        reads: list[str] = []
        opens: list[str] = []
        import hf2q._files as files

        real_read, real_init = files.read_capped, st.SafetensorsFile.__init__

        def read_text(path: str, *a: object, **kw: object) -> bytes:  # config.json is read through read_capped
            if Path(path).name == "config.json":
                reads.append(str(path))
            return real_read(path, *a, **kw)

        def init(self: st.SafetensorsFile, path: object, *a: object, **kw: object) -> None:
            opens.append(str(path))
            real_init(self, path, *a, **kw)

        with monkeypatch.context() as m:
            m.setattr(files, "read_capped", read_text)
            m.setattr(st.SafetensorsFile, "__init__", init)
            argv = [cmd, "--json", str(d)] if cmd == "inspect" else [cmd, "--device", "host", "--json", str(d)]
            assert main(argv) == 0
        capsys.readouterr()
        assert len(reads) == 1, reads
        assert len(opens) == len(set(opens)), opens  # every shard's header parsed once


def test_staged_sources_without_a_device_format(tmp_path: Path) -> None:
    """f64 and f8 sources (no device format) and f16 -> bf16 go through the
    staging path and round as numpy / ml_dtypes do (through float32)."""
    rng = np.random.default_rng(3)
    f64 = rng.standard_normal((4, 64))
    f8 = rng.standard_normal((2, 64)).astype(ml_dtypes.float8_e4m3fn)
    f16 = rng.standard_normal((3, 64)).astype(np.float16)
    d = tmp_path / "mixed"
    d.mkdir()
    save_file({"a.weight": f64, "b.weight": f8, "c.weight": f16}, str(d / "model.safetensors"))
    dev = hf2q.Device("host")
    m = hf2q.load(d, dev, dtype="f32", progress=False)
    assert m["a.weight"].numpy().tobytes() == f64.astype(np.float32).tobytes()
    assert m["b.weight"].numpy().tobytes() == f8.astype(np.float32).tobytes()
    m = hf2q.load(d, dev, dtype="bf16", progress=False)
    for name, x in (("a.weight", f64), ("b.weight", f8), ("c.weight", f16)):
        want = x.astype(np.float32).astype(ml_dtypes.bfloat16)
        assert m[name].dtype == "bf16" and m[name].numpy().tobytes() == want.tobytes(), name
    from gguf import GGMLQuantizationType, quants

    m = hf2q.load(d, dev, dtype="q8_0", progress=False)
    assert m["a.weight"].dtype == "q8_0"  # f64 -> f32 staged, then quantized natively
    assert m["a.weight"].numpy().tobytes() == quants.quantize(f64.astype(np.float32), GGMLQuantizationType.Q8_0).tobytes()


def test_a_lone_files_errors_name_the_file(tmp_path: Path) -> None:
    """A checkpoint given as one safetensors file: messages about the whole
    checkpoint name that file, not its folder (the folder named '.')."""
    from hf2q.errors import ConfigError
    from hf2q.safetensors import open_checkpoint

    f = tmp_path / "plain.safetensors"
    save_file({"a": np.ones((4, 64), np.float32)}, str(f))
    with open_checkpoint(f) as c:
        assert c.location == f
    with pytest.raises(ConfigError, match=f"^{f}: recipe 'q4_k_m' decides each tensor's type"):
        hf2q.load(f, device="host", recipe="q4_k_m")
