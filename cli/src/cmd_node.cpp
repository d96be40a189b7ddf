// `llmesh node`: one process of a multi-process mesh (DESIGN.md §2, §4). Every node has a node
// agent (joins, heartbeats, hosts assigned replicas) and a bridge to the other processes over
// UCX; by role it also runs the coordinator, a router, and the OpenAI-compatible gateway.
// Described by a cluster config (`--config FILE --name NODE`) or by flags when added at run
// time (`--join SEED --name NODE --listen HOST:PORT --role ROLES`). Stops on SIGINT/SIGTERM:
// the gateway drains, hosted replicas stop, then the process exits 0.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "commands.hpp"
#include "gateway_flags.hpp"
#include "replica_flags.hpp"
#include "vllm_flags.hpp"
#include "llmesh/actors/bridge_actor.hpp"
#include "llmesh/actors/cluster_config.hpp"
#include "llmesh/actors/coordinator_actor.hpp"
#include "llmesh/actors/node_agent.hpp"
#include "llmesh/actors/router_actor.hpp"
#include "llmesh/actors/router_client.hpp"
#include "llmesh/actors/transport_metrics.hpp"
#include "llmesh/gateway/http_server.hpp"
#include "llmesh/gateway/rpc_server.hpp"
#include "llmesh/transport/fault_injector.hpp"
#include "llmesh/transport/transport_tally.hpp"
#include "llmesh/transport/ucx_transport.hpp"
#include "stop_signal.hpp"

namespace llmesh::cli {
namespace {

/// What a gateway node heard last of each model's runtime LoRA adapters, passed on to its API
/// once there is one. Thread-safe (the agent's thread writes, the main thread attaches).
class runtime_lora_news {
 public:
  void update(const std::string& model, const std::vector<model::lora_source>& adapters) {
    std::lock_guard lock(mu_);
    latest_[model] = adapters;
    if (api_) api_->set_runtime_adapters(model, adapters);
  }
  /// From now on news goes to `api` (null: nowhere), which first hears what came before.
  void attach(gateway::api_service* api) {
    std::lock_guard lock(mu_);
    api_ = api;
    if (!api_) return;
    for (const auto& [model, adapters] : latest_) api_->set_runtime_adapters(model, adapters);
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::vector<model::lora_source>> latest_;
  gateway::api_service* api_ = nullptr;
};

struct node_flags {
  std::string config, name, join, listen, roles, token, http, rpc, metrics, device = "cpu";
  std::vector<std::string> model_dirs;  ///< --join gateway: one --model per served model
  std::vector<std::string> lora_modules;  ///< --join gateway with one --model: its adapters' names (the config's)
  int threads = 0, heartbeat_ms = 500, slots = 0;
  size_t drain_s = 10, max_migrations = 3;
  bool deterministic = false;
  gateway_flags gw;
  actors::speculation_config speculation;
  std::string speculative_config;  ///< vLLM's --speculative-config JSON (a replica node's)
  bool prefix_caching = true;  ///< vLLM's --enable-prefix-caching / --no-enable-prefix-caching
  bool no_kv_events = false;   ///< Dynamo's --no-kv-events (a router node joined by hand)
};

/// What this process is, from the config or the flags.
struct node_plan {
  std::string name, listen, seed, token;
  int slots = 0;
  std::vector<actors::node_role> roles;
  std::chrono::milliseconds heartbeat{500}, failure_timeout{3000};
  std::vector<actors::model_spec> models;  ///< the coordinator's and the routers' (config mode)
  /// A gateway's models: its name, directory (its tokenizer, chat template and config) and
  /// reasoning parser.
  struct gateway_model {
    std::string name, dir, reasoning_parser, tool_call_parser, pooling;
    std::vector<model::lora_source> loras = {};  ///< the config's loras (each answers as a model)
    std::string chat_template = {};  ///< replaces the directory's ("": keep it)
    size_t max_model_len = 0;        ///< the context the API grants (0: the model's)
  };
  std::vector<gateway_model> gateway_models;
  std::optional<actors::endpoint> http, rpc;
  std::optional<actors::endpoint> metrics;  ///< this process's own metrics endpoint, if any
  bool kv_events = true;  ///< its router asks replicas for KV events (the config's kv_events, or not --no-kv-events)
  bool has(actors::node_role r) const { return std::find(roles.begin(), roles.end(), r) != roles.end(); }
};

constexpr const char* no_gateway_role =
    "--reasoning-parser, --tool-call-parser, --pooling, --chat-template and --max-model-len are a gateway's flags "
    "(this node has no gateway role)";

result<node_plan> plan_from_flags(const node_flags& f) {
  node_plan p;
  p.name = f.name;
  if (!f.config.empty()) {
    auto cfg = actors::load_cluster_config(f.config);
    if (!cfg) return cfg.take_error();
    const auto* n = cfg->node(f.name);
    if (!n) return make_error(errc::invalid_request, f.config + ": no node named '" + f.name + "'");
    p.roles = n->roles;
    p.listen = n->listen.str();
    p.seed = cfg->seed.str();
    p.token = cfg->token;
    p.heartbeat = cfg->heartbeat;
    p.failure_timeout = cfg->failure_timeout;
    p.models = cfg->models;
    p.http = n->http;
    p.rpc = n->rpc;
    p.metrics = n->metrics;
    p.slots = n->slots;
    p.kv_events = cfg->kv_events;
    if (!f.metrics.empty()) {
      return make_error(errc::invalid_request, "--metrics: with --config, set the node's 'metrics' address in the config");
    }
    if (f.no_kv_events) return make_error(errc::invalid_request, "--no-kv-events: with --config, set 'kv_events: false' in the config");
    if (!f.lora_modules.empty()) {
      return make_error(errc::invalid_request, "--lora-modules: with --config, list a model's adapters as its 'loras' in the config");
    }
    if (p.has(actors::node_role::gateway)) {
      if (cfg->models.empty()) return make_error(errc::invalid_request, f.config + ": a gateway needs a model");
      if (sets_model_flags(f.gw)) {
        return make_error(errc::invalid_request,
                          "--reasoning-parser, --tool-call-parser, --pooling, --chat-template, --max-model-len: with --config, set "
                          "each model's reasoning_parser, tool_call_parser, pooling, chat_template and max_model_len in the config");
      }
      for (const auto& m : cfg->models) {
        if (!m.prefill_for.empty()) continue;  // its replicas prefill for another model: not a model of the API
        p.gateway_models.push_back({m.name, m.path, m.reasoning_parser, m.tool_call_parser, m.pooling, m.loras, m.chat_template,
                                    m.max_model_len});
      }
    } else if (sets_model_flags(f.gw)) {
      return make_error(errc::invalid_request, no_gateway_role);
    }
    return p;
  }
  if (f.join.empty()) return make_error(errc::invalid_request, "give --config FILE, or --join HOST:PORT with --listen and --role");
  auto seed = actors::parse_endpoint(f.join);
  if (!seed) return make_error(errc::invalid_request, "--join: " + seed.err().message);
  auto listen = actors::parse_endpoint(f.listen);
  if (!listen) return make_error(errc::invalid_request, "--listen: " + listen.err().message);
  p.seed = seed->str();
  p.listen = listen->str();
  if (!f.metrics.empty()) {
    auto m = actors::parse_endpoint(f.metrics);
    if (!m) return make_error(errc::invalid_request, "--metrics: " + m.err().message);
    p.metrics = *m;
  }
  p.heartbeat = std::chrono::milliseconds(f.heartbeat_ms);
  p.slots = f.slots;
  p.kv_events = !f.no_kv_events;
  p.token = f.token;
  if (p.token.empty()) {
    if (const char* t = std::getenv("LLMESH_TOKEN")) p.token = t;
  }
  if (p.token.empty()) return make_error(errc::invalid_request, "--join needs the cluster token: --token or LLMESH_TOKEN");
  for (size_t at = 0; at <= f.roles.size();) {
    const size_t comma = std::min(f.roles.find(',', at), f.roles.size());
    const std::string r = f.roles.substr(at, comma - at);
    at = comma + 1;
    if (r == "replica") p.roles.push_back(actors::node_role::replica);
    else if (r == "router") p.roles.push_back(actors::node_role::router);
    else if (r == "gateway") p.roles.push_back(actors::node_role::gateway);
    else if (r == "coordinator") return make_error(errc::invalid_request, "--role: the coordinator is the seed node; it does not join");
    else return make_error(errc::invalid_request, "--role: unknown role '" + r + "' (replica, router, gateway)");
  }
  if (!p.has(actors::node_role::gateway) && sets_model_flags(f.gw)) {
    return make_error(errc::invalid_request, no_gateway_role);
  }
  if (f.no_kv_events && !p.has(actors::node_role::router)) {
    return make_error(errc::invalid_request, "--no-kv-events is a router's flag (this node has no router role)");
  }
  if (p.has(actors::node_role::gateway)) {
    if (f.model_dirs.empty() || f.http.empty()) return make_error(errc::invalid_request, "a gateway node needs --model DIR and --http HOST:PORT");
    auto h = actors::parse_endpoint(f.http);
    if (!h) return make_error(errc::invalid_request, "--http: " + h.err().message);
    p.http = *h;
    if (!f.rpc.empty()) {
      auto r = actors::parse_endpoint(f.rpc);
      if (!r) return make_error(errc::invalid_request, "--rpc: " + r.err().message);
      p.rpc = *r;
    }
    for (const auto& dir : f.model_dirs) {
      // The directory's name is the model's: the name the coordinator's config gives it.
      std::filesystem::path path = std::filesystem::path(dir).lexically_normal();
      std::string name = path.filename().string();
      if (name.empty()) name = path.parent_path().filename().string();
      for (const auto& known : p.gateway_models) {
        if (known.name == name) return make_error(errc::invalid_request, "--model: two models named '" + name + "'");
      }
      p.gateway_models.push_back(
          {name, dir, f.gw.reasoning_parser, f.gw.tool_call_parser, f.gw.pooling, {}, f.gw.chat_template, f.gw.max_model_len});
    }
    if (!f.lora_modules.empty()) {
      if (p.gateway_models.size() != 1) return make_error(errc::invalid_request, "--lora-modules: give exactly one --model");
      auto loras = lora_sources(f.lora_modules, p.gateway_models[0].name);
      if (!loras) return loras.take_error();
      p.gateway_models[0].loras = std::move(*loras);
    }
  } else if (!f.lora_modules.empty()) {
    return make_error(errc::invalid_request, "--lora-modules is a gateway's flag with --join (the config's models carry their loras)");
  }
  return p;
}

std::vector<transport::role> wire_roles(const std::vector<actors::node_role>& roles) {
  std::vector<transport::role> out;
  for (auto r : roles) out.push_back(static_cast<transport::role>(r));  // same order in both enums
  return out;
}

status run_node(node_flags f) {
  std::string draft_dir;  // --speculative-config's draft model, for every replica of this node
  if (!f.speculative_config.empty()) LLMESH_TRY(apply_speculative_config(f.speculative_config, f.speculation, draft_dir));
  LLMESH_TRY(check_speculation_flags(f.speculation));
  std::shared_ptr<const model::model> draft;
  if (!draft_dir.empty()) {
    auto d = model::model::load(draft_dir);
    if (!d) return make_error(d.err().code, "--speculative-config: draft model " + draft_dir + ": " + d.err().message);
    draft = std::move(*d);
  }
  auto plan = plan_from_flags(f);
  if (!plan) return plan.take_error();
  const node_plan& p = *plan;
  if (p.has(actors::node_role::gateway) && !p.has(actors::node_role::router)) {
    return make_error(errc::invalid_request, "node '" + p.name + "': a gateway needs the router role in the same node");
  }
  auto device = model::parse_backend(f.device);
  if (!device) return device.take_error();

  std::shared_ptr<actors::coordinator> core;
  if (p.has(actors::node_role::coordinator)) {
    actors::coordinator_options co;
    co.token = p.token;
    co.failure_timeout = p.failure_timeout;
    co.models = p.models;
    auto c = actors::coordinator::create(co);
    if (!c) return c.take_error();
    core = std::make_shared<actors::coordinator>(std::move(*c));
  }

  // The gateway's flags and model files next: a typo fails before anything listens.
  auto cors = cors_options_of(f.gw);
  if (!cors) return cors.take_error();
  if (cors->enabled() && !p.has(actors::node_role::gateway)) {
    return make_error(errc::invalid_request, "--allowed-origins: CORS is a gateway's; this node has no gateway role");
  }
  auto otlp = otlp_options_of(f.gw);
  if (!otlp) return otlp.take_error();
  if (*otlp && !p.has(actors::node_role::gateway)) {
    return make_error(errc::invalid_request,
                      "--otlp-traces-endpoint: request spans are a gateway's; this node has no gateway role");
  }
  if (f.gw.tls.enabled() && !p.has(actors::node_role::gateway) && !p.metrics) {
    return make_error(errc::invalid_request,
                      "--ssl-certfile: HTTPS is a gateway's or a metrics endpoint's; this node has no gateway role and no "
                      "metrics address");
  }
  LLMESH_TRY(gateway::check_tls(f.gw.tls));
  std::vector<gateway::served_model> served;
  const bool from_config = !f.config.empty();  // the overrides' names in errors: the config's keys or the flags
  for (const auto& [name, dir, reasoning_parser, tool_call_parser, pooling_name, loras, chat_template, max_model_len] :
       p.gateway_models) {
    gateway::served_model m;
    m.name = name;
    m.loras = loras;
    auto reasoning = gateway::parse_reasoning_parser(reasoning_parser);
    if (!reasoning) return reasoning.take_error();
    m.reasoning = *reasoning;
    auto tools = gateway::parse_tool_call_parser(tool_call_parser);
    if (!tools) return tools.take_error();
    m.tool_parser = *tools;
    auto t = model::tokenizer::load(dir);
    if (!t) return t.take_error();
    m.tok = *t;
    if (m.reasoning != gateway::reasoning_parser::none) LLMESH_TRY(gateway::check_reasoning_tokens(*m.tok, name, m.reasoning));
    auto kept = gateway::tool_parser_kept_tokens(*m.tok, m.tool_parser, name);
    if (!kept) return kept.take_error();
    m.tool_tokens = std::move(*kept);
    if (auto c = model::chat_template::load(dir); c) m.chat = std::move(*c);
    auto c = model::load_config(dir);
    if (!c) return c.take_error();
    m.cfg = std::move(*c);
    auto pooling = gateway::load_embedding_defaults(dir, pooling_name);
    if (!pooling) return pooling.take_error();
    m.embedding = *pooling;
    LLMESH_TRY(apply_model_overrides(m, dir, chat_template, max_model_len, from_config));
    served.push_back(std::move(m));
  }
  auto ucx = transport::ucx_transport::create();
  if (!ucx) return ucx.take_error();
  // Fault hooks (`llmesh ctl fault NODE RULE`) on every connection; no rule, no cost but a lock.
  auto faults = std::make_shared<transport::fault_injector>(std::move(*ucx));
  if (auto s = stop_signal::install(); !s) return s;

  // Before the actor system: the transport's thread counts into it until the system is gone.
  actors::metrics_registry metrics;
  auto* decode_errors = actors::export_transport_metrics(metrics, std::weak_ptr<const transport::transport>(faults), "mesh");
  auto tensor_plane = transport::transport_tally::create();
  if (p.has(actors::node_role::replica)) actors::export_transport_metrics(metrics, tensor_plane, "tensor");
  // This process's own endpoint (a replica node's only way to be scraped): before the mesh,
  // so that a taken port fails first; served on its own thread until the node stops.
  std::unique_ptr<gateway::http_server> metrics_server;
  std::thread metrics_thread;
  if (p.metrics) {
    gateway::http_options mo;
    mo.host = p.metrics->host;
    mo.port = p.metrics->port;
    mo.max_connections = 64;
    mo.max_connections_per_client = 16;
    mo.tls = f.gw.tls;  // the node's certificate, when it has one: scraped over HTTPS
    auto s = gateway::http_server::listen_metrics(metrics, mo);
    if (!s) return s.take_error();
    metrics_server = std::move(*s);
    std::fprintf(stderr, "llmesh: node %s metrics on %s://%s:%u/metrics\n", p.name.c_str(), url_scheme(f.gw), mo.host.c_str(),
                 metrics_server->port());
    std::fflush(stderr);
    metrics_thread = std::thread([srv = metrics_server.get()] { srv->run(); });
  }
  struct metrics_stop {  // every return from here on stops and joins it
    std::unique_ptr<gateway::http_server>& server;
    std::thread& thread;
    ~metrics_stop() {
      if (server) server->stop(std::chrono::milliseconds(0));
      if (thread.joinable()) thread.join();
    }
  } stop_metrics{metrics_server, metrics_thread};

  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 2);
  cfg.set("scheduler.policy", caf::atom("sharing"));  // idle workers sleep
  auto sys = std::make_unique<caf::actor_system>(cfg);
  std::weak_ptr<transport::fault_injector> fault_hook = faults;
  transport::transport* net = faults.get();  // owned by the bridge from here on
  auto bridge = actors::spawn_bridge(*sys, std::move(faults), p.name, decode_errors);  // handlers first, then listen
  auto bound = net->listen(p.listen);
  if (!bound) {
    caf::anon_send_exit(bridge, caf::exit_reason::kill);
    return bound.take_error();
  }

  caf::actor router;
  auto ready = std::make_shared<actors::ready_counts>();
  if (p.has(actors::node_role::router)) {
    actors::router_options ro;
    for (const auto& m : p.models) {  // each model's policy (a joined router: the default)
      if (auto pol = actors::parse_balance_policy(m.policy); pol) ro.policies[m.name] = *pol;
      if (!m.prefill_for.empty()) {
        ro.max_local_prefill_by_model[m.prefill_for] = m.max_local_prefill_length;
        ro.max_prefill_queue_by_model[m.prefill_for] = m.max_prefill_queue_size;
      }
    }
    ro.metrics = &metrics;
    ro.ready = ready;
    ro.kv_events = p.kv_events;
    router = sys->spawn(actors::router_actor, ro);
  }
  caf::actor coordinator;
  if (core) {
    coordinator = sys->spawn(actors::coordinator_actor, core, bridge, router, p.name, p.heartbeat);
    caf::anon_send(bridge, actors::export_atom::value, coordinator, actors::coordinator_actor_id);
    caf::anon_send(bridge, actors::watch_atom::value, coordinator);
  }
  std::atomic<bool> fatal{false};
  actors::node_agent_options ao;
  ao.node = p.name;
  ao.roles = wire_roles(p.roles);
  ao.listen = p.listen;
  ao.slots = p.slots;
  ao.seed = p.seed;
  ao.token = p.token;
  ao.heartbeat = p.heartbeat;
  ao.engine.device = *device;
  ao.engine.deterministic = f.deterministic;
  ao.engine.threads = f.threads > 0 ? f.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ao.sched.speculation = f.speculation;
  ao.sched.draft_model = draft;  // each replica checks it shares its model's tokenizer
  ao.sched.prefix_caching = f.prefix_caching;
  ao.set_fault = [fault_hook](const std::string& spec) {
    auto rule = transport::parse_fault_rule(spec);
    auto f = fault_hook.lock();
    if (rule && f) f->set_rule(std::nullopt, *rule);
  };
  // The tensor plane (spread replicas): one UCX transport per rank, on this node's mesh host.
  ao.make_tensor_transport = [tensor_plane]() -> result<std::shared_ptr<transport::transport>> {
    auto t = transport::ucx_transport::create();
    if (!t) return t.take_error();
    return tensor_plane->track(std::move(*t));  // counted on this node's metrics as plane "tensor"
  };
  ao.tensor_host = p.listen.substr(0, p.listen.rfind(':'));
  ao.on_fatal = [&fatal](const std::string&) {
    fatal = true;
    stop_signal::wake();
  };
  // A gateway node hears which adapters were added to its models while the mesh serves (also
  // before its API is up: kept until then).
  auto lora_news = std::make_shared<runtime_lora_news>();
  ao.on_lora_news = [lora_news](const std::string& model, const std::vector<model::lora_source>& adapters) {
    lora_news->update(model, adapters);
  };
  auto agent = sys->spawn(actors::node_agent, ao, bridge);
  caf::anon_send(bridge, actors::export_atom::value, agent, actors::agent_actor_id);
  caf::anon_send(bridge, actors::watch_atom::value, agent);
  if (coordinator) {
    caf::anon_send(agent, actors::agent_atom::value, coordinator);
    caf::anon_send(coordinator, actors::agent_atom::value, agent);
  } else if (router) {
    caf::anon_send(agent, actors::router_atom::value, router);  // replicas reach it through the agent
  }
  caf::anon_send(agent, actors::join_atom::value);

  std::string roles;
  for (auto r : p.roles) roles += (roles.empty() ? "" : ",") + std::string(actors::node_role_name(r));
  std::fprintf(stderr, "llmesh: node %s (%s) on mesh address %s%s\n", p.name.c_str(), roles.c_str(), bound->c_str(),
               core ? "; coordinating" : (" ; joining " + p.seed).c_str());
  std::fflush(stderr);

  const auto drain = std::chrono::seconds(f.drain_s);
  if (p.has(actors::node_role::gateway)) {
    actors::router_client client(*sys, router, ready, f.max_migrations, &metrics);
    client.set_lora_agent(agent);  // runtime LoRA updates go to the mesh through the agent
    gateway::api_options api_opt;
    gateway::http_options ho;
    ho.host = p.http->host;
    ho.port = p.http->port;
    apply_gateway_flags(f.gw, api_opt, ho);
    ho.cors = *cors;
    ho.tracer = start_tracer(std::move(*otlp), metrics);
    // vLLM's runtime LoRA routes: the coordinator takes them for models with enable_lora.
    api_opt.runtime_lora_updates = true;
    std::string names;
    for (const auto& m : served) names += (names.empty() ? "'" : ", '") + m.name + "'";
    auto api = std::make_unique<gateway::api_service>(api_opt, std::move(served), client, metrics);
    lora_news->attach(api.get());
    auto server = gateway::http_server::listen(*api, ho);
    if (!server) {
      caf::anon_send_exit(agent, caf::exit_reason::kill);
      return server.take_error();
    }
    std::unique_ptr<gateway::rpc_server> rpc;
    if (p.rpc) {
      auto r = gateway::rpc_server::start(*api, {p.rpc->host, p.rpc->port, f.gw.tls, ho.tracer});
      if (!r) {
        caf::anon_send_exit(agent, caf::exit_reason::kill);
        return r.take_error();
      }
      rpc = std::move(*r);
    }
    std::fprintf(stderr, "llmesh: node %s serving %s on %s://%s:%u%s\n", p.name.c_str(), names.c_str(), url_scheme(f.gw),
                 ho.host.c_str(), (*server)->port(),
                 rpc ? (std::string(f.gw.tls.enabled() ? " and RPC over TLS " : " and RPC ") + p.rpc->host + ":" +
                        std::to_string(rpc->port()))
                           .c_str()
                     : "");
    std::fflush(stderr);
    gateway::http_server* srv = server->get();
    std::thread waiter([srv, drain, &fatal] {
      const int sig = stop_signal::wait();
      if (sig == 0 && !fatal) return;  // woken: the server stopped on its own
      srv->stop(fatal ? std::chrono::seconds(0) : drain);
    });
    (*server)->run();
    stop_signal::wake();
    waiter.join();
    rpc.reset();
    api->close_background();  // before the server: background streams' readers post into it
    server->reset();
    lora_news->attach(nullptr);
    api.reset();
  } else {
    stop_signal::wait();
  }
  std::fprintf(stderr, "llmesh: node %s stopping\n", p.name.c_str());
  {
    // Hosted replicas stop and free their engines first; then everything else.
    caf::scoped_actor self{*sys};
    self->send(agent, actors::stop_atom::value);
    self->wait_for(agent);
    for (const auto& a : {coordinator, router, bridge}) {
      if (a) self->send_exit(a, caf::exit_reason::user_shutdown);
    }
  }
  sys.reset();
  stop_signal::uninstall();
  if (fatal) return make_error(errc::invalid_request, "node '" + p.name + "' could not join the mesh (see above)");
  std::fprintf(stderr, "llmesh: node %s stopped\n", p.name.c_str());
  return ok_status();
}

}  // namespace

void add_node(CLI::App& app, command_set& commands) {
  auto f = std::make_shared<node_flags>();
  auto* sub = app.add_subcommand("node", "Run one node of a multi-process mesh");
  sub->add_option("--config", f->config, "Cluster config (cluster-configs/*.yaml)");
  sub->add_option("--name", f->name, "This node's name (its entry in the config)")->required();
  sub->add_option("--join", f->join, "Join at run time: the coordinator's mesh address HOST:PORT");
  sub->add_option("--listen", f->listen, "--join: this node's mesh address HOST:PORT");
  sub->add_option("--role", f->roles, "--join: roles, comma separated (replica, router, gateway)")->default_str("replica");
  sub->add_option("--token", f->token, "--join: the cluster token (or LLMESH_TOKEN)");
  sub->add_option("--model", f->model_dirs,
                  "--join with the gateway role: a served model's directory (tokenizer); its name is the directory's, "
                  "as in the cluster config; repeat for several models");
  sub->add_option("--lora-modules", f->lora_modules,
                  "--join with the gateway role and one --model: the LoRA adapters the mesh serves on it (NAME=PATH, "
                  "as the coordinator's config lists them; the gateway serves their names as models)");
  sub->add_option("--http", f->http, "--join with the gateway role: HTTP address HOST:PORT");
  sub->add_option("--rpc", f->rpc, "--join with the gateway role: native API (Cap'n Proto RPC) address HOST:PORT");
  sub->add_option("--metrics", f->metrics,
                  "--join: this process's own Prometheus endpoint HOST:PORT (GET /metrics, /health), for a node "
                  "without a gateway; with --config: the node's 'metrics' address");
  sub->add_option("--heartbeat-ms", f->heartbeat_ms, "--join: heartbeat interval")->check(CLI::Range(10, 60000));
  sub->add_option("--slots", f->slots, "--join: tensor-parallel shards this replica node may host (default 2)")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--device", f->device, "Replicas' device: cpu, cuda or auto")->capture_default_str();
  sub->add_flag("--deterministic", f->deterministic,
                "CUDA: batch-invariant projections at every batch size (needed for speculative decoding on CUDA)");
  sub->add_option("--threads", f->threads, "Kernel threads per replica; 0 = one per core")->check(CLI::Range(0, 1024));
  sub->add_option("--drain-timeout", f->drain_s, "Seconds to let requests finish on SIGTERM")->check(CLI::Range(0, 3600));
  sub->add_option("--max-migrations", f->max_migrations, "Gateway: replica failures a request survives")
      ->check(CLI::Range(0, 100))->capture_default_str();
  add_gateway_flags(sub, f->gw);  // a gateway node's API key and limits
  add_prefix_caching_flag(sub, f->prefix_caching);
  sub->add_flag("--no-kv-events", f->no_kv_events,
                "Dynamo's, for a router node joined by hand: its router does not ask replicas what their prefix caches hold "
                "and predicts it from where it sent each prompt (with --config: the config's kv_events: false)");
  add_speculation_flags(sub, f->speculation);  // a replica node's (quantization is the model's: the cluster config)
  sub->add_option("--speculative-config", f->speculative_config,
                  "A replica node's, vLLM's JSON: prompt lookup ({\"method\": \"ngram\", \"num_speculative_tokens\": K, ...}) or "
                  "a draft model ({\"model\": DIR, \"num_speculative_tokens\": K}) for every replica it hosts (each model "
                  "must share the draft's tokenizer)");
  commands.emplace_back(sub, [f] {
    if (f->roles.empty()) f->roles = "replica";
    return run_node(*f);
  });
}

}  // namespace llmesh::cli
