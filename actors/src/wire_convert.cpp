// Actor messages <-> wire structs (wire_convert.hpp).
#include "llmesh/actors/wire_convert.hpp"

namespace llmesh::actors {

transport::generate_msg to_wire(const replica_request& r) {
  return {r.id, r.prompt, static_cast<uint32_t>(std::min<size_t>(r.max_tokens, UINT32_MAX)),
          {r.sampling.temperature, r.sampling.top_p, r.sampling.top_k, r.sampling.seed}, r.eos_ids};
}

replica_request from_wire(const transport::generate_msg& m) {
  replica_request r;
  r.id = m.id;
  r.prompt = m.prompt;
  r.max_tokens = m.max_tokens;
  r.sampling.temperature = m.params.temperature;
  r.sampling.top_p = m.params.top_p;
  r.sampling.top_k = m.params.top_k;
  r.sampling.seed = m.params.seed;
  r.eos_ids = m.eos_ids;
  return r;
}

transport::token_body to_wire(const token_msg& t) {
  return {t.id, t.token, static_cast<transport::finish_kind>(t.finish), t.failed, t.err.code, t.failed ? t.err.message : ""};
}

token_msg from_wire(const transport::token_body& t) {
  return {t.id, t.token, static_cast<finish_reason>(t.finish), t.failed, t.failed ? make_error(t.code, t.message) : error{}};
}

transport::load_msg to_wire(const replica_load& l) {
  return {l.replica, l.ready, static_cast<uint32_t>(l.running), static_cast<uint32_t>(l.waiting), l.kv_used, l.kv_total};
}

replica_load from_wire(const transport::load_msg& l) {
  return {l.replica, l.ready, l.running, l.waiting, l.kv_used, l.kv_total};
}

}  // namespace llmesh::actors
