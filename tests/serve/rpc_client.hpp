// What the native-API tests share (rpc_test.cpp, rpc_choices_test.cpp): the server's RPC port,
// a sink that collects the streamed tokens, and one generate call's outcome.
#pragma once

#include <capnp/ez-rpc.h>
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>

#include "../cli/subprocess.hpp"
#include "llmesh/schemas/rpc.capnp.h"
#include "reference.hpp"
#include "server_process.hpp"

namespace llmesh::testing {

inline const std::string bin = LLMESH_BINARY;
inline const std::string model_dir = std::string(LLMESH_SOURCE_DIR) + "/models/kjv-tiny";

inline int rpc_port(server_process& s) {
  const std::string marker = "(Cap'n Proto RPC, schemas/rpc.capnp) on 127.0.0.1:";
  const auto at = s.log().find(marker);
  return at == std::string::npos ? 0 : std::atoi(s.log().c_str() + at + marker.size());
}

/// Collects what the server streams; `at_least` tokens fulfil `enough`.
class sink final : public rpc::TokenSink::Server {
 public:
  sink(std::vector<int32_t>& ids, std::string& text) : ids_(ids), text_(text) {}
  sink(std::vector<int32_t>& ids, std::string& text, size_t at_least, kj::Own<kj::PromiseFulfiller<void>> enough)
      : ids_(ids), text_(text), at_least_(at_least), enough_(kj::mv(enough)) {}
  kj::Promise<void> tokens(TokensContext ctx) override {
    for (auto id : ctx.getParams().getIds()) ids_.push_back(id);
    text_ += ctx.getParams().getText().cStr();
    if (enough_.get() != nullptr && ids_.size() >= at_least_) enough_->fulfill();
    return kj::READY_NOW;
  }

 private:
  std::vector<int32_t>& ids_;
  std::string& text_;
  size_t at_least_ = 0;
  kj::Own<kj::PromiseFulfiller<void>> enough_;
};

struct outcome {
  bool ok = false;
  int code = 0;
  std::string message, finish, text, streamed_text;
  std::vector<int32_t> ids, streamed;
  size_t prompt_tokens = 0;
};

using request_setup = std::function<void(rpc::GenerateRequest::Builder)>;

inline outcome generate(capnp::EzRpcClient& c, const request_setup& setup) {
  auto main = c.getMain<rpc::Llmesh>();
  auto req = main.generateRequest();
  setup(req.initRequest());
  outcome o;
  req.setSink(kj::heap<sink>(o.streamed, o.streamed_text));
  auto resp = req.send().wait(c.getWaitScope());
  auto r = resp.getResult();
  o.ok = r.getOk();
  o.code = r.getErrorCode();
  o.message = r.getErrorMessage().cStr();
  o.finish = r.getFinishReason().cStr();
  o.text = r.getText().cStr();
  o.prompt_tokens = r.getPromptTokens();
  for (auto id : r.getTokenIds()) o.ids.push_back(id);
  return o;
}

}  // namespace llmesh::testing
