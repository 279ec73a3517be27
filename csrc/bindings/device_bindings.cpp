// nanobind glue for devices and buffers: argument conversion, GIL release,
// zero-copy array views that keep their buffer alive. No logic.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "device/batch_queue.h"
#include "device/device.h"
#include "release_gil.h"
#include "device/reader.h"
#if defined(HF2Q_HAVE_CUDA)
#include "device/cuda/cuda_api.h"
#endif

namespace nb = nanobind;
using namespace nb::literals;
using hf2q::device::BufferImpl;
using hf2q::device::Device;
using hf2q::device::DType;

namespace {

// read_file_batch's jobs as Python passes them: (buffer, [(elem_offset, fd,
// file_offset, nbytes)], source dtype, check_finite, scaled or None).
using FileSegTuple = std::tuple<std::size_t, int, std::uint64_t, std::size_t>;
using ScaledTuple = std::tuple<BufferImpl*, std::size_t, std::size_t, std::size_t, std::size_t, std::size_t>;
using FileJobTuple = std::tuple<BufferImpl*, std::vector<FileSegTuple>, std::string, bool, std::optional<ScaledTuple>>;

std::vector<Device::BatchJob> to_batch_jobs(const std::vector<FileJobTuple>& jobs) {
  std::vector<Device::BatchJob> v;
  v.reserve(jobs.size());
  for (const auto& [buf, segs, src_dtype, check_finite, scaled] : jobs) {
    Device::BatchJob j{buf, {}, hf2q::device::dtype_from_name(src_dtype), check_finite};
    if (scaled) {
      std::tie(j.scale, j.rows, j.cols, j.block_rows, j.block_cols, j.base) = *scaled;
      if (j.scale == nullptr) throw std::invalid_argument("read_file_batch: a scaled job has no scale buffer");
    }
    j.segments.reserve(segs.size());
    for (const auto& [elem_offset, fd, file_offset, nbytes] : segs) {
      j.segments.push_back(Device::SegmentSpec{elem_offset, fd, file_offset, nbytes});
    }
    v.push_back(std::move(j));
  }
  return v;
}

// transpose_units_many's items as Python passes them: (buf, outer, period, start, a, b, unit).
using TransposeTuple =
    std::tuple<BufferImpl*, std::size_t, std::size_t, std::size_t, std::size_t, std::size_t, std::size_t>;

std::vector<Device::UnitTransposeSpec> to_transpose_specs(const std::vector<TransposeTuple>& items) {
  std::vector<Device::UnitTransposeSpec> v;
  v.reserve(items.size());
  for (const auto& [buf, outer, period, start, a, b, unit] : items) {
    v.push_back(Device::UnitTransposeSpec{buf, outer, period, start, a, b, unit});
  }
  return v;
}

// A read_file_batch call's jobs converted ahead of the call: a loader
// converts the next batch's thousands of segments while the batch before it
// is read, so the call itself holds the GIL for no per-segment work. It
// holds raw buffer pointers: its Python owner keeps the buffers alive.
struct PreparedFileBatch {
  std::vector<Device::BatchJob> jobs;
  // The buffers the jobs write and read, owned by C++ (a queued batch keeps
  // them until its read ended: FileBatchQueue).
  std::vector<std::shared_ptr<BufferImpl>> keep;
};

PreparedFileBatch prepared_file_batch(const std::vector<FileJobTuple>& jobs) {
  PreparedFileBatch b{to_batch_jobs(jobs), {}};
  b.keep.reserve(b.jobs.size());
  for (const Device::BatchJob& j : b.jobs) {
    b.keep.push_back(j.buf->shared_from_this());  // (every buffer is made by a shared_ptr: Device::alloc*)
    if (j.scale != nullptr) b.keep.push_back(j.scale->shared_from_this());
  }
  return b;
}


using RoBytes = nb::ndarray<const std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// A capsule owning one reference to the buffer: the owner of every view.
nb::capsule keep_alive(const std::shared_ptr<BufferImpl>& buf) {
  auto* ref = new std::shared_ptr<BufferImpl>(buf);
  return nb::capsule(ref, [](void* p) noexcept { delete static_cast<std::shared_ptr<BufferImpl>*>(p); });
}

// Storage view: (dtype, shape) as numpy sees the bytes. bf16 -> uint16 (the
// Python layer re-views it as ml_dtypes.bfloat16); q8_0 -> uint8 with the
// last dimension in bytes (gguf-py's layout).
nb::dlpack::dtype storage_dtype(DType t, bool dlpack_bf16) {
  using hf2q::device::ElemKind;
  const hf2q::device::StorageElem e = hf2q::device::storage_elem(t);
  nb::dlpack::dtype_code code = nb::dlpack::dtype_code::UInt;
  if (e.kind == ElemKind::Float) code = nb::dlpack::dtype_code::Float;
  if (e.kind == ElemKind::Int) code = nb::dlpack::dtype_code::Int;
  if (e.kind == ElemKind::BFloat && dlpack_bf16) code = nb::dlpack::dtype_code::Bfloat;
  return nb::dlpack::dtype{static_cast<std::uint8_t>(code), static_cast<std::uint8_t>(e.bits), 1};
}

std::vector<std::size_t> storage_shape(const BufferImpl& b) {
  std::vector<std::size_t> shape(b.shape().begin(), b.shape().end());
  if (!shape.empty()) shape.back() = static_cast<std::size_t>(hf2q::device::storage_last_dim(b.dtype(), b.shape().back()));
  return shape;
}

// A view of the buffer's memory where it lives: CPU for host/Metal, the
// backend's DLPack device (kDLCUDA, index) otherwise.
template <typename Framework>
nb::ndarray<Framework> make_view(const std::shared_ptr<BufferImpl>& b, bool dlpack_bf16) {
  const std::vector<std::size_t> shape = storage_shape(*b);
  const auto& info = b->device()->info();
  return nb::ndarray<Framework>(b->data(), shape.size(), shape.data(), keep_alive(b), nullptr,
                                storage_dtype(b->dtype(), dlpack_bf16), info.dlpack_device_type,
                                info.device_index);
}

// Storage bytes [offset, offset + out.size()) copied into a CPU array.
using RwBytes = nb::ndarray<std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

nb::dict stats_dict(Device& d) {
  hf2q::device::ResidencyStats st;
  {
    hf2q::bindings::ReleaseGil nogil;  // may commit: mlock of staged buffers
    st = d.stats();
  }
  nb::dict out;
  out["enabled"] = st.enabled;
  out["count"] = st.count;
  out["allocated_size"] = st.allocated_size;
  out["locked_bytes"] = st.locked_bytes;
  out["unwired_bytes"] = st.unwired_bytes;
  out["sets"] = st.sets;
  out["pending"] = st.pending;
  out["requested"] = st.requested;
  out["label"] = st.label;
  return out;
}

std::pair<long long, unsigned long long> result_pair(const hf2q::device::UploadResult& r) {
  const long long first = r.first_nonfinite == static_cast<std::size_t>(-1) ? -1 : static_cast<long long>(r.first_nonfinite);
  return {first, static_cast<unsigned long long>(r.inf_scales)};
}

std::vector<std::pair<long long, unsigned long long>> run_file_batch(Device& d,
                                                                     const std::vector<Device::BatchJob>& jobs) {
  std::vector<hf2q::device::UploadResult> r;
  {
    hf2q::bindings::ReleaseGil nogil;
    r = d.read_file_batch(jobs);
  }
  std::vector<std::pair<long long, unsigned long long>> out;
  out.reserve(r.size());
  for (const auto& x : r) out.push_back(result_pair(x));
  return out;
}

}  // namespace

void bind_device(nb::module_& m) {
  static nb::object device_error;
  static nb::object file_read_error;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const hf2q::device::DeviceError& e) {
      nb::object cls = nb::module_::import_("hf2q.errors").attr("DeviceError");
      PyErr_SetString(cls.ptr(), e.what());
    } catch (const hf2q::device::FileReadError& e) {
      // The cause crosses once, as .code (hf2q.safetensors' FileTruncated / Io).
      const auto* typed = dynamic_cast<const hf2q::device::CheckpointReadError*>(&e);
      const bool truncated = typed != nullptr && typed->why() == hf2q::device::ReadFailure::Truncated;
      nb::object cls = nb::module_::import_("hf2q.device").attr("FileReadError");
      nb::object err = cls(nb::str(e.what()));
      err.attr("code") = nb::str(truncated ? "FileTruncated" : "Io");
      err.attr("job") = nb::int_(e.job);
      if (e.sys_errno != 0) err.attr("system_errno") = nb::int_(e.sys_errno);
      PyErr_SetObject(cls.ptr(), err.ptr());
    }
  });

  nb::class_<BufferImpl>(m, "NativeBuffer")
      .def_prop_ro("dtype", [](const BufferImpl& b) { return std::string(hf2q::device::dtype_name(b.dtype())); })
      .def_prop_ro("shape", [](const BufferImpl& b) { return b.shape(); })
      .def_prop_ro("numel", &BufferImpl::numel)
      .def_prop_ro("byte_len", &BufferImpl::byte_len)
      .def_prop_ro("alloc_len", &BufferImpl::alloc_len)
      .def_prop_ro("address", [](const BufferImpl& b) { return reinterpret_cast<std::uintptr_t>(b.data()); })
      .def_prop_ro("device", [](const BufferImpl& b) { return b.device(); })
      .def("numpy_view",
           [](std::shared_ptr<BufferImpl> b) {
             if (!b->device()->info().cpu_visible) {
               throw hf2q::device::DeviceError("a " + b->device()->info().kind +
                                               " buffer lives in device memory the CPU cannot address");
             }
             return make_view<nb::numpy>(b, false);
           })
      .def(
          "dlpack_view",
          [](std::shared_ptr<BufferImpl> b, bool wait) {
            if (wait) {
              hf2q::bindings::ReleaseGil nogil;
              b->device()->synchronize();  // the consumer may read at once, on any stream
            }
            return make_view<nb::array_api>(b, true);
          },
          "wait"_a = true)
      .def_prop_ro("dlpack_device", [](const BufferImpl& b) {
        const auto& info = b.device()->info();
        return std::make_pair(info.dlpack_device_type, info.device_index);
      })
      .def(
          "copy_out",
          [](std::shared_ptr<BufferImpl> b, std::size_t offset, RwBytes out) {
            hf2q::bindings::ReleaseGil nogil;
            b->device()->copy_out(*b, offset, out.data(), out.size());
          },
          "offset"_a, "out"_a.noconvert());

  nb::class_<PreparedFileBatch>(m, "NativeFileBatch")
      .def("__init__", [](PreparedFileBatch* self, const std::vector<FileJobTuple>& jobs) {
        new (self) PreparedFileBatch(prepared_file_batch(jobs));
      }, "jobs"_a)
      .def_prop_ro("jobs", [](const PreparedFileBatch& b) { return b.jobs.size(); });

  // Prepared batches read in order on the queue's own thread (docs/CUDA.md).
  nb::class_<hf2q::device::FileBatchQueue>(m, "FileBatchQueue")
      .def(nb::init<Device&>(), "device"_a, nb::keep_alive<1, 2>())
      .def(
          "submit",
          [](hf2q::device::FileBatchQueue& q, const PreparedFileBatch& batch, std::uint64_t after,
             const std::vector<TransposeTuple>& transposes) {
            std::vector<std::shared_ptr<BufferImpl>> keep = batch.keep;
            std::vector<Device::UnitTransposeSpec> t = to_transpose_specs(transposes);
            hf2q::bindings::ReleaseGil nogil;
            return q.submit(batch.jobs, std::move(keep), after, std::move(t));
          },
          "batch"_a, "after"_a = 0, "transposes"_a = std::vector<TransposeTuple>{})
      .def("cancel", &hf2q::device::FileBatchQueue::cancel)
      .def(
          "wait",
          [](hf2q::device::FileBatchQueue& q, std::uint64_t ticket, double timeout) -> nb::object {
            std::optional<std::pair<std::vector<hf2q::device::UploadResult>, double>> r;
            {
              hf2q::bindings::ReleaseGil nogil;
              r = q.wait(ticket, timeout);
            }
            if (!r) return nb::none();
            std::vector<std::pair<long long, unsigned long long>> out;
            out.reserve(r->first.size());
            for (const auto& x : r->first) out.push_back(result_pair(x));
            return nb::make_tuple(nb::cast(out), r->second);
          },
          "ticket"_a, "timeout"_a)
      .def("close", &hf2q::device::FileBatchQueue::close, nb::call_guard<hf2q::bindings::ReleaseGil>());

  nb::class_<Device>(m, "NativeDevice")
      .def_static("open", &Device::open, "kind"_a, nb::call_guard<hf2q::bindings::ReleaseGil>())  // CUDA: driver init + NVRTC compile
      .def_prop_ro("kind", [](const Device& d) { return d.info().kind; })
      .def_prop_ro("name", [](const Device& d) { return d.info().name; })
      .def_prop_ro("page_size", [](const Device& d) { return d.info().page_size; })
      .def_prop_ro("max_buffer_len", [](const Device& d) { return d.info().max_buffer_len; })
      .def_prop_ro("working_set_bytes", [](const Device& d) { return d.info().working_set_bytes; })
      .def_prop_ro("wired_budget_bytes", [](const Device& d) { return d.info().wired_budget_bytes; })
      .def_prop_ro("residency_enabled", &Device::residency_enabled)
      .def("use_as_scratch", &Device::use_as_scratch, "reuse_bytes"_a)
      .def_prop_ro("cpu_visible", [](const Device& d) { return d.info().cpu_visible; })
      .def_prop_ro("index", [](const Device& d) { return d.info().device_index; })
      .def(
          "alloc",
          [](Device& d, const std::vector<std::int64_t>& shape, const std::string& dtype) {
            const DType t = hf2q::device::dtype_from_name(dtype);
            hf2q::bindings::ReleaseGil nogil;
            return d.alloc(shape, t);
          },
          "shape"_a, "dtype"_a)
      .def(
          "alloc_many",
          [](Device& d, const std::vector<std::pair<std::vector<std::int64_t>, std::string>>& specs,
             const std::vector<bool>& filled_by_read) {
            if (!filled_by_read.empty() && filled_by_read.size() != specs.size()) {
              throw std::invalid_argument("alloc_many: filled_by_read must have one flag per spec");
            }
            std::vector<Device::AllocSpec> v;
            v.reserve(specs.size());
            for (std::size_t i = 0; i < specs.size(); ++i) {
              v.push_back(Device::AllocSpec{specs[i].first, hf2q::device::dtype_from_name(specs[i].second),
                                            !filled_by_read.empty() && filled_by_read[i]});
            }
            hf2q::bindings::ReleaseGil nogil;
            return d.alloc_many(v);
          },
          "specs"_a, "filled_by_read"_a = std::vector<bool>{})
      .def(
          "alloc_window",
          [](Device& d, std::size_t len,
             const std::vector<std::tuple<std::size_t, std::vector<std::int64_t>, std::string>>& specs, bool zero) {
            std::vector<Device::PlacedSpec> v;
            v.reserve(specs.size());
            for (const auto& [off, shape, dtype] : specs) {
              v.push_back(Device::PlacedSpec{off, shape, hf2q::device::dtype_from_name(dtype)});
            }
            hf2q::bindings::ReleaseGil nogil;
            return d.alloc_window(len, v, zero);
          },
          "len"_a, "specs"_a, "zero"_a = true)
      .def("register_buffer", [](Device& d, BufferImpl& b) { hf2q::bindings::ReleaseGil nogil; return d.register_buffer(b); }, "buf"_a)
      .def("is_registered", &Device::is_registered, "buf"_a, nb::call_guard<hf2q::bindings::ReleaseGil>())
      .def("is_locked", &Device::is_locked, "buf"_a, nb::call_guard<hf2q::bindings::ReleaseGil>())
      .def("commit", [](Device& d) { hf2q::bindings::ReleaseGil nogil; d.commit(); })
      .def("synchronize", [](Device& d) { hf2q::bindings::ReleaseGil nogil; d.synchronize(); })
      .def("memory",
           [](Device& d) -> std::optional<std::pair<std::size_t, std::size_t>> {
             std::size_t free_b = 0, total_b = 0;
             if (!d.memory(&free_b, &total_b)) return std::nullopt;
             return std::make_pair(free_b, total_b);
           },
           "(free, total) bytes of device memory where the backend says (a GPU), else None.")
      .def("request_residency", [](Device& d) { hf2q::bindings::ReleaseGil nogil; d.request_residency(); })
      .def("end_residency", [](Device& d) { hf2q::bindings::ReleaseGil nogil; d.end_residency(); })
      .def("stats", &stats_dict)
      .def("take_notice", &Device::take_notice)
      .def("attach_queue", &Device::attach_queue, "queue"_a)
      .def(
          "write",
          [](Device& d, BufferImpl& b, std::size_t elem_offset, RoBytes src, const std::string& src_dtype) {
            const DType t = hf2q::device::dtype_from_name(src_dtype);
            hf2q::device::UploadResult r;
            {
              hf2q::bindings::ReleaseGil nogil;
              r = d.write(b, elem_offset, src.data(), src.size(), t);
            }
            return result_pair(r);
          },
          "buf"_a, "elem_offset"_a, "src"_a.noconvert(), "src_dtype"_a)
      .def(
          "read_file",
          [](Device& d, BufferImpl& b, std::size_t elem_offset, int fd, std::uint64_t file_offset, std::size_t nbytes,
             const std::string& src_dtype, bool check_finite) {
            const DType t = hf2q::device::dtype_from_name(src_dtype);
            hf2q::device::UploadResult r;
            {
              hf2q::bindings::ReleaseGil nogil;
              r = d.read_file(b, elem_offset, fd, file_offset, nbytes, t, check_finite);
            }
            return result_pair(r);
          },
          "buf"_a, "elem_offset"_a, "fd"_a, "file_offset"_a, "nbytes"_a, "src_dtype"_a, "check_finite"_a = false)
      .def(
          "read_file_segments",
          [](Device& d, BufferImpl& b, const std::vector<std::tuple<std::size_t, int, std::uint64_t, std::size_t>>& segs,
             const std::string& src_dtype, bool check_finite) {
            const DType t = hf2q::device::dtype_from_name(src_dtype);
            std::vector<Device::SegmentSpec> specs;
            specs.reserve(segs.size());
            for (const auto& [elem_offset, fd, file_offset, nbytes] : segs) {
              specs.push_back(Device::SegmentSpec{elem_offset, fd, file_offset, nbytes});
            }
            hf2q::device::UploadResult r;
            {
              hf2q::bindings::ReleaseGil nogil;
              r = d.read_file_segments(b, specs, t, check_finite);
            }
            return result_pair(r);
          },
          "buf"_a, "segments"_a, "src_dtype"_a, "check_finite"_a = false)
      .def(
          "read_prepared_file_batch",
          [](Device& d, const PreparedFileBatch& batch) { return run_file_batch(d, batch.jobs); }, "batch"_a)
      .def(
          "convert",
          [](Device& d, BufferImpl& dst, BufferImpl& src) {
            hf2q::device::UploadResult r;
            {
              hf2q::bindings::ReleaseGil nogil;
              r = d.convert(dst, src);
            }
            return result_pair(r);
          },
          "dst"_a, "src"_a)
      .def(
          "scaled_fp8",
          [](Device& d, BufferImpl& dst, std::size_t elem_offset, BufferImpl& w, BufferImpl& scale,
             std::tuple<std::size_t, std::size_t, std::size_t> shape, std::tuple<std::size_t, std::size_t> block) {
            hf2q::device::UploadResult r;
            {
              hf2q::bindings::ReleaseGil nogil;
              r = d.scaled_fp8(dst, elem_offset, w, scale, std::get<0>(shape), std::get<1>(shape),
                               std::get<2>(shape), std::get<0>(block), std::get<1>(block));
            }
            return result_pair(r);
          },
          "dst"_a, "elem_offset"_a, "w"_a, "scale"_a, "shape"_a, "block"_a,
          "A scaled FP8 tensor on this device (w: f8 buffer, scale: f32 grid buffer) decoded into dst from "
          "elem_offset on; returns (first non-finite index or -1, Q8_0 blocks with an Inf scale).")
      .def(
          "scaled_fp8_gather",
          [](Device& d, BufferImpl& src, const std::string& weight,
             const std::vector<std::tuple<BufferImpl*, std::size_t, BufferImpl*, std::tuple<std::size_t, std::size_t>,
                                          std::tuple<std::size_t, std::size_t>,
                                          std::vector<std::pair<std::size_t, std::size_t>>, std::string,
                                          std::vector<std::pair<std::size_t, std::size_t>>>>& stacks) {
            const DType w = hf2q::device::dtype_from_name(weight);
            std::vector<Device::GatherStack> v;
            v.reserve(stacks.size());
            for (const auto& [dst, off, scale, shape, block, pieces, sdtype, spieces] : stacks) {
              v.push_back(Device::GatherStack{dst, off, scale, std::get<0>(shape), std::get<1>(shape),
                                              std::get<0>(block), std::get<1>(block), pieces,
                                              sdtype.empty() ? DType::F32 : hf2q::device::dtype_from_name(sdtype),
                                              spieces});
            }
            std::vector<hf2q::device::UploadResult> r;
            {
              hf2q::bindings::ReleaseGil nogil;
              r = d.scaled_fp8_gather(src, w, v);
            }
            std::vector<std::pair<long long, unsigned long long>> out;
            out.reserve(r.size());
            for (const auto& x : r) out.push_back(result_pair(x));
            return out;
          },
          "src"_a, "weight"_a, "stacks"_a,
          "Scaled FP8 stacks whose matrices lie in src (raw bytes on this device), each (dst, elem_offset, scale, "
          "(rows, cols), (block_rows, block_cols), pieces: [(byte offset, matrices)], laid end to end in dst from "
          "elem_offset, their f32 grids end to end in scale, scale_dtype, scale_pieces: [(byte offset, values)]: "
          "with a scale_dtype, the grids are those scale tensors of src, widened into scale first; '': scale is "
          "filled already), decoded; per stack (first non-finite index from elem_offset or -1, Q8_0 blocks with "
          "an Inf scale).")
      .def(
          "transpose_units",
          [](Device& d, BufferImpl& buf, std::size_t outer, std::size_t period, std::size_t start, std::size_t a,
             std::size_t b, std::size_t unit) {
            hf2q::bindings::ReleaseGil nogil;
            d.transpose_units(buf, outer, period, start, a, b, unit);
          },
          "buf"_a, "outer"_a, "period"_a, "start"_a, "a"_a, "b"_a, "unit"_a,
          "In each of `outer` periods of `period` elements, the [a, b] grid of `unit`-element units at element "
          "`start` rewritten as its transpose [b, a], in place (whole blocks of the buffer's format).")
      .def(
          "transpose_units_many",
          [](Device& d, const std::vector<TransposeTuple>& items) {
            std::vector<Device::UnitTransposeSpec> v = to_transpose_specs(items);
            hf2q::bindings::ReleaseGil nogil;
            d.transpose_units_many(v);
          },
          "items"_a, "Several buffers' transpose_units (buf, outer, period, start, a, b, unit), in order; every one "
          "checked before any runs.")
      .def("checksums", [](Device& d, BufferImpl& b) {
        std::vector<std::uint32_t> sums;
        {
          hf2q::bindings::ReleaseGil nogil;
          sums = d.device_checksums(b);
        }
        auto* heap = new std::vector<std::uint32_t>(std::move(sums));
        nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<std::uint32_t>*>(p); });
        const std::size_t n = heap->size();
        return nb::ndarray<nb::numpy, std::uint32_t, nb::ndim<1>>(heap->data(), {n}, owner);
      }, "buf"_a);

  m.def("backend_kinds", [] {
    std::size_t n = 0;
    const hf2q::device::BackendEntry* e = hf2q::device::backend_registry(&n);
    std::vector<std::string> kinds;
    for (std::size_t i = 0; i < n; ++i) kinds.emplace_back(e[i].kind);
    return kinds;
  });
  m.def(
      "backend_registry",
      [] {
        std::size_t n = 0;
        const hf2q::device::BackendEntry* e = hf2q::device::backend_registry(&n);
        std::vector<std::tuple<std::string, bool, int, bool>> rows;
        for (std::size_t i = 0; i < n; ++i) rows.emplace_back(e[i].kind, e[i].indexed, e[i].default_rank, e[i].prepare);
        return rows;
      },
      "The native backend registry: (kind, indexed, default_rank, prepare) rows.");
  m.def(
      "cuda_configure",
      [](const std::vector<std::string>& nvrtc_candidates, const std::string& cache_dir) {
#if defined(HF2Q_HAVE_CUDA)
        hf2q::device::cuda::configure(nvrtc_candidates, cache_dir);
#else
        (void)nvrtc_candidates, (void)cache_dir;
#endif
      },
      "nvrtc_candidates"_a, "cache_dir"_a,
      "Where the CUDA backend looks for NVRTC first, and its kernel cache directory ('' disables it).");
  m.def("residency_disabled_by_env", &hf2q::device::residency_disabled_by_env);
  m.def("inject_alloc_failure", &hf2q::device::inject_alloc_failure, "n"_a,
        "Testing hook: the n-th allocation from now fails with DeviceError (0 disables).");
  m.attr("VERIFY_GROUP") = hf2q::device::kVerifyGroup;
}
