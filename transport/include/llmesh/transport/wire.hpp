// The mesh's wire messages as plain C++ (no Cap'n Proto type leaves transport/): one envelope
// per frame — source and destination actor addresses, a correlation id, a trace id, and one
// body whose alternative is the message kind. codec.hpp turns envelopes into Cap'n Proto
// frames (schemas/mesh.capnp) and back, under limits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "llmesh/common/error.hpp"

namespace llmesh::transport {

struct actor_address {
  std::string node;   ///< the hosting node's name
  uint64_t actor = 0; ///< the actor's id there (0: the node agent)
  bool operator==(const actor_address&) const = default;
};

// --- inference ---
/// The most alternatives a token's logprobs may carry (kernels::max_logprobs).
inline constexpr int32_t max_logprobs = 20;
/// The most values an embedding request's end may carry: a model's hidden size, or every
/// prompt position's for pooling all (4 Mi values, 16 MiB; the gateway refuses a request whose
/// prompt × values per position exceeds it).
inline constexpr size_t max_embedding = size_t{1} << 22;
/// The longest structured-output spec a request may carry (model::max_constraint_bytes).
inline constexpr size_t max_constraint_text = 256 * 1024;
struct sampling {
  float temperature = 0.0f, top_p = 1.0f;
  int32_t top_k = 0;
  uint64_t seed = 0;
  int32_t logprobs = -1;  ///< -1 or 0..max_logprobs (checked on decode)
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;  ///< finite (checked on decode)
  float repetition_penalty = 1.0f;                          ///< finite and > 0 (checked on decode)
  uint32_t min_tokens = 0;
  bool logit_bias = false;
  float min_p = 0.0f;  ///< within [0, 1] (checked on decode)
  int32_t prompt_logprobs = -1;  ///< -1 or 0..max_logprobs (checked on decode)
  bool constrained = false;
  bool bad_words = false;
  bool processed_logprobs = false;
  bool operator==(const sampling&) const = default;
};
struct token_bias {
  int32_t id = 0;
  float bias = 0.0f;
  bool operator==(const token_bias&) const = default;
};
struct generate_msg {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  uint32_t max_tokens = 0;
  sampling params;
  std::vector<int32_t> eos_ids;
  uint32_t generated = 0;  ///< at most the prompt's length (checked on decode)
  std::vector<token_bias> logit_bias;  ///< at most frame_limits::max_list entries
  uint8_t constraint_kind = 0;         ///< model::constraint_spec::kind (0..5, checked on decode)
  std::string constraint_text;         ///< at most max_constraint_text bytes (checked on decode)
  std::vector<int32_t> allowed_ids;    ///< non-empty: only these may be drawn (at most max_list)
  std::vector<std::vector<int32_t>> bad_words;  ///< vLLM's bad_words as ids (at most max_list ids in all)
  std::vector<int32_t> constraint_after;        ///< the constraint holds after these (at most max_list)
  int32_t priority = 0;                         ///< vLLM's priority: lower is served first
  uint64_t cache_salt = 0;                      ///< vLLM's cache_salt as a key (0: none)
  uint8_t pooling = 0;                          ///< actors::pooling (0..4, checked on decode; 0: a generation)
  std::string lora;                             ///< its LoRA adapter's name ("": none; at most max_name bytes)
  bool prefill_only = false;                    ///< disaggregated prefill: answer with a kv_blocks_msg
  bool operator==(const generate_msg&) const = default;
};
enum class finish_kind : uint8_t { none, length, eos, cancelled };
struct token_body {
  uint64_t id = 0;
  int32_t token = -1;
  finish_kind finish = finish_kind::none;
  bool failed = false;
  errc code = errc::internal;  ///< when failed
  std::string message;         ///< when failed
  struct logprobs_t {
    float logprob = 0.0f;
    std::vector<int32_t> top_ids;      ///< at most max_logprobs (checked on decode)
    std::vector<float> top_logprobs;   ///< one per top id
    int32_t rank = 0;                  ///< 0 (unknown) or 1..vocabulary size
    bool operator==(const logprobs_t&) const = default;
  };
  std::optional<logprobs_t> logprobs;
  /// With a request's first token, when it asked: entry i is prompt token i + 1's (each
  /// checked as `logprobs` is on decode).
  std::vector<logprobs_t> prompt_logprobs;
  int32_t cached_tokens = -1;  ///< with a request's first token: the prefix-cache hit (token_msg's)
  std::vector<float> embedding = {};  ///< an embedding request's end (at most max_embedding values, checked on decode)
  /// The request's time on its replica, microseconds (token_msg's times; -1: unset, below: refused on decode).
  int64_t queued_us = -1, prefill_us = -1, inference_us = -1;
  bool operator==(const token_body&) const = default;
};
struct cancel_msg {
  uint64_t id = 0;
  bool operator==(const cancel_msg&) const = default;
};
struct status_request {
  bool operator==(const status_request&) const = default;
};
/// vLLM's reset_prefix_cache for one replica: it empties its prefix cache, then answers a load_msg.
struct reset_prefix_cache_msg {
  bool operator==(const reset_prefix_cache_msg&) const = default;
};
/// A router asks a replica for its KV events after cursor `since` (actors' kv_events.hpp).
struct kv_events_request {
  uint64_t since = 0;
  bool operator==(const kv_events_request&) const = default;
};
/// A replica's prefix cache changes (chained block hashes) after the asked cursor, or its whole
/// cache (`full`); `seq` is the next cursor; `block_size`: tokens per hashed block.
struct kv_events_msg {
  bool full = false;
  uint64_t seq = 0;
  std::vector<uint64_t> stored, removed;
  uint64_t block_size = 0;
  bool operator==(const kv_events_msg&) const = default;
};
struct load_msg {
  uint64_t replica = 0;
  bool ready = false;
  uint32_t running = 0, waiting = 0;
  uint64_t kv_used = 0, kv_total = 0;
  uint64_t drafted = 0, accepted = 0;  ///< speculative decoding's drafts run and kept
  uint64_t preemptions = 0;            ///< running requests sent back to wait for blocks
  uint64_t kv_imported = 0, kv_refused = 0;  ///< disaggregated prefill: blocks taken in, imports refused
  bool operator==(const load_msg&) const = default;
};

/// The most KV bytes one kv_blocks_msg carries (a prefix beyond it moves only its leading
/// blocks; the rest is computed where the request runs): under the 64 MiB frame limit.
inline constexpr size_t max_kv_bytes = size_t{48} << 20;
/// Disaggregated prefill's blocks (mesh.capnp KvBlocks; actors::kv_prefix on the wire).
struct kv_blocks_msg {
  uint64_t id = 0;
  bool ok = false;
  errc code = errc::internal;  ///< when !ok
  std::string message;         ///< when !ok
  std::vector<int32_t> tokens;  ///< whole blocks (a multiple of block_size, checked on decode)
  uint64_t cache_salt = 0;
  std::string lora;
  uint32_t block_size = 0;
  uint8_t kv_dtype = 0;        ///< 0 float32, 1 bfloat16, 2 fp8_e4m3, 3 fp8_e5m2 (checked on decode)
  uint64_t block_bytes = 0;
  /// tokens / block_size × block_bytes bytes, at most max_kv_bytes (checked on decode); shared,
  /// not copied, on its way through the actors and into the frame (tens of MiB).
  std::shared_ptr<const std::vector<std::byte>> data;
  bool import = false;
  size_t data_size() const { return data ? data->size() : 0; }
  /// Field by field, the bytes by value.
  bool operator==(const kv_blocks_msg& o) const {
    const bool same_bytes = data_size() == o.data_size() && (data_size() == 0 || *data == *o.data);
    return id == o.id && ok == o.ok && code == o.code && message == o.message && tokens == o.tokens &&
           cache_salt == o.cache_salt && lora == o.lora && block_size == o.block_size && kv_dtype == o.kv_dtype &&
           block_bytes == o.block_bytes && import == o.import && same_bytes;
  }
};

// --- membership ---
enum class role : uint8_t { coordinator, gateway, router, replica };
struct resources {
  uint32_t cores = 0;
  uint64_t memory_bytes = 0;
  uint32_t gpus = 0;
  uint32_t slots = 0;  ///< shards it may host (0: the coordinator's default)
  bool operator==(const resources&) const = default;
};
struct hello_msg {
  std::string node;
  std::vector<role> roles;
  std::string listen;
  resources res;
  std::string nonce;  ///< bytes
  bool operator==(const hello_msg&) const = default;
};
struct challenge_msg {
  std::string nonce;
  bool operator==(const challenge_msg&) const = default;
};
struct proof_msg {
  std::string mac;
  bool operator==(const proof_msg&) const = default;
};
struct member {
  std::string node;
  std::vector<role> roles;
  std::string listen;
  bool operator==(const member&) const = default;
};
struct welcome_msg {
  bool accepted = false;
  std::string reason;
  std::vector<member> members;
  bool operator==(const welcome_msg&) const = default;
};
struct heartbeat_msg {
  std::string node;
  uint64_t seq = 0;
  bool operator==(const heartbeat_msg&) const = default;
};

// --- control ---
enum class replica_phase : uint8_t { loading, ready, draining, dead };
struct replica_state_msg {
  uint64_t replica = 0;
  std::string node, model;
  replica_phase phase = replica_phase::loading;
  uint64_t actor = 0;   ///< ready: the replica actor's id on its node
  std::string reason;   ///< dead: why
  std::string listen;   ///< the hosting node's mesh address (for routers in other processes)
  std::string prefill_for = {};  ///< ready: a prefill replica for that model's requests ("": one of `model`)
  uint64_t max_local_prefill = 0;  ///< with prefill_for: its model's max_local_prefill_length (0: the router's own)
  uint64_t max_prefill_queue = 0;  ///< with prefill_for: its model's max_prefill_queue_size (0: the router's own)
  bool operator==(const replica_state_msg&) const = default;
};
struct collective_id_msg {
  uint64_t replica = 0;
  uint32_t ranks = 0;
  std::string id;  ///< bytes (e.g. an ncclUniqueId)
  bool operator==(const collective_id_msg&) const = default;
};

enum class assign_op : uint8_t { start, stop };
struct assign_msg {
  uint64_t replica = 0;
  std::string model, path;
  uint32_t tp = 1;
  uint64_t kv_cache_mb = 0;
  assign_op op = assign_op::start;
  /// Spread placement (empty: every rank on this node): the ranks this node runs, every rank's
  /// node mesh address by rank, and the tensor group's key (bytes).
  std::vector<uint32_t> ranks;
  std::vector<std::string> shard_nodes;
  std::string group_key;
  std::string quantization;  ///< the model's --quantization ("" = none); the node parses it
  struct lora_module {
    std::string name, path;
    bool operator==(const lora_module&) const = default;
  };
  std::vector<lora_module> loras;  ///< adapters served beside the model, in order (at most max_list)
  std::string kv_cache_dtype;      ///< the model's --kv-cache-dtype ("" = float32); the node parses it
  uint64_t max_model_len = 0;      ///< the context its gateways grant (0: the model's)
  std::string dtype;               ///< the model's --dtype ("" = auto); the node parses it
  bool enable_lora = false;        ///< adapters may come while it serves
  uint32_t max_loras = 0;          ///< adapters held at once (0: the node's default)
  bool expert_parallel = false;    ///< an MoE model's ranks run whole experts (--enable-expert-parallel)
  /// vLLM's speculative_config JSON for its replica ("": the node's own settings)
  std::string speculative_config = {};
  /// The cluster config's scheduler limits for its replica (0: the node's own): vLLM's
  /// max_num_batched_tokens (16..2^20), max_num_seqs (..2^16), long_prefill_token_threshold
  /// (..2^30), max_num_partial_prefills and max_long_partial_prefills (..2^16, long <= partial).
  uint64_t max_batch_tokens = 0, max_seqs = 0, long_prefill_threshold = 0;
  uint32_t max_partial_prefills = 0, max_long_partial_prefills = 0;
  bool operator==(const assign_msg&) const = default;
};

// --- shards in other processes ---
struct step_seq {
  uint32_t n_tokens = 0;
  uint64_t pos0 = 0;
  uint32_t n_blocks = 0;
  bool want_logits = true;
  int32_t prompt_logprobs = -1;  ///< -1..max_logprobs (checked on decode)
  int32_t next = -1;             ///< -1 or a token id (the engine checks it against the vocabulary)
  uint32_t draws = 1;            ///< rows drawn from its last positions (1..n_tokens, checked on decode)
  int32_t lora = -1;             ///< its LoRA adapter's index (-1: none; >= -1 checked on decode, the engine checks the rest)
  bool operator==(const step_seq&) const = default;
};
/// One step for a shard in another process; sequence i's tokens and block table are the next
/// n_tokens and n_blocks entries.
struct step_row {
  sampling params;
  uint64_t position = 0;
  bool operator==(const step_row&) const = default;
};
struct shard_step_msg {
  uint64_t step = 0;
  std::vector<int32_t> tokens, tables;
  std::vector<step_seq> seqs;
  std::vector<step_row> rows;  ///< one per drawn row (draws of each sequence with want_logits)
  bool operator==(const shard_step_msg&) const = default;
};
struct shard_result_msg {
  uint64_t step = 0;
  uint32_t rank = 0;
  bool ok = true;
  errc code = errc::internal;  ///< when !ok
  std::string message;
  bool operator==(const shard_result_msg&) const = default;
};
struct shard_ready_msg {
  uint64_t replica = 0;
  uint32_t rank = 0;
  std::string tensor;  ///< the rank's tensor-plane address
  uint64_t actor = 0;  ///< its shard actor's id
  std::string key;     ///< bytes: the group's key
  bool ok = true;
  std::string reason;
  uint64_t kv_blocks = 0;  ///< its KV cache's blocks (the block ids rank 0 hands out must fit)
  std::string quantization;  ///< how its node holds the weights ("" from older nodes: none)
  std::string loras;         ///< the LoRA adapters its node loaded: names in order, one per line
  std::string kv_cache_dtype;  ///< its KV cache's elements ("" from older nodes: float32)
  std::string dtype;           ///< the type its node rewrote the weights in (--dtype; "" from older nodes: auto)
  bool operator==(const shard_ready_msg&) const = default;
};
struct shard_group_msg {
  uint64_t replica = 0;
  std::string key;
  std::vector<std::string> tensors;  ///< by rank
  bool operator==(const shard_group_msg&) const = default;
};
struct control_msg {
  std::string command;
  std::vector<std::string> args;
  std::string nonce;  ///< bytes
  uint64_t timestamp_ms = 0;
  std::string mac;    ///< bytes
  bool operator==(const control_msg&) const = default;
};
struct control_reply_msg {
  bool ok = false;
  std::string text, json;
  bool operator==(const control_reply_msg&) const = default;
};

using body = std::variant<generate_msg, token_body, cancel_msg, status_request, load_msg, hello_msg, challenge_msg,
                          proof_msg, welcome_msg, heartbeat_msg, replica_state_msg, collective_id_msg, assign_msg,
                          control_msg, control_reply_msg, shard_step_msg, shard_result_msg, shard_ready_msg,
                          shard_group_msg, kv_blocks_msg, reset_prefix_cache_msg, kv_events_request, kv_events_msg>;

struct envelope {
  actor_address source, destination;
  uint64_t correlation_id = 0;
  uint64_t trace_id = 0;
  body msg;
  bool operator==(const envelope&) const = default;
};

/// The message kind's name ("generate", "token", ...), for logs and counters.
const char* kind_name(const body& b);

}  // namespace llmesh::transport
