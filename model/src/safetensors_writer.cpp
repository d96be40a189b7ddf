// Writes safetensors files (the format read by safetensors.cpp).
#include <fstream>
#include <nlohmann/json.hpp>

#include "llmesh/model/random_model.hpp"

namespace llmesh::model {

status write_safetensors(const std::string& path, const std::vector<tensor_spec>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};
  size_t offset = 0;
  std::vector<size_t> sizes;
  for (const auto& t : tensors) {
    size_t n = t.int_bytes ? t.int_bytes : kernels::dtype_size(t.type);
    for (size_t d : t.shape) n *= d;
    header[t.name] = {{"dtype", t.int_bytes == 8 ? std::string("I64") : t.int_bytes == 1 ? std::string("U8") : t.int_bytes ? std::string("I32") : std::string(kernels::dtype_name(t.type))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + n}}};
    sizes.push_back(n);
    offset += n;
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');  // data starts 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return make_error(errc::io_error, "cannot write " + path);
  uint64_t len = text.size();
  char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  out.write(len_bytes, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < tensors.size(); ++i) {
    buf.assign(sizes[i], 0);
    if (tensors[i].fill) tensors[i].fill(buf);
    out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
  }
  out.close();
  if (!out) return make_error(errc::io_error, "write failed: " + path);
  return ok_status();
}

}  // namespace llmesh::model
