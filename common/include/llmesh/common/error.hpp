// The closed set of error kinds every llmesh component reports, and `result<T>`, the
// `expected`-style return type of fallible functions (std::expected is C++23; we build C++20).
// Policies that depend on the kind (HTTP status mapping, retry, migration) each live in one
// place; the component closest to the cause picks the kind and writes a one-line message.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace llmesh {

/// What went wrong, classified once by the component closest to the cause.
enum class errc {
  invalid_request,         ///< bad input from a user: flags, JSON fields, prompt, model files
  unauthorized,            ///< missing or wrong credentials
  not_found,               ///< a named thing (file, model, route) does not exist
  overloaded,              ///< a bounded queue or budget is full; retry later
  replica_unavailable,     ///< no ready replica can take the request
  shard_failed,            ///< a tensor-parallel shard died or reported an error
  transport_disconnected,  ///< a peer went away
  cancelled,               ///< the client or operator cancelled
  deadline_exceeded,       ///< a bounded wait ran out
  protocol_violation,      ///< a peer sent something malformed
  unsupported,             ///< valid input this build cannot handle (architecture, dtype, shape)
  io_error,                ///< the operating system refused a file or socket operation
  internal,                ///< a bug in llmesh
};

/// Stable lower-case name of an error kind, for logs and messages.
constexpr std::string_view errc_name(errc code) {
  switch (code) {
    case errc::invalid_request: return "invalid_request";
    case errc::unauthorized: return "unauthorized";
    case errc::not_found: return "not_found";
    case errc::overloaded: return "overloaded";
    case errc::replica_unavailable: return "replica_unavailable";
    case errc::shard_failed: return "shard_failed";
    case errc::transport_disconnected: return "transport_disconnected";
    case errc::cancelled: return "cancelled";
    case errc::deadline_exceeded: return "deadline_exceeded";
    case errc::protocol_violation: return "protocol_violation";
    case errc::unsupported: return "unsupported";
    case errc::io_error: return "io_error";
    case errc::internal: return "internal";
  }
  return "unknown";
}

/// An error kind with a one-line, human-readable message naming the problem.
struct error {
  errc code = errc::internal;
  std::string message;
};

/// Makes an error; the message should name the offending thing (file, field, value).
inline error make_error(errc code, std::string message) { return error{code, std::move(message)}; }

/// Either a value or an error. Cheap to move; check `ok()` before `value()`.
template <class T>
class [[nodiscard]] result {
 public:
  result(T value) : data_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  result(error err) : data_(std::in_place_index<1>, std::move(err)) {}  // NOLINT

  bool ok() const { return data_.index() == 0; }
  explicit operator bool() const { return ok(); }

  /// REQUIRES: ok().
  T& value() & { assert(ok()); return std::get<0>(data_); }
  const T& value() const& { assert(ok()); return std::get<0>(data_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(data_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  /// REQUIRES: !ok().
  const error& err() const { assert(!ok()); return std::get<1>(data_); }
  error&& take_error() { assert(!ok()); return std::get<1>(std::move(data_)); }

 private:
  std::variant<T, error> data_;
};

/// The result of a fallible function that returns nothing.
template <>
class [[nodiscard]] result<void> {
 public:
  result() = default;
  result(error err) : err_(std::move(err)), failed_(true) {}  // NOLINT

  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const error& err() const { assert(failed_); return err_; }
  error&& take_error() { assert(failed_); return std::move(err_); }

 private:
  error err_;
  bool failed_ = false;
};

using status = result<void>;

/// Returns the success value of a `status`.
inline status ok_status() { return {}; }

}  // namespace llmesh

/// Evaluates a result-returning expression and returns its error from the enclosing function.
#define LLMESH_TRY(expr)                                 \
  do {                                                   \
    auto llmesh_try_result_ = (expr);                    \
    if (!llmesh_try_result_.ok()) return llmesh_try_result_.take_error(); \
  } while (0)
