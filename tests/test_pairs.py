"""Speculative pairs: a DFlash drafter bound to a Gemma 4 or Qwen3.5/3.6 MoE
target shares the target's embedding and LM head buffers (one data pointer,
counted once), is checked field by field before anything is uploaded, and a
pair loaded, freed and loaded again leaves residency as it found it."""

from __future__ import annotations

import copy
import gc
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import hf2q
from hf2q import pairs
from hf2q.models.dflash import DRAFTER_CONFIGS, DFlashConfig
from hf2q.pairs import PairError, TargetHeads, check_pair
from hf2q.testing import make_dflash_checkpoint, make_gemma4_checkpoint, make_qwen35_moe_checkpoint
from hf2q.testing.gemma4_checkpoint import GEMMA4_26B_A4B_TEXT_CONFIG
from hf2q.testing.qwen35_checkpoint import QWEN36_35B_A3B_TEXT_CONFIG, TINY_TEXT_CONFIG

DATA = Path(__file__).parent / "data" / "gemma4"
GEMMA_TINY = DATA / "gemma4_moe_causal_lm" / "hf"  # H=32, 2 layers, vocab 96, tied
GEMMA_UNTIED = DATA / "gemma4_dense_ple" / "hf"  # H=32, 4 layers, 90 embedding rows, own lm_head


def _drafter_config(base: str = "tiny", **edits) -> dict:
    c = copy.deepcopy(DRAFTER_CONFIGS[base])
    dc = c["dflash_config"]
    for k, v in edits.items():
        if k in ("mask_token_id", "target_layer_ids"):
            dc[k] = v
        else:
            c[k] = v
    return c


def _small_drafter(hidden: int, vocab: int, n_target: int, ids: list[int], mask: int, base: str = "tiny") -> dict:
    return _drafter_config(base, hidden_size=hidden, vocab_size=vocab, num_target_layers=n_target,
                           target_layer_ids=ids, mask_token_id=mask, head_dim=16, num_attention_heads=2,
                           num_key_value_heads=1, intermediate_size=64)


@pytest.fixture()
def dev():
    return hf2q.Device._isolated("host")


@pytest.fixture(scope="module")
def gemma_drafter(tmp_path_factory) -> Path:
    return make_dflash_checkpoint(tmp_path_factory.mktemp("d_gemma"), _small_drafter(32, 96, 2, [0, 1], 4))


def _count(dev) -> int:
    return int(dev.residency.stats()["count"])


def _state(dev) -> dict:
    """Residency numbers (buffers, bytes, locks); "requested" only records that
    a residency request was ever made, which a load does on purpose."""
    return {k: v for k, v in dev.residency.stats().items() if k != "requested"}


# ----------------------------------------------------------------------------- binding
def test_api_binds_drafter_to_tied_gemma4_target(dev, gemma_drafter: Path) -> None:
    target = hf2q.load(GEMMA_TINY, dev, progress=False, dense_dtype="bf16")
    n_target = _count(dev)
    drafter = hf2q.dflash.load(gemma_drafter, target=target, progress=False)
    emb = target["token_embd.weight"]
    assert drafter.embed_tokens is emb and drafter.lm_head is emb  # tied: one buffer
    assert drafter.lm_head.address == emb.address
    assert drafter.target is target
    # counted once: the drafter's own buffers are its manifest; residency grew by exactly those
    assert "token_embd.weight" not in drafter.buffers_by_name()
    assert _count(dev) == n_target + len(drafter.buffers_by_name())
    pair = drafter.pair
    assert pair.gpu_resident_bytes() == target.gpu_resident_bytes() + drafter.gpu_resident_bytes()
    s = drafter.summary.as_dict()
    assert s["pair_resident_bytes"] == pair.gpu_resident_bytes() and s["tied"] is True
    assert s["shared"] == {"embed_tokens": "token_embd.weight", "lm_head": "token_embd.weight"}


def test_untied_target_lends_its_output_buffer(dev, tmp_path: Path) -> None:
    target = hf2q.load(GEMMA_UNTIED, dev, progress=False)
    d = make_dflash_checkpoint(tmp_path / "d", _small_drafter(32, 90, 4, [1, 3], 7))
    drafter = hf2q.dflash.load(d, target=target, progress=False)
    assert drafter.lm_head.address == target["output.weight"].address
    assert drafter.embed_tokens.address == target["token_embd.weight"].address
    assert drafter.lm_head.address != drafter.embed_tokens.address
    assert drafter.pair.summary()["tied"] is False


def test_vocab_is_the_trimmed_embedding(dev, tmp_path: Path) -> None:
    target = hf2q.load(GEMMA_UNTIED, dev, progress=False)  # config vocab 96, embedding rows 90
    d = make_dflash_checkpoint(tmp_path / "d", _small_drafter(32, 96, 4, [1, 3], 7))
    before = _count(dev)
    with pytest.raises(PairError, match="90 rows") as e:
        hf2q.dflash.load(d, target=target, progress=False)
    assert e.value.key == "vocab_size" and (e.value.drafter_value, e.value.target_value) == (96, 90)
    assert _count(dev) == before  # nothing uploaded


@pytest.mark.parametrize("edit, key", [
    (dict(hidden=64), "hidden_size"),
    (dict(vocab=128), "vocab_size"),
    (dict(n_target=3, ids=[0, 2]), "num_target_layers"),
    (dict(mask=96), "dflash_config.mask_token_id"),
])
def test_each_mismatch_is_refused_before_upload(edit, key, dev, tmp_path: Path) -> None:
    target = hf2q.load(GEMMA_TINY, dev, progress=False)
    args = dict(hidden=32, vocab=96, n_target=2, ids=[0, 1], mask=4)
    args.update(edit)
    d = make_dflash_checkpoint(tmp_path / "d", _small_drafter(args["hidden"], args["vocab"], args["n_target"],
                                                              args["ids"], args["mask"]))
    before = _count(dev)
    with pytest.raises(PairError) as e:
        hf2q.dflash.load(d, target=target, progress=False)
    assert e.value.key == key and key in str(e.value)
    assert isinstance(e.value, hf2q.ConfigError)
    assert _count(dev) == before


def _heads(**kw) -> TargetHeads:
    base = dict(family="x", embedding="e", lm_head="e", tied=True, declared_tied=True, hidden_size=8,
                vocab_size=10, embedding_rows=10, num_layers=4)
    base.update(kw)
    return TargetHeads(**base)


def test_target_layer_ids_and_tie_checks() -> None:
    ok = SimpleNamespace(hidden_size=8, vocab_size=10, num_target_layers=4, target_layer_ids=(0, 3), mask_token_id=9)
    check_pair(ok, _heads())
    bad_ids = SimpleNamespace(**{**vars(ok), "target_layer_ids": (1, 4)})
    with pytest.raises(PairError, match=r"\[4\]") as e:
        check_pair(bad_ids, _heads())
    assert e.value.key == "dflash_config.target_layer_ids"
    with pytest.raises(PairError) as e:
        check_pair(ok, _heads(declared_tied=False))
    assert e.value.key == "tie_word_embeddings"


def test_a_family_without_heads_cannot_be_a_target(dev, tmp_path: Path, gemma_drafter: Path) -> None:
    drafter_as_target = hf2q.load(gemma_drafter, dev, progress=False)
    with pytest.raises(PairError, match="dflash family") as e:
        hf2q.dflash.load(gemma_drafter, target=drafter_as_target, progress=False)
    assert e.value.key == "target"


def test_other_device_is_refused(dev, gemma_drafter: Path) -> None:
    target = hf2q.load(GEMMA_TINY, dev, progress=False)
    with pytest.raises(PairError) as e:
        hf2q.dflash.load(gemma_drafter, hf2q.Device._isolated("host"), target=target, progress=False)
    assert e.value.key == "device"


def test_load_free_load_restores_residency(dev, gemma_drafter: Path) -> None:
    before = _state(dev)
    pair = pairs.load_pair(GEMMA_TINY, gemma_drafter, dev, progress=False, dense_dtype="q8_0")
    loaded = _state(dev)
    total = pair.gpu_resident_bytes()
    assert loaded["count"] == before["count"] + len(pair.target) + len(pair.drafter.buffers_by_name())
    del pair
    gc.collect()
    assert _state(dev) == before
    pair = pairs.load_pair(GEMMA_TINY, gemma_drafter, dev, progress=False, dense_dtype="q8_0")
    assert _state(dev) == loaded and pair.gpu_resident_bytes() == total
    del pair
    gc.collect()
    assert _state(dev) == before


def test_load_pair_checks_before_loading_the_target(dev, tmp_path: Path) -> None:
    d = make_dflash_checkpoint(tmp_path / "d", _small_drafter(32, 96, 5, [0, 4], 4))
    before = _state(dev)
    with pytest.raises(PairError) as e:
        pairs.load_pair(GEMMA_TINY, d, dev, progress=False)
    assert e.value.key == "num_target_layers"
    assert _state(dev) == before


def test_cli_load_target_with_drafter(gemma_drafter: Path, capsys) -> None:
    from hf2q.cli import main

    assert main(["load", str(GEMMA_TINY), "--drafter", str(gemma_drafter), "--device", "host", "--json",
                 "--dense-dtype", "q8_0", "--verify"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["target"]["model"] == "gemma4" and out["drafter"]["model"] == "dflash"
    p = out["pair"]
    assert p["pair_resident_bytes"] == p["target_resident_bytes"] + p["drafter_resident_bytes"]
    assert out["verify"]["buffers"] == out["target"]["tensors"] + out["drafter"]["tensors"]
    assert main(["load", str(GEMMA_TINY), "--drafter", str(gemma_drafter), "--device", "host",
                 "--no-progress"]) == 0
    assert "pair resident bytes:" in capsys.readouterr().out


def test_cli_mismatch_exit_code(tmp_path: Path, capsys) -> None:
    from hf2q.cli import main

    d = make_dflash_checkpoint(tmp_path / "d", _small_drafter(64, 96, 2, [0, 1], 4))
    assert main(["load", str(GEMMA_TINY), "--drafter", str(d), "--device", "host", "--json"]) == 2
    assert "hidden_size" in json.loads(capsys.readouterr().out)["error"]["message"]  # --json: the error as JSON
    assert main(["load", str(GEMMA_TINY), "--drafter", str(d), "--device", "host"]) == 2
    assert "hidden_size" in capsys.readouterr().err


# ----------------------------------------------------------------------------- published pairs
def test_published_drafters_fit_their_targets() -> None:
    """The real configs: z-lab's drafters against gemma-4-26B-A4B and Qwen3.6-35B-A3B (config numbers)."""
    from hf2q.models.gemma4 import Gemma4Config
    from hf2q.models.qwen35 import Qwen35Config

    g = Gemma4Config.from_dict(GEMMA4_26B_A4B_TEXT_CONFIG)
    check_pair(DFlashConfig.from_dict(DRAFTER_CONFIGS["gemma-4-26B-A4B-it"]),
               _heads(family="gemma4", hidden_size=g.hidden_size, vocab_size=g.vocab_size,
                      embedding_rows=g.vocab_size, num_layers=g.num_hidden_layers))
    q = Qwen35Config.from_dict(QWEN36_35B_A3B_TEXT_CONFIG)
    for name in ("Qwen3.6-35B-A3B", "Qwen3.6-35B-A3B-new"):
        check_pair(DFlashConfig.from_dict(DRAFTER_CONFIGS[name]),
                   _heads(family="qwen35moe", hidden_size=q.hidden_size, vocab_size=q.vocab_size,
                          embedding_rows=q.vocab_size, num_layers=q.num_hidden_layers, tied=False))
    with pytest.raises(PairError, match="hidden_size"):  # the 27B drafter is not for the 35B-A3B
        check_pair(DFlashConfig.from_dict(DRAFTER_CONFIGS["Qwen3.6-27B"]),
                   _heads(hidden_size=q.hidden_size, vocab_size=q.vocab_size, embedding_rows=q.vocab_size,
                          num_layers=q.num_hidden_layers))


def test_gemma4_26b_shaped_pair(tmp_path: Path, dev) -> None:
    """gemma-4-26B-A4B's layer pattern, vocabulary and tap layers (hidden size reduced), with the
    gemma-4-26B-A4B drafter's target_layer_ids / mask id, through the CLI form's API."""
    text = dict(GEMMA4_26B_A4B_TEXT_CONFIG, hidden_size=32, intermediate_size=32, moe_intermediate_size=32,
                num_experts=4, top_k_experts=2, num_attention_heads=2, num_key_value_heads=2, head_dim=32,
                global_head_dim=64, num_global_key_value_heads=1)
    t = make_gemma4_checkpoint(tmp_path / "t", text, wrapper=True)
    ids = DRAFTER_CONFIGS["gemma-4-26B-A4B-it"]["dflash_config"]["target_layer_ids"]
    d = make_dflash_checkpoint(tmp_path / "d", _small_drafter(32, 262144, 30, ids, 4, base="gemma-4-26B-A4B-it"))
    pair = pairs.load_pair(t, d, dev, progress=False, dense_dtype="bf16")
    assert pair.drafter.lm_head.address == pair.target["token_embd.weight"].address
    assert pair.target["token_embd.weight"].shape == (262144, 32)
    assert pair.gpu_resident_bytes() == pair.target.gpu_resident_bytes() + pair.drafter.gpu_resident_bytes()
    _cli_pair(t, d, "gemma4", tied=True)


def _cli_pair(target: Path, drafter: Path, family: str, *, tied: bool) -> None:
    import contextlib
    import io

    from hf2q.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["load", str(target), "--drafter", str(drafter), "--device", "host", "--json",
                     "--dense-dtype", "bf16"]) == 0
    p = json.loads(out.getvalue())["pair"]
    assert p["target_family"] == family and p["tied"] is tied
    assert p["pair_resident_bytes"] == p["target_resident_bytes"] + p["drafter_resident_bytes"]


def test_qwen36_35b_a3b_shaped_pair(tmp_path: Path, dev) -> None:
    """Qwen3.6-35B-A3B's 40 layers and 248320-token vocabulary (other sizes tiny), untied, with the
    Qwen3.6-35B-A3B drafter's target_layer_ids / mask id."""
    text = dict(TINY_TEXT_CONFIG, num_hidden_layers=40, full_attention_interval=4, mtp_num_hidden_layers=0,
                layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 10, vocab_size=248320)
    t = make_qwen35_moe_checkpoint(tmp_path / "t", text, mtp=False)
    dc = DRAFTER_CONFIGS["Qwen3.6-35B-A3B"]["dflash_config"]
    d = make_dflash_checkpoint(tmp_path / "d", _small_drafter(64, 248320, 40, dc["target_layer_ids"],
                                                              dc["mask_token_id"], base="Qwen3.6-35B-A3B"))
    target = hf2q.load(t, dev, progress=False, dense_dtype="bf16")
    drafter = hf2q.dflash.load(d, target=target, progress=False)
    assert drafter.lm_head.address == target["output.weight"].address
    assert drafter.embed_tokens.address == target["token_embd.weight"].address
    assert drafter.pair.heads.num_layers == 40
    del drafter, target
    _cli_pair(t, d, "qwen35moe", tied=False)


def test_a_failed_drafter_upload_frees_the_target(dev, tmp_path: Path, gemma_drafter: Path) -> None:
    # The target is loaded first; a drafter that fails afterwards (here a NaN
    # with check_finite=True) must not keep it resident through the traceback.
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    from hf2q.errors import NonFiniteError

    d = tmp_path / "d"
    shutil.copytree(gemma_drafter, d)
    f = d / "model.safetensors"
    tensors = load_file(str(f))
    name = "layers.0.mlp.down_proj.weight"
    t = tensors[name].copy()
    t.reshape(-1).view(np.uint16)[0] = 0x7FC0  # bf16 NaN
    tensors[name] = t
    save_file(tensors, str(f))
    before = _state(dev)
    with pytest.raises(NonFiniteError) as e:
        pairs.load_pair(GEMMA_TINY, d, dev, progress=False, check_finite=True)
    assert e.value.tensor == name
    assert _state(dev) == before  # while the exception (and its traceback) is still held


# ----------------------------------------------------------------------------- the target planned once
def _count_reads(monkeypatch, directory: Path) -> dict[str, int]:
    """How often each small file of ``directory`` is opened through the capped
    reader (config.json, tokenizer.json: every config and tokenizer read)."""
    import hf2q._files as files

    reads: dict[str, int] = {}
    real = files.open_regular

    def spy(path, error):
        p = Path(path)
        if p.parent == directory:
            reads[p.name] = reads.get(p.name, 0) + 1
        return real(path, error)

    monkeypatch.setattr(files, "open_regular", spy)
    return reads


def _count_calls(monkeypatch, module, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(module, name)

    def spy(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(module, name, spy)
    return calls


@pytest.mark.parametrize("how", ["api", "cli"])
def test_gemma4_pair_plans_its_target_once(how: str, dev, gemma_drafter: Path, monkeypatch, capsys) -> None:
    """load_pair and `hf2q load --drafter`: one plan of the target, so its
    config.json and tokenizer.json are each read once."""
    import hf2q.models.gemma4 as gemma4

    plans = _count_calls(monkeypatch, gemma4, "plan_gemma4")
    reads = _count_reads(monkeypatch, GEMMA_TINY)
    if how == "api":
        pair = pairs.load_pair(GEMMA_TINY, gemma_drafter, dev, progress=False, dense_dtype="q8_0")
        assert pair.target["blk.0.attn_q.weight"].dtype == "q8_0"  # the options reached the one plan
        del pair
    else:
        from hf2q.cli import main

        assert main(["load", str(GEMMA_TINY), "--drafter", str(gemma_drafter), "--device", "host", "--json",
                     "--dense-dtype", "q8_0"]) == 0
        assert json.loads(capsys.readouterr().out)["pair"]["target_family"] == "gemma4"
    assert len(plans) == 1
    assert reads == {"config.json": 1, "tokenizer.json": 1}


def test_qwen_pair_plans_its_target_once(dev, tmp_path: Path, monkeypatch) -> None:
    import importlib

    qwen_load = importlib.import_module("hf2q.models.qwen35.load")  # (the package's `load` is the function)
    t = make_qwen35_moe_checkpoint(tmp_path / "t", "tiny")
    d = make_dflash_checkpoint(tmp_path / "d", _small_drafter(64, 256, 4, [0, 3], 5))
    plans = _count_calls(monkeypatch, qwen_load, "plan_qwen35_moe")
    reads = _count_reads(monkeypatch, t)
    pair = pairs.load_pair(t, d, dev, progress=False, expert_dtype="bf16")
    assert len(plans) == 1 and reads == {"config.json": 1}
    assert pair.target["blk.0.ffn_down_exps.weight"].dtype == "bf16"
    assert pair.target.summary.as_dict()["expert_dtype"] == "bf16"  # the summary comes from that plan
    assert pair.drafter.lm_head.address == pair.target["output.weight"].address


def test_a_pair_refuses_an_option_its_target_does_not_take(dev, gemma_drafter: Path, capsys) -> None:
    with pytest.raises(TypeError, match="the gemma4 family takes no option.s. dtype; it takes expert_dtype, "
                                        "dense_dtype"):
        pairs.load_pair(GEMMA_TINY, gemma_drafter, dev, progress=False, dtype="f32")
    from hf2q.cli import main

    assert main(["load", str(GEMMA_TINY), "--drafter", str(gemma_drafter), "--device", "host",
                 "--dtype", "f32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--dtype does not apply to" in err
    assert "the gemma4 family takes --expert-dtype, --dense-dtype" in err
