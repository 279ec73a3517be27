"""Reference transforms (docs/QWEN35MOE.md) against independent
formulations, and an end-to-end check of every planned tensor of the tiny
checkpoints against an oracle written straight from the spec."""

from __future__ import annotations

import gguf
import ml_dtypes
import numpy as np
import pytest

from hf2q.qwen35 import (
    Qwen35Config,
    a_log_to_ssm_a,
    as_source_array,
    convert_reference,
    device_nbytes,
    norm_plus_one,
    plan_qwen35_moe,
    reorder_conv1d,
    reorder_in_proj_ab,
    reorder_in_proj_qkv,
    reorder_in_proj_z,
    reorder_out_proj,
    reorder_per_head,
    reorder_v_heads,
    split_gate_up,
    squeeze_conv1d,
    stack_experts_reference,
    to_device_dtype,
    transform_tensor,
)
from hf2q.testing.qwen35_checkpoint import make_qwen35_moe_checkpoint, read_checkpoint_arrays

BF16 = np.dtype(ml_dtypes.bfloat16)
rng = np.random.default_rng(1234)


def bf16(shape) -> np.ndarray:
    return (rng.standard_normal(shape).astype(np.float32)).astype(BF16)


def tiled_source_heads(nk: int, r: int) -> list[int]:
    """docs/QWEN35MOE.md (transform 7): grouped head k*r + j goes to tiled position j*nk + k.
    Returns src[dst] for dst = 0..nk*r-1."""
    src = [0] * (nk * r)
    for k in range(nk):
        for j in range(r):
            src[j * nk + k] = k * r + j
    return src


def head_rows(src_heads: list[int], width: int) -> np.ndarray:
    return np.array([h * width + d for h in src_heads for d in range(width)])


def loop_reorder(x: np.ndarray, axis: int, nk: int, r: int, width: int, start: int = 0) -> np.ndarray:
    """Block-by-block copy (no reshape/transpose)."""
    y = x.copy()
    xa, ya = np.moveaxis(x, axis, 0), np.moveaxis(y, axis, 0)
    for k in range(nk):
        for j in range(r):
            s, d = start + (k * r + j) * width, start + (j * nk + k) * width
            ya[d:d + width] = xa[s:s + width]
    return y


@pytest.mark.parametrize("nk,nv,dk,dv", [(2, 6, 32, 64), (3, 6, 8, 4), (16, 32, 128, 128), (4, 4, 8, 8), (1, 5, 2, 3)])
def test_reorders_vs_loops(nk: int, nv: int, dk: int, dv: int) -> None:
    r = nv // nk
    H, K = 7, 4
    C = 2 * nk * dk + nv * dv
    src = tiled_source_heads(nk, r)
    qk = 2 * nk * dk

    qkv = bf16((C, H))
    got = reorder_in_proj_qkv(qkv, nk, nv, dk, dv)
    assert got.dtype == BF16 and got.shape == qkv.shape
    assert np.array_equal(got.view(np.uint16), loop_reorder(qkv, 0, nk, r, dv, start=qk).view(np.uint16))
    assert np.array_equal(got[:qk].view(np.uint16), qkv[:qk].view(np.uint16))  # Q, K untouched
    assert np.array_equal(got[qk:].view(np.uint16), qkv[qk:][head_rows(src, dv)].view(np.uint16))

    z = bf16((nv * dv, H))
    assert np.array_equal(reorder_in_proj_z(z, nk, nv, dv).view(np.uint16), z[head_rows(src, dv)].view(np.uint16))

    a = bf16((nv, H))
    assert np.array_equal(reorder_in_proj_ab(a, nk, nv).view(np.uint16), a[src].view(np.uint16))

    alog = rng.standard_normal(nv).astype(np.float32)
    assert np.array_equal(reorder_per_head(alog, nk, nv), alog[src])

    conv = bf16((C, 1, K))
    sq = squeeze_conv1d(conv)
    assert sq.shape == (C, K) and np.array_equal(sq.view(np.uint16), conv[:, 0, :].view(np.uint16))
    rows = np.concatenate([np.arange(qk), qk + head_rows(src, dv)])
    assert np.array_equal(reorder_conv1d(sq, nk, nv, dk, dv).view(np.uint16), sq[rows].view(np.uint16))

    out = bf16((H, nv * dv))
    got = reorder_out_proj(out, nk, nv, dv)
    assert np.array_equal(got.view(np.uint16), out[:, head_rows(src, dv)].view(np.uint16))
    assert np.array_equal(got.view(np.uint16), loop_reorder(out, 1, nk, r, dv).view(np.uint16))
    if nk == nv:
        assert np.array_equal(got.view(np.uint16), out.view(np.uint16))


@pytest.mark.parametrize("nk,nv,dk,dv", [(2, 6, 32, 64), (3, 6, 8, 4), (16, 32, 128, 128), (4, 4, 8, 8), (1, 5, 2, 3),
                                         (5, 15, 1, 1), (4, 12, 2, 1)])
def test_reorders_in_place_match_the_copies(nk: int, nv: int, dk: int, dv: int) -> None:
    """``in_place=True`` moves the blocks of the given array (every cycle of
    the permutation, fixed points included) and returns it: the same bytes
    as the copying reorder, which leaves its input alone."""
    H, K = 5, 4
    C = 2 * nk * dk + nv * dv
    cases = [
        (reorder_in_proj_qkv, (C, H), (nk, nv, dk, dv)),
        (reorder_conv1d, (C, K), (nk, nv, dk, dv)),
        (reorder_in_proj_z, (nv * dv, H), (nk, nv, dv)),
        (reorder_in_proj_ab, (nv, H), (nk, nv)),
        (reorder_per_head, (nv,), (nk, nv)),
        (reorder_out_proj, (H, nv * dv), (nk, nv, dv)),
    ]
    for fn, shape, args in cases:
        x = bf16(shape)
        keep = x.copy()
        want = fn(x, *args)
        assert np.array_equal(x.view(np.uint16), keep.view(np.uint16)), fn.__name__  # the copy leaves x alone
        got = fn(x, *args, in_place=True)
        assert got is x, fn.__name__
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), fn.__name__
    with pytest.raises(ValueError, match="read-only"):
        ro = bf16((nv * dv, H))
        ro.flags.writeable = False
        reorder_in_proj_z(ro, nk, nv, dv, in_place=True)
    with pytest.raises(ValueError, match="must hold"):  # the same checks as the copy
        reorder_in_proj_z(bf16((nv * dv + 1, H)), nk, nv, dv, in_place=True)


@pytest.mark.parametrize("scratch", [64, 512 << 10])  # along a later axis: many chunks of leading rows, or one
def test_reorder_v_heads_in_place_on_any_axis_and_layout(monkeypatch, scratch: int) -> None:
    from hf2q.models.qwen35 import transforms

    monkeypatch.setattr(transforms, "_SCRATCH_BYTES", scratch)
    for nk, r, hd in ((2, 3, 4), (3, 2, 1), (1, 4, 2), (4, 1, 3), (6, 5, 1)):
        n = nk * r * hd
        for shape, axis in (((n,), 0), ((n, 3), 0), ((3, n), 1), ((2, n, 3), 1), ((2, 3, n), -1), ((37, n), 1),
                            ((0, n), 1), ((5, 2, n), 2)):
            x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
            for view in (x.copy(), np.asfortranarray(x), x.copy()[..., ::-1] if shape[-1] == n and axis != -1 else x.copy()):
                want = reorder_v_heads(view, axis, nk, r, hd)
                got = reorder_v_heads(view, axis, nk, r, hd, in_place=True)
                assert got is view and np.array_equal(got, want), (nk, r, hd, shape, axis)


def test_reorder_v_heads_is_a_permutation_and_checks_shape() -> None:
    x = np.arange(2 * 3 * 4).reshape(24)
    y = reorder_v_heads(x, 0, 2, 3, 4)
    assert sorted(y.tolist()) == x.tolist()
    # tiled head 1 (j=0, k=1) is grouped head 3 (k=1, j=0)
    assert y[4:8].tolist() == x[12:16].tolist()
    with pytest.raises(ValueError, match="must hold"):
        reorder_v_heads(x, 0, 2, 2, 4)


def test_a_log_to_ssm_a() -> None:
    a = np.concatenate([rng.uniform(-20, 5, 100_000), [0.0, -0.0, 1.0, np.log(16.0)]]).astype(np.float32)
    got = a_log_to_ssm_a(a)
    assert got.dtype == np.float32 and got.shape == a.shape
    # correctly rounded float32 of -exp(a) ...
    assert np.array_equal(got, (-np.exp(a.astype(np.float64))).astype(np.float32))
    # ... hence within 1 ULP of any float32 exp with <= 1 ULP error (torch's, which llama.cpp
    # uses); numpy's own float32 exp is only good to ~2.5 ULP, so it is checked loosely
    f32 = -np.exp(a)
    ulp = np.abs(got.view(np.int32).astype(np.int64) - f32.view(np.int32).astype(np.int64))
    assert ulp.max() <= 3
    # BF16 A_log: widened exactly first
    b = a[:1000].astype(BF16)
    assert np.array_equal(a_log_to_ssm_a(b), (-np.exp(b.astype(np.float64))).astype(np.float32))
    assert np.all(got < 0)


def test_norm_plus_one() -> None:
    x = bf16(4096)
    got = norm_plus_one(x)
    widened = (x.view(np.uint16).astype(np.uint32) << 16).view(np.float32)  # BF16 -> F32 is bits << 16
    assert got.dtype == np.float32 and np.array_equal(got, widened + np.float32(1.0))
    h = rng.standard_normal(100).astype(np.float16)
    assert np.array_equal(norm_plus_one(h), h.astype(np.float32) + np.float32(1))
    f = rng.standard_normal(100).astype(np.float32)
    assert np.array_equal(norm_plus_one(f), f + np.float32(1))


def test_squeeze_conv1d_errors() -> None:
    with pytest.raises(ValueError, match=r"\[C, 1, K\]"):
        squeeze_conv1d(np.zeros((8, 2, 4), np.float32))
    assert squeeze_conv1d(np.zeros((8, 4), np.float32)).shape == (8, 4)


def test_split_and_stack() -> None:
    E, I, H = 3, 4, 5
    gates = [bf16((I, H)) for _ in range(E)]
    ups = [bf16((I, H)) for _ in range(E)]
    downs = [bf16((H, I)) for _ in range(E)]
    fused = np.empty((E, 2 * I, H), BF16)
    for e in range(E):
        fused[e, :I], fused[e, I:] = gates[e], ups[e]
    g, u = split_gate_up(fused, "gate"), split_gate_up(fused, "up")
    st_g, st_u, st_d = (stack_experts_reference(x) for x in (gates, ups, downs))
    assert st_g.shape == (E, I, H) and st_d.shape == (E, H, I) and st_g.dtype == BF16
    for e in range(E):
        assert np.array_equal(st_g[e].view(np.uint16), gates[e].view(np.uint16))
        assert np.array_equal(st_d[e].view(np.uint16), downs[e].view(np.uint16))
    assert np.array_equal(g.view(np.uint16), st_g.view(np.uint16))
    assert np.array_equal(u.view(np.uint16), st_u.view(np.uint16))
    with pytest.raises(ValueError, match="2\\*I"):
        split_gate_up(np.zeros((2, 3, 4), np.float32), "gate")
    with pytest.raises(ValueError, match="half"):
        split_gate_up(fused, "down")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shape"):
        stack_experts_reference([gates[0], downs[0]])
    with pytest.raises(ValueError, match="dtype"):
        stack_experts_reference([gates[0], gates[1].astype(np.float32)])
    with pytest.raises(ValueError):
        stack_experts_reference([])


def test_device_dtypes() -> None:
    x = bf16((4, 64))
    f = to_device_dtype(x, "f32")
    assert f.dtype == np.float32 and np.array_equal(f, x.astype(np.float32))
    assert to_device_dtype(x, "bf16").dtype == BF16
    q = to_device_dtype(x, "q8_0")
    assert q.dtype == np.uint8 and q.nbytes == device_nbytes((4, 64), "q8_0") == 4 * 2 * 34
    assert np.array_equal(q, gguf.quants.quantize(x.astype(np.float32), gguf.GGMLQuantizationType.Q8_0))
    y = rng.standard_normal((3, 32)).astype(np.float32)
    assert np.array_equal(to_device_dtype(y, "bf16").view(np.uint16), y.astype(BF16).view(np.uint16))
    with pytest.raises(ValueError):
        device_nbytes((3, 48), "q8_0")
    assert np.array_equal(to_device_dtype(y, "f16").view(np.uint16), y.astype(np.float16).view(np.uint16))
    assert np.array_equal(to_device_dtype(x.astype(BF16), "f16").view(np.uint16),
                          x.astype(BF16).astype(np.float32).astype(np.float16).view(np.uint16))
    with pytest.raises(ValueError):
        to_device_dtype(y, "q4_0")
    assert as_source_array(x.view(np.uint16), "BF16").dtype == BF16
    with pytest.raises(TypeError):
        as_source_array(x, "F32")


# ----------------------------------------------------------------------------- end to end, tiny
def oracle(gguf_name: str, arr: dict[str, np.ndarray], c: Qwen35Config, prefix: str, fused: bool) -> np.ndarray:
    """Final logical float32 array of one GGUF tensor, straight from docs/QWEN35MOE.md with index arrays."""
    nk, nv, dk, dv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    L, E = c.num_hidden_layers, c.num_experts
    src = tiled_source_heads(nk, nv // nk)
    qk = 2 * nk * dk
    f32 = lambda a: a.astype(np.float32)  # noqa: E731
    glob = {"token_embd.weight": (f"{prefix}embed_tokens.weight", False), "output.weight": ("lm_head.weight", False),
            "output_norm.weight": (f"{prefix}norm.weight", True)}
    if gguf_name in glob:
        n, plus = glob[gguf_name]
        return f32(arr[n]) + np.float32(1) if plus else f32(arr[n])
    _, b, rest = gguf_name.split(".", 2)
    b = int(b)
    p = f"{prefix}layers.{b}." if b < L else f"mtp.layers.{b - L}."
    nextn = {"nextn.eh_proj.weight": ("mtp.fc.weight", False), "nextn.enorm.weight": ("mtp.pre_fc_norm_embedding.weight", True),
             "nextn.hnorm.weight": ("mtp.pre_fc_norm_hidden.weight", True), "nextn.shared_head_norm.weight": ("mtp.norm.weight", True)}
    if rest in nextn:
        n, plus = nextn[rest]
        return f32(arr[n]) + np.float32(1) if plus else f32(arr[n])
    plain = {"attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
             "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
             "ffn_gate_inp.weight": "mlp.gate.weight", "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
             "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight", "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
             "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight", "ssm_norm.weight": "linear_attn.norm.weight"}
    if rest in plain:
        return f32(arr[p + plain[rest]])
    plus1 = {"attn_norm.weight": "input_layernorm.weight", "post_attention_norm.weight": "post_attention_layernorm.weight",
             "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight"}
    if rest in plus1:
        return f32(arr[p + plus1[rest]]) + np.float32(1)
    la = p + "linear_attn."
    if rest == "attn_qkv.weight":
        return f32(arr[la + "in_proj_qkv.weight"])[np.concatenate([np.arange(qk), qk + head_rows(src, dv)])]
    if rest == "attn_gate.weight":
        return f32(arr[la + "in_proj_z.weight"])[head_rows(src, dv)]
    if rest == "ssm_alpha.weight":
        return f32(arr[la + "in_proj_a.weight"])[src]
    if rest == "ssm_beta.weight":
        return f32(arr[la + "in_proj_b.weight"])[src]
    if rest == "ssm_a":
        return (-np.exp(arr[la + "A_log"].astype(np.float64)[src])).astype(np.float32)  # compared within 1 ULP
    if rest == "ssm_dt.bias":
        return f32(arr[la + "dt_bias"])[src]
    if rest == "ssm_conv1d.weight":
        return f32(arr[la + "conv1d.weight"])[:, 0, :][np.concatenate([np.arange(qk), qk + head_rows(src, dv)])]
    if rest == "ssm_out.weight":
        return f32(arr[la + "out_proj.weight"])[:, head_rows(src, dv)]
    proj = rest.split("_")[1]  # ffn_gate_exps -> gate
    if fused:
        if proj == "down":
            return f32(arr[p + "mlp.experts.down_proj"])
        gu = f32(arr[p + "mlp.experts.gate_up_proj"])
        half = gu.shape[1] // 2
        return gu[:, :half] if proj == "gate" else gu[:, half:]
    return np.array([f32(arr[f"{p}mlp.experts.{e}.{proj}_proj.weight"]) for e in range(E)])


def device_oracle(x: np.ndarray, dtype: str) -> np.ndarray:
    x = np.ascontiguousarray(x)
    if dtype == "f32":
        return x
    if dtype == "bf16":
        return x.astype(BF16)
    return gguf.quants.quantize(np.ascontiguousarray(x), gguf.GGMLQuantizationType.Q8_0)


VARIANTS = [
    dict(fused_gate_up=False, sharded=False, multimodal=False),
    dict(fused_gate_up=True, sharded=False, multimodal=False),
    dict(fused_gate_up=False, sharded=True, multimodal=True),
    dict(fused_gate_up=True, sharded=True, multimodal=True),
]


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> list:
    out = []
    for i, v in enumerate(VARIANTS):
        d = make_qwen35_moe_checkpoint(tmp_path_factory.mktemp(f"tiny{i}"), "tiny", seed=7, **v)
        out.append((v, d, read_checkpoint_arrays(d)))
    return out


def planned_outputs(d, arr, dense: str, expert: str) -> dict[str, np.ndarray]:
    c = Qwen35Config.from_file(d)
    plan = plan_qwen35_moe({k: (a.dtype, a.shape) for k, a in arr.items()}, c, dense_dtype=dense, expert_dtype=expert)
    return {t.gguf_name: convert_reference(t, [arr[s.name] for s in t.sources], c) for t in plan}


@pytest.mark.parametrize("dense,expert", [("f32", "q8_0"), ("q8_0", "q8_0"), ("bf16", "f32")])
def test_end_to_end_vs_oracle(tiny_dirs, dense: str, expert: str) -> None:
    for v, d, arr in tiny_dirs:
        c = Qwen35Config.from_file(d)
        plan = plan_qwen35_moe({k: (a.dtype, a.shape) for k, a in arr.items()}, c, dense_dtype=dense, expert_dtype=expert)
        assert len(plan) == 96
        prefix = "model.language_model." if v["multimodal"] else "model."
        for t in plan:
            got = convert_reference(t, [arr[s.name] for s in t.sources], c)
            want_logical = oracle(t.gguf_name, arr, c, prefix, v["fused_gate_up"])
            assert want_logical.shape == t.shape, t.gguf_name
            assert got.nbytes == t.nbytes, t.gguf_name
            if t.gguf_name.endswith("ssm_a"):
                ulp = np.abs(got.view(np.int32).astype(np.int64) - want_logical.view(np.int32).astype(np.int64))
                assert got.dtype == np.float32 and ulp.max() <= 1, t.gguf_name
                continue
            want = device_oracle(want_logical, t.dtype)
            assert got.dtype == want.dtype and got.shape == want.shape, t.gguf_name
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), t.gguf_name


def test_variants_hold_the_same_weights(tiny_dirs) -> None:
    outs = [planned_outputs(d, arr, "q8_0", "q8_0") for _, d, arr in tiny_dirs]
    for o in outs[1:]:
        assert o.keys() == outs[0].keys()
        for k in o:
            assert np.array_equal(o[k].view(np.uint8), outs[0][k].view(np.uint8)), k


def test_transform_tensor_keeps_bf16_and_checks_inputs(tiny_dirs) -> None:
    _, d, arr = tiny_dirs[0]
    c = Qwen35Config.from_file(d)
    plan = plan_qwen35_moe({k: (a.dtype, a.shape) for k, a in arr.items()}, c)
    t = plan["blk.0.attn_qkv.weight"]
    x = transform_tensor(t, [arr[s.name] for s in t.sources], c)
    assert x.dtype == BF16 and x.shape == t.shape  # permutation: exact in BF16
    raw = transform_tensor(t, [arr[s.name].view(np.uint16) for s in t.sources], c)  # raw bits accepted
    assert np.array_equal(raw.view(np.uint16), x.view(np.uint16))
    assert transform_tensor(plan["blk.0.ssm_a"], [arr["model.layers.0.linear_attn.A_log"]], c).dtype == np.float32
    assert transform_tensor(plan["blk.0.attn_norm.weight"], [arr["model.layers.0.input_layernorm.weight"]], c).dtype == np.float32
    g = plan["blk.1.ffn_gate_exps.weight"]
    srcs = [arr[s.name] for s in g.sources]
    # pieces may come in any order: the plan's expert indices decide the slot
    rev = type(g)(**{**g.__dict__, "sources": tuple(reversed(g.sources))})
    assert np.array_equal(transform_tensor(rev, srcs[::-1], c).view(np.uint16), transform_tensor(g, srcs, c).view(np.uint16))
    with pytest.raises(ValueError, match="sources"):
        transform_tensor(t, [], c)
    with pytest.raises(ValueError, match="shape"):
        transform_tensor(t, [arr["model.layers.0.linear_attn.in_proj_z.weight"]], c)
    with pytest.raises(TypeError):
        transform_tensor(t, [arr[t.sources[0].name].astype(np.float32)], c)


def test_transform_tensor_consume(tiny_dirs) -> None:
    """``consume=True`` (the loader's own reads) may reorder in place: every
    planned tensor comes out byte for byte as without it; without it the
    sources are never written."""
    for v, d, arr in tiny_dirs:
        c = Qwen35Config.from_file(d)
        plan = plan_qwen35_moe({k: (a.dtype, a.shape) for k, a in arr.items()}, c)
        moved = 0
        for t in plan:
            if t.transforms and set(t.transforms) <= {"fused_split", "stack_experts"}:
                continue  # streamed by the loader
            srcs = [arr[s.name] for s in t.sources]
            keep = [a.copy() for a in srcs]
            want = transform_tensor(t, srcs, c)
            assert all(np.array_equal(a.view(np.uint8), k.view(np.uint8)) for a, k in zip(srcs, keep)), t.gguf_name
            mine = [a.copy() for a in srcs]
            got = transform_tensor(t, mine, c, consume=True)
            assert got.dtype == want.dtype and got.shape == want.shape and got.flags.c_contiguous, t.gguf_name
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), t.gguf_name
            moved += any(np.shares_memory(got, m) for m in mine)
            # read-only or raw-bit sources: still the same result
            ro = [a.copy() for a in srcs]
            for a in ro:
                a.flags.writeable = False
            assert np.array_equal(transform_tensor(t, ro, c, consume=True).view(np.uint8), want.view(np.uint8))
            if all(a.dtype == BF16 for a in srcs):
                raw = transform_tensor(t, [a.copy().view(np.uint16) for a in srcs], c, consume=True)
                assert np.array_equal(raw.view(np.uint8), want.view(np.uint8)), t.gguf_name
                # raw_bf16 (the loader's reads): BF16 bits stay uint16, the widening transforms read them exactly
                bits = transform_tensor(t, [a.copy().view(np.uint16) for a in srcs], c, consume=True, raw_bf16=True)
                assert bits.dtype == (np.uint16 if want.dtype == BF16 else want.dtype), t.gguf_name
                assert np.array_equal(bits.view(np.uint8), want.view(np.uint8)), t.gguf_name
        assert moved >= 3 * 4  # qkv, z, a, b (and conv1d, A_log, dt_bias) of the 3 linear layers, in place
