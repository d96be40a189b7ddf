// KV transfer for disaggregated prefill (replica_core.hpp: export_prefix, import_prefix): a
// prompt's cached whole blocks copied out of one replica's engine and into another's prefix
// cache, where the request that follows finds them as if it had computed them there.
#include <string>

#include "llmesh/actors/replica_core.hpp"

namespace llmesh::actors {

result<uint64_t> replica_core::cache_key(uint64_t cache_salt, const std::string& lora) const {
  request_spec spec;
  spec.cache_salt = cache_salt;
  if (!lora.empty()) {
    spec.lora = eng_.loaded_model().loras().find(lora).first;
    if (spec.lora < 0) return make_error(errc::not_found, "the LoRA adapter '" + lora + "' is not loaded on this replica");
  }
  return prefix_key(spec);
}

result<kv_prefix> replica_core::export_prefix(std::span<const int32_t> prompt, uint64_t cache_salt, const std::string& lora) {
  if (!blocks_.prefix_caching()) return make_error(errc::unsupported, "KV export: prefix caching is off on this replica");
  auto key = cache_key(cache_salt, lora);
  if (!key) return key.take_error();
  const size_t bs = blocks_.block_size();
  const size_t whole = prompt.empty() ? 0 : (prompt.size() - 1) / bs * bs;  // never the last token's block
  block_list b;
  b.last_hash = *key;
  const size_t held = blocks_.match_chain(prompt.first(whole), b);
  auto data = eng_.export_kv(b.ids);
  blocks_.release(b);
  if (!data) return data.take_error();
  kv_prefix p;
  p.tokens.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(held));
  p.cache_salt = cache_salt;
  p.lora = lora;
  p.block_size = static_cast<uint32_t>(bs);
  p.kv_type = eng_.kv_type();
  p.block_bytes = eng_.kv_block_bytes();
  p.data = std::make_shared<const std::vector<std::byte>>(std::move(*data));
  return p;
}

result<size_t> replica_core::import_prefix(const kv_prefix& p) {
  if (!blocks_.prefix_caching()) return make_error(errc::unsupported, "KV import: prefix caching is off on this replica");
  const size_t bs = blocks_.block_size();
  if (p.block_size != bs || p.kv_type != eng_.kv_type() || p.block_bytes != eng_.kv_block_bytes() ||
      p.tokens.size() % bs != 0 || !p.data || p.data->size() != p.blocks() * p.block_bytes) {
    return make_error(errc::invalid_request,
                      "KV import: blocks of " + std::to_string(p.block_size) + " positions, " + std::to_string(p.block_bytes) +
                          " bytes, " + std::string(model::kv_cache_dtype_name(p.kv_type)) + " (" + std::to_string(p.tokens.size()) +
                          " tokens) do not fit this replica's blocks of " + std::to_string(bs) + " positions, " +
                          std::to_string(eng_.kv_block_bytes()) + " bytes, " +
                          std::string(model::kv_cache_dtype_name(eng_.kv_type())));
  }
  const size_t vocab = eng_.config().vocab;
  for (int32_t t : p.tokens) {
    if (t < 0 || static_cast<size_t>(t) >= vocab) {
      return make_error(errc::invalid_request, "KV import: token id " + std::to_string(t) + " is outside the vocabulary");
    }
  }
  auto key = cache_key(p.cache_salt, p.lora);
  if (!key) return key.take_error();
  block_list b;
  b.last_hash = *key;
  const size_t held = blocks_.match_chain(p.tokens, b) / bs;  // already cached here: kept as they are
  if (auto s = blocks_.reserve(b, p.tokens.size()); !s) {
    blocks_.release(b);
    return s.take_error();
  }
  const std::span<const int32_t> fresh(b.ids.data() + held, b.ids.size() - held);
  const std::span<const std::byte> bytes(p.data->data() + held * p.block_bytes, fresh.size() * p.block_bytes);
  if (auto s = eng_.import_kv(fresh, bytes); !s) {
    blocks_.release(b);  // uncommitted: the fresh blocks go back to the free list, uncached
    return s.take_error();
  }
  blocks_.commit(b, p.tokens);
  blocks_.release(b);
  return fresh.size();
}

}  // namespace llmesh::actors
