// The Responses API's background mode through api_service, the test playing the replica (a
// mesh that keeps each request's sink): a background response answers at once as queued,
// reads as in_progress with its output so far while it runs and as stored once it ends; its
// stream's events can be read from any sequence number, live; cancelling ends it "cancelled"
// (in the mesh too) and is idempotent; DELETE cancels; the runs' bounds; a closing service
// leaves no run touching it.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "api_fixture.hpp"
#include "llmesh/gateway/api_service.hpp"
#include "llmesh/gateway/background_runs.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

/// Keeps every request and its sink; the test answers for the replica.
struct sink_mesh : actors::mesh_client {
  void submit(actors::replica_request r, actors::token_sink sink) override {
    std::lock_guard lock(mu);
    requests.push_back(std::move(r));
    sinks.push_back(std::move(sink));
  }
  void cancel(uint64_t id) override {
    std::lock_guard lock(mu);
    cancelled.push_back(id);
  }
  size_t ready_replicas() const override { return 1; }
  bool was_cancelled(uint64_t id) {
    std::lock_guard lock(mu);
    return std::find(cancelled.begin(), cancelled.end(), id) != cancelled.end();
  }
  std::mutex mu;
  std::vector<actors::replica_request> requests;
  std::vector<actors::token_sink> sinks;
  std::vector<uint64_t> cancelled;
};

/// The SSE events of `bytes`, parsed, in order.
std::vector<json> events_of(const std::string& bytes) {
  std::vector<json> out;
  for (size_t at = 0; at < bytes.size();) {
    size_t end = bytes.find("\n\n", at);
    if (end == std::string::npos) end = bytes.size();
    const std::string ev = bytes.substr(at, end - at);
    at = end + 2;
    const size_t data = ev.find("\ndata: ");
    if (data == std::string::npos) continue;
    out.push_back(json::parse(ev.substr(data + 7)));
  }
  return out;
}

std::vector<std::string> types_of(const std::vector<json>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) out.push_back(e["type"]);
  return out;
}

class BackgroundResponses : public ::testing::Test {
 protected:
  void SetUp() override { start(api_options{}); }
  void start(api_options o) {
    api_.reset();
    o.max_concurrent = 8;
    api_ = kjv_service(o, mesh_, metrics_, tok_);
    ASSERT_TRUE(api_);
  }
  api_outcome call(const std::string& method, const std::string& path, const std::string& body = "") {
    return api_->handle(method, path, "", body);
  }
  http_reply reply(const std::string& method, const std::string& path, const std::string& body = "") {
    auto o = call(method, path, body);
    EXPECT_TRUE(std::holds_alternative<http_reply>(o)) << method << " " << path;
    return std::holds_alternative<http_reply>(o) ? std::get<http_reply>(o) : http_reply{};
  }
  json get(const std::string& path) {
    auto r = reply("GET", path);
    EXPECT_EQ(r.status, 200) << path << " " << r.body;
    return r.status == 200 ? json::parse(r.body) : json();
  }
  /// The replica's answer to the last request: `text`'s tokens, the last ending it by length
  /// when `end`.
  void answer(const std::string& text, bool end, size_t request = SIZE_MAX) {
    const auto ids = tok_->encode(text, false);
    actors::token_sink sink;
    uint64_t id = 0;
    {
      std::lock_guard lock(mesh_.mu);
      const size_t i = request == SIZE_MAX ? mesh_.sinks.size() - 1 : request;
      sink = mesh_.sinks.at(i);
      id = mesh_.requests.at(i).id;
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      const bool last = end && i + 1 == ids.size();
      sink(actors::token_msg{id, ids[i], last ? actors::finish_reason::length : actors::finish_reason::none, false, {}, {}, {}});
    }
  }

  std::shared_ptr<const model::tokenizer> tok_;
  sink_mesh mesh_;
  actors::metrics_registry metrics_;
  std::unique_ptr<api_service> api_;
};

TEST_F(BackgroundResponses, AnswersQueuedThenReadsAsItRunsAndAsStoredOnceItEnds) {
  const json body = {{"model", "m"}, {"input", "Who is the LORD?"}, {"max_output_tokens", 4}, {"background", true}};
  const http_reply queued = reply("POST", "/v1/responses", body.dump());
  ASSERT_EQ(queued.status, 200) << queued.body;
  const json q = json::parse(queued.body);
  EXPECT_EQ(q["status"], "queued");
  EXPECT_EQ(q["background"], true);
  EXPECT_EQ(q["store"], true);
  EXPECT_EQ(q["output"], json::array());
  const std::string id = q["id"];
  ASSERT_EQ(mesh_.requests.size(), 1u);  // already running in the mesh
  EXPECT_EQ(api_->inflight(), 1u);       // and holding its slot
  auto gauge = [&](const char* name) {
    const std::string m = metrics_.render(), series = "\n" + std::string(name) + " ";
    const size_t at = m.find(series);
    return at == std::string::npos ? -1.0 : std::atof(m.c_str() + at + series.size());
  };
  EXPECT_EQ(gauge("llmesh_background_responses_running"), 1.0);
  EXPECT_EQ(get("/v1/responses/" + id)["status"], "queued");
  // Its input items are there while it runs.
  EXPECT_EQ(get("/v1/responses/" + id + "/input_items")["data"][0]["content"][0]["text"], "Who is the LORD?");

  answer(" the God", false);
  const json running = get("/v1/responses/" + id);
  EXPECT_EQ(running["status"], "in_progress");
  ASSERT_EQ(running["output"].size(), 1u);
  EXPECT_EQ(running["output"][0]["status"], "in_progress");
  const std::string so_far = running["output"][0]["content"][0]["text"];
  EXPECT_EQ(so_far, tok_->decoder().decode(tok_->encode(" the God", false), false));

  answer(" of", true);
  const json done = get("/v1/responses/" + id);
  EXPECT_EQ(done["status"], "incomplete");  // ended by max_output_tokens
  EXPECT_EQ(done["background"], true);
  EXPECT_EQ(done["output"][0]["content"][0]["text"], so_far + tok_->decoder().decode(tok_->encode(" of", false), false));
  EXPECT_EQ(done["usage"]["output_tokens"], 3);
  EXPECT_EQ(api_->inflight(), 0u);  // the slot went with the run's end
  EXPECT_EQ(gauge("llmesh_background_responses_running"), 0.0);
  EXPECT_EQ(gauge("llmesh_stored_responses"), 1.0);
  EXPECT_GT(gauge("llmesh_stored_responses_bytes"), 100.0);
  // The same as the stored response, which a later request continues.
  EXPECT_EQ(get("/v1/responses/" + id + "/input_items")["data"].size(), 1u);
  auto next = call("POST", "/v1/responses", json{{"model", "m"}, {"previous_response_id", id}, {"input", "And?"}}.dump());
  EXPECT_TRUE(std::holds_alternative<generation_job>(next));
  // Cancelling an ended one is refused, naming its status.
  const http_reply late = reply("POST", "/v1/responses/" + id + "/cancel");
  EXPECT_EQ(late.status, 400);
  EXPECT_NE(late.body.find("already ended (incomplete)"), std::string::npos) << late.body;
}

TEST_F(BackgroundResponses, ItsStreamCanBeReadFromAnySequenceNumberWhileItRunsAndAfter) {
  const json body = {{"model", "m"}, {"input", "Who is the LORD?"}, {"max_output_tokens", 4}, {"background", true}, {"stream", true}};
  auto o = call("POST", "/v1/responses", body.dump());
  ASSERT_TRUE(std::holds_alternative<event_tail>(o));
  auto run = std::get<event_tail>(o).run;
  EXPECT_EQ(std::get<event_tail>(o).after, -1);
  auto first = run->read(-1);
  EXPECT_FALSE(first.ended);
  EXPECT_EQ(types_of(events_of(first.bytes)), (std::vector<std::string>{"response.created", "response.queued"}));
  EXPECT_EQ(first.last, 1);
  EXPECT_EQ(events_of(first.bytes)[0]["response"]["status"], "queued");
  // Nothing new: a waker is kept, and called once when something comes.
  std::atomic<int> woken{0};
  auto none = run->read(first.last, [&] { ++woken; });
  EXPECT_TRUE(none.bytes.empty());
  EXPECT_EQ(none.last, 1);
  answer(" the God", false);
  EXPECT_EQ(woken.load(), 1);
  answer(" of", true);
  EXPECT_EQ(woken.load(), 1);
  auto rest = run->read(first.last);
  EXPECT_TRUE(rest.ended);
  const auto later = events_of(rest.bytes);
  ASSERT_FALSE(later.empty());
  EXPECT_EQ(later.front()["type"], "response.in_progress");
  EXPECT_EQ(later.back()["type"], "response.incomplete");
  EXPECT_EQ(later.back()["response"]["background"], true);
  // Sequence numbers continue, one per event.
  for (size_t i = 0; i < later.size(); ++i) EXPECT_EQ(later[i]["sequence_number"], static_cast<int64_t>(i + 2));
  // Everything from 0 is the two pages joined; from 5, the events numbered above 5.
  EXPECT_EQ(run->read(-1).bytes, first.bytes + rest.bytes);
  const std::string id = later.back()["response"]["id"];
  auto resumed = call("GET", "/v1/responses/" + id + "?stream=true&starting_after=5");
  ASSERT_TRUE(std::holds_alternative<event_tail>(resumed));
  EXPECT_EQ(std::get<event_tail>(resumed).after, 5);
  const auto from6 = events_of(std::get<event_tail>(resumed).run->read(5).bytes);
  ASSERT_EQ(from6.size(), later.size() - 4);
  EXPECT_EQ(from6.front()["sequence_number"], 6);
  // The final event's response is the stored one.
  EXPECT_EQ(get("/v1/responses/" + id), later.back()["response"]);
  for (const char* q : {"?stream=yes", "?stream=true&starting_after=-1", "?stream=true&starting_after=x"}) {
    EXPECT_EQ(reply("GET", "/v1/responses/" + id + q).status, 400) << q;
  }
  // The same request in the foreground streams the same events but the queued one.
  json fg = body;
  fg.erase("background");
  auto f = call("POST", "/v1/responses", fg.dump());
  ASSERT_TRUE(std::holds_alternative<generation_job>(f));
  auto& job = std::get<generation_job>(f);
  std::string streamed;
  for (const auto& [text, end] : std::vector<std::pair<std::string, bool>>{{" the God", false}, {" of", true}}) {
    const auto ids = tok_->encode(text, false);
    for (size_t i = 0; i < ids.size(); ++i) {
      const bool last = end && i + 1 == ids.size();
      streamed += job.output->on_message(actors::token_msg{job.requests[0].id, ids[i], last ? actors::finish_reason::length : actors::finish_reason::none,
                                                           false, {}, {}, {}});
    }
  }
  auto bg_types = types_of(events_of(run->read(-1).bytes));
  bg_types.erase(std::find(bg_types.begin(), bg_types.end(), "response.queued"));
  EXPECT_EQ(bg_types, types_of(events_of(streamed)));
  // A foreground response's stream is not kept.
  const std::string fg_id = events_of(streamed).back()["response"]["id"];
  const http_reply not_kept = reply("GET", "/v1/responses/" + fg_id + "?stream=true");
  EXPECT_EQ(not_kept.status, 400);
  EXPECT_NE(not_kept.body.find("only a background response's stream can be read again"), std::string::npos) << not_kept.body;
}

TEST_F(BackgroundResponses, CancellingEndsItCancelledInTheMeshTooAndTwiceIsTheSame) {
  const json body = {{"model", "m"}, {"input", "Who is the LORD?"}, {"background", true}, {"stream", true}};
  auto o = call("POST", "/v1/responses", body.dump());
  ASSERT_TRUE(std::holds_alternative<event_tail>(o));
  auto run = std::get<event_tail>(o).run;
  answer(" the God", false);
  const uint64_t request = mesh_.requests.at(0).id;
  std::atomic<int> woken{0};
  const auto before = run->read(-1);
  EXPECT_TRUE(run->read(before.last, [&] { ++woken; }).bytes.empty());
  const http_reply c = reply("POST", "/v1/responses/" + run->id() + "/cancel");
  ASSERT_EQ(c.status, 200) << c.body;
  const json cancelled = json::parse(c.body);
  EXPECT_EQ(cancelled["status"], "cancelled");
  EXPECT_EQ(cancelled["output"][0]["status"], "incomplete");
  EXPECT_EQ(cancelled["output"][0]["content"][0]["text"], tok_->decoder().decode(tok_->encode(" the God", false), false));
  EXPECT_EQ(cancelled["usage"]["output_tokens"], tok_->encode(" the God", false).size());  // what it had made
  EXPECT_GT(cancelled["usage"]["input_tokens"], 0);
  EXPECT_TRUE(mesh_.was_cancelled(request));
  EXPECT_EQ(woken.load(), 1);  // a reader learns the stream ended
  EXPECT_TRUE(run->read(before.last).ended);
  EXPECT_TRUE(run->read(before.last).bytes.empty());
  EXPECT_EQ(api_->inflight(), 0u);
  EXPECT_NE(metrics_.render().find("\nllmesh_background_responses_running 0\n"), std::string::npos);
  // Later messages change nothing; cancelling again answers the same response.
  answer(" of", true);
  EXPECT_EQ(get("/v1/responses/" + run->id()), cancelled);
  const http_reply again = reply("POST", "/v1/responses/" + run->id() + "/cancel");
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(json::parse(again.body), cancelled);
}

TEST_F(BackgroundResponses, DeleteCancelsARunningOneAndForgetsIt) {
  const json q = json::parse(reply("POST", "/v1/responses", json{{"model", "m"}, {"input", "x"}, {"background", true}}.dump()).body);
  const std::string id = q["id"];
  const http_reply d = reply("DELETE", "/v1/responses/" + id);
  EXPECT_EQ(d.status, 200) << d.body;
  EXPECT_TRUE(mesh_.was_cancelled(mesh_.requests.at(0).id));
  EXPECT_EQ(reply("GET", "/v1/responses/" + id).status, 404);
  EXPECT_EQ(reply("GET", "/v1/responses/" + id + "?stream=true").status, 404);
  EXPECT_EQ(reply("POST", "/v1/responses/" + id + "/cancel").status, 404);
  EXPECT_EQ(reply("DELETE", "/v1/responses/" + id).status, 404);
  answer(" y", true);  // nothing to take it
  EXPECT_EQ(api_->inflight(), 0u);
}

TEST_F(BackgroundResponses, AFailureBeforeAnyOutputEndsItFailed) {
  auto o = call("POST", "/v1/responses", json{{"model", "m"}, {"input", "x"}, {"background", true}, {"stream", true}}.dump());
  ASSERT_TRUE(std::holds_alternative<event_tail>(o));
  auto run = std::get<event_tail>(o).run;
  actors::token_msg failed;
  failed.id = mesh_.requests.at(0).id;
  failed.failed = true;
  failed.err = make_error(errc::replica_unavailable, "no replica is ready");
  mesh_.sinks.at(0)(failed);
  const auto page = run->read(-1);
  EXPECT_TRUE(page.ended);
  const auto events = events_of(page.bytes);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[2]["type"], "response.failed");
  const json r = get("/v1/responses/" + run->id());
  EXPECT_EQ(r["status"], "failed");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("no replica is ready"), std::string::npos) << r;
  EXPECT_EQ(api_->inflight(), 0u);
}

TEST_F(BackgroundResponses, NeedsTheStoreAndItsConcurrencySlots) {
  const http_reply no_store = reply("POST", "/v1/responses", json{{"model", "m"}, {"input", "x"}, {"background", true}, {"store", false}}.dump());
  EXPECT_EQ(no_store.status, 400);
  EXPECT_NE(no_store.body.find("'background' needs 'store'"), std::string::npos) << no_store.body;
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(reply("POST", "/v1/responses", json{{"model", "m"}, {"input", "x"}, {"background", true}}.dump()).status, 200);
  }
  EXPECT_EQ(reply("POST", "/v1/responses", json{{"model", "m"}, {"input", "x"}, {"background", true}}.dump()).status, 429);
  api_options none;
  none.max_stored_responses = 0;
  start(none);
  const http_reply off = reply("POST", "/v1/responses", json{{"model", "m"}, {"input", "x"}, {"background", true}}.dump());
  EXPECT_EQ(off.status, 400);
  EXPECT_NE(off.body.find("--max-stored-responses 0"), std::string::npos) << off.body;
}

TEST_F(BackgroundResponses, AClosingServiceCancelsItsRunsAndTheirSinksTouchNothing) {
  const std::string first_id = json::parse(reply("POST", "/v1/responses", json{{"model", "m"}, {"input", "x"}, {"background", true}}.dump()).body)["id"];
  const uint64_t request = mesh_.requests.at(0).id;
  api_->close_background();  // as the server stops, before its mesh
  EXPECT_TRUE(mesh_.was_cancelled(request));
  // It reads as it stood; cancelling it now is the server stopping, not a finished response.
  EXPECT_EQ(get("/v1/responses/" + first_id)["status"], "queued");
  EXPECT_EQ(reply("POST", "/v1/responses/" + first_id + "/cancel").status, 503);
  const http_reply late = reply("POST", "/v1/responses", json{{"model", "m"}, {"input", "x"}, {"background", true}}.dump());
  EXPECT_EQ(late.status, 503) << late.body;
  EXPECT_EQ(mesh_.requests.size(), 1u);
  reply("POST", "/v1/responses", json{{"model", "m"}, {"input", "x"}, {"background", true}, {"stream", true}}.dump());
  api_.reset();
  answer(" y", true);  // the sink outlives the service: it must not reach it
}

TEST_F(BackgroundResponses, MessagesFromAnotherThreadWhileClientsPollAndRead) {
  auto o = call("POST", "/v1/responses", json{{"model", "m"}, {"input", "x"}, {"background", true}, {"stream", true}}.dump());
  ASSERT_TRUE(std::holds_alternative<event_tail>(o));
  auto run = std::get<event_tail>(o).run;
  const std::string text = " the God of Abraham and the God of Isaac and the God of Jacob";
  std::thread replica([&] {
    for (int i = 0; i < 20; ++i) answer(text, false);
    answer(" end", true);
  });
  std::string read_live;
  int64_t after = -1;
  for (bool ended = false; !ended;) {
    const auto page = run->read(after);
    read_live += page.bytes;
    after = page.last;
    ended = page.ended;
    EXPECT_TRUE(get("/v1/responses/" + run->id()).is_object());
    std::this_thread::yield();
  }
  replica.join();
  EXPECT_EQ(read_live, run->read(-1).bytes);
  const auto events = events_of(read_live);
  for (size_t i = 0; i < events.size(); ++i) ASSERT_EQ(events[i]["sequence_number"], static_cast<int64_t>(i));
  EXPECT_EQ(events.back()["type"], "response.incomplete");
}

TEST(BackgroundRuns, KeepTheNewestEndedWithinTheirBoundsAndEveryLiveOne) {
  // Plain runs over a mesh that answers nothing: the group renders one choice as responses.
  sink_mesh mesh;
  const std::string dir = LLMESH_SOURCE_DIR "/models/kjv-tiny";
  auto tok = model::tokenizer::load(dir);
  ASSERT_TRUE(tok.ok());
  auto job_of = [&](int i) {
    generation_job job;
    job.tok = *tok;
    group_setup g;
    g.chat = g.streaming = g.include_usage = true;
    char hex[32];
    std::snprintf(hex, sizeof hex, "%024x", i);
    g.id = std::string("chatcmpl-") + hex;
    g.model = "m";
    job.output = std::make_unique<completion_group>(g, (*tok)->decoder(), nullptr);
    actors::replica_request r;
    r.id = static_cast<uint64_t>(1000 + i);
    job.output->add_choice(r.id, stream_setup{});
    responses_echo echo;
    echo.store = echo.background = true;
    job.output->render_as_responses(std::make_unique<responses_renderer>(echo, g.id, 1, "m"));
    job.requests.push_back(std::move(r));
    return job;
  };
  background_runs runs(mesh, background_limits{2, size_t{1} << 20});
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(runs.start(job_of(i), json::array())->id());
  EXPECT_EQ(runs.size(), 5u);  // all live
  for (int i = 0; i < 4; ++i) {
    mesh.sinks.at(static_cast<size_t>(i))(actors::token_msg{mesh.requests[static_cast<size_t>(i)].id, 5, actors::finish_reason::length, false, {}, {}, {}});
  }
  runs.start(job_of(5), json::array());  // pruning happens as runs start
  EXPECT_EQ(runs.size(), 4u);            // 2 ended kept + 2 live
  EXPECT_EQ(runs.find(ids[0]), nullptr);
  EXPECT_EQ(runs.find(ids[1]), nullptr);
  ASSERT_NE(runs.find(ids[2]), nullptr);
  EXPECT_FALSE(runs.find(ids[2])->live());
  EXPECT_TRUE(runs.find(ids[4])->live());
  EXPECT_TRUE(runs.forget(ids[4]));
  EXPECT_TRUE(mesh.was_cancelled(1004));
  EXPECT_FALSE(runs.forget(ids[4]));
  // By bytes: a bound below one run's events keeps no ended run.
  background_runs tight(mesh, background_limits{100, 1});
  const std::string a = tight.start(job_of(6), json::array())->id();
  mesh.sinks.back()(actors::token_msg{1006, 5, actors::finish_reason::length, false, {}, {}, {}});
  tight.start(job_of(7), json::array());
  EXPECT_EQ(tight.find(a), nullptr);
  EXPECT_EQ(tight.size(), 1u);
}

}  // namespace
}  // namespace llmesh::gateway
