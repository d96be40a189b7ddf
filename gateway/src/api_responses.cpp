// OpenAI's Responses API on the HTTP API (api_service.hpp): POST /v1/responses as the chat
// request it means (responses_api.hpp), continuing a stored response with
// previous_response_id, in the background with `background` (background_runs.hpp); and a
// stored response's routes — GET /v1/responses/{id} (a background one as it stands, or its
// events with ?stream=true&starting_after=N), its GET .../input_items, DELETE, and
// POST .../cancel (background responses only).
#include <charconv>
#include <cstdio>

#include "json_reply.hpp"
#include "llmesh/gateway/api_service.hpp"
#include "llmesh/gateway/background_runs.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

using detail::dumped;
using detail::json_body;

error response_not_found(std::string_view id) {
  return make_error(errc::not_found, "no stored response with id '" + std::string(id) +
                                         "' (it was never stored, was deleted, or was dropped to keep the store within its bounds)");
}

/// One `name=value` of a query string (no percent-decoding: the values here are ids, numbers
/// and words); nullopt when absent.
std::optional<std::string_view> query_value(std::string_view query, std::string_view name) {
  while (!query.empty()) {
    const size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    const size_t eq = pair.find('=');
    if (pair.substr(0, eq) == name) return eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
  }
  return std::nullopt;
}

}  // namespace

result<json> items_page(const json& items, std::string_view query) {
  size_t limit = 20;
  if (auto v = query_value(query, "limit")) {
    int n = 0;
    auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
    if (ec != std::errc() || end != v->data() + v->size() || n < 1 || n > 100) {
      return make_error(errc::invalid_request, "'limit' must be an integer from 1 to 100, got '" + std::string(*v) + "'");
    }
    limit = static_cast<size_t>(n);
  }
  bool desc = true;
  if (auto v = query_value(query, "order")) {
    if (*v != "asc" && *v != "desc") return make_error(errc::invalid_request, "'order' must be asc or desc, got '" + std::string(*v) + "'");
    desc = *v == "desc";
  }
  std::vector<const json*> ordered;
  for (const json& item : items) ordered.push_back(&item);
  if (desc) std::reverse(ordered.begin(), ordered.end());
  size_t from = 0;
  if (auto v = query_value(query, "after")) {
    auto it = std::find_if(ordered.begin(), ordered.end(), [&](const json* i) {
      return i->is_object() && i->contains("id") && (*i)["id"].is_string() && (*i)["id"].get_ref<const std::string&>() == *v;
    });
    if (it == ordered.end()) return make_error(errc::invalid_request, "'after': there is no item '" + std::string(*v) + "' in this list");
    from = static_cast<size_t>(it - ordered.begin()) + 1;
  }
  json data = json::array();
  for (size_t i = from; i < ordered.size() && data.size() < limit; ++i) data.push_back(*ordered[i]);
  json page = {{"object", "list"}, {"data", data}};
  page["first_id"] = data.empty() ? json(nullptr) : data.front()["id"];
  page["last_id"] = data.empty() ? json(nullptr) : data.back()["id"];
  page["has_more"] = from + data.size() < ordered.size();
  return page;
}

api_outcome api_service::responses(std::string_view body) {
  auto j = parse_request_object(body);
  if (!j) return error_reply(j.err());
  responses_job job;
  result<json> chat = json();
  try {
    if (j->contains("previous_response_id") && !(*j)["previous_response_id"].is_null()) {
      const json& prev_id = (*j)["previous_response_id"];
      if (!prev_id.is_string()) return error_reply(make_error(errc::invalid_request, "'previous_response_id' must be a string"));
      if (!store_->enabled()) {
        return error_reply(make_error(errc::invalid_request, "'previous_response_id' needs stored responses, and this server "
                                                             "stores none (--max-stored-responses 0): send the whole conversation as 'input'"));
      }
      auto prev = store_->get(prev_id.get<std::string>());
      if (!prev) return error_reply(response_not_found(prev_id.get<std::string>()));
      job.earlier = prev->conversation();
      job.echo.previous_response_id = prev_id;
    }
    if (j->contains("conversation") && !(*j)["conversation"].is_null()) {
      const json& conv = (*j)["conversation"];
      const json* cid = conv.is_string() ? &conv : conv.is_object() && conv.contains("id") ? &conv["id"] : nullptr;
      if (!cid || !cid->is_string()) {
        return error_reply(make_error(errc::invalid_request, "'conversation' must be a conversation's id, or an object with its 'id'"));
      }
      if (!job.echo.previous_response_id.is_null()) {
        return error_reply(make_error(errc::invalid_request, "'conversation' and 'previous_response_id' cannot both be given"));
      }
      if (!conversations_->enabled()) {
        return error_reply(make_error(errc::invalid_request, "'conversation': this server keeps no conversations (--max-conversations 0)"));
      }
      job.conversation = cid->get<std::string>();
      auto c = conversations_->get(job.conversation);
      if (!c) {
        return error_reply(make_error(errc::not_found, "no conversation with id '" + job.conversation + "'"));
      }
      job.earlier = (*c)["items"];
      job.echo.conversation = {{"id", job.conversation}};
    }
    chat = responses_to_chat(*j, job.echo, job.earlier);
    // truncation "auto": the oldest items give way until the prompt fits (the stored
    // conversation keeps them all).
    if (chat && job.echo.truncation == "auto") {
      if (const size_t k = items_to_drop(*j, job); k > 0) {
        auto [cut_body, cut_earlier] = without_first_items(*j, job.earlier, k);
        chat = responses_to_chat(cut_body, job.echo, cut_earlier);
      }
    }
  } catch (const nlohmann::json::exception& e) {  // a field of an unexpected type
    chat = make_error(errc::invalid_request, std::string("the request does not have the Responses API's shape: ") + e.what());
  }
  if (!chat) return error_reply(chat.err());
  // OpenAI stores unless told not to; a server without a store says so in the response.
  job.echo.store = store_->enabled() && (!j->contains("store") || (*j)["store"].is_null() || (*j)["store"].get<bool>());
  if (job.echo.background && !job.echo.store) {
    return error_reply(make_error(errc::invalid_request,
                                  store_->enabled() ? "'background' needs 'store': a background response is read back from the store"
                                                    : "'background' needs stored responses, and this server stores none "
                                                      "(--max-stored-responses 0)"));
  }
  const bool background = job.echo.background;
  const bool streamed = j->contains("stream") && (*j)["stream"].is_boolean() && (*j)["stream"].get<bool>();
  if (job.echo.store || !job.conversation.empty()) job.request = std::move(*j);
  api_outcome out = chat_completions(dumped(*chat), &job);
  if (!background || !std::holds_alternative<generation_job>(out)) return out;
  // Runs without the connection: a stream reads its events as they come (and the client may
  // go away); otherwise the answer is the response as queued.
  auto& started = std::get<generation_job>(out);
  json items = responses_input_items(job.request, started.output->responses()->hex());
  auto run = runs_->start(std::move(started), std::move(items));
  if (!run) return error_reply(make_error(errc::replica_unavailable, "the server is stopping"));
  if (streamed) return event_tail{run, -1};
  return json_body(run->queued());
}

size_t api_service::items_to_drop(const json& body, const responses_job& job) {
  if (!body.contains("model") || !body["model"].is_string()) return 0;  // the chat path says what is wrong
  auto m = find(body["model"].get<std::string>());
  if (!m || !(*m)->chat) return 0;
  const size_t ctx = (*m)->cfg.max_positions;
  // Room for the answer: max_output_tokens, or (not given) a quarter of the context within the
  // server's max_tokens limit, so that a truncated conversation is not answered in a token.
  const size_t wanted = body.contains("max_output_tokens") && body["max_output_tokens"].is_number_unsigned()
                            ? std::max<size_t>(body["max_output_tokens"].get<size_t>(), 1)
                            : std::max<size_t>(std::min(opt_.limits.max_tokens, ctx / 4), 1);
  // Cuts only before a user message (the kept part begins a turn, as strict templates want);
  // never the input's last item.
  const json input = body["input"].is_array() ? body["input"] : json::array({{{"role", "user"}}});
  std::vector<size_t> cuts;
  for (size_t k = 1; k < job.earlier.size() + input.size(); ++k) {
    const json& item = k < job.earlier.size() ? job.earlier[k] : input[k - job.earlier.size()];
    if (item.is_object() && item.value("type", std::string("message")) == "message" && item.value("role", std::string()) == "user") {
      cuts.push_back(k);
    }
  }
  auto fits = [&](size_t k) {
    auto [cut_body, cut_earlier] = without_first_items(body, job.earlier, k);
    responses_echo echo;
    auto chat = responses_to_chat(cut_body, echo, cut_earlier);
    if (!chat) return false;
    auto r = parse_chat_request(dumped(*chat), opt_.limits);
    if (!r) return false;
    auto prompt = chat_prompt(*r, **m);
    return prompt && prompt->second.size() + wanted <= ctx;
  };
  if (cuts.empty() || fits(0)) return 0;
  // The fewest items left out that fit (more left out, a shorter prompt): a binary search over
  // the cuts. When even the last cut does not fit, that one: the chat path then says why.
  size_t lo = 0, hi = cuts.size() - 1;
  if (!fits(cuts[hi])) return cuts[hi];
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (fits(cuts[mid])) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return cuts[lo];
}

http_reply api_service::cancel_response(const std::string& id) const {
  auto ended = [&](const std::string& status) {
    return error_reply(make_error(errc::invalid_request, "the background response '" + id +
                                                             "' cannot be cancelled: it has already ended (" + status + ")"));
  };
  if (auto run = runs_->find(id)) {
    auto [was_live, response] = run->cancel();
    const std::string status = response.is_object() ? response.value("status", std::string()) : std::string();
    if (was_live || status == "cancelled") return json_body(response);  // cancelling twice: the same response
    if (status == "queued" || status == "in_progress") {  // closed as it ran: the server is stopping
      return error_reply(make_error(errc::replica_unavailable, "the server is stopping"));
    }
    return ended(status);
  }
  auto stored = store_->get(id);
  if (!stored) return error_reply(response_not_found(id));
  const json& r = stored->response;
  const std::string status = r.value("status", std::string());
  if (r.value("background", false)) {
    if (status == "cancelled") return json_body(r);
    return ended(status);
  }
  return error_reply(make_error(errc::invalid_request, "only a background response can be cancelled, and '" + id +
                                                           "' is not one (it has already " + (status == "failed" ? "failed" : "finished") + ")"));
}

std::unique_ptr<responses_renderer> api_service::responses_output(const responses_job& r, std::string_view chat_id,
                                                                  int64_t created, const std::string& model) const {
  auto out = std::make_unique<responses_renderer>(r.echo, chat_id, created, model);
  if (r.echo.store || !r.conversation.empty()) {
    stored_response kept;
    kept.input_items = responses_input_items(r.request, out->hex());
    kept.earlier = r.earlier;
    out->on_final([store = r.echo.store ? store_ : nullptr, conversations = conversations_, conversation = r.conversation,
                   kept = std::move(kept)](const json& response) mutable {
      // A conversation takes the turn when the response finished (not failed or cancelled).
      const std::string status = response.value("status", std::string());
      if (!conversation.empty() && (status == "completed" || status == "incomplete")) {
        if (auto s = extend_conversation(*conversations, conversation, kept.input_items, response); !s && s.err().code != errc::not_found) {
          // (deleted meanwhile: nothing to extend) It would outgrow what the server keeps.
          std::fprintf(stderr, "llmesh: conversation %s not extended: %s\n", conversation.c_str(), s.err().message.c_str());
        }
      }
      if (!store) return;
      kept.response = response;
      store->put(response["id"].get<std::string>(), std::move(kept));
    });
  }
  return out;
}

api_outcome api_service::stored_responses(std::string_view method, std::string_view rest, std::string_view query) const {
  const size_t slash = rest.find('/');
  const std::string id(rest.substr(0, slash));
  const std::string_view sub = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  const std::string path = "/v1/responses/" + std::string(rest);
  if (id.empty() || (!sub.empty() && sub != "input_items" && sub != "cancel")) {
    return error_reply(make_error(errc::not_found, "no route for " + std::string(method) + " " + path));
  }
  const bool get = method == "GET";
  const bool allowed = sub.empty() ? get || method == "DELETE" : sub == "input_items" ? get : method == "POST";
  if (!allowed) {
    http_reply r = error_reply(make_error(errc::invalid_request, std::string(method) + " is not allowed on " + path));
    r.status = 405;
    r.headers.emplace_back("Allow", sub.empty() ? "GET, DELETE" : sub == "input_items" ? "GET" : "POST");
    return r;
  }
  if (method == "DELETE") {
    const bool was_run = runs_->forget(id);  // a live one is cancelled first (and stored so)
    if (!store_->erase(id) && !was_run) return error_reply(response_not_found(id));
    return json_body({{"id", id}, {"object", "response"}, {"deleted", true}});
  }
  if (sub == "cancel") return cancel_response(id);
  auto run = runs_->find(id);
  if (sub.empty()) {
    auto stream = query_value(query, "stream");
    if (stream && *stream != "true" && *stream != "false") {
      return error_reply(make_error(errc::invalid_request, "'stream' must be true or false, got '" + std::string(*stream) + "'"));
    }
    if (stream && *stream == "true") {
      int64_t after = -1;
      if (auto v = query_value(query, "starting_after")) {
        auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), after);
        if (ec != std::errc() || end != v->data() + v->size() || after < 0) {
          return error_reply(make_error(errc::invalid_request, "'starting_after' must be a sequence number (an integer >= 0), got '" + std::string(*v) + "'"));
        }
      }
      if (run) return event_tail{run, after};
      if (!store_->get(id)) return error_reply(response_not_found(id));
      return error_reply(make_error(errc::invalid_request, "the events of '" + id + "' are not kept: only a background "
                                                           "response's stream can be read again, while this server keeps its events "
                                                           "(GET it without 'stream' for the response)"));
    }
    if (run) return json_body(run->snapshot());  // as it stands, or as it ended
  }
  auto stored = store_->get(id);
  if (!stored && !(run && sub == "input_items")) return error_reply(response_not_found(id));
  if (sub == "input_items") {
    auto page = items_page(stored ? stored->input_items : run->input_items(), query);
    if (!page) return error_reply(page.err());
    return json_body(*page);
  }
  return json_body(stored->response);
}

}  // namespace llmesh::gateway
