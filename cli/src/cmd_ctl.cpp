// `llmesh ctl`: operator commands against the coordinator (DESIGN.md §4) over the mesh
// transport. The command is authenticated with the cluster token (an HMAC over a fresh nonce,
// a timestamp and the command: join_auth.hpp); the token itself never travels.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "commands.hpp"
#include "llmesh/actors/cluster_config.hpp"
#include "llmesh/actors/coordinator.hpp"
#include "llmesh/actors/join_auth.hpp"
#include "llmesh/transport/codec.hpp"
#include "llmesh/transport/ucx_transport.hpp"

namespace llmesh::cli {
namespace {

struct ctl_flags {
  std::string control, config, token, command;
  std::vector<std::string> args;
  bool json = false;
  int timeout_s = 0;  ///< 0: 10 s, or 70 for a LoRA update (its nodes have 60 s to answer)
};

constexpr uint64_t ctl_actor_id = 7;  // where the coordinator's reply goes on this connection

status run_ctl(const ctl_flags& f) {
  std::string control = f.control, token = f.token;
  if (!f.config.empty()) {
    auto cfg = actors::load_cluster_config(f.config);
    if (!cfg) return cfg.take_error();
    if (control.empty()) control = cfg->seed.str();
    if (token.empty()) token = cfg->token;
  }
  if (token.empty()) {
    if (const char* t = std::getenv("LLMESH_TOKEN")) token = t;
  }
  if (control.empty()) return make_error(errc::invalid_request, "give --control HOST:PORT (or --config FILE)");
  if (token.empty()) return make_error(errc::invalid_request, "give the cluster token: --token, LLMESH_TOKEN or --config FILE");

  auto net = transport::ucx_transport::create();
  if (!net) return net.take_error();
  std::mutex mu;
  std::condition_variable cv;
  std::optional<transport::control_reply_msg> reply;
  std::optional<std::string> lost;
  transport::transport_handlers h;
  h.on_frame = [&](transport::peer_id, std::span<const uint8_t> frame) {
    auto e = transport::decode(frame);
    if (!e) return;
    if (auto* r = std::get_if<transport::control_reply_msg>(&e->msg)) {
      std::lock_guard l(mu);
      reply = *r;
      cv.notify_all();
    }
  };
  h.on_peer_down = [&](transport::peer_id, const error& why) {
    std::lock_guard l(mu);
    lost = why.message;
    cv.notify_all();
  };
  (*net)->set_handlers(std::move(h));
  auto peer = (*net)->connect(control);
  if (!peer) return make_error(peer.err().code, "cannot reach the coordinator at " + control + ": " + peer.err().message);

  auto nonce = actors::join_auth::make_nonce();
  if (!nonce) return nonce.take_error();
  const uint64_t now_ms = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                    std::chrono::system_clock::now().time_since_epoch())
                                                    .count());
  transport::control_msg c{f.command, f.args, *nonce, now_ms,
                           actors::join_auth::control_mac(token, *nonce, now_ms, f.command, f.args)};
  transport::envelope e{{"ctl", ctl_actor_id}, {"", actors::coordinator_actor_id}, 0, 0, std::move(c)};
  if (auto s = (*net)->send(*peer, transport::encode(e)); !s) {
    return make_error(s.err().code, "cannot reach the coordinator at " + control + ": " + s.err().message);
  }
  {
    std::unique_lock l(mu);
    const bool lora = f.command == "load-lora" || f.command == "unload-lora";
    const int timeout_s = f.timeout_s > 0 ? f.timeout_s : lora ? 70 : 10;
    if (!cv.wait_for(l, std::chrono::seconds(timeout_s), [&] { return reply || lost; })) {
      return make_error(errc::deadline_exceeded, "no answer from the coordinator at " + control + " within " +
                                           std::to_string(timeout_s) + " s");
    }
    if (!reply) return make_error(errc::transport_disconnected, "cannot reach the coordinator at " + control + ": " + *lost);
  }
  net->reset();
  if (!reply->ok) return make_error(errc::invalid_request, reply->text);
  if (f.json) {
    std::printf("%s\n", reply->json.c_str());
  } else {
    std::printf("%s%s", reply->text.c_str(), !reply->text.empty() && reply->text.back() == '\n' ? "" : "\n");
  }
  return ok_status();
}

}  // namespace

void add_ctl(CLI::App& app, command_set& commands) {
  auto f = std::make_shared<ctl_flags>();
  auto* sub = app.add_subcommand("ctl", "Operator commands against the coordinator: status, nodes, replicas, loras, drain NODE, "
                                        "remove NODE, scale MODEL N, fault NODE RULE, load-lora MODEL NAME PATH, "
                                        "unload-lora MODEL NAME");
  sub->add_option("--control", f->control, "The coordinator's mesh address HOST:PORT");
  sub->add_option("--config", f->config, "Cluster config: the seed address and the token");
  sub->add_option("--token", f->token, "The cluster token (or LLMESH_TOKEN)");
  sub->add_flag("--json", f->json, "Print JSON");
  sub->add_option("--timeout", f->timeout_s, "Seconds to wait for the answer (10; 70 for load-lora and unload-lora)")->check(CLI::Range(1, 3600));
  sub->add_option("command", f->command, "status, nodes, replicas, loras, drain, remove, scale, fault, load-lora or unload-lora")
      ->required();
  sub->add_option("args", f->args,
                  "The command's arguments; fault's RULE: drop=0.1,dup=0.05,delay=20ms,partition,for=3s "
                  "(any subset) or none");
  commands.emplace_back(sub, [f] { return run_ctl(*f); });
}

}  // namespace llmesh::cli
