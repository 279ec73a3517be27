#include "header_scan.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <tuple>
#include <unordered_set>

namespace hf2q::device {
namespace {

class Scanner {
 public:
  Scanner(const char* p, std::size_t n) : p_(p), end_(p + n) {}

  void ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  bool eat(char c) {
    ws();
    if (p_ < end_ && *p_ == c) {
      ++p_;
      return true;
    }
    return false;
  }
  bool peek(char c) {
    ws();
    return p_ < end_ && *p_ == c;
  }
  bool at_end() {
    ws();
    return p_ == end_;
  }
  // A string with no escape and no control byte (its bytes as a view).
  bool string(std::string_view* out) {
    if (!eat('"')) return false;
    const char* s = p_;
    while (p_ < end_ && *p_ != '"') {
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '\\' || c < 0x20) return false;
      ++p_;
    }
    if (p_ == end_) return false;
    *out = std::string_view(s, static_cast<std::size_t>(p_ - s));
    ++p_;
    return true;
  }
  // An integer as JSON writes a u64: digits, no leading zero, no sign,
  // fraction or exponent, at most 2^64 - 1.
  bool u64(std::uint64_t* out) {
    ws();
    const char* s = p_;
    std::uint64_t v = 0;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
      const std::uint64_t d = static_cast<std::uint64_t>(*p_ - '0');
      if (v > (UINT64_MAX - d) / 10) return false;
      v = v * 10 + d;
      ++p_;
    }
    const std::size_t n = static_cast<std::size_t>(p_ - s);
    if (n == 0 || (n > 1 && *s == '0')) return false;
    if (p_ < end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E')) return false;
    *out = v;
    return true;
  }
  bool null() {
    ws();
    if (end_ - p_ >= 4 && std::string_view(p_, 4) == "null") {
      p_ += 4;
      return true;
    }
    return false;
  }

 private:
  const char* p_;
  const char* end_;
};

// Keys of a plain metadata object: real writers put a handful there. More is
// the careful parser's (Python's randomised hashing), so that a crafted file's
// colliding keys cannot make the unseeded set below quadratic in the file.
constexpr std::size_t kMaxPlainMetadataKeys = 1024;

bool metadata(Scanner& s, ScannedHeader* out) {
  if (s.null()) return true;
  if (!s.eat('{')) return false;
  std::unordered_set<std::string_view> seen;
  if (s.eat('}')) return true;
  do {
    std::string_view k, v;
    if (seen.size() == kMaxPlainMetadataKeys) return false;
    if (!s.string(&k) || !s.eat(':') || !s.string(&v) || !seen.insert(k).second) return false;
    out->metadata.emplace_back(k, v);
  } while (s.eat(','));
  return s.eat('}');
}

bool tensor(Scanner& s, std::string_view name, ScannedHeader* out) {
  if (!s.eat('{')) return false;
  ScannedHeader::Tensor t;
  t.name = name;
  bool dtype = false, shape = false, offsets = false;
  for (int field = 0; field < 3; ++field) {
    if (field > 0 && !s.eat(',')) return false;
    std::string_view k;
    if (!s.string(&k) || !s.eat(':')) return false;
    if (k == "dtype" && !dtype) {
      if (!s.string(&t.dtype)) return false;
      dtype = true;
    } else if (k == "shape" && !shape) {
      if (!s.eat('[')) return false;
      t.dims_begin = out->dims.size();
      if (!s.eat(']')) {
        do {
          std::uint64_t d = 0;
          if (!s.u64(&d)) return false;
          out->dims.push_back(d);
        } while (s.eat(','));
        if (!s.eat(']')) return false;
      }
      t.ndims = out->dims.size() - t.dims_begin;
      shape = true;
    } else if (k == "data_offsets" && !offsets) {
      if (!s.eat('[') || !s.u64(&t.begin) || !s.eat(',') || !s.u64(&t.end) || !s.eat(']')) return false;
      offsets = true;
    } else {
      return false;  // another field, or one repeated
    }
  }
  if (!s.eat('}')) return false;
  out->tensors.push_back(t);
  return true;
}

}  // namespace

bool scan_header(const char* text, std::size_t len, ScannedHeader* out) {
  out->tensors.clear();
  out->dims.clear();
  out->metadata.clear();
  Scanner s(text, len);
  if (!s.eat('{')) return false;
  // A repeated tensor name is found by check_layout (after its sort by name)
  // or by the caller: no hash set of 60,000 names a crafted file could flood.
  bool have_meta = false;
  if (!s.peek('}')) {
    do {
      std::string_view key;
      if (!s.string(&key) || !s.eat(':')) return false;
      if (key == "__metadata__") {
        if (have_meta || !metadata(s, out)) return false;
        have_meta = true;
      } else if (!tensor(s, key, out)) {
        return false;
      }
    } while (s.eat(','));
  }
  return s.eat('}') && s.at_end();
}

namespace {

bool index_metadata(Scanner& s, ScannedIndex* out) {
  if (s.null()) return true;
  if (!s.eat('{')) return false;
  if (s.eat('}')) return true;
  std::unordered_set<std::string_view> seen;
  do {
    ScannedIndex::Meta m;
    if (seen.size() == kMaxPlainMetadataKeys) return false;
    if (!s.string(&m.key) || !s.eat(':') || !seen.insert(m.key).second) return false;
    if (s.peek('"')) {
      if (!s.string(&m.text)) return false;
    } else if (s.u64(&m.value)) {
      m.is_int = true;
    } else {
      return false;
    }
    out->metadata.push_back(m);
  } while (s.eat(','));
  return s.eat('}');
}

// (Repeated tensor names are the caller's to find: it builds a map of them anyway.)
bool weight_map(Scanner& s, ScannedIndex* out) {
  if (!s.eat('{')) return false;
  if (s.eat('}')) return true;
  do {
    std::string_view tensor, shard;
    if (!s.string(&tensor) || !s.eat(':') || !s.string(&shard)) return false;
    out->weight_map.emplace_back(tensor, shard);
  } while (s.eat(','));
  return s.eat('}');
}

}  // namespace

bool scan_index(const char* text, std::size_t len, ScannedIndex* out) {
  out->weight_map.clear();
  out->metadata.clear();
  Scanner s(text, len);
  if (!s.eat('{')) return false;
  bool have_map = false, have_meta = false;
  if (!s.peek('}')) {
    do {
      std::string_view key;
      if (!s.string(&key) || !s.eat(':')) return false;
      if (key == "weight_map" && !have_map) {
        if (!weight_map(s, out)) return false;
        have_map = true;
      } else if (key == "metadata" && !have_meta) {
        if (!index_metadata(s, out)) return false;
        have_meta = true;
      } else {
        return false;  // another member, or one repeated
      }
    } while (s.eat(','));
  }
  return have_map && s.eat('}') && s.at_end();
}

bool check_layout(ScannedHeader* h, std::uint64_t data_bytes,
                  const std::vector<std::pair<std::string_view, unsigned>>& dtype_bits) {
  using Tensor = ScannedHeader::Tensor;
  std::vector<unsigned> bits(h->tensors.size());
  for (std::size_t i = 0; i < h->tensors.size(); ++i) {
    const Tensor& t = h->tensors[i];
    auto it = std::find_if(dtype_bits.begin(), dtype_bits.end(), [&](const auto& d) { return d.first == t.dtype; });
    if (it == dtype_bits.end() || it->second == 0) return false;
    bits[i] = it->second;
  }
  std::vector<std::size_t> order(h->tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const Tensor &x = h->tensors[a], &y = h->tensors[b];
    return std::tie(x.begin, x.end, x.name) < std::tie(y.begin, y.end, y.name);
  });
  std::uint64_t previous_end = 0;
  for (std::size_t i : order) {
    const Tensor& t = h->tensors[i];
    if (t.begin != previous_end || t.end < t.begin) return false;
    // The running product: a prefix that overflows is an error even where a
    // later zero dimension would bring the total back to 0 (as the careful
    // check rules).
    std::uint64_t numel = 1;
    for (std::size_t k = 0; k < t.ndims; ++k) {
      if (__builtin_mul_overflow(numel, h->dims[t.dims_begin + k], &numel)) return false;
    }
    std::uint64_t nbits = 0;
    if (numel == 0 || __builtin_mul_overflow(numel, std::uint64_t{bits[i]}, &nbits) || nbits % 8 != 0 ||
        t.end - t.begin != nbits / 8) {
      return false;  // an empty tensor too: rare, and the careful check decides it
    }
    previous_end = t.end;
  }
  if (previous_end != data_bytes) return false;
  // Name order, and no name twice (the scan keeps a repeated one): sorted
  // indices first, so that a false return leaves the header's order.
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return h->tensors[a].name < h->tensors[b].name; });
  for (std::size_t i = 1; i < order.size(); ++i) {
    if (h->tensors[order[i]].name == h->tensors[order[i - 1]].name) return false;
  }
  std::vector<Tensor> by_name;
  by_name.reserve(order.size());
  for (std::size_t i : order) by_name.push_back(h->tensors[i]);
  h->tensors.swap(by_name);
  return true;
}

}  // namespace hf2q::device
