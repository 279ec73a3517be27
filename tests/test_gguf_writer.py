"""hf2q.export.gguf (our GGUF v3 encoder) read back by gguf-py's reader, and
compared byte for byte with gguf-py's own writer for the same content."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

gguf = pytest.importorskip("gguf")

from hf2q.export.gguf import KV, GGUFEncodeError, TensorInfo, ValueType as T, encode_header, padded  # noqa: E402


def _write(path, kvs, tensors, datas) -> None:
    head, offsets = encode_header(kvs, tensors)
    with open(path, "wb") as f:
        f.write(head)
        for t, d, off in zip(tensors, datas, offsets):
            assert f.tell() - len(head) == off
            f.write(d)
            f.write(bytes(padded(len(d)) - len(d)))


def _gguf_py(path, kvs, tensors, datas) -> None:
    w = gguf.GGUFWriter(path, arch="llama")
    w.kv_data[0].clear()  # no implicit general.architecture: ours lists every key itself
    for kv in kvs:
        w.add_key_value(kv.key, kv.value, gguf.GGUFValueType(int(kv.type)),
                        sub_type=None if kv.sub_type is None else gguf.GGUFValueType(int(kv.sub_type)))
    for t, d in zip(tensors, datas):
        arr = np.frombuffer(d, dtype=np.uint8)
        if t.ggml_type == 0:
            arr = arr.view(np.float32).reshape(t.shape)
            w.add_tensor(t.name, arr)
        else:
            w.add_tensor(t.name, arr.reshape(*t.shape[:-1], -1), raw_dtype=gguf.GGMLQuantizationType(t.ggml_type))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


KVS = [
    KV("general.architecture", T.STRING, "llama"),
    KV("general.name", T.STRING, "tïny ✓"),
    KV("llama.block_count", T.UINT32, 4),
    KV("llama.rope.freq_base", T.FLOAT32, 1e6),
    KV("llama.attention.head_count_kv", T.ARRAY, [2, 1, 2, 1], T.INT32),
    KV("llama.attention.recurrent_layers", T.ARRAY, [True, False], T.BOOL),
    KV("tokenizer.ggml.tokens", T.ARRAY, ["a", "bé", ""], T.STRING),
    KV("tokenizer.ggml.scores", T.ARRAY, [0.5, -1.0], T.FLOAT32),
    KV("x.u8", T.UINT8, 255), KV("x.i8", T.INT8, -128), KV("x.u16", T.UINT16, 65535), KV("x.i16", T.INT16, -3),
    KV("x.i32", T.INT32, -7), KV("x.u64", T.UINT64, 2**64 - 1), KV("x.i64", T.INT64, -(2**63)),
    KV("x.f64", T.FLOAT64, 0.1), KV("x.bool", T.BOOL, True),
]


def test_same_bytes_as_gguf_py_and_read_back(tmp_path) -> None:
    rng = np.random.default_rng(0)
    datas = [rng.standard_normal(6).astype(np.float32).tobytes(), rng.integers(0, 255, 2 * 34, dtype=np.uint8).tobytes(),
             rng.standard_normal(8 * 3).astype(np.float32).tobytes()]
    tensors = [TensorInfo("a.weight", (6,), 0, 24), TensorInfo("b.weight", (2, 32), 8, 68),
               TensorInfo("c.weight", (8, 3), 0, 96)]
    ours, theirs = tmp_path / "ours.gguf", tmp_path / "theirs.gguf"
    _write(ours, KVS, tensors, datas)
    _gguf_py(theirs, KVS, tensors, datas)
    assert ours.read_bytes() == theirs.read_bytes()
    r = gguf.GGUFReader(ours)
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == [kv.key for kv in KVS]
    for kv in KVS:
        f = fields[kv.key]
        assert int(f.types[0]) == int(kv.type)
        got = f.contents()
        want = kv.value
        if kv.type == T.FLOAT32 or kv.sub_type == T.FLOAT32:
            np.testing.assert_array_equal(np.float32(got), np.float32(want))
        else:
            assert (got.tolist() if isinstance(got, np.ndarray) else got) == want
    assert [t.name for t in r.tensors] == ["a.weight", "b.weight", "c.weight"]
    for t, d in zip(r.tensors, datas):
        assert np.asarray(t.data).view(np.uint8).tobytes() == d


@pytest.mark.parametrize("kv, msg", [
    (KV("k", T.UINT32, -1), "does not fit"),
    (KV("k", T.UINT8, 256), "does not fit"),
    (KV("k", T.UINT32, 1.5), "integer expected"),
    (KV("k", T.BOOL, 1), "bool value expected"),
    (KV("k", T.STRING, 3), "string value expected"),
    (KV("k", T.ARRAY, [1, 2]), "element type"),
    (KV("k", T.ARRAY, [1, 2**40], T.INT32), "does not fit"),
    (KV("k", T.STRING, "\udc80"), "UTF-8"),
])
def test_bad_values_are_typed_errors(kv, msg) -> None:
    with pytest.raises(GGUFEncodeError, match=msg):
        encode_header([kv], [])


def test_duplicates_and_bad_shapes_refused() -> None:
    with pytest.raises(GGUFEncodeError, match="twice"):
        encode_header([KV("a", T.UINT32, 1), KV("a", T.UINT32, 2)], [])
    with pytest.raises(GGUFEncodeError, match="twice"):
        encode_header([], [TensorInfo("t", (1,), 0, 4), TensorInfo("t", (1,), 0, 4)])
    with pytest.raises(GGUFEncodeError, match="dimensions"):
        encode_header([], [TensorInfo("t", (1, 1, 1, 1, 1), 0, 4)])
    with pytest.raises(GGUFEncodeError, match="power of two"):
        encode_header([], [], alignment=48)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 70), st.integers(1, 5)), min_size=1, max_size=6),
       st.lists(st.text(max_size=12), max_size=5))
def test_offsets_and_strings_match_gguf_py(tmp_path_factory, shapes, strings) -> None:
    tmp = tmp_path_factory.mktemp("g")
    tensors, datas = [], []
    for i, (a, b) in enumerate(shapes):
        d = np.arange(a * b, dtype=np.float32).tobytes()
        tensors.append(TensorInfo(f"t{i}", (a, b), 0, len(d)))
        datas.append(d)
    kvs = [KV("general.architecture", T.STRING, "llama")]
    if strings:
        kvs.append(KV("s", T.ARRAY, strings, T.STRING))
    try:
        encode_header(kvs, tensors)
    except GGUFEncodeError:  # lone surrogates: not UTF-8; gguf-py would fail too
        return
    _write(tmp / "o.gguf", kvs, tensors, datas)
    _gguf_py(tmp / "t.gguf", kvs, tensors, datas)
    assert (tmp / "o.gguf").read_bytes() == (tmp / "t.gguf").read_bytes()
