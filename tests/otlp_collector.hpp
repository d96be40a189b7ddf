// Test helpers for tracing: a stand-in OpenTelemetry collector (an HTTP/1.1 server on
// 127.0.0.1, a port chosen at run time, that keeps every POST and answers with the statuses it
// is told), a protobuf reader that turns an OTLP ExportTraceServiceRequest into its spans —
// written from opentelemetry-proto's field numbers, independently of the encoder under test —
// and, for tests that start servers, the OTEL_* environment they see and the spans they sent.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

namespace llmesh::testing {

/// One POST the collector took.
struct otlp_post {
  std::string target;
  std::map<std::string, std::string> headers;  ///< names lower-cased
  std::string body;
};

class otlp_collector {
 public:
  otlp_collector() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd_, 16) != 0) return;
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~otlp_collector() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    close(fd_);
  }
  otlp_collector(const otlp_collector&) = delete;
  otlp_collector& operator=(const otlp_collector&) = delete;

  int port() const { return port_; }
  std::string url(const std::string& path = "/v1/traces") const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  /// The next answers' statuses (then 200 again), e.g. {503, 503} for two refusals.
  void answer_next(std::vector<int> statuses) {
    std::lock_guard lk(mu_);
    statuses_.assign(statuses.begin(), statuses.end());
  }
  /// Every POST so far, answered or not (refused ones too).
  std::vector<otlp_post> posts() {
    std::lock_guard lk(mu_);
    return posts_;
  }
  /// Waits until `n` POSTs came (false after `patience`).
  bool wait_posts(size_t n, std::chrono::milliseconds patience = std::chrono::seconds(30)) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, patience, [&] { return posts_.size() >= n; });
  }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      handle(c);
      close(c);
    }
  }
  void handle(int c) {
    std::string in;
    char buf[8192];
    size_t head_end = std::string::npos, need = 0;
    for (;;) {
      pollfd p{c, POLLIN, 0};
      if (poll(&p, 1, 5000) <= 0) return;
      const ssize_t n = recv(c, buf, sizeof buf, 0);
      if (n <= 0) return;
      in.append(buf, static_cast<size_t>(n));
      if (head_end == std::string::npos && (head_end = in.find("\r\n\r\n")) != std::string::npos) {
        const std::string lower = lowered(in.substr(0, head_end));
        if (const auto at = lower.find("\r\ncontent-length:"); at != std::string::npos) need = std::stoul(lower.substr(at + 17));
      }
      if (head_end != std::string::npos && in.size() >= head_end + 4 + need) break;
    }
    otlp_post post;
    const auto sp1 = in.find(' '), sp2 = in.find(' ', sp1 + 1);
    post.target = in.substr(sp1 + 1, sp2 - sp1 - 1);
    size_t line = in.find("\r\n") + 2;
    while (line < head_end) {
      const size_t next = in.find("\r\n", line);
      const std::string h = in.substr(line, next - line);
      if (const auto colon = h.find(':'); colon != std::string::npos) {
        std::string v = h.substr(colon + 1);
        while (!v.empty() && v.front() == ' ') v.erase(0, 1);
        post.headers[lowered(h.substr(0, colon))] = v;
      }
      line = next + 2;
    }
    post.body = in.substr(head_end + 4, need);
    int status = 200;
    {
      std::lock_guard lk(mu_);
      if (!statuses_.empty()) {
        status = statuses_.front();
        statuses_.pop_front();
      }
      posts_.push_back(std::move(post));
    }
    cv_.notify_all();
    const std::string reply = "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: application/x-protobuf\r\n"
                              "Content-Length: 0\r\nConnection: close\r\n\r\n";
    (void)send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
  }
  static std::string lowered(std::string s) {
    for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  }

  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> statuses_;
  std::vector<otlp_post> posts_;
  std::thread thread_;
};

// --- reading OTLP protobuf ---

struct pb_field {
  uint32_t number = 0;
  uint32_t wire = 0;
  uint64_t value = 0;  ///< varint, fixed64, fixed32
  std::string bytes;   ///< length-delimited
};

/// The fields of one message, in order; a malformed message ends the list early and sets `ok` false.
inline std::vector<pb_field> pb_fields(const std::string& msg, bool* ok = nullptr) {
  std::vector<pb_field> out;
  size_t i = 0;
  auto varint = [&](uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (i >= msg.size()) return false;
      const auto b = static_cast<uint8_t>(msg[i++]);
      v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  };
  if (ok) *ok = true;
  while (i < msg.size()) {
    uint64_t tag = 0;
    pb_field f;
    bool good = varint(tag);
    f.number = static_cast<uint32_t>(tag >> 3);
    f.wire = static_cast<uint32_t>(tag & 7);
    if (good && f.wire == 0) {
      good = varint(f.value);
    } else if (good && (f.wire == 1 || f.wire == 5)) {
      const size_t n = f.wire == 1 ? 8 : 4;
      good = i + n <= msg.size();
      for (size_t k = 0; good && k < n; ++k) f.value |= uint64_t{static_cast<uint8_t>(msg[i + k])} << (8 * k);
      i += n;
    } else if (good && f.wire == 2) {
      uint64_t len = 0;
      good = varint(len) && i + len <= msg.size();
      if (good) f.bytes = msg.substr(i, len);
      i += len;
    } else {
      good = false;
    }
    if (!good) {
      if (ok) *ok = false;
      break;
    }
    out.push_back(std::move(f));
  }
  return out;
}

using pb_value = std::variant<std::monostate, std::string, bool, int64_t, double>;

/// A span as read back.
struct read_span {
  std::string trace_id, span_id, parent_span_id, trace_state, name;  ///< ids in lowercase hex
  uint64_t kind = 0, start_ns = 0, end_ns = 0, flags = 0, status_code = 0;
  std::string status_message;
  std::map<std::string, pb_value> attributes;
  std::map<uint32_t, uint32_t> wires;                 ///< each Span field's wire type
  std::map<std::string, uint32_t> attribute_wires;    ///< each attribute's AnyValue wire type
};

inline std::string pb_hex(const std::string& b) {
  static constexpr char d[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s.push_back(d[c >> 4]);
    s.push_back(d[c & 15]);
  }
  return s;
}

/// A KeyValue's key and value (AnyValue: string 1, bool 2, int 3, double 4); `wire`: the
/// value's wire type.
inline std::pair<std::string, pb_value> pb_key_value(const std::string& kv, uint32_t* wire = nullptr) {
  std::pair<std::string, pb_value> out;
  for (const auto& f : pb_fields(kv)) {
    if (f.number == 1) out.first = f.bytes;
    if (f.number != 2) continue;
    for (const auto& v : pb_fields(f.bytes)) {
      if (wire) *wire = v.wire;
      if (v.number == 1) out.second = v.bytes;
      if (v.number == 2) out.second = v.value != 0;
      if (v.number == 3) out.second = static_cast<int64_t>(v.value);
      if (v.number == 4) {
        double d;
        std::memcpy(&d, &v.value, sizeof d);
        out.second = d;
      }
    }
  }
  return out;
}

/// An ExportTraceServiceRequest: its resource attributes and every span in it.
struct read_request {
  std::map<std::string, pb_value> resource;
  std::string scope_name;
  std::vector<read_span> spans;
};

inline read_request pb_read_traces(const std::string& body) {
  read_request r;
  for (const auto& rs : pb_fields(body)) {          // resource_spans = 1
    if (rs.number != 1) continue;
    for (const auto& f : pb_fields(rs.bytes)) {
      if (f.number == 1) {                             // resource = 1
        for (const auto& a : pb_fields(f.bytes)) {
          if (a.number == 1) r.resource.insert(pb_key_value(a.bytes));
        }
      }
      if (f.number != 2) continue;                     // scope_spans = 2
      for (const auto& ss : pb_fields(f.bytes)) {
        if (ss.number == 1) {
          for (const auto& sc : pb_fields(ss.bytes)) {
            if (sc.number == 1) r.scope_name = sc.bytes;
          }
        }
        if (ss.number != 2) continue;                  // spans = 2
        read_span s;
        for (const auto& x : pb_fields(ss.bytes)) {
          s.wires[x.number] = x.wire;
          switch (x.number) {
            case 1: s.trace_id = pb_hex(x.bytes); break;
            case 2: s.span_id = pb_hex(x.bytes); break;
            case 3: s.trace_state = x.bytes; break;
            case 4: s.parent_span_id = pb_hex(x.bytes); break;
            case 5: s.name = x.bytes; break;
            case 6: s.kind = x.value; break;
            case 7: s.start_ns = x.value; break;
            case 8: s.end_ns = x.value; break;
            case 9: {
              uint32_t wire = 0;
              auto kv = pb_key_value(x.bytes, &wire);
              s.attribute_wires[kv.first] = wire;
              s.attributes.insert(std::move(kv));
              break;
            }
            case 15:
              for (const auto& st : pb_fields(x.bytes)) {
                if (st.number == 2) s.status_message = st.bytes;
                if (st.number == 3) s.status_code = st.value;
              }
              break;
            case 16: s.flags = x.value; break;
            default: break;
          }
        }
        r.spans.push_back(std::move(s));
      }
    }
  }
  return r;
}

/// Sets environment variables for the servers a test starts — and empties the other OTEL_*
/// settings the exporter reads, so the machine's own cannot change what the test sees —;
/// restores them all after.
struct scoped_otel_env {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  void set(const char* k, const char* v) {
    const char* old = std::getenv(k);
    saved.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
    setenv(k, v, 1);
  }
  scoped_otel_env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* k : {"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS",
                          "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
                          "OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
                          "OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_BSP_SCHEDULE_DELAY",
                          "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_SERVICE_NAME",
                          "OTEL_RESOURCE_ATTRIBUTES"}) {
      set(k, "");  // empty: unset, to the exporter
    }
    for (const auto& [k, v] : vars) set(k, v);
  }
  ~scoped_otel_env() {
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
      if (it->second) {
        setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        unsetenv(it->first.c_str());
      }
    }
  }
};

/// Every span the collector got so far.
inline std::vector<read_span> spans_of(otlp_collector& c) {
  std::vector<read_span> out;
  for (const auto& p : c.posts()) {
    for (auto& s : pb_read_traces(p.body).spans) out.push_back(std::move(s));
  }
  return out;
}

/// Waits until the collector holds `n` spans (false after 30 s).
inline bool wait_spans(otlp_collector& c, size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (spans_of(c).size() < n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

inline const read_span* span_with(const std::vector<read_span>& spans, const std::string& request_id) {
  for (const auto& s : spans) {
    auto it = s.attributes.find("gen_ai.request.id");
    if (it != s.attributes.end() && std::get<std::string>(it->second) == request_id) return &s;
  }
  return nullptr;
}

}  // namespace llmesh::testing
