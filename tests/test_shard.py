"""Sharded loads (hf2q.Shard, docs/SHARDING.md): for world 2 and 4, one
process per rank on the host device (plain multiprocessing, and
torch.distributed with the gloo backend), every family and dtype option:

- the ranks' slices put together (numpy concatenation along the split axis,
  independent of the loader's range arithmetic) equal the unsharded load byte
  for byte; replicated tensors are equal on every rank; a per-expert tensor
  is on its owner only;
- each rank's bytes read from the files (counted in the rank's process by
  wrapping the four read calls, tests/_shard_worker.py) are exactly its share
  plus the replicated tensors, and at most 1.05x that share;
- bad shards are typed errors.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hf2q
from hf2q import formats, models
from hf2q.device import Device
from hf2q.errors import ShardError
from hf2q.safetensors import open_checkpoint
from hf2q.shard import Owned, Shard, Split, expert_counts

import _shard_worker as worker

QWEN_SHARDABLE = {"num_attention_heads": 4, "num_key_value_heads": 2, "moe_intermediate_size": 128,
                  "shared_expert_intermediate_size": 128}
#: every value of each dtype option at least once (the other at its default)
DTYPE_COMBOS = [{"dense_dtype": d} for d in ("f32", "bf16", "q8_0")] + \
    [{"expert_dtype": d} for d in ("f32", "bf16")]


def _generic_checkpoint(d: Path) -> Path:
    """A small Mixtral-shaped checkpoint (F32, per-expert HF names, a q bias,
    an integer tensor): the generic family's names."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    H, I, V, E = 128, 128, 96, 4
    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": rng.standard_normal((V, H), dtype=np.float32),
                                "model.norm.weight": rng.standard_normal(H, dtype=np.float32),
                                "lm_head.weight": rng.standard_normal((V, H), dtype=np.float32),
                                "model.position_ids": np.arange(16, dtype=np.int32)}
    for b in range(2):
        p = f"model.layers.{b}."
        t[p + "input_layernorm.weight"] = rng.standard_normal(H, dtype=np.float32)
        for n, shape in (("q_proj", (H, H)), ("k_proj", (32, H)), ("v_proj", (32, H)), ("o_proj", (H, H))):
            t[p + f"self_attn.{n}.weight"] = rng.standard_normal(shape, dtype=np.float32)
        t[p + "self_attn.q_proj.bias"] = rng.standard_normal(H, dtype=np.float32)
        t[p + "block_sparse_moe.gate.weight"] = rng.standard_normal((E, H), dtype=np.float32)
        for e in range(E):
            q = p + f"block_sparse_moe.experts.{e}."
            t[q + "w1.weight"] = rng.standard_normal((I, H), dtype=np.float32)
            t[q + "w3.weight"] = rng.standard_normal((I, H), dtype=np.float32)
            t[q + "w2.weight"] = rng.standard_normal((H, I), dtype=np.float32)
    d.mkdir(parents=True, exist_ok=True)
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text('{"architectures": ["MixtralForCausalLM"], "model_type": "mixtral"}')
    return d


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    from hf2q.testing.dflash_checkpoint import make_dflash_checkpoint
    from hf2q.testing.gemma4_checkpoint import GEMMA4_26B_A4B_TEXT_CONFIG, make_gemma4_checkpoint
    from hf2q.testing.qwen35_checkpoint import TINY_TEXT_CONFIG, make_qwen35_moe_checkpoint

    root = tmp_path_factory.mktemp("shard")
    qcfg = {**TINY_TEXT_CONFIG, **QWEN_SHARDABLE}
    gcfg = dict(GEMMA4_26B_A4B_TEXT_CONFIG, hidden_size=64, intermediate_size=128, moe_intermediate_size=128,
                num_experts=4, top_k_experts=2, num_attention_heads=4, num_key_value_heads=4, head_dim=32,
                global_head_dim=64, num_global_key_value_heads=2, num_hidden_layers=2, vocab_size=256,
                layer_types=["sliding_attention", "full_attention"])
    return {
        "generic": _generic_checkpoint(root / "generic"),
        "qwen35": make_qwen35_moe_checkpoint(root / "qwen35", qcfg),
        "qwen35_fused": make_qwen35_moe_checkpoint(root / "qwen35f", qcfg, fused_gate_up=True, sharded=True),
        "qwen35_tiny": make_qwen35_moe_checkpoint(root / "qwen35t", "tiny"),
        # 200 tokenizer tokens: the embedding loses rows (a row-sliced piece, then sharded)
        "gemma4": make_gemma4_checkpoint(root / "gemma4", gcfg, tokenizer_tokens=200),
        "dflash": make_dflash_checkpoint(root / "dflash", "tiny"),
    }


def _cases(ck: dict[str, Path]) -> list[tuple[str, str, dict[str, Any], str]]:
    out: list[tuple[str, str, dict[str, Any], str]] = []
    for mode in ("tensor", "expert"):
        out += [(str(ck["generic"]), "generic", {"dtype": d}, mode) for d in ("keep", "f32", "bf16", "q8_0")]
        for key in ("qwen35", "qwen35_fused"):
            out += [(str(ck[key]), "qwen35moe", dict(o), mode) for o in DTYPE_COMBOS]
        out += [(str(ck["gemma4"]), "gemma4", dict(o), mode) for o in DTYPE_COMBOS]
        out.append((str(ck["dflash"]), "dflash", {}, mode))
    return out


def _storage(raw: bytes, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Raw bytes as ``shape`` with the last axis in blocks (one element per
    block for plain formats) and a trailing axis of the block's bytes: a
    split of any logical axis on whole blocks is a split of the same axis here."""
    fmt = formats.get(dtype)
    shape = shape or (1,)
    return np.frombuffer(raw, np.uint8).reshape(shape[:-1] + (shape[-1] // fmt.block_elems, fmt.block_bytes))


def _join(parts: list[np.ndarray], split: Split) -> np.ndarray:
    """Rank slices along ``split.axis`` back into one tensor (each fused part
    rebuilt from every rank's slice of it)."""
    ax, k = split.axis, split.parts
    pieces = [p.reshape(p.shape[:ax] + (k, p.shape[ax] // k) + p.shape[ax + 1:]) for p in parts]
    whole = np.concatenate(pieces, axis=ax + 1)
    return whole.reshape(whole.shape[:ax] + (-1,) + whole.shape[ax + 2:])


_WHOLE: dict[tuple, Any] = {}


def _whole(path: str, fam: str, opts: dict[str, Any]) -> tuple[Any, dict[str, tuple[str, tuple, bytes]]]:
    """(unsharded plan, unsharded load's buffers), once per case."""
    key = (path, fam, tuple(sorted(opts.items())))
    if key not in _WHOLE:
        impl = models.family(fam).impl()
        _, cfg = models.read_config(path)
        with open_checkpoint(Path(path)) as ck:
            plan = impl.plan_checkpoint(ck, config=cfg, **opts)
        m: Any = hf2q.load(path, Device("host"), family=fam, progress=False, **opts)
        _WHOLE[key] = plan, {n: (b.dtype, tuple(b.shape), b.to_host().tobytes())
                             for n, b in m.buffers_by_name().items()}
    return _WHOLE[key]


def _check(cases: list, results: dict[int, list], world: int) -> None:
    """Slices joined == the unsharded load; reads == the rank's share."""
    for i, (path, fam, opts, mode) in enumerate(cases):
        what = f"{fam} {opts} {mode} world {world}"
        plan, whole = _whole(path, fam, opts)
        impl = models.family(fam).impl()
        experts = expert_counts(plan)
        shares = [0] * world
        whole_reads = [0] * world
        split_count = 0
        for e in plan:
            d = impl.shard_rule(e, mode, experts)
            dtype, shape, raw = whole[e.name]
            per_rank = [results[r][i][0] for r in range(world)]
            if d is None:
                for r in range(world):
                    assert per_rank[r][e.name] == whole[e.name], f"{what}: replicated {e.name} differs on rank {r}"
                    shares[r] += e.source_nbytes
                    whole_reads[r] += e.source_nbytes
            elif isinstance(d, Owned):
                split_count += 1
                owner = d.expert // (d.count // world)
                for r in range(world):
                    assert (e.name in per_rank[r]) == (r == owner), f"{what}: {e.name} on rank {r}"
                    if r == owner:
                        assert per_rank[r][e.name] == whole[e.name], what
                        shares[r] += e.source_nbytes
                        whole_reads[r] += e.source_nbytes
            else:
                split_count += 1
                got = [per_rank[r][e.name] for r in range(world)]
                assert all(g[0] == dtype for g in got), what
                joined = _join([_storage(g[2], g[0], g[1]) for g in got], d)
                assert joined.tobytes() == raw, f"{what}: {e.name} slices joined differ from the whole load"
                for r in range(world):
                    shares[r] += e.source_nbytes // world
                    # a numpy step on whole tensors reads the whole source (docs/SHARDING.md)
                    whole_reads[r] += e.source_nbytes if e.transform is not None else e.source_nbytes // world
        for r in range(world):
            names = set(results[r][i][0])
            assert names <= set(whole), what
            read = results[r][i][1]
            assert read == whole_reads[r], f"{what}: rank {r} read {read} bytes, planned {whole_reads[r]}"
            assert read <= 1.05 * shares[r], f"{what}: rank {r} read {read} bytes, share {shares[r]}"
        if fam != "dflash":
            assert split_count > 0, f"{what}: nothing was split or owned"


def _spawn_ranks(target, world: int, args: tuple) -> dict[int, list]:
    # Each rank its own process, forked from one clean server process that
    # imported the ranks' modules once (torch.distributed included, about 1.6 s
    # of CPU), rather than a new interpreter importing them for every rank
    # ("spawn"); a rank still shares nothing with pytest's process or the others.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["_shard_worker", "hf2q.shard", "numpy", "torch.distributed"])
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, *args, q)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        out = dict(q.get(timeout=600) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=60)
    bad = {r: v for r, v in out.items() if isinstance(v, str)}
    assert not bad, bad
    assert all(p.exitcode == 0 for p in procs)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_multiprocessing_ranks_join_to_the_whole_load(checkpoints, world: int) -> None:
    cases = _cases(checkpoints)
    results = _spawn_ranks(worker.mp_main, world, (cases,))
    _check(cases, results, world)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_torch_distributed_gloo_ranks(checkpoints, world: int) -> None:
    """Shard.from_torch_distributed in a gloo group of ``world`` processes."""
    import torch.distributed  # noqa: F401  (the test extra pins torch: this runs in CI, never skips)

    cases = [c for c in _cases(checkpoints) if c[1] in ("qwen35moe", "gemma4", "generic")][::3]
    results = _spawn_ranks(worker.gloo_main, world, (_free_port(), cases))
    _check(cases, results, world)


# --------------------------------------------------------------------------- rules, shapes, errors
def _plan(path: Path, fam: str, shard: Shard | None, **opts: Any):
    _, cfg = models.read_config(path)
    with open_checkpoint(path) as ck:
        return models.family(fam).impl().plan_checkpoint(ck, config=cfg, shard=shard, **opts)


def test_documented_rules_on_qwen35(checkpoints) -> None:
    """docs/SHARDING.md's table, checked on the planned shapes."""
    whole = _plan(checkpoints["qwen35"], "qwen35moe", None)
    tp = _plan(checkpoints["qwen35"], "qwen35moe", Shard(1, 2))
    ep = _plan(checkpoints["qwen35"], "qwen35moe", Shard(1, 2, "expert"))
    half = {  # name (after "blk.N.") -> axis halved under tensor parallel
        "token_embd.weight": 0, "output.weight": 0, "attn_q.weight": 0, "attn_k.weight": 0,
        "attn_v.weight": 0, "attn_output.weight": 1, "ffn_gate_exps.weight": 1,
        "ffn_up_exps.weight": 1, "ffn_down_exps.weight": 2, "ffn_gate_shexp.weight": 0,
        "ffn_up_shexp.weight": 0, "ffn_down_shexp.weight": 1,
    }
    seen = set()
    for e in whole:
        short = e.name.split(".", 2)[-1] if e.name.startswith("blk.") else e.name
        want = list(e.shape)
        if short in half:
            want[half[short]] //= 2
            seen.add(short)
        assert list(tp[e.name].shape) == want, e.name
        want = list(e.shape)
        if e.name.endswith("_exps.weight"):
            want[0] //= 2
        assert list(ep[e.name].shape) == want, e.name
    assert seen == set(half)
    # replicated under TP: norms, router, the linear-attention block
    for n in ("blk.0.attn_norm.weight", "blk.0.ffn_gate_inp.weight", "blk.0.attn_qkv.weight", "output_norm.weight"):
        assert tp[n].shape == whole[n].shape
    assert tp.extra["shard"] == {"rank": 1, "world": 2, "mode": "tensor"}
    assert tp.source_nbytes < whole.source_nbytes


def test_column_split_reads_strided_ranges_row_split_one(checkpoints) -> None:
    """A row split is one range per piece; a column split one range per row
    (coalesced where rows are whole)."""
    tp = _plan(checkpoints["qwen35"], "qwen35moe", Shard(0, 2))
    (q,) = tp["blk.3.attn_q.weight"].sources
    assert q.select is not None and len(q.select) == 1
    (o,) = tp["blk.3.attn_output.weight"].sources
    rows = tp["blk.3.attn_output.weight"].shape[0]
    assert o.select is not None and len(o.select) == rows
    assert (o.select[:, 2] == tp["blk.3.attn_output.weight"].shape[1]).all()
    # EP of a per-expert stack: this rank's experts only, one range each, re-based to 0
    ep = _plan(checkpoints["qwen35"], "qwen35moe", Shard(1, 2, "expert"))
    src = ep["blk.0.ffn_up_exps.weight"].sources
    assert [p.expert for p in src] == [2, 3]  # type: ignore[attr-defined]
    assert src[0].select is not None and int(src[0].select[0, 0]) == 0


def test_bad_shards_are_typed_errors(checkpoints) -> None:
    with pytest.raises(ShardError, match="rank"):
        Shard(2, 2)
    with pytest.raises(ShardError, match="rank"):
        Shard(-1, 2)
    with pytest.raises(ShardError, match="world"):
        Shard(0, 0)
    with pytest.raises(TypeError):
        Shard(0.0, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mode"):
        Shard(0, 2, "pipeline")  # type: ignore[arg-type]
    assert issubclass(ShardError, hf2q.Hf2qError) and hf2q.ShardError is ShardError
    # 4 experts over 3 ranks
    with pytest.raises(ShardError, match="expert") as ei:
        _plan(checkpoints["qwen35"], "qwen35moe", Shard(0, 3, "expert"))
    assert ei.value.tensor == "blk.0.ffn_gate_exps.weight"
    # a vocabulary of 256 rows over 3 ranks
    with pytest.raises(ShardError, match="not divisible by the world size 3") as ei:
        _plan(checkpoints["qwen35"], "qwen35moe", Shard(0, 3))
    assert ei.value.tensor == "token_embd.weight"
    # tiny's expert down_proj has 32 columns: 16 per rank is half a Q8_0 block
    with pytest.raises(ShardError, match="whole number of 32-element blocks") as ei:
        _plan(checkpoints["qwen35_tiny"], "qwen35moe", Shard(0, 2))
    # ... and the same split in f32 is fine
    p = _plan(checkpoints["qwen35_tiny"], "qwen35moe", Shard(0, 2), expert_dtype="f32")
    assert p["blk.0.ffn_down_exps.weight"].shape[-1] == 16
    # generic per-expert tensors over 8 ranks: 4 experts do not divide
    with pytest.raises(ShardError, match="expert count"):
        _plan(checkpoints["generic"], "generic", Shard(0, 8, "expert"))
    with pytest.raises(TypeError, match="Shard"):
        hf2q.load(checkpoints["generic"], Device("host"), progress=False, shard=(0, 2))  # type: ignore[arg-type]


def test_world_one_is_the_whole_load(checkpoints) -> None:
    for key, fam in (("qwen35_fused", "qwen35moe"), ("gemma4", "gemma4"), ("generic", "generic")):
        a: Any = hf2q.load(checkpoints[key], Device("host"), family=fam, progress=False)
        b: Any = hf2q.load(checkpoints[key], Device("host"), family=fam, progress=False, shard=Shard(0, 1))
        assert list(a.buffers_by_name()) == list(b.buffers_by_name())
        for n, buf in a.buffers_by_name().items():
            assert buf.to_host().tobytes() == b[n].to_host().tobytes(), n
        assert b.summary.data_bytes == a.summary.data_bytes


def test_family_loads_take_shard(checkpoints) -> None:
    """Every family's own load takes ``shard=`` (the summary says which)."""
    from hf2q import dflash, gemma4, qwen35
    from hf2q.models import generic

    s = Shard(1, 2)
    assert qwen35.load(checkpoints["qwen35"], Device("host"), progress=False, shard=s).summary.extra["shard"]["rank"] == 1
    assert gemma4.load(checkpoints["gemma4"], Device("host"), progress=False, shard=s).summary.extra["shard"]["world"] == 2
    assert "shard" in generic.load(checkpoints["generic"], Device("host"), progress=False, shard=s).summary.extra
    dflash.load(checkpoints["dflash"], Device("host"), progress=False, shard=s)  # replicated


def test_from_torch_distributed_needs_a_group() -> None:
    with pytest.raises(ShardError, match="not initialised"):
        Shard.from_torch_distributed()


def test_cuda_index_beyond_the_gpus_is_a_device_error() -> None:
    """Device("cuda:N") for a GPU that is not there: a clear DeviceError (or,
    in a build without CUDA, the unknown-kind ValueError), never a crash."""
    from hf2q import _core

    with pytest.raises((hf2q.DeviceError, ValueError)) as ei:
        Device("cuda:7")
    if "cuda" in _core.backend_kinds():
        assert isinstance(ei.value, hf2q.DeviceError)  # no driver here: it says so; with GPUs: see below


# --------------------------------------------------------------------------- GPU (the lead runs these on an H200)
def _cuda_available() -> bool:
    from hf2q import _core

    if "cuda" not in _core.backend_kinds():
        return False
    try:
        Device("cuda:0")
    except hf2q.DeviceError:
        return False
    return True


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_available(), reason="no CUDA GPU")
def test_cuda_world_one_equals_whole_load(checkpoints) -> None:
    for key, fam in (("qwen35_fused", "qwen35moe"), ("gemma4", "gemma4")):
        a: Any = hf2q.load(checkpoints[key], Device("host"), family=fam, progress=False)
        b: Any = hf2q.load(checkpoints[key], Device("cuda:0"), family=fam, progress=False, shard=Shard(0, 1))
        for n, buf in a.buffers_by_name().items():
            assert buf.to_host().tobytes() == b[n].to_host().tobytes(), n


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("mode", ["tensor", "expert"])
def test_cuda_two_ranks_share_cuda0(checkpoints, mode: str) -> None:
    """Two processes, both on cuda:0, each loading its half."""
    cases = [(str(checkpoints[k]), f, dict(o), mode) for k, f in (("qwen35", "qwen35moe"), ("gemma4", "gemma4"))
             for o in DTYPE_COMBOS[::2]]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker.mp_main, args=(r, 2, cases, q, "cuda:0")) for r in range(2)]
    for p in procs:
        p.start()
    out = dict(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert not any(isinstance(v, str) for v in out.values()), out
    _check(cases, out, 2)


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_available(), reason="no CUDA GPU")
def test_cuda_index_past_the_last_gpu_names_it() -> None:
    """One rank per GPU asks for cuda:N: the first N past the machine's GPUs
    is a DeviceError naming it (N > 0 that exists opens)."""
    n = 1
    while True:
        try:
            d = Device(f"cuda:{n}")
        except hf2q.DeviceError as e:
            assert f"cuda:{n}" in str(e) or f"GPU {n}" in str(e), str(e)
            break
        assert d.index == n and d.kind == "cuda"
        n += 1


def test_f32_source_shards_stage_only_their_ranges(tmp_path: Path) -> None:
    """F32 sources to BF16 (Gemma 4's golden F32 checkpoint): staged entries,
    the trimmed embedding too, read only their ranges. Both ranks, in this process."""
    src = Path(__file__).parent / "data" / "gemma4" / "gemma4_dense_f32_source" / "hf"
    for opts in ({"dense_dtype": "bf16"}, {"dense_dtype": "f32"}):
        case = (str(src), "gemma4", opts, "tensor")
        try:
            results = {r: [worker.load_rank(*case[:3], r, 2, "tensor")] for r in range(2)}
        finally:
            worker.remove_read_counter()
        _check([case], results, 2)


def test_a_split_numpy_step_runs_whole_then_slices() -> None:
    """An entry whose transform needs whole tensors (Qwen3.5's non-streamable
    steps): the sharded entry keeps the whole sources and slices the result."""
    from hf2q.plan import Piece, TensorPlan
    from hf2q.shard import shard_entry

    whole = np.arange(8 * 64, dtype=np.float32).reshape(8, 64)
    e = TensorPlan("blk.0.ffn_down.weight", (8, 64), "f32", (Piece("w", "f32", (8, 64)),),
                   transform=lambda arrays: arrays[0] * 2)
    for r in range(2):
        s = shard_entry(e, Split(1), Shard(r, 2))
        assert s is not None and s.shape == (8, 32) and s.sources == e.sources
        assert s.transform is not None
        np.testing.assert_array_equal(s.transform([whole]), (whole * 2)[:, r * 32:(r + 1) * 32])
    s = shard_entry(e, Split(1, parts=2), Shard(1, 2))
    assert s is not None and s.transform is not None
    np.testing.assert_array_equal(s.transform([whole]), np.concatenate([(whole * 2)[:, 16:32], (whole * 2)[:, 48:]], 1))


@pytest.mark.parametrize("case,dtype,reason", [("gptoss_mxfp4", "keep", "mxfp4"), ("gptoss_mxfp4", "bf16", "mxfp4"),
                                               ("qwen3_fp8_deepseek", "keep", "fp8 kept with scales")])
def test_unsliceable_formats_are_a_shard_error_at_plan_time(case: str, dtype: str, reason: str) -> None:
    # Refused before any buffer is allocated, naming the tensor (a ValueError from the
    # loader mid-load before; a kept FP8 weight was cut while its scales stayed whole).
    ck = Path(__file__).parent / "data" / "fp8" / case / "hf"
    with pytest.raises(ShardError) as ei:
        hf2q.load(ck, hf2q.Device("host"), dtype=dtype, shard=hf2q.Shard(0, 2), progress=False)
    assert ei.value.reason == reason and ei.value.tensor


def test_fp8_converted_shards_equal_the_whole_load_sliced() -> None:
    ck = Path(__file__).parent / "data" / "fp8" / "qwen3_fp8_deepseek" / "hf"
    dev = hf2q.Device("host")
    whole = hf2q.load(ck, dev, dtype="bf16", progress=False)
    halves = [hf2q.load(ck, dev, dtype="bf16", shard=hf2q.Shard(r, 2), progress=False) for r in range(2)]
    split = 0
    for name, buf in whole.named_buffers():
        a = np.asarray(buf.to_host()).view(np.uint8).reshape(buf.shape + (-1,))
        parts = [np.asarray(h[name].to_host()).view(np.uint8).reshape(h[name].shape + (-1,)) for h in halves]
        if parts[0].shape == a.shape:  # replicated
            assert all(np.array_equal(p, a) for p in parts), name
            continue
        axis = next(i for i, (x, y) in enumerate(zip(parts[0].shape, a.shape)) if x != y)
        assert np.array_equal(np.concatenate(parts, axis=axis), a), name
        split += 1
    assert split > 0
