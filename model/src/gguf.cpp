// GGUF v2/v3 (ggml's docs/gguf.md): "GGUF", u32 version, u64 tensor count, u64 metadata count;
// the metadata (string key, u32 type, value; strings are a u64 length and bytes, arrays a u32
// item type, a u64 count and the items); the tensor infos (name, u32 n_dims, n_dims u64 dims,
// u32 type, u64 offset); padding to general.alignment; the tensor data, each offset relative to
// its start. All little-endian. Nothing is read before its bounds are checked.
#include "llmesh/model/gguf.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "llmesh/model/safetensors.hpp"

namespace llmesh::model {
namespace {

/// Why these bounds: a Llama 3 or Qwen vocabulary is ~1.3 M array items in all (tokens, types,
/// merges) and a checkpoint a few thousand tensors; more means a corrupt or hostile file, and
/// each item costs ~100 bytes of memory here.
constexpr uint64_t max_array_items = 4u << 20;
constexpr uint64_t max_tensors = 1u << 20;
constexpr int max_array_depth = 3;
constexpr size_t max_dims = 4;

error bad(const std::string& path, const std::string& msg) { return make_error(errc::invalid_request, path + ": " + msg); }

class cursor {
 public:
  cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }
  template <class T>
  bool read(T& out) {
    if (left() < sizeof(T)) return false;
    std::memcpy(&out, data_ + pos_, sizeof(T));  // the file is little-endian, as is every host we build for
    pos_ += sizeof(T);
    return true;
  }
  bool read_string(std::string& out) {
    uint64_t n = 0;
    if (!read(n) || n > left()) return false;
    out.assign(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return true;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

/// Bytes of one value of a fixed-size type; 0 for string and array.
size_t scalar_bytes(uint32_t type) {
  switch (type) {
    case 0: case 1: case 7: return 1;
    case 2: case 3: return 2;
    case 4: case 5: case 6: return 4;
    case 10: case 11: case 12: return 8;
    default: return 0;
  }
}

struct value_reader {
  cursor& c;
  const std::string& path;
  uint64_t items = 0;

  result<gguf_value> read(uint32_t type, const std::string& key, int depth) {
    gguf_value v;
    v.type = type;
    auto truncated = [&] { return bad(path, "truncated in the value of '" + key + "'"); };
    switch (type) {
      case 0: { uint8_t x; if (!c.read(x)) return truncated(); v.u = x; v.i = x; break; }
      case 1: { int8_t x; if (!c.read(x)) return truncated(); v.i = x; v.u = static_cast<uint64_t>(x); break; }
      case 2: { uint16_t x; if (!c.read(x)) return truncated(); v.u = x; v.i = x; break; }
      case 3: { int16_t x; if (!c.read(x)) return truncated(); v.i = x; v.u = static_cast<uint64_t>(x); break; }
      case 4: { uint32_t x; if (!c.read(x)) return truncated(); v.u = x; v.i = x; break; }
      case 5: { int32_t x; if (!c.read(x)) return truncated(); v.i = x; v.u = static_cast<uint64_t>(x); break; }
      case 6: { float x; if (!c.read(x)) return truncated(); v.f = x; break; }
      case 7: {
        uint8_t x;
        if (!c.read(x)) return truncated();
        if (x > 1) return bad(path, "'" + key + "' is a bool of value " + std::to_string(x));
        v.u = x;
        break;
      }
      case 8: if (!c.read_string(v.s)) return truncated(); break;
      case 9: {
        if (depth >= max_array_depth) return bad(path, "'" + key + "' nests arrays deeper than " + std::to_string(max_array_depth));
        uint64_t n = 0;
        if (!c.read(v.item_type) || !c.read(n)) return truncated();
        const size_t each = v.item_type == 8 ? 8 : (v.item_type == 9 ? 12 : scalar_bytes(v.item_type));
        if (each == 0) return bad(path, "'" + key + "' is an array of unknown type " + std::to_string(v.item_type));
        if (n > c.left() / each) return truncated();
        items += n;
        if (items > max_array_items) return bad(path, "more than " + std::to_string(max_array_items) + " metadata array items");
        v.items.reserve(static_cast<size_t>(n));
        for (uint64_t k = 0; k < n; ++k) {
          auto item = read(v.item_type, key, depth + 1);
          if (!item) return item.take_error();
          v.items.push_back(std::move(item.value()));
        }
        break;
      }
      case 10: { uint64_t x; if (!c.read(x)) return truncated(); v.u = x; v.i = static_cast<int64_t>(x); break; }
      case 11: { int64_t x; if (!c.read(x)) return truncated(); v.i = x; v.u = static_cast<uint64_t>(x); break; }
      case 12: { double x; if (!c.read(x)) return truncated(); v.f = x; break; }
      default: return bad(path, "'" + key + "' has unknown value type " + std::to_string(type));
    }
    return v;
  }
};

}  // namespace

bool gguf_value::as_uint(uint64_t& out) const {
  if (is_bool()) {
    out = u;
    return true;
  }
  if (!is_integer()) return false;
  const bool is_signed = type == 1 || type == 3 || type == 5 || type == 11;
  if (is_signed && i < 0) return false;
  out = is_signed ? static_cast<uint64_t>(i) : u;
  return true;
}

bool gguf_value::as_double(double& out) const {
  if (is_float()) {
    out = f;
    return true;
  }
  if (!is_integer()) return false;
  const bool is_signed = type == 1 || type == 3 || type == 5 || type == 11;
  out = is_signed ? static_cast<double>(i) : static_cast<double>(u);
  return true;
}

namespace ggml {

block_info block(uint32_t type) {
  switch (type) {
    case f32: return {1, 4};
    case f16: return {1, 2};
    case bf16: return {1, 2};
    case q4_0: return {32, 18};
    case q4_1: return {32, 20};
    case q5_0: return {32, 22};
    case q5_1: return {32, 24};
    case q8_0: return {32, 34};
    case q2_k: return {256, 84};
    case q3_k: return {256, 110};
    case q4_k: return {256, 144};
    case q5_k: return {256, 176};
    case q6_k: return {256, 210};
    case iq4_nl: return {32, 18};
    case iq4_xs: return {256, 136};
    case mxfp4: return {32, 17};  // block_mxfp4: an E8M0 exponent, then 16 bytes of e2m1 pairs
    default: return {};
  }
}

std::string type_name(uint32_t type) {
  switch (type) {
    case f32: return "F32";
    case f16: return "F16";
    case bf16: return "BF16";
    case q4_0: return "Q4_0";
    case q4_1: return "Q4_1";
    case q5_0: return "Q5_0";
    case q5_1: return "Q5_1";
    case q8_0: return "Q8_0";
    case 9: return "Q8_1";
    case q2_k: return "Q2_K";
    case q3_k: return "Q3_K";
    case q4_k: return "Q4_K";
    case q5_k: return "Q5_K";
    case q6_k: return "Q6_K";
    case 15: return "Q8_K";
    case 16: return "IQ2_XXS";
    case 17: return "IQ2_XS";
    case 18: return "IQ3_XXS";
    case 19: return "IQ1_S";
    case iq4_nl: return "IQ4_NL";
    case 21: return "IQ3_S";
    case 22: return "IQ2_S";
    case iq4_xs: return "IQ4_XS";
    case 29: return "IQ1_M";
    case mxfp4: return "MXFP4";
    default: return "type " + std::to_string(type);
  }
}

}  // namespace ggml

result<std::shared_ptr<const gguf_file>> gguf_file::open(const std::string& path) {
  auto mapped = mapped_file::open(path);
  if (!mapped) return mapped.take_error();
  std::shared_ptr<const mapped_file> file = std::move(mapped.value());
  return parse(path, file->data(), file->size(), file);
}

result<std::shared_ptr<const gguf_file>> gguf_file::parse(const std::string& path, const uint8_t* data, size_t size,
                                                          std::shared_ptr<const void> keep) {
  std::shared_ptr<gguf_file> g(new gguf_file());
  g->path_ = path;
  g->keep_ = std::move(keep);
  cursor c(data, size);
  char magic[4];
  if (!c.read(magic) || std::memcmp(magic, "GGUF", 4) != 0) return bad(path, "not a GGUF file (no GGUF magic)");
  uint64_t n_tensors = 0, n_kv = 0;
  if (!c.read(g->version_)) return bad(path, "truncated header");
  if (g->version_ != 2 && g->version_ != 3) {
    return make_error(errc::unsupported, path + ": GGUF version " + std::to_string(g->version_) + " (supported: 2, 3)");
  }
  if (!c.read(n_tensors) || !c.read(n_kv)) return bad(path, "truncated header");
  if (n_kv > c.left() / 13) return bad(path, "metadata count " + std::to_string(n_kv) + " does not fit the file");
  if (n_tensors > max_tensors || n_tensors > c.left() / 24) {
    return bad(path, "tensor count " + std::to_string(n_tensors) + " does not fit the file");
  }
  value_reader values{c, path};
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    uint32_t type = 0;
    if (!c.read_string(key) || !c.read(type)) return bad(path, "truncated in metadata entry " + std::to_string(k));
    auto v = values.read(type, key, 0);
    if (!v) return v.take_error();
    if (!g->kv_.emplace(key, std::move(v.value())).second) return bad(path, "metadata key '" + key + "' appears twice");
  }
  uint64_t alignment = 32;
  if (const gguf_value* a = g->find("general.alignment")) {
    if (!a->as_uint(alignment) || alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > (1u << 20)) {
      return bad(path, "general.alignment must be a power of two");
    }
  }
  struct info {
    uint64_t offset;
  };
  std::vector<info> offsets;
  g->tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    gguf_tensor t;
    uint32_t n_dims = 0;
    uint64_t offset = 0;
    if (!c.read_string(t.name) || !c.read(n_dims)) return bad(path, "truncated in tensor info " + std::to_string(k));
    if (n_dims == 0 || n_dims > max_dims) {
      return bad(path, "tensor '" + t.name + "' has " + std::to_string(n_dims) + " dimensions (1 to 4)");
    }
    uint64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      if (!c.read(dim)) return bad(path, "truncated in tensor info '" + t.name + "'");
      if (dim == 0 || elements > (uint64_t{1} << 48) / dim) return bad(path, "tensor '" + t.name + "' has a bad shape");
      elements *= dim;
      t.dims.push_back(dim);
    }
    if (!c.read(t.type) || !c.read(offset)) return bad(path, "truncated in tensor info '" + t.name + "'");
    const auto b = ggml::block(t.type);
    if (b.elements == 0) {
      return make_error(errc::unsupported, path + ": tensor '" + t.name + "' has type " + ggml::type_name(t.type) +
                                               " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, "
                                               "IQ4_NL, IQ4_XS, MXFP4)");
    }
    if (t.dims[0] % b.elements != 0) {
      return bad(path, "tensor '" + t.name + "' of type " + ggml::type_name(t.type) + " has rows of " +
                           std::to_string(t.dims[0]) + " elements, not whole blocks of " + std::to_string(b.elements));
    }
    if (offset % alignment != 0) return bad(path, "tensor '" + t.name + "' is not aligned to " + std::to_string(alignment));
    t.bytes = static_cast<size_t>(elements / b.elements * b.bytes);
    if (!g->by_name_.emplace(t.name, g->tensors_.size()).second) return bad(path, "tensor '" + t.name + "' appears twice");
    offsets.push_back({offset});
    g->tensors_.push_back(std::move(t));
  }
  const uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
  if (data_start > size && n_tensors > 0) return bad(path, "truncated before the tensor data");
  const uint64_t data_size = data_start > size ? 0 : size - data_start;
  for (size_t k = 0; k < g->tensors_.size(); ++k) {
    auto& t = g->tensors_[k];
    if (offsets[k].offset > data_size || t.bytes > data_size - offsets[k].offset) {
      return bad(path, "truncated: tensor '" + t.name + "' ends past the end of the file");
    }
    t.data = data + data_start + offsets[k].offset;
  }
  return std::shared_ptr<const gguf_file>(std::move(g));
}

const gguf_value* gguf_file::find(std::string_view key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const gguf_tensor* gguf_file::tensor(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

bool is_gguf_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char magic[4] = {};
  const bool ok = ::read(fd, magic, 4) == 4 && std::memcmp(magic, "GGUF", 4) == 0;
  ::close(fd);
  return ok;
}

}  // namespace llmesh::model
