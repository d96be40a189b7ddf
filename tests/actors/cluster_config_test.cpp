// Cluster configs: every file in cluster-configs/ parses, local.yaml holds what its comments
// say, each validation rule refuses with a one-line message naming the file, entry and field,
// and malformed or hostile YAML (tabs, unclosed brackets, garbage, 100000-deep nesting, random
// mutations) ends in an error, never a crash.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "llmesh/actors/cluster_config.hpp"

namespace llmesh::actors {
namespace {

const std::filesystem::path configs_dir = std::filesystem::path(LLMESH_SOURCE_DIR) / "cluster-configs";

// A small valid config that the rule tests edit one line at a time.
const std::string base = R"yaml(mesh: test
seed: 127.0.0.1:7100
token: 0123456789abcdef
heartbeat_ms: 500
failure_timeout_ms: 3000
nodes:
  - name: seed
    roles: [coordinator, gateway, router]
    listen: 127.0.0.1:7100
    http: 127.0.0.1:8080
    rpc: 127.0.0.1:8081
  - name: replica-a
    roles: [replica]
    listen: 127.0.0.1:7101
  - name: replica-b
    roles: [replica]
    listen: 127.0.0.1:7102
models:
  - name: m
    path: models/m
    tp: 2
    replicas: 2
    policy: least-load
    kv_cache_mb: 256
    placement: packed
)yaml";

/// `base` with the first `from` replaced by `to` (the test fails if `from` is absent).
std::string with(const std::string& from, const std::string& to, std::string text = base) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "not in the config: " << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

std::string error_of(const std::string& text) {
  auto c = parse_cluster_config(text, "t.yaml");
  if (c.ok()) return "(parsed)";
  EXPECT_EQ(c.err().code, errc::invalid_request);
  EXPECT_EQ(c.err().message.find('\n'), std::string::npos) << c.err().message;
  EXPECT_EQ(c.err().message.rfind("t.yaml", 0), 0u) << c.err().message;
  return c.err().message;
}

/// Expects `text` to be refused with a message that contains every one of `parts`.
void expect_refused(const std::string& text, std::initializer_list<std::string> parts) {
  std::string message = error_of(text);
  for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
}

TEST(ClusterConfig, EveryFileInTheFolderParses) {
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(configs_dir)) {
    auto ext = entry.path().extension();
    if (ext != ".yaml" && ext != ".yml") continue;
    ++n;
    auto c = load_cluster_config(entry.path().string());
    EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.err().message);
  }
  EXPECT_GE(n, 2u) << "cluster-configs/ should hold local.yaml and local-split-shards.yaml at least";
}

TEST(ClusterConfig, LocalYamlHoldsWhatItsCommentsSay) {
  auto c = load_cluster_config((configs_dir / "local.yaml").string());
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->mesh, "local");
  EXPECT_EQ(c->seed, (endpoint{"127.0.0.1", 7100}));
  EXPECT_GE(c->token.size(), 16u);
  EXPECT_EQ(c->heartbeat.count(), 500);
  EXPECT_EQ(c->failure_timeout.count(), 3000);
  EXPECT_FALSE(c->allow_public);
  ASSERT_EQ(c->nodes.size(), 3u);
  const node_spec* seed = c->node("seed");
  ASSERT_NE(seed, nullptr);
  EXPECT_EQ(seed->roles, (std::vector<node_role>{node_role::coordinator, node_role::gateway, node_role::router}));
  EXPECT_EQ(seed->listen.str(), "127.0.0.1:7100");
  EXPECT_EQ(seed->http->str(), "127.0.0.1:8080");
  EXPECT_EQ(seed->rpc->str(), "127.0.0.1:8081");
  EXPECT_FALSE(seed->has(node_role::replica));
  for (auto [name, port] : {std::pair{"replica-a", 7101}, std::pair{"replica-b", 7102}}) {
    const node_spec* n = c->node(name);
    ASSERT_NE(n, nullptr) << name;
    EXPECT_EQ(n->roles, std::vector<node_role>{node_role::replica});
    EXPECT_EQ(n->listen, (endpoint{"127.0.0.1", static_cast<uint16_t>(port)}));
    EXPECT_FALSE(n->http.has_value());
    EXPECT_FALSE(n->rpc.has_value());
  }
  EXPECT_EQ(c->node("nobody"), nullptr);
  ASSERT_EQ(c->models.size(), 1u);
  const model_spec& m = c->models[0];
  EXPECT_EQ(m.name, "kjv-tiny");
  EXPECT_EQ(m.path, "models/kjv-tiny");
  EXPECT_EQ(m.tp, 2);
  EXPECT_EQ(m.replicas, 2);
  EXPECT_EQ(m.policy, "least-load");
  EXPECT_EQ(m.kv_cache_mb, 256u);
  EXPECT_EQ(m.place, placement::packed);
  // The path is relative to the working directory; from the repository root it is the bundled model.
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(LLMESH_SOURCE_DIR) / m.path / "config.json"));
}

TEST(ClusterConfig, SplitShardsSpreadsOneReplicaOverTwoProcesses) {
  auto c = load_cluster_config((configs_dir / "local-split-shards.yaml").string());
  ASSERT_TRUE(c.ok()) << c.err().message;
  ASSERT_EQ(c->models.size(), 1u);
  EXPECT_EQ(c->models[0].place, placement::spread);
  EXPECT_EQ(c->models[0].tp, 2);
  EXPECT_EQ(c->models[0].replicas, 1);
  ASSERT_NE(c->node("shard-0"), nullptr);
  ASSERT_NE(c->node("shard-1"), nullptr);
  EXPECT_NE(c->node("shard-0")->listen, c->node("shard-1")->listen);
  EXPECT_EQ(c->node("seed")->http->port, 8090);
}

TEST(ClusterConfig, DefaultsApplyToOptionalFields) {
  std::string text = base;
  for (const char* line : {"heartbeat_ms: 500\n", "failure_timeout_ms: 3000\n", "    tp: 2\n", "    replicas: 2\n",
                           "    policy: least-load\n", "    kv_cache_mb: 256\n", "    placement: packed\n"})
    text = with(line, "", text);
  auto c = parse_cluster_config(text, "t.yaml");
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->heartbeat.count(), 500);
  EXPECT_EQ(c->failure_timeout.count(), 3000);
  const model_spec& m = c->models[0];
  EXPECT_EQ(m.tp, 1);
  EXPECT_EQ(m.replicas, 1);
  EXPECT_EQ(m.policy, "least-load");
  EXPECT_EQ(m.kv_cache_mb, 1024u);
  EXPECT_EQ(m.place, placement::packed);
  EXPECT_EQ(m.quantization, "none");
  EXPECT_EQ(m.kv_cache_dtype, "float32");
  EXPECT_EQ(m.dtype, "auto");
  EXPECT_TRUE(parse_cluster_config(with("models:\n", "models: []\n", with("  - name: m\n    path: models/m\n", "", text)), "t.yaml").ok());
}

TEST(ParseEndpoint, ReadsHostPortAndBracketedIpv6) {
  EXPECT_EQ(*parse_endpoint("127.0.0.1:7100"), (endpoint{"127.0.0.1", 7100}));
  EXPECT_EQ(*parse_endpoint("node-3.example:1"), (endpoint{"node-3.example", 1}));
  EXPECT_EQ(*parse_endpoint("[::1]:65535"), (endpoint{"::1", 65535}));
  EXPECT_EQ(parse_endpoint("[::1]:8080")->str(), "[::1]:8080");
  EXPECT_EQ(parse_endpoint("localhost:8080")->str(), "localhost:8080");
  for (const char* bad : {"", "x", ":80", "host:", "host:0", "host:65536", "host:99999999999", "host:+80", "host:-1", "host:8o",
                          "::1:80", "[::1]", "[::1]80", "[host]:80", "[]:80", "a b:80", "host:80 "}) {
    auto e = parse_endpoint(bad);
    EXPECT_FALSE(e.ok()) << "accepted '" << bad << "'";
    if (!e.ok()) {
      EXPECT_EQ(e.err().code, errc::invalid_request);
    }
  }
  EXPECT_TRUE(is_unspecified_host("0.0.0.0"));
  EXPECT_TRUE(is_unspecified_host("0"));
  EXPECT_TRUE(is_unspecified_host("::"));
  EXPECT_TRUE(is_unspecified_host("0:0::0"));
  EXPECT_FALSE(is_unspecified_host("127.0.0.1"));
  EXPECT_FALSE(is_unspecified_host("::1"));
  EXPECT_FALSE(is_unspecified_host("10.0.0.0"));
}

TEST(ClusterConfig, ErrorNamesTheFileTheEntryAndTheField) {
  EXPECT_EQ(error_of(with("listen: 127.0.0.1:7102", "listen: x")), "t.yaml: nodes[2] (replica-b): 'listen' must be HOST:PORT, got 'x'");
}

TEST(ClusterConfig, AReplicaNodeMaySayHowManyShardsItHosts) {
  auto c = parse_cluster_config(with("listen: 127.0.0.1:7101", "listen: 127.0.0.1:7101\n    slots: 6"), "t.yaml");
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->node("replica-a")->slots, 6);
  EXPECT_EQ(c->node("replica-b")->slots, 0);  // not said: the coordinator's default
  expect_refused(with("listen: 127.0.0.1:7101", "listen: 127.0.0.1:7101\n    slots: 0"), {"nodes[1] (replica-a)", "'slots'"});
  expect_refused(with("listen: 127.0.0.1:7101", "listen: 127.0.0.1:7101\n    slots: 5000"), {"'slots'"});
  expect_refused(with("listen: 127.0.0.1:7101", "listen: 127.0.0.1:7101\n    slots: many"), {"'slots'"});
  expect_refused(with("listen: 127.0.0.1:7100", "listen: 127.0.0.1:7100\n    slots: 2"), {"nodes[0] (seed)", "'slots' is only for replica nodes"});
}

TEST(ClusterConfig, RequiredFieldsAreRequired) {
  expect_refused(with("mesh: test\n", ""), {"'mesh' is required"});
  expect_refused(with("seed: 127.0.0.1:7100\n", ""), {"'seed' is required"});
  expect_refused(with("token: 0123456789abcdef\n", ""), {"'token' is required"});
  expect_refused(base.substr(0, base.find("nodes:")), {"'nodes' is required"});
  expect_refused(with("  - name: replica-a\n    roles", "  - roles"), {"nodes[1]: 'name' is required"});
  expect_refused(with("    roles: [replica]\n    listen: 127.0.0.1:7101", "    listen: 127.0.0.1:7101"), {"nodes[1] (replica-a)", "'roles' is required"});
  expect_refused(with("\n    listen: 127.0.0.1:7102", ""), {"nodes[2] (replica-b)", "'listen' is required"});
  expect_refused(with("    path: models/m\n", ""), {"models[0] (m)", "'path' is required"});
  expect_refused(with("  - name: m\n    path", "  - path"), {"models[0]: 'name' is required"});
  expect_refused("", {"empty"});
  expect_refused("# only a comment\n", {"empty"});
}

TEST(ClusterConfig, UnknownAndRepeatedKeysAreRefused) {
  expect_refused(with("mesh:", "mesch:"), {"unknown key 'mesch'", "known: mesh"});
  expect_refused(with("listen: 127.0.0.1:7101", "lisen: 127.0.0.1:7101"), {"nodes[1]", "unknown key 'lisen'"});
  expect_refused(with("    replicas: 2", "    replica: 2"), {"models[0] (m)", "unknown key 'replica'"});
  expect_refused(with("mesh: test\n", "mesh: test\nmesh: other\n"), {"key 'mesh' appears twice"});
  expect_refused(with("    tp: 2\n", "    tp: 2\n    tp: 4\n"), {"models[0] (m)", "key 'tp' appears twice"});
  expect_refused(with("mesh: test\n", "[a]: 1\nmesh: test\n"), {"keys must be strings"});
  expect_refused(with("mesh: test\n", "<<: {mesh: x}\nmesh: test\n"), {"unknown key '<<'"});
}

TEST(ClusterConfig, TypesAreChecked) {
  expect_refused(with("tp: 2", "tp: two"), {"'tp' must be an integer in 1..64, got 'two'"});
  expect_refused(with("tp: 2", "tp: '2'"), {"'tp'", "unquoted"});
  expect_refused(with("tp: 2", "tp: 1.5"), {"'tp'", "got '1.5'"});
  expect_refused(with("tp: 2", "tp: 0x2"), {"'tp'", "got '0x2'"});
  expect_refused(with("tp: 2", "tp: [2]"), {"'tp' must be an integer in 1..64, got a list"});
  expect_refused(with("heartbeat_ms: 500", "heartbeat_ms: 99999999999999999999999"), {"'heartbeat_ms'"});
  expect_refused(with("mesh: test", "mesh: [a, b]"), {"'mesh' must be a string, got a list"});
  expect_refused(with("mesh: test", "mesh:"), {"'mesh' must be a string, got nothing"});
  expect_refused(with("mesh: test", "mesh: two words"), {"'mesh' must be"});
  expect_refused(with("  - name: replica-a", "  - name: ~"), {"nodes[1]: 'name' must be a string"});
  expect_refused(with("roles: [replica]", "roles: replica"), {"nodes[1] (replica-a)", "'roles' must be a non-empty list"});
  expect_refused(with("roles: [replica]", "roles: []"), {"'roles' must be a non-empty list"});
  expect_refused(with("roles: [replica]", "roles: [[replica]]"), {"'roles' has unknown role"});
  expect_refused(with("nodes:\n", "nodes: 5\n", base.substr(0, base.find("nodes:") + 7)), {"'nodes' must be a non-empty list"});
  expect_refused(with("models:\n", "models: {}\n", base.substr(0, base.find("models:") + 8)), {"'models' must be a list"});
  expect_refused(with("  - name: replica-b\n", "  - replica-b\n  - name: replica-b\n"), {"nodes[2]: must be a mapping"});
  expect_refused("just a string\n", {"must be a mapping"});
  expect_refused(with("mesh: test\n", "allow_public: yes\nmesh: test\n"), {"'allow_public' must be true or false, got 'yes'"});
}

TEST(ClusterConfig, NodeRulesAreChecked) {
  expect_refused(with("  - name: replica-b", "  - name: replica-a"), {"nodes[2] (replica-a)", "name 'replica-a' is already used by nodes[1]"});
  expect_refused(with("listen: 127.0.0.1:7102", "listen: 127.0.0.1:7101"),
                 {"nodes[2] (replica-b)", "'listen' '127.0.0.1:7101' is already used by nodes[1] (replica-a) 'listen'"});
  expect_refused(with("listen: 127.0.0.1:7102", "listen: 127.0.0.1:8080"), {"'listen' '127.0.0.1:8080' is already used by nodes[0] (seed) 'http'"});
  expect_refused(with("  - name: replica-b", "  - name: bad/name"), {"nodes[2] (bad/name): 'name' must be"});
  expect_refused(with("roles: [replica]", "roles: [replicas]"), {"nodes[1] (replica-a)", "unknown role 'replicas'"});
  expect_refused(with("roles: [replica]", "roles: [replica, replica]"), {"'roles' lists 'replica' twice"});
  expect_refused(with("    listen: 127.0.0.1:7101", "    listen: 127.0.0.1:7101\n    http: 127.0.0.1:9000"),
                 {"nodes[1] (replica-a)", "'http' is only for gateway nodes"});
  expect_refused(with("    listen: 127.0.0.1:7101", "    listen: 127.0.0.1:7101\n    rpc: 127.0.0.1:9000"), {"'rpc' is only for gateway nodes"});
  expect_refused(with("    http: 127.0.0.1:8080\n", ""), {"nodes[0] (seed)", "'http' is required on a gateway node"});
  EXPECT_EQ(error_of(with("    rpc: 127.0.0.1:8081\n", "")), "(parsed)");  // rpc is optional
}

TEST(ClusterConfig, AnyNodeMayHaveAMetricsAddressOfItsOwn) {
  auto c = parse_cluster_config(with("    listen: 127.0.0.1:7101", "    listen: 127.0.0.1:7101\n    metrics: 127.0.0.1:9101"), "t.yaml");
  ASSERT_TRUE(c) << c.err().message;
  ASSERT_TRUE(c->node("replica-a")->metrics.has_value());
  EXPECT_EQ(c->node("replica-a")->metrics->str(), "127.0.0.1:9101");
  EXPECT_FALSE(c->node("replica-b")->metrics.has_value());
  EXPECT_FALSE(c->node("seed")->metrics.has_value());
  expect_refused(with("    listen: 127.0.0.1:7101", "    listen: 127.0.0.1:7101\n    metrics: 127.0.0.1:8080"),
                 {"nodes[1] (replica-a)", "'metrics' '127.0.0.1:8080' is already used by nodes[0] (seed) 'http'"});
  expect_refused(with("    listen: 127.0.0.1:7101", "    listen: 127.0.0.1:7101\n    metrics: 9101"),
                 {"nodes[1] (replica-a): 'metrics' must be HOST:PORT, got '9101'"});
  expect_refused(with("    listen: 127.0.0.1:7101", "    listen: 127.0.0.1:7101\n    metrics: 0.0.0.0:9101"),
                 {"'metrics' '0.0.0.0:9101' listens on every interface", "allow_public"});
}

TEST(ClusterConfig, MeshRulesAreChecked) {
  expect_refused(with("[coordinator, gateway, router]", "[gateway, router]"), {"no node has the coordinator role"});
  expect_refused(with("roles: [replica]", "roles: [replica, coordinator]"), {"nodes[1] (replica-a)", "a second coordinator"});
  expect_refused(with("seed: 127.0.0.1:7100", "seed: 127.0.0.1:7101"), {"'seed' '127.0.0.1:7101' must equal the coordinator's 'listen'"});
  expect_refused(with("[coordinator, gateway, router]", "[coordinator, router]", with("    http: 127.0.0.1:8080\n    rpc: 127.0.0.1:8081\n", "")),
                 {"no node has the gateway role"});
  expect_refused(with("[coordinator, gateway, router]", "[coordinator, gateway]"), {"no node has the router role"});
  expect_refused(with("token: 0123456789abcdef", "token: 0123456789abcde"), {"'token' must be 16..1024 characters", "got 15"});
  expect_refused(with("token: 0123456789abcdef", "token: '0123456789 abcdef'"), {"'token'"});
  expect_refused(with("heartbeat_ms: 500", "heartbeat_ms: 3000"), {"'heartbeat_ms' (3000) must be less than 'failure_timeout_ms' (3000)"});
  expect_refused(with("heartbeat_ms: 500", "heartbeat_ms: 0"), {"'heartbeat_ms' must be an integer in 1..60000"});
  expect_refused(with("failure_timeout_ms: 3000", "failure_timeout_ms: -3"), {"'failure_timeout_ms'"});
}

TEST(ClusterConfig, LoraAdaptersAreReadAndTheirNamesChecked) {
  const std::string two = "placement: packed\n    loras:\n      - name: psalms\n        path: adapters/psalms\n"
                          "      - {name: org/chat:v2, path: /abs/chat}";
  auto q = parse_cluster_config(with("placement: packed", two), "t.yaml");
  ASSERT_TRUE(q.ok()) << q.err().message;
  ASSERT_EQ(q->models[0].loras.size(), 2u);
  EXPECT_EQ(q->models[0].loras[0], (model::lora_source{"psalms", "adapters/psalms"}));
  EXPECT_EQ(q->models[0].loras[1], (model::lora_source{"org/chat:v2", "/abs/chat"}));
  EXPECT_TRUE(parse_cluster_config(base, "t.yaml")->models[0].loras.empty());
  expect_refused(with("placement: packed", "placement: packed\n    loras: adapters"), {"'loras' must be a list of {name, path}"});
  expect_refused(with("placement: packed", "placement: packed\n    loras: [{name: a}]"), {"'path' is required"});
  expect_refused(with("placement: packed", "placement: packed\n    loras: [{name: 'a b', path: x}]"), {"loras[0]: name 'a b'"});
  expect_refused(with("placement: packed", "placement: packed\n    loras: [{name: a, path: x}, {name: a, path: y}]"),
                 {"LoRA adapter name 'a' given twice"});
  expect_refused(with("placement: packed", "placement: packed\n    loras: [{name: m, path: x}]"), {"is the base model's name"});
  // Adapters answer as models: a name is unique among all models and adapters of the file.
  const std::string second = "placement: packed\n    loras: [{name: a, path: x}]\n  - name: n\n    path: models/n\n"
                             "    replicas: 0\n    loras: [{name: a, path: y}]";
  expect_refused(with("placement: packed", second), {"LoRA adapter 'a' is already models[0]'s"});
  const std::string named = "placement: packed\n    loras: [{name: n, path: x}]\n  - name: n\n    path: models/n\n    replicas: 0";
  expect_refused(with("placement: packed", named), {"name 'n' is already a LoRA adapter's of models[0]"});
}

TEST(ClusterConfig, EnableLoraLetsAdaptersComeWhileServingPackedModelsOnly) {
  EXPECT_FALSE(parse_cluster_config(base, "t.yaml")->models[0].enable_lora);
  auto on = parse_cluster_config(with("placement: packed", "placement: packed\n    enable_lora: true"), "t.yaml");
  ASSERT_TRUE(on.ok()) << on.err().message;
  EXPECT_TRUE(on->models[0].enable_lora);
  EXPECT_TRUE(on->models[0].loras.empty());
  // Not implied by loras: the runtime routes are an opt-in of their own.
  auto listed = parse_cluster_config(with("placement: packed", "placement: packed\n    loras: [{name: a, path: x}]"), "t.yaml");
  ASSERT_TRUE(listed.ok()) << listed.err().message;
  EXPECT_FALSE(listed->models[0].enable_lora);
  expect_refused(with("placement: packed", "placement: packed\n    enable_lora: yes"), {"'enable_lora' must be true or false"});
  expect_refused(with("placement: packed", "placement: packed\n    enable_lora: 'true'"), {"'enable_lora' must be true or false"});
  auto bounded = parse_cluster_config(with("placement: packed", "placement: packed\n    enable_lora: true\n    max_loras: 8"), "t.yaml");
  ASSERT_TRUE(bounded.ok()) << bounded.err().message;
  EXPECT_EQ(bounded->models[0].max_loras, 8u);
  EXPECT_EQ(on->models[0].max_loras, 0u) << "unset: the node's default (64)";
  expect_refused(with("placement: packed", "placement: packed\n    max_loras: 0"), {"'max_loras' must be an integer in 1..65536"});
  expect_refused(with("placement: packed", "placement: packed\n    loras: [{name: a, path: x}, {name: b, path: y}]\n    max_loras: 1"),
                 {"'max_loras' (1) is below the 2 adapters 'loras' lists"});
  expect_refused(with("placement: packed", "placement: spread\n    enable_lora: true"),
                 {"'enable_lora': adapters added while serving reach packed replicas only"});
}

// Dynamo's --no-kv-events for a whole mesh: its routers predict what replicas cache.
TEST(ClusterConfig, KvEventsAreOnUnlessTheFileSaysFalse) {
  EXPECT_TRUE(parse_cluster_config(base, "t.yaml")->kv_events);
  EXPECT_TRUE(parse_cluster_config(with("heartbeat_ms: 500", "heartbeat_ms: 500\nkv_events: true"), "t.yaml")->kv_events);
  auto off = parse_cluster_config(with("heartbeat_ms: 500", "heartbeat_ms: 500\nkv_events: false"), "t.yaml");
  ASSERT_TRUE(off.ok()) << off.err().message;
  EXPECT_FALSE(off->kv_events);
  expect_refused(with("heartbeat_ms: 500", "heartbeat_ms: 500\nkv_events: no"), {"'kv_events' must be true or false"});
}

TEST(ClusterConfig, ExpertParallelIsAModelsFlag) {
  EXPECT_FALSE(parse_cluster_config(base, "t.yaml")->models[0].expert_parallel);
  auto on = parse_cluster_config(with("placement: packed", "placement: packed\n    expert_parallel: true"), "t.yaml");
  ASSERT_TRUE(on.ok()) << on.err().message;
  EXPECT_TRUE(on->models[0].expert_parallel);
  expect_refused(with("placement: packed", "placement: packed\n    expert_parallel: 1"), {"'expert_parallel' must be true or false"});
}

// serve's scheduler flags, by vLLM's names, for a model's replicas (0: the node's own).
TEST(ClusterConfig, SchedulerLimitsAreAModelsAndCheckedWhenRead) {
  const auto plain = parse_cluster_config(base, "t.yaml")->models[0];
  EXPECT_EQ(plain.max_num_batched_tokens + plain.max_num_seqs + plain.long_prefill_token_threshold + plain.max_num_partial_prefills +
                plain.max_long_partial_prefills,
            0u);
  auto c = parse_cluster_config(with("placement: packed", "placement: packed\n    max_num_batched_tokens: 512\n    max_num_seqs: 32\n"
                                                          "    long_prefill_token_threshold: 64\n    max_num_partial_prefills: 4\n"
                                                          "    max_long_partial_prefills: 2"),
                                "t.yaml");
  ASSERT_TRUE(c.ok()) << c.err().message;
  const auto& m = c->models[0];
  EXPECT_EQ(m.max_num_batched_tokens, 512u);
  EXPECT_EQ(m.max_num_seqs, 32u);
  EXPECT_EQ(m.long_prefill_token_threshold, 64u);
  EXPECT_EQ(m.max_num_partial_prefills, 4u);
  EXPECT_EQ(m.max_long_partial_prefills, 2u);
  expect_refused(with("placement: packed", "placement: packed\n    max_num_batched_tokens: 8"), {"'max_num_batched_tokens'"});
  expect_refused(with("placement: packed", "placement: packed\n    max_num_seqs: 0"), {"'max_num_seqs'"});
  expect_refused(with("placement: packed", "placement: packed\n    long_prefill_token_threshold: -1"), {"'long_prefill_token_threshold'"});
  expect_refused(with("placement: packed", "placement: packed\n    max_num_partial_prefills: 2\n    max_long_partial_prefills: 3"),
                 {"'max_long_partial_prefills' must be at most 'max_num_partial_prefills' (2)"});
  expect_refused(with("placement: packed", "placement: packed\n    max_long_partial_prefills: 2"),
                 {"'max_long_partial_prefills' must be at most 'max_num_partial_prefills' (1)"});
  expect_refused(with("placement: packed", "placement: packed\n    max_model_len: 100\n    long_prefill_token_threshold: 101"),
                 {"'long_prefill_token_threshold' (101) exceeds 'max_model_len' (100)"});
}

TEST(ClusterConfig, SpeculativeConfigIsVllmsAndCheckedWhenRead) {
  EXPECT_EQ(parse_cluster_config(base, "t.yaml")->models[0].speculative_config, "");
  auto map = parse_cluster_config(
      with("placement: packed", "placement: packed\n    speculative_config: {model: /d/draft, num_speculative_tokens: 3}"), "t.yaml");
  ASSERT_TRUE(map.ok()) << map.err().message;
  auto j = nlohmann::json::parse(map->models[0].speculative_config);
  EXPECT_EQ(j["model"], "/d/draft");
  EXPECT_EQ(j["num_speculative_tokens"], 3) << "a number, not the string \"3\"";
  auto text = parse_cluster_config(
      with("placement: packed", "placement: packed\n    speculative_config: '{\"method\": \"ngram\", \"num_speculative_tokens\": 2}'"),
      "t.yaml");
  ASSERT_TRUE(text.ok()) << text.err().message;
  EXPECT_EQ(nlohmann::json::parse(text->models[0].speculative_config)["method"], "ngram");
  expect_refused(with("placement: packed", "placement: packed\n    speculative_config: {method: eagle, model: x, num_speculative_tokens: 2}"),
                 {"models[0] (m): 'speculative_config': method \"eagle\""});
  expect_refused(with("placement: packed", "placement: packed\n    speculative_config: {model: x}"),
                 {"'speculative_config': a draft model needs num_speculative_tokens"});
  expect_refused(with("placement: packed", "placement: packed\n    speculative_config: {method: ngram}"),
                 {"'speculative_config': num_speculative_tokens is needed"});
  expect_refused(with("placement: packed", "placement: packed\n    speculative_config: ngram"), {"'speculative_config' must be a mapping"});
  // Aliases that repeat a subtree thousands of times are refused before they are expanded.
  expect_refused(with("placement: packed",
                      "placement: packed\n    speculative_config:\n      a: &a [1, 1, 1, 1, 1, 1, 1, 1]\n"
                      "      b: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n      c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\n"
                      "      d: [*c, *c, *c, *c, *c, *c, *c, *c]"),
                 {"'speculative_config' must be a mapping of distinct keys"});
  expect_refused(with("placement: packed", "placement: packed\n    speculative_config: {model: x, num_speculative_tokens: 2, foo: 1}"),
                 {"'foo' is not taken here"});
}

TEST(ClusterConfig, ModelRulesAreChecked) {
  expect_refused(with("tp: 2", "tp: 0"), {"models[0] (m): 'tp' must be an integer in 1..64, got '0'"});
  expect_refused(with("tp: 2", "tp: 65"), {"'tp' must be an integer in 1..64, got '65'"});
  EXPECT_EQ(error_of(with("tp: 2", "tp: 64")), "(parsed)");
  expect_refused(with("replicas: 2", "replicas: -1"), {"'replicas' must be an integer in 0..1024"});
  expect_refused(with("replicas: 2", "replicas: 1025"), {"'replicas' must be an integer in 0..1024"});
  EXPECT_EQ(error_of(with("replicas: 2", "replicas: 0")), "(parsed)");
  expect_refused(with("policy: least-load", "policy: random"), {"'policy' must be round-robin, least-load, power-of-two or prefix-aware, got 'random'"});
  for (const char* p : {"round-robin", "power-of-two", "prefix-aware"}) EXPECT_EQ(error_of(with("least-load", p)), "(parsed)");
  expect_refused(with("kv_cache_mb: 256", "kv_cache_mb: 0"), {"'kv_cache_mb' must be an integer"});
  expect_refused(with("placement: packed", "placement: scattered"), {"'placement' must be packed or spread, got 'scattered'"});
  EXPECT_EQ(error_of(with("placement: packed", "placement: spread")), "(parsed)");  // 2 replica nodes for tp 2
  expect_refused(with("placement: packed", "placement: packed\n    quantization: bitsandbytes"), {"'quantization': --quantization bitsandbytes is not supported"});
  {
    auto q = parse_cluster_config(with("placement: packed", "placement: packed\n    quantization: int8"), "t.yaml");
    ASSERT_TRUE(q.ok()) << q.err().message;
    EXPECT_EQ(q->models[0].quantization, "int8");
    EXPECT_EQ(q->models[0].reasoning_parser, "none");
    auto marlin = parse_cluster_config(with("placement: packed", "placement: packed\n    quantization: awq_marlin"), "t.yaml");
    ASSERT_TRUE(marlin.ok()) << marlin.err().message;
    EXPECT_EQ(marlin->models[0].quantization, "awq");  // vLLM's alias, by its method
  }
  expect_refused(with("placement: packed", "placement: packed\n    kv_cache_dtype: fp8_inc"),
                 {"'kv_cache_dtype' must be auto, float32, bfloat16, fp8, fp8_e4m3 or fp8_e5m2, got 'fp8_inc'"});
  for (const auto& [given, kept] : {std::pair{"bfloat16", "bfloat16"}, {"bf16", "bfloat16"}, {"auto", "float32"},
                                    {"fp8", "fp8_e4m3"}, {"fp8_e4m3", "fp8_e4m3"}, {"fp8_e5m2", "fp8_e5m2"}}) {
    auto t = parse_cluster_config(with("placement: packed", std::string("placement: packed\n    kv_cache_dtype: ") + given), "t.yaml");
    ASSERT_TRUE(t.ok()) << t.err().message;
    EXPECT_EQ(t->models[0].kv_cache_dtype, kept);
  }
  expect_refused(with("placement: packed", "placement: packed\n    dtype: fp8"),
                 {"'dtype' must be auto, bfloat16, float16 (half) or float32 (float), got 'fp8'"});
  for (const auto& [given, kept] : {std::pair{"half", "float16"}, {"float", "float32"}, {"bfloat16", "bfloat16"}}) {
    auto t = parse_cluster_config(with("placement: packed", std::string("placement: packed\n    dtype: ") + given), "t.yaml");
    ASSERT_TRUE(t.ok()) << t.err().message;
    EXPECT_EQ(t->models[0].dtype, kept);
  }
  expect_refused(with("placement: packed", "placement: packed\n    max_model_len: 0"), {"'max_model_len' must be an integer"});
  expect_refused(with("placement: packed", "placement: packed\n    chat_template: ''"), {"'chat_template' must not be empty"});
  {
    auto g = parse_cluster_config(
        with("placement: packed", "placement: packed\n    max_model_len: 4096\n    chat_template: templates/chat.jinja"), "t.yaml");
    ASSERT_TRUE(g.ok()) << g.err().message;
    EXPECT_EQ(g->models[0].max_model_len, 4096u);
    EXPECT_EQ(g->models[0].chat_template, "templates/chat.jinja");
  }
  expect_refused(with("placement: packed", "placement: packed\n    reasoning_parser: granite"),
                 {"'reasoning_parser' must be none, deepseek_r1, qwen3 or openai_gptoss, got 'granite'"});
  expect_refused(with("placement: packed", "placement: packed\n    tool_call_parser: xlam"),
                 {"'tool_call_parser' must be hermes, llama3_json, mistral, pythonic, qwen3_coder, granite, phi4_mini_json or openai, got 'xlam'"});
  expect_refused(with("placement: packed", "placement: packed\n    pooling: max"),
                 {"'pooling' must be model, last, mean or cls, got 'max'"});
  {
    auto q = parse_cluster_config(with("placement: packed", "placement: packed\n    pooling: mean"), "t.yaml");
    ASSERT_TRUE(q.ok()) << q.err().message;
    EXPECT_EQ(q->models[0].pooling, "mean");
    EXPECT_EQ(parse_cluster_config(base, "t.yaml")->models[0].pooling, "model");
  }
  {
    auto q = parse_cluster_config(with("placement: packed", "placement: packed\n    tool_call_parser: llama3_json"), "t.yaml");
    ASSERT_TRUE(q.ok()) << q.err().message;
    EXPECT_EQ(q->models[0].tool_call_parser, "llama3_json");
    EXPECT_EQ(parse_cluster_config(base, "t.yaml")->models[0].tool_call_parser, "hermes");
  }
  for (const char* p : {"qwen3", "deepseek_r1", "none"}) {
    auto q = parse_cluster_config(with("placement: packed", std::string("placement: packed\n    reasoning_parser: ") + p), "t.yaml");
    ASSERT_TRUE(q.ok()) << q.err().message;
    EXPECT_EQ(q->models[0].reasoning_parser, p);
  }
  expect_refused(with("tp: 2", "tp: 3", with("placement: packed", "placement: spread")),
                 {"models[0] (m): 'placement' spread", "tp=3", "only 2 nodes have the replica role"});
  expect_refused(with("path: models/m\n", "path: models/m\n  - name: m\n    path: other\n"), {"models[1] (m)", "name 'm' is already used by models[0]"});
  // Several models: each keeps its own fields; routers route by the name.
  auto two = parse_cluster_config(with("placement: packed\n", "placement: packed\n  - name: n\n    path: other\n    policy: round-robin\n"), "t.yaml");
  ASSERT_TRUE(two.ok()) << two.err().message;
  ASSERT_EQ(two->models.size(), 2u);
  EXPECT_EQ(two->models[1].name, "n");
  EXPECT_EQ(two->models[1].path, "other");
  EXPECT_EQ(two->models[1].policy, "round-robin");
  EXPECT_EQ(two->models[1].tp, 1);
  EXPECT_EQ(two->models[1].replicas, 1);
  EXPECT_EQ(two->models[0].tp, 2);
  EXPECT_EQ(two->models[0].replicas, 2);
  expect_refused(with("placement: packed\n", "placement: packed\n  - name: n\n    path: other\n    tp: 3\n    placement: spread\n"),
                 {"models[1] (n): 'placement' spread", "only 2 nodes"});
  std::string no_replica_nodes = with("roles: [replica]", "roles: [router]", with("roles: [replica]", "roles: [router]"));
  expect_refused(no_replica_nodes, {"'replicas' is 2 but no node has the replica role"});
  EXPECT_EQ(error_of(with("replicas: 2", "replicas: 0", no_replica_nodes)), "(parsed)");
}

TEST(ClusterConfig, AddressesAreCheckedAndNotPublicUnlessAllowed) {
  expect_refused(with("listen: 127.0.0.1:7101", "listen: 127.0.0.1:0"), {"nodes[1] (replica-a): 'listen' port must be 1..65535"});
  expect_refused(with("listen: 127.0.0.1:7101", "listen: 127.0.0.1:65536"), {"'listen' port must be 1..65535"});
  expect_refused(with("listen: 127.0.0.1:7101", "listen: ::1:7101"), {"needs brackets"});
  expect_refused(with("http: 127.0.0.1:8080", "http: 8080"), {"nodes[0] (seed): 'http' must be HOST:PORT, got '8080'"});
  expect_refused(with("http: 127.0.0.1:8080", "http: 0.0.0.0:8080"), {"'http' '0.0.0.0:8080' listens on every interface", "allow_public"});
  expect_refused(with("listen: 127.0.0.1:7101", "listen: '[::]:7101'"), {"'listen' '[::]:7101' listens on every interface"});
  expect_refused(with("seed: 127.0.0.1:7100", "seed: 0.0.0.0:7100"), {"'seed'", "every interface"});
  std::string open = with("http: 127.0.0.1:8080", "http: 0.0.0.0:8080", with("mesh: test\n", "mesh: test\nallow_public: true\n"));
  auto c = parse_cluster_config(open, "t.yaml");
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_TRUE(c->allow_public);
  EXPECT_EQ(c->node("seed")->http->host, "0.0.0.0");
  EXPECT_EQ(error_of(with("listen: 127.0.0.1:7101", "listen: '[::1]:7101'")), "(parsed)");
}

TEST(ClusterConfig, WindowsLineEndingsAndByteOrderMarkAreFine) {
  std::string crlf;
  for (char ch : base) crlf += ch == '\n' ? std::string("\r\n") : std::string(1, ch);
  EXPECT_EQ(error_of(crlf), "(parsed)");
  EXPECT_EQ(error_of("\xEF\xBB\xBF" + base), "(parsed)");
}

TEST(ClusterConfig, OneDocumentOnly) {
  expect_refused(base + "---\nmesh: other\n", {"exactly one YAML document, found 2"});
}

TEST(ClusterConfig, MalformedYamlIsAnErrorWithALine) {
  expect_refused(with("    roles: [replica]\n    listen: 127.0.0.1:7101", "    roles: [replica]\n\tlisten: 127.0.0.1:7101"), {"t.yaml:14:", "tab"});
  expect_refused(with("roles: [replica]", "roles: [replica"), {"malformed YAML", "t.yaml:"});
  expect_refused("mesh: {a: 1\n", {"malformed YAML"});
  // yaml-cpp 0.7 ends an unclosed quoted scalar at the end of the text; the checks still refuse it.
  expect_refused("mesh: 'unterminated\n", {"'mesh' must be"});
  expect_refused("mesh: \"unterminated\n", {"'mesh' must be"});
  expect_refused("a: b: c\n", {"malformed YAML"});
  expect_refused("a: *nowhere\n", {"malformed YAML"});
  expect_refused("- a\nb: c\n", {"t.yaml:"});
}

TEST(ClusterConfig, GarbageIsAnError) {
  std::mt19937 rng(7);
  std::string garbage(1'000'000, ' ');
  for (char& ch : garbage) ch = static_cast<char>(rng());
  EXPECT_NE(error_of(garbage), "(parsed)");
  std::string printable(1'000'000, ' ');
  for (char& ch : printable) ch = static_cast<char>(0x20 + rng() % 95);
  EXPECT_NE(error_of(printable), "(parsed)");
  expect_refused(std::string((1 << 20) + 1, 'a'), {"larger than 1 MiB"});
  expect_refused(std::string("mesh: te\0st\n", 12), {"t.yaml"});
}

TEST(ClusterConfig, DeepNestingIsRefusedBeforeYamlCppRecurses) {
  constexpr size_t deep = 100000;
  expect_refused(std::string(deep, '['), {"t.yaml:1: nested deeper than 64 levels"});
  expect_refused(std::string(deep, '[') + std::string(deep, ']'), {"nested deeper than 64"});
  expect_refused(std::string(deep, '{'), {"nested deeper than 64"});
  expect_refused("mesh: " + std::string(deep, '['), {"nested deeper than 64"});
  std::string mixed;
  for (size_t i = 0; i < deep; ++i) mixed += i % 2 ? "{a: " : "[";
  expect_refused(mixed, {"nested deeper than 64"});
  std::string dashes;
  for (size_t i = 0; i < deep; ++i) dashes += "- ";
  expect_refused(dashes + "x\n", {"indented deeper than 128 columns"});
  std::string indented;
  for (size_t i = 0; i < 200; ++i) indented += std::string(i, ' ') + "a:\n";
  expect_refused(indented, {"t.yaml:130: indented deeper than 128 columns"});
  // 64 levels pass the scan and reach the normal checks; brackets in quotes and comments do not count.
  expect_refused(with("roles: [replica]", "roles: " + std::string(64, '[') + std::string(64, ']')), {"'roles' has unknown role"});
  expect_refused(with("roles: [replica]", "roles: " + std::string(65, '[') + std::string(65, ']')), {"t.yaml:13: nested deeper than 64"});
  EXPECT_EQ(error_of(with("token: 0123456789abcdef", "token: '" + std::string(100, '[') + "'  # " + std::string(100, '{'))), "(parsed)");
  EXPECT_EQ(error_of(with("token: 0123456789abcdef", "token: \"" + std::string(100, '[') + "\\\"\"")), "(parsed)");
}

TEST(ClusterConfig, ACommaOutsideFlowCollectionsIsRefusedBeforeYamlCppSeesIt) {
  // yaml-cpp 0.7 allocates without bound on each of these (24 GB, then the OOM killer).
  for (const char* text : {",", ",\n", ", x\n", "&a ,", "!t ,", "[a, b]\n,", ",# comment\nmesh: x\n", "a: ,"}) {
    auto c = parse_cluster_config(text, "comma.yaml");
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.err().message.find("',' outside a [...] or {...} list"), std::string::npos) << c.err().message;
  }
  // Commas inside flow collections, quotes and plain values still parse.
  auto ok = parse_cluster_config(R"(mesh: m
seed: 127.0.0.1:7100
token: "a,token,with,commas"
nodes:
  - {name: seed, roles: [coordinator, gateway, router], listen: 127.0.0.1:7100, http: 127.0.0.1:8080}
  - name: r
    roles: [replica]
    listen: 127.0.0.1:7101
models:
  - name: m
    path: some/dir,with,commas
)", "commas.yaml");
  EXPECT_TRUE(ok.ok()) << ok.err().message;
}

// yaml-cpp's message quotes the character it refused (here a carriage return after a
// backslash): the error stays one line of printable text, the character shown as \x0d.
TEST(ClusterConfig, AMalformedYamlMessageStaysOneLine) {
  auto c = parse_cluster_config("mesh: \"a\\\rb\"\n", "bad.yaml");
  ASSERT_FALSE(c.ok());
  for (char ch : c.err().message) EXPECT_GE(static_cast<unsigned char>(ch), 0x20) << c.err().message;
  EXPECT_NE(c.err().message.find("\\x0d"), std::string::npos) << c.err().message;
  EXPECT_NE(c.err().message.find("malformed YAML"), std::string::npos) << c.err().message;
}

TEST(ClusterConfig, RandomMutationsParseOrFailCleanly) {
  const std::string local = [] {
    auto c = load_cluster_config((configs_dir / "local.yaml").string());
    EXPECT_TRUE(c.ok());
    std::ifstream in(configs_dir / "local.yaml");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  ASSERT_FALSE(local.empty());
  // A parser that runs away with memory fails here with bad_alloc instead of taking the
  // machine to the OOM killer (yaml-cpp once took 24 GB on a mutated file).
  rlimit cap{size_t{4} << 30, size_t{4} << 30};
  setrlimit(RLIMIT_AS, &cap);
  std::mt19937 rng(20240611);
  const std::string alphabet = "[]{}:,-#'\"\t\n &*!|>%@?~0123456789abcxyz.\\";
  auto pick = [&](size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); };
  size_t parsed = 0, refused = 0;
  for (int round = 0; round < 2000; ++round) {
    std::string text = local;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t at = pick(text.size());
      switch (rng() % 5) {
        case 0: if (!text.empty()) text[at] = alphabet[pick(alphabet.size())]; break;
        case 1: text.insert(at, 1, alphabet[pick(alphabet.size())]); break;
        case 2: text.erase(at, 1 + pick(16)); break;
        case 3: text.insert(at, text.substr(pick(text.size()), 1 + pick(64))); break;
        case 4: if (!text.empty()) text[at] = static_cast<char>(rng()); break;
      }
    }
    auto c = parse_cluster_config(text, "fuzz.yaml");
    if (c.ok()) {
      ++parsed;  // whatever passes still satisfies the mesh rules
      size_t coordinators = 0;
      for (const auto& n : c->nodes) {
        EXPECT_NE(n.listen.port, 0);
        if (n.has(node_role::coordinator)) {
          ++coordinators;
          EXPECT_EQ(n.listen, c->seed);
        }
        EXPECT_EQ(n.http.has_value(), n.has(node_role::gateway));
      }
      EXPECT_EQ(coordinators, 1u);
      EXPECT_GE(c->token.size(), 16u);
      EXPECT_LT(c->heartbeat, c->failure_timeout);
    } else {
      ++refused;
      EXPECT_EQ(c.err().code, errc::invalid_request);
      EXPECT_EQ(c.err().message.rfind("fuzz.yaml", 0), 0u) << c.err().message;
      EXPECT_EQ(c.err().message.find('\n'), std::string::npos) << c.err().message;
      // Running out of memory is not a clean refusal (see the address-space cap above).
      EXPECT_EQ(c.err().message.find("bad_alloc"), std::string::npos) << "round " << round << ":\n" << text;
    }
  }
  EXPECT_GT(parsed, 0u);  // mutations in comments and values leave valid configs
  EXPECT_GT(refused, 0u);
}

TEST(LoadClusterConfig, MissingFileAndDirectoryAreErrors) {
  auto missing = load_cluster_config((configs_dir / "no-such.yaml").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.err().code, errc::not_found);
  EXPECT_NE(missing.err().message.find("no-such.yaml"), std::string::npos);
  auto dir = load_cluster_config(configs_dir.string());
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.err().code, errc::io_error);
}

}  // namespace
}  // namespace llmesh::actors

namespace llmesh::actors {
namespace {

// Disaggregated prefill: an entry whose replicas prefill for another entry's requests.
TEST(ClusterConfig, APrefillEntryNamesAModelThatServesAndMatchesItsCache) {
  const std::string prefill = "    placement: packed\n  - name: p\n    path: models/m\n    tp: 1\n    prefill_for: m\n";
  auto two = [&](const std::string& more) { return with("    placement: packed\n", prefill + more); };
  auto c = parse_cluster_config(two("    max_local_prefill_length: 256\n    max_prefill_queue_size: 3\n"), "t.yaml");
  ASSERT_TRUE(c.ok()) << c.err().message;
  ASSERT_EQ(c->models.size(), 2u);
  EXPECT_EQ(c->models[1].prefill_for, "m");
  EXPECT_EQ(c->models[1].max_local_prefill_length, 256u);
  EXPECT_EQ(c->models[1].max_prefill_queue_size, 3u);
  EXPECT_EQ(c->models[0].prefill_for, "");
  c = parse_cluster_config(two(""), "t.yaml");
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->models[1].max_local_prefill_length, 1000u);  // Dynamo's default
  EXPECT_EQ(c->models[1].max_prefill_queue_size, 0u);        // no limit
  expect_refused(with("    placement: packed\n", "    placement: packed\n  - name: p\n    path: models/m\n    prefill_for: nobody\n"),
                 {"models[1] (p)", "'prefill_for' 'nobody' must name another model entry that serves requests"});
  expect_refused(with("    placement: packed\n", "    placement: packed\n  - name: p\n    path: models/m\n    prefill_for: p\n"),
                 {"must name another model entry"});
  expect_refused(two("  - name: q\n    path: models/m\n    prefill_for: p\n"), {"models[2] (q)", "must name another model entry that serves"});
  expect_refused(two("    kv_cache_dtype: bfloat16\n"), {"'kv_cache_dtype' 'bfloat16' differs from 'm''s 'float32'"});
  expect_refused(with("path: models/m\n    tp: 1", "path: models/other\n    tp: 1", with("    placement: packed\n", prefill)),
                 {"'path' 'models/other' differs from 'm''s 'models/m'", "same weights"});
  // The same directory written another way is the same weights.
  EXPECT_TRUE(parse_cluster_config(with("path: models/m\n    tp: 1", "path: ./models//m\n    tp: 1",
                                        with("    placement: packed\n", prefill)), "t.yaml").ok());
  expect_refused(two("    quantization: int8\n"), {"'quantization' 'int8' differs"});
  expect_refused(two("    dtype: float32\n"), {"'dtype' 'float32' differs"});
  expect_refused(two("  - name: q\n    path: models/m\n    prefill_for: m\n"), {"models[2] (q)", "models[1] already prefills for 'm'"});
  expect_refused(with("    placement: packed\n", "    placement: spread\n" + prefill.substr(std::string("    placement: packed\n").size())),
                 {"'prefill_for' 'm' is spread over nodes"});
  expect_refused(two("    placement: spread\n"), {"'prefill_for': prefill replicas hand over their KV blocks from one process"});
  expect_refused(two("    loras: [{name: a, path: /a}]\n"), {"'prefill_for': a prefill entry serves its model's adapters by name"});
  expect_refused(with("    placement: packed\n", "    placement: packed\n    max_local_prefill_length: 9\n"),
                 {"'max_local_prefill_length' goes with 'prefill_for'"});
  expect_refused(two("    max_local_prefill_length: 0\n"), {"'max_local_prefill_length'"});
  expect_refused(with("    placement: packed\n", "    placement: packed\n    max_prefill_queue_size: 2\n"),
                 {"'max_prefill_queue_size' goes with 'prefill_for'"});
  expect_refused(two("    max_prefill_queue_size: -1\n"), {"'max_prefill_queue_size'"});
}

}  // namespace
}  // namespace llmesh::actors
