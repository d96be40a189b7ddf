// config.json's field readers, shared by config.cpp and config_rope.cpp: each a value or an
// invalid_request error naming the field ("config.json: ...").
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "llmesh/common/error.hpp"

namespace llmesh::model::detail {

using json = nlohmann::json;

inline error bad(const std::string& msg) { return make_error(errc::invalid_request, "config.json: " + msg); }

inline result<size_t> get_size(const json& j, const char* key, bool required, size_t fallback = 0) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) return bad(std::string("missing field '") + key + "'");
    return fallback;
  }
  const auto& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0) {
    return bad(std::string("field '") + key + "' must be a non-negative integer");
  }
  return static_cast<size_t>(v.get<int64_t>());
}

inline result<double> get_number(const json& j, const char* key, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) return bad(std::string("field '") + key + "' must be a number");
  return j[key].get<double>();
}

inline result<bool> get_bool(const json& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) return bad(std::string("field '") + key + "' must be true or false");
  return j[key].get<bool>();
}

inline result<std::string> get_string(const json& j, const char* key, const std::string& fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_string()) return bad(std::string("field '") + key + "' must be a string");
  return j[key].get<std::string>();
}

}  // namespace llmesh::model::detail
