// nanobind glue for hf2q._core: argument conversion and GIL release only.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "../kernels/checked_ops.h"
#include "../device/dtype.h"
#include "../device/header_scan.h"
#include "../device/reader.h"
#include "../kernels/formats.h"
#include "../kernels/kernels.h"
#include "../kernels/mxfp4.h"
#include "../kernels/thread_pool.h"
#include "release_gil.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using RoBytes = nb::ndarray<const std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using RwBytes = nb::ndarray<std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using RoU32 = nb::ndarray<const std::uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using RwU16 = nb::ndarray<std::uint16_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

}  // namespace

void bind_device(nb::module_& m);

namespace {

// A string object for `v`, made once per distinct value while `cache` holds
// fewer than kMaxCachedStrings of them (the few dtype names of a header, the
// shard names of an index); past that, a new one each time: a crafted file
// with a distinct value per tensor costs a linear scan of a bounded list at most.
constexpr std::size_t kMaxCachedStrings = 64;

// The scans' Python objects, built with the C API (one of each per tensor of a
// 60,000-tensor header): a str from UTF-8 bytes, an int from a u64.
nb::object utf8(std::string_view v) {
  PyObject* o = PyUnicode_DecodeUTF8(v.data(), static_cast<Py_ssize_t>(v.size()), "strict");
  if (o == nullptr) throw nb::python_error();
  return nb::steal(o);
}

nb::object u64(std::uint64_t v) {
  PyObject* o = PyLong_FromUnsignedLongLong(v);
  if (o == nullptr) throw nb::python_error();
  return nb::steal(o);
}

nb::object cached(std::vector<std::pair<std::string_view, nb::object>>& cache, std::string_view v) {
  for (const auto& e : cache) {
    if (e.first == v) return e.second;
  }
  nb::object obj = utf8(v);
  if (cache.size() < kMaxCachedStrings) cache.emplace_back(v, obj);
  return obj;
}

// A scanned tensor's shape as a tuple of ints.
nb::object shape_tuple(const hf2q::device::ScannedHeader& h, const hf2q::device::ScannedHeader::Tensor& t) {
  PyObject* shape = PyTuple_New(static_cast<Py_ssize_t>(t.ndims));
  if (shape == nullptr) throw nb::python_error();
  nb::object obj = nb::steal(shape);
  for (std::size_t i = 0; i < t.ndims; ++i) {
    // PyTuple_SetItem (it steals the reference), not the macro: the stable ABI (abi3 wheels) has only the function.
    if (PyTuple_SetItem(shape, static_cast<Py_ssize_t>(i), u64(h.dims[t.dims_begin + i]).release().ptr()) != 0) {
      throw nb::python_error();
    }
  }
  return obj;
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "hf2q native core: conversion kernels and device buffers";
  // We live inside other people's processes: no output unless asked. A daemon
  // thread holding a buffer at interpreter exit is not a leak worth a message.
  nb::set_leak_warnings(false);

  m.def(
      "bf16_to_f32",
      [](RoBytes src, RwBytes out) {
        hf2q::bindings::ReleaseGil nogil;
        hf2q::ops::bf16_to_f32(src.data(), src.size(), out.data(), out.size());
      },
      "src"_a.noconvert(), "out"_a.noconvert());
  m.def(
      "f16_to_f32",
      [](RoBytes src, RwBytes out) {
        hf2q::bindings::ReleaseGil nogil;
        hf2q::ops::f16_to_f32(src.data(), src.size(), out.data(), out.size());
      },
      "src"_a.noconvert(), "out"_a.noconvert());
  m.def(
      "quantize_q8_0",
      [](RoBytes src, const std::string& src_dtype, RwBytes out) {
        const hf2q::DType t = hf2q::device::dtype_from_name(src_dtype);
        hf2q::kernels::Q8Result r;
        {
          hf2q::bindings::ReleaseGil nogil;
          r = hf2q::ops::quantize_q8_0(t, src.data(), src.size(), out.data(), out.size());
        }
        const long long first = r.first_nonfinite == hf2q::kernels::kNoIndex
                                    ? -1
                                    : static_cast<long long>(r.first_nonfinite);
        return std::make_pair(first, static_cast<unsigned long long>(r.inf_scales));
      },
      "src"_a.noconvert(), "src_dtype"_a, "out"_a.noconvert(),
      "Returns (first non-finite flat index or -1, number of +Inf scales).");
  m.def(
      "dequantize_q8_0",
      [](RoBytes src, RwBytes out) {
        hf2q::bindings::ReleaseGil nogil;
        hf2q::ops::dequantize_q8_0(src.data(), src.size(), out.data(), out.size());
      },
      "src"_a.noconvert(), "out"_a.noconvert());
  m.def(
      "quantize_blocks",
      [](RoBytes src, const std::string& src_dtype, const std::string& format, RwBytes out) {
        const hf2q::DType s = hf2q::device::dtype_from_name(src_dtype);
        const hf2q::DType d = hf2q::device::dtype_from_name(format);
        hf2q::kernels::EncodeResult r;
        {
          hf2q::bindings::ReleaseGil nogil;
          r = hf2q::ops::encode(d, s, src.data(), src.size(), out.data(), out.size());
        }
        const long long first = r.first_nonfinite == hf2q::kernels::kNoIndex
                                    ? -1
                                    : static_cast<long long>(r.first_nonfinite);
        return std::make_pair(first, static_cast<unsigned long long>(r.inf_scales));
      },
      "src"_a.noconvert(), "src_dtype"_a, "format"_a, "out"_a.noconvert(),
      "Encode into a block format through its row's kernels; returns (first non-finite flat index or -1, "
      "blocks with an Inf scale).");
  m.def(
      "dequantize_blocks",
      [](RoBytes src, const std::string& format, RwBytes out) {
        const hf2q::DType t = hf2q::device::dtype_from_name(format);
        hf2q::bindings::ReleaseGil nogil;
        hf2q::ops::to_f32(t, src.data(), src.size(), out.data(), out.size());
      },
      "src"_a.noconvert(), "format"_a, "out"_a.noconvert());
  m.def(
      "scaled_fp8",
      [](RoBytes w, const std::string& w_dtype, RoBytes scale, const std::string& scale_dtype,
         std::tuple<std::size_t, std::size_t, std::size_t> shape, std::tuple<std::size_t, std::size_t> block,
         const std::string& out_dtype, RwBytes out) {
        hf2q::kernels::ScaledFp8 s;
        s.weight = hf2q::device::dtype_from_name(w_dtype);
        s.scale = hf2q::device::dtype_from_name(scale_dtype);
        s.lead = std::get<0>(shape);
        s.rows = std::get<1>(shape);
        s.cols = std::get<2>(shape);
        s.block_rows = std::get<0>(block);
        s.block_cols = std::get<1>(block);
        if (s.block_rows == 0 || s.block_cols == 0) throw std::invalid_argument("an FP8 scale block has no zero dimension");
        s.scale_rows = s.rows / s.block_rows + (s.rows % s.block_rows != 0);
        s.scale_cols = s.cols / s.block_cols + (s.cols % s.block_cols != 0);
        const hf2q::DType o = hf2q::device::dtype_from_name(out_dtype);
        hf2q::kernels::EncodeResult r;
        {
          hf2q::bindings::ReleaseGil nogil;
          r = hf2q::ops::scaled_fp8(s, w.data(), w.size(), scale.data(), scale.size(), o, out.data(), out.size());
        }
        const long long first = r.first_nonfinite == hf2q::kernels::kNoIndex
                                    ? -1
                                    : static_cast<long long>(r.first_nonfinite);
        return std::make_pair(first, static_cast<unsigned long long>(r.inf_scales));
      },
      "w"_a.noconvert(), "w_dtype"_a, "scale"_a.noconvert(), "scale_dtype"_a, "shape"_a, "block"_a, "out_dtype"_a,
      "out"_a.noconvert(),
      "A scaled FP8 tensor [lead, rows, cols] (its scale grid: one value per block of `block`, edge blocks "
      "partial) decoded into out_dtype (f32, bf16, f16, q8_0); returns (first non-finite flat index or -1, "
      "Q8_0 blocks with an Inf scale).");
  m.def(
      "mxfp4_repack",
      [](RoBytes packed, RoBytes scales, RwBytes out) {
        const std::size_t n = scales.size();
        if (packed.size() / 16 != n || packed.size() % 16 != 0) {
          throw std::invalid_argument("packed holds " + std::to_string(packed.size()) + " bytes, expected 16 per scale (" +
                                      std::to_string(n) + " scales)");
        }
        if (out.size() / 17 != n || out.size() % 17 != 0) {
          throw std::invalid_argument("out holds " + std::to_string(out.size()) + " bytes, expected 17 per block (" +
                                      std::to_string(n) + " blocks)");
        }
        hf2q::bindings::ReleaseGil nogil;
        hf2q::kernels::mxfp4_repack(packed.data(), scales.data(), out.data(), n);
      },
      "packed"_a.noconvert(), "scales"_a.noconvert(), "out"_a.noconvert(),
      "MXFP4 as gpt-oss stores it (16 bytes per block, element 2i in the low nibble of byte i; one E8M0 byte per "
      "block) into ggml block_mxfp4 (17 bytes per block).");
  m.def(
      "f32_to_f16_rne",
      [](RoU32 src, RwU16 out) {
        if (src.size() != out.size()) throw std::invalid_argument("src and out sizes differ");
        hf2q::bindings::ReleaseGil nogil;
        for (std::size_t i = 0; i < src.size(); ++i) {
          float f;
          std::memcpy(&f, src.data() + i, 4);
          out.data()[i] = hf2q::kernels::f32_to_f16_rne(f);
        }
      },
      "src"_a.noconvert(), "out"_a.noconvert(),
      "Scalar float32 bits -> float16 bits (the Q8_0 scale conversion); for tests.");

  m.def("get_num_threads", &hf2q::get_num_threads);
  m.def("set_num_threads", [](int n) {
    if (n < 1 || n > hf2q::kMaxThreads) {
      throw std::invalid_argument("number of threads must be in [1, " + std::to_string(hf2q::kMaxThreads) +
                                  "], got " + std::to_string(n));
    }
    hf2q::bindings::ReleaseGil nogil;
    hf2q::set_num_threads(n);
  }, "n"_a);
  m.def(
      "_parallel_probe",
      [](std::size_t chunks, double chunk_seconds, bool wait_for_pool) {
        // Tests: a parallel_for of `chunks` sleeping chunks; (threads it ran
        // on, CLOCK_MONOTONIC seconds when its first chunk began and its last
        // one ended: time.monotonic()'s clock). 1 thread: it ran inline.
        hf2q::bindings::ReleaseGil nogil;
        auto now = [] {
          timespec ts{};
          clock_gettime(CLOCK_MONOTONIC, &ts);
          return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
        };
        std::mutex mu;
        std::set<std::thread::id> ids;
        double first = 0.0, last = 0.0;
        hf2q::parallel_for(
            chunks, 1,
            [&](std::size_t, std::size_t) {
              const double begin = now();
              std::this_thread::sleep_for(std::chrono::duration<double>(chunk_seconds));
              const double end = now();
              std::lock_guard<std::mutex> lk(mu);
              ids.insert(std::this_thread::get_id());
              first = first == 0.0 ? begin : std::min(first, begin);
              last = std::max(last, end);
            },
            wait_for_pool ? hf2q::WhenBusy::kWait : hf2q::WhenBusy::kInline);
        return std::make_tuple(ids.size(), first, last);
      },
      "chunks"_a, "chunk_seconds"_a, "wait_for_pool"_a);
  m.def("simd_isa", [] { return std::string(hf2q::kernels::isa_name(hf2q::kernels::active_isa())); });
  m.def("best_isa", [] { return std::string(hf2q::kernels::isa_name(hf2q::kernels::best_isa())); });
  m.def("set_simd_enabled", &hf2q::kernels::set_simd_enabled, "enabled"_a);
  m.def("simd_enabled", &hf2q::kernels::simd_enabled);

  m.def(
      "format_table",
      [] {
        std::vector<std::tuple<std::string, int, std::size_t, std::size_t, std::string, std::string, int, bool, bool>>
            rows;
        for (const hf2q::FormatRow& r : hf2q::kFormats) {
          const bool encodes = r.kernels != nullptr && r.kernels->encode != nullptr;
          const bool decodes = r.kernels != nullptr && r.kernels->to_f32 != nullptr;
          rows.emplace_back(r.name, r.id, r.block_elems, r.block_bytes, r.numpy, r.safetensors, r.gguf_type, encodes,
                            decodes);
        }
        return rows;
      },
      "The native format table: (name, id, block_elems, block_bytes, numpy, safetensors, gguf_type, encodes, "
      "decodes) rows; encodes / decodes: the row's kernels have an encode / a to_f32.");

  m.def(
      "read_file",
      [](int fd, std::uint64_t offset, RwBytes out, std::size_t chunk) {
        hf2q::bindings::ReleaseGil nogil;
        hf2q::device::read_range(fd, out.data(), out.size(), offset, chunk);
      },
      "fd"_a, "offset"_a, "out"_a.noconvert(), "chunk"_a = 0,
      "pread exactly out.size bytes at offset into out, in parallel chunks (0: the default size); "
      "raises FileReadError with .code 'FileTruncated' or 'Io'.");
  m.attr("READ_CHUNK_BYTES") = hf2q::device::kReadChunkBytes;
  m.def(
      "scan_header",
      [](nb::bytes header, std::optional<std::uint64_t> data_bytes,
         std::optional<std::vector<std::pair<std::string, unsigned>>> dtype_bits) -> nb::object {
        hf2q::device::ScannedHeader h;
        bool plain = false, laid_out = false;
        std::vector<std::pair<std::string_view, unsigned>> bits;
        if (dtype_bits) {
          for (const auto& d : *dtype_bits) bits.emplace_back(d.first, d.second);
        }
        {
          hf2q::bindings::ReleaseGil nogil;  // the bytes object is immutable and held by the caller
          plain = hf2q::device::scan_header(header.c_str(), header.size(), &h);
          if (plain && data_bytes && dtype_bits) laid_out = hf2q::device::check_layout(&h, *data_bytes, bits);
        }
        if (!plain) return nb::none();
        // Built with the C API: one tuple per tensor of a 60,000-tensor header.
        nb::dict meta;
        for (const auto& kv : h.metadata) meta[utf8(kv.first)] = utf8(kv.second);
        nb::list out;
        std::vector<std::pair<std::string_view, nb::object>> dtypes;  // the few distinct dtype strings, made once
        for (const auto& t : h.tensors) {
          nb::object dt = cached(dtypes, t.dtype);
          nb::object shape_obj = shape_tuple(h, t);
          out.append(nb::make_tuple(u64(t.begin), u64(t.end), utf8(t.name), dt, shape_obj));
        }
        return nb::make_tuple(meta, out, laid_out);
      },
      "header"_a, "data_bytes"_a = nb::none(), "dtype_bits"_a = nb::none(),
      "A safetensors header that holds nothing unusual, scanned in one native pass: (metadata, [(begin, end, "
      "name, dtype, shape), ...], laid_out), or None where the careful parser must decide "
      "(csrc/device/header_scan.h). laid_out: data_bytes and dtype_bits [(dtype, bits), ...] were given and "
      "the layout rules hold (check_layout: no tensor name repeated either); the entries are then in name order, "
      "else in header order, a repeated name kept for the caller to find.");
  m.def(
      "scan_header_infos",
      [](nb::bytes header, std::uint64_t data_bytes, std::vector<std::pair<std::string, unsigned>> dtype_bits,
         nb::handle new_instance, nb::handle cls, std::uint64_t base, nb::handle path, nb::tuple fields) -> nb::object {
        if (nb::len(fields) != 6) throw nb::value_error("fields: the six TensorInfo field names");
        hf2q::device::ScannedHeader h;
        bool laid_out = false;
        std::vector<std::pair<std::string_view, unsigned>> bits;
        for (const auto& d : dtype_bits) bits.emplace_back(d.first, d.second);
        {
          hf2q::bindings::ReleaseGil nogil;  // the bytes object is immutable and held by the caller
          laid_out = hf2q::device::scan_header(header.c_str(), header.size(), &h) &&
                     hf2q::device::check_layout(&h, data_bytes, bits);
        }
        if (!laid_out) return nb::none();
        for (const auto& t : h.tensors) {  // absolute offsets: base + end must fit (it does for a real file)
          std::uint64_t sum = 0;
          if (__builtin_add_overflow(base, t.end, &sum)) return nb::none();
        }
        nb::dict meta;
        for (const auto& kv : h.metadata) meta[utf8(kv.first)] = utf8(kv.second);
        // Each instance as the dataclass's __init__ makes one: object.__new__(cls),
        // then its fields set in declaration order.
        nb::tuple new_args = nb::make_tuple(cls);
        nb::dict out;
        std::vector<std::pair<std::string_view, nb::object>> dtypes;  // the few distinct dtype strings, made once
        for (const auto& t : h.tensors) {  // in name order (check_layout sorted them)
          nb::object dt = cached(dtypes, t.dtype);
          nb::object shape_obj = shape_tuple(h, t);
          nb::object name = utf8(t.name);
          PyObject* inst = PyObject_Call(new_instance.ptr(), new_args.ptr(), nullptr);
          if (inst == nullptr) throw nb::python_error();
          nb::object inst_obj = nb::steal(inst);
          nb::object offset = u64(base + t.begin), nbytes = u64(t.end - t.begin);
          PyObject* const values[6] = {name.ptr(), dt.ptr(), shape_obj.ptr(), offset.ptr(), nbytes.ptr(), path.ptr()};
          for (std::size_t i = 0; i < 6; ++i) {
            // object.__setattr__ (the frozen class's own refuses): the values
            // stay in the instance, no __dict__ object made until one is asked for.
            if (PyObject_GenericSetAttr(inst, fields[i].ptr(), values[i]) != 0) throw nb::python_error();
          }
          if (PyDict_SetItem(out.ptr(), name.ptr(), inst) != 0) throw nb::python_error();
        }
        return nb::make_tuple(meta, out);
      },
      "header"_a, "data_bytes"_a, "dtype_bits"_a, "new"_a, "cls"_a, "base"_a, "path"_a, "fields"_a,
      "A plain, laid-out safetensors header (scan_header's fast path with check_layout holding) as (metadata, "
      "{name: cls instance}) in name order, each made as new(cls) with its six fields (name, dtype, shape, "
      "base + begin, end - begin, path) set as object.__setattr__ sets them; None where the Python path must decide.");
  m.def(
      "scan_index",
      [](nb::bytes index) -> nb::object {
        hf2q::device::ScannedIndex idx;
        bool plain = false;
        {
          hf2q::bindings::ReleaseGil nogil;  // the bytes object is immutable and held by the caller
          plain = hf2q::device::scan_index(index.c_str(), index.size(), &idx);
        }
        if (!plain) return nb::none();
        nb::dict meta;
        for (const auto& e : idx.metadata) {
          meta[utf8(e.key)] = e.is_int ? u64(e.value) : utf8(e.text);
        }
        // One string object per distinct shard name (a few, against 60,000 tensors).
        std::vector<std::pair<std::string_view, nb::object>> shards;
        nb::list pairs;
        for (const auto& [tensor, shard] : idx.weight_map) pairs.append(nb::make_tuple(utf8(tensor), cached(shards, shard)));
        return nb::make_tuple(meta, pairs);
      },
      "index"_a,
      "A model.safetensors.index.json that holds nothing unusual, scanned in one native pass: (metadata, "
      "[(tensor, shard), ...] in file order, a tensor named twice kept twice), or None where the careful "
      "parser must decide (csrc/device/header_scan.h).");
  m.def(
      "can_convert",
      [](const std::string& src, const std::string& dst) {
        return hf2q::device::can_convert(hf2q::device::dtype_from_name(src), hf2q::device::dtype_from_name(dst));
      },
      "src"_a, "dst"_a, "Whether device writes convert src-dtype data into a dst buffer natively.");

  bind_device(m);
}
