// A cluster config (`cluster-configs/*.yaml`, DESIGN §4): the mesh's name, seed (coordinator)
// address and join token, every node with its roles and addresses, and every model with its
// path, tensor-parallel size, replica count, router policy and KV-cache budget. A plain class
// (no CAF, no yaml-cpp in this header); `llmesh node --config FILE --name NODE` reads one.
//
// Parsing validates everything a node would otherwise trip over at run time and answers with
// one line naming the file, the entry and the field, e.g.
//   local.yaml: nodes[2] (replica-b): 'listen' must be HOST:PORT, got 'x'
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/model/lora.hpp"

namespace llmesh::actors {

/// A TCP address: a host name, an IPv4 address or an IPv6 address (without brackets) and a port.
struct endpoint {
  std::string host;
  uint16_t port = 0;

  /// "HOST:PORT", with brackets around an IPv6 host ("[::1]:7100").
  std::string str() const;
  bool operator==(const endpoint&) const = default;
};

/// Parses "HOST:PORT" or "[IPV6]:PORT". The host is a name or address made of letters, digits,
/// '.', '-' (and ':' inside brackets); the port is decimal, 1..65535. Does not resolve names
/// and does not refuse 0.0.0.0 (that is the config's rule; see `is_unspecified_host`).
[[nodiscard]] result<endpoint> parse_endpoint(std::string_view host_port);

/// True for hosts that mean "every interface" (0.0.0.0, ::, and their spellings such as "0" or
/// "0:0::0"), which a config may use only with `allow_public: true` (DESIGN §6).
bool is_unspecified_host(std::string_view host);

/// What a node runs. One process may hold several roles (the seed node of `local.yaml` is
/// coordinator, gateway and router).
enum class node_role { coordinator, gateway, router, replica };

/// "coordinator", "gateway", "router" or "replica".
std::string_view node_role_name(node_role role);

/// Where a replica's tensor-parallel shards live.
enum class placement {
  packed,  ///< all tp shards of a replica in one replica node's process
  spread,  ///< each shard of a replica on a different replica node (tensor plane over UCX)
};

/// One process of the mesh.
struct node_spec {
  std::string name;              ///< unique in the file; `llmesh node --name NAME` picks it
  std::vector<node_role> roles;  ///< non-empty, no repeats
  endpoint listen;               ///< the mesh (actor message) address; unique in the file
  std::optional<endpoint> http;  ///< gateway only, and required there: the OpenAI-compatible API
  std::optional<endpoint> rpc;   ///< gateway only, optional: the native Cap'n Proto RPC API
  /// Optional, any node: HOST:PORT of a Prometheus endpoint (GET /metrics, GET /health) of this
  /// process alone, for nodes without a gateway's HTTP API.
  std::optional<endpoint> metrics;
  int slots = 0;                 ///< replica only, optional: tensor-parallel shards it may host (0: 2)

  bool has(node_role role) const;
};

/// One model the mesh serves.
struct model_spec {
  std::string name;  ///< the API's "model" field; unique in the file
  std::string path;  ///< HF model directory, as written (relative paths are the node's cwd's)
  int tp = 1;        ///< tensor-parallel shards per replica, 1..64
  int replicas = 1;  ///< replicas to keep running, 0..1024 (0: declared, scaled up later)
  std::string policy = "least-load";  ///< router policy: round-robin|least-load|power-of-two|prefix-aware
  size_t kv_cache_mb = 1024;          ///< KV-cache budget per tensor-parallel shard, MiB
  std::string kv_cache_dtype = "float32";  ///< the KV cache's elements: float32 | bfloat16 (--kv-cache-dtype)
  /// Gateways' chat template for it (--chat-template: a file, or the template inline; "": the directory's)
  std::string chat_template;
  size_t max_model_len = 0;  ///< the context gateways grant (--max-model-len; 0: the model's)
  placement place = placement::packed;
  std::string quantization = "none";  ///< how replica nodes hold the weights: none | int8 | fp8 (online), or the checkpoint's method (--quantization)
  std::string dtype = "auto";         ///< the weight matrices' type: auto | float32 | bfloat16 | float16 (--dtype)
  /// How gateways split chat output's thinking (--reasoning-parser): none | deepseek_r1 | qwen3 | openai_gptoss
  std::string reasoning_parser = "none";
  /// The format gateways take tool_choice "auto"'s calls from (--tool-call-parser): hermes | llama3_json | mistral | pythonic |
  /// qwen3_coder (qwen3_xml) | granite | phi4_mini_json | openai
  std::string tool_call_parser = "hermes";
  /// Gateways' /v1/embeddings pooling (--pooling): model (the directory's) | last | mean | cls
  std::string pooling = "model";
  /// LoRA adapters served beside the model (--lora-modules): `loras: [{name: N, path: DIR}, ...]`;
  /// each name is unique among the file's models and adapters.
  std::vector<model::lora_source> loras;
  /// Adapters may be added and removed while the mesh serves (/v1/load_lora_adapter on a
  /// gateway, `llmesh ctl load-lora`): vLLM's --enable-lora with VLLM_ALLOW_RUNTIME_LORA_UPDATING.
  /// Not implied by `loras` (an explicit opt-in, as vLLM's variable is); packed placement only.
  bool enable_lora = false;
  /// Adapters a replica holds at once, the config's and those added while serving (vLLM's
  /// --max-cpu-loras; 0: 64); at least `loras`' count. A load beyond it is refused.
  size_t max_loras = 0;
  /// A mixture of experts' shards run whole experts instead of a slice of each (vLLM's
  /// --enable-expert-parallel; a dense model ignores it).
  bool expert_parallel = false;
  /// vLLM's speculative_config for its replicas, as JSON ("": the replica nodes' own
  /// --speculative-config or speculation flags): prompt lookup, or a draft model's directory
  /// (as written; relative paths are the node's cwd's) that each replica node loads.
  std::string speculative_config;
  /// Disaggregated prefill: this entry's replicas are prefill replicas for that model's requests
  /// (another entry's name; the same weights, any tp, the same KV dtype, packed): a prompt of
  /// which more than `max_local_prefill_length` tokens are not cached on its replica is computed
  /// on one of them first, unless each has `max_prefill_queue_size` requests (0: no limit), and
  /// its KV blocks move to the request's replica. Gateways do not serve this entry's name.
  std::string prefill_for;
  size_t max_local_prefill_length = 1000;  ///< Dynamo's; with prefill_for
  size_t max_prefill_queue_size = 0;       ///< Dynamo's; with prefill_for
  /// Its replicas' scheduler limits, as `llmesh serve`'s flags of vLLM's names (0: the replica
  /// node's own): max_num_batched_tokens (16..2^20), max_num_seqs (1..2^16),
  /// long_prefill_token_threshold, max_num_partial_prefills and max_long_partial_prefills
  /// (at most max_num_partial_prefills) — batch_scheduler.hpp's scheduler_config.
  size_t max_num_batched_tokens = 0, max_num_seqs = 0, long_prefill_token_threshold = 0;
  size_t max_num_partial_prefills = 0, max_long_partial_prefills = 0;
};

/// A whole cluster config, validated. Immutable after parsing; safe to share between threads.
struct cluster_config {
  std::string mesh;   ///< the mesh's name (nodes of another mesh are refused)
  endpoint seed;      ///< the coordinator's `listen` address; where nodes join
  std::string token;  ///< cluster join token, at least 16 characters
  std::chrono::milliseconds heartbeat{500}, failure_timeout{3000};
  bool allow_public = false;  ///< whether 0.0.0.0 / :: addresses were allowed
  /// Routers ask replicas what their prefix caches hold (KV events); false: Dynamo's
  /// --no-kv-events, they predict it from where they sent each prompt.
  bool kv_events = true;
  std::vector<node_spec> nodes;
  std::vector<model_spec> models;

  /// The node with this name, or nullptr.
  const node_spec* node(std::string_view name) const;
};

/// Parses and validates a config's text. `source` names the file in error messages. Every
/// error is invalid_request with a one-line message; malformed YAML reports its line.
[[nodiscard]] result<cluster_config> parse_cluster_config(std::string_view yaml_text, const std::string& source);

/// Reads `path` (not_found / io_error when it cannot) and parses it, naming `path` in errors.
[[nodiscard]] result<cluster_config> load_cluster_config(const std::string& path);

}  // namespace llmesh::actors
