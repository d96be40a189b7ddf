// Evaluator of the chat-template Jinja subset. Values are JSON (ordered, like Python dicts)
// plus "undefined"; output follows Python's str() (None, True, 1.0). Scopes: the context,
// then one per for-loop iteration (a `set` inside a loop does not leak, as in Jinja; use
// namespace() to carry state out).
#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

#include "eval.hpp"

namespace llmesh::model::jinja {
namespace {

struct value {
  json j;
  bool undefined = false;
};

error fail(const std::string& msg) { return make_error(errc::invalid_request, "chat template: " + msg); }
error unsupported(const std::string& what) { return make_error(errc::unsupported, "chat template: unsupported " + what); }

bool truthy(const value& v) {
  if (v.undefined) return false;
  const json& j = v.j;
  if (j.is_null()) return false;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) return j.get<int64_t>() != 0;
  if (j.is_number()) return j.get<double>() != 0.0;
  if (j.is_string()) return !j.get<std::string>().empty();
  return !j.empty();  // array, object
}

std::string to_str(const value& v);

std::string py_repr(const json& j) {
  if (j.is_string()) {
    std::string s = j.get<std::string>();
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("\\'") : c == '\n' ? std::string("\\n") : std::string(1, c);
    return out + "'";
  }
  if (j.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + py_repr(j[i]);
    return out + "]";
  }
  if (j.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, v] : j.items()) {
      out += (first ? "" : ", ") + py_repr(json(k)) + ": " + py_repr(v);
      first = false;
    }
    return out + "}";
  }
  return to_str(value{j});
}

std::string to_str(const value& v) {
  if (v.undefined) return "";
  const json& j = v.j;
  if (j.is_string()) return j.get<std::string>();
  if (j.is_null()) return "None";
  if (j.is_boolean()) return j.get<bool>() ? "True" : "False";
  if (j.is_number_float()) {
    std::string s = j.dump();
    if (s.find_first_of(".eE") == std::string::npos) s += ".0";
    return s;
  }
  if (j.is_number()) return j.dump();
  return py_repr(j);
}

/// Python's json.dumps(x, ensure_ascii=False) with separators (", ", ": ") or an indent.
std::string to_json(const json& j, int indent, int depth = 0) {
  if (!j.is_array() && !j.is_object()) return j.dump(-1, ' ', false);
  if (j.empty()) return j.is_array() ? "[]" : "{}";
  const std::string nl = indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent) * (depth + 1), ' ') : "";
  const std::string close = indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent) * depth, ' ') : "";
  const std::string sep = indent >= 0 ? "," : ", ";
  std::string out = j.is_array() ? "[" : "{";
  bool first = true;
  if (j.is_array()) {
    for (const auto& x : j) {
      out += (first ? "" : sep) + nl + to_json(x, indent, depth + 1);
      first = false;
    }
  } else {
    for (const auto& [k, x] : j.items()) {
      out += (first ? "" : sep) + nl + json(k).dump(-1, ' ', false) + ": " + to_json(x, indent, depth + 1);
      first = false;
    }
  }
  return out + close + (j.is_array() ? "]" : "}");
}

std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  auto is_strip = [&](char c) { return chars.empty() ? std::isspace(static_cast<unsigned char>(c)) != 0 : chars.find(c) != std::string::npos; };
  size_t b = 0, e = s.size();
  if (left) while (b < e && is_strip(s[b])) ++b;
  if (right) while (e > b && is_strip(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string r;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, from.size(), from) == 0) {
      r += to;
      i += from.size();
    } else {
      r.push_back(s[i++]);
    }
  }
  return r;
}

/// ASCII upper/lower case (Python's str.upper/lower on the ASCII letters the templates use).
std::string change_case(std::string s, bool upper) {
  for (char& c : s) c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> split(const std::string& s, const std::string* sep) {
  std::vector<std::string> out;
  if (sep == nullptr) {  // Python's split(): runs of whitespace, no empty parts
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
      size_t j = i;
      while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
      if (j > i) out.push_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  size_t at = 0;
  while (true) {
    size_t f = s.find(*sep, at);
    if (f == std::string::npos || sep->empty()) {
      out.push_back(s.substr(at));
      return out;
    }
    out.push_back(s.substr(at, f - at));
    at = f + sep->size();
  }
}

class evaluator {
 public:
  explicit evaluator(const json& context) { scopes_.push_back(context.is_object() ? context : json::object()); }

  status run(const node_list& nodes, std::string& out) {
    for (const auto& n : nodes) {
      switch (n->type) {
        case node::kind::text:
          out += n->text;
          break;
        case node::kind::output: {
          auto v = eval(*n->value);
          if (!v) return v.take_error();
          out += to_str(*v);
          break;
        }
        case node::kind::if_:
          for (const auto& [cond, body] : n->branches) {
            bool take = true;
            if (cond) {
              auto c = eval(*cond);
              if (!c) return c.take_error();
              take = truthy(*c);
            }
            if (take) {
              LLMESH_TRY(run(body, out));
              break;
            }
          }
          break;
        case node::kind::set:
          LLMESH_TRY(assign(*n));
          break;
        case node::kind::for_:
          LLMESH_TRY(loop(*n, out));
          break;
        case node::kind::macro:  // defined from here on (Jinja assigns it when the statement runs)
          macros_[n->text] = n.get();
          break;
      }
    }
    return ok_status();
  }

 private:
  status assign(const node& n) {
    auto v = eval(*n.value);
    if (!v) return v.take_error();
    const std::string& t = n.targets[0];
    size_t dot = t.find('.');
    if (dot == std::string::npos) {
      scopes_.back()[t] = v->j;
      return ok_status();
    }
    std::string obj = t.substr(0, dot), attr = t.substr(dot + 1);
    for (size_t i = scopes_.size(); i-- > 0;) {
      if (i < floor_ && i > 0) i = 0;  // a macro's caller's scopes are hidden
      json& sc = scopes_[i];
      if (sc.contains(obj) && sc[obj].is_object()) {
        sc[obj][attr] = v->j;
        return ok_status();
      }
    }
    return fail("cannot set attribute '" + attr + "' of '" + obj + "'");
  }

  status loop(const node& n, std::string& out) {
    auto it = eval(*n.value);
    if (!it) return it.take_error();
    json items = json::array();
    const json& src = it->j;
    if (it->undefined || src.is_null()) {
      // iterating undefined yields nothing, as in Jinja
    } else if (src.is_array()) {
      items = src;
    } else if (src.is_object()) {
      for (const auto& [k, v] : src.items()) items.push_back(k);
    } else if (src.is_string()) {
      const std::string s = src.get<std::string>();
      for (size_t i = 0; i < s.size();) {
        size_t len = (static_cast<unsigned char>(s[i]) < 0x80) ? 1 : (static_cast<unsigned char>(s[i]) >> 5) == 6 ? 2 : (static_cast<unsigned char>(s[i]) >> 4) == 14 ? 3 : 4;
        items.push_back(s.substr(i, len));
        i += len;
      }
    } else {
      return fail("cannot iterate over " + to_str(*it));
    }
    auto bind = [&](json& scope, const json& item) -> status {
      if (n.targets.size() == 1) {
        scope[n.targets[0]] = item;
        return ok_status();
      }
      if (!item.is_array() || item.size() != n.targets.size()) return fail("cannot unpack loop item into " + std::to_string(n.targets.size()) + " names");
      for (size_t k = 0; k < n.targets.size(); ++k) scope[n.targets[k]] = item[k];
      return ok_status();
    };
    if (n.filter) {  // "for x in xs if cond": filter first, so loop.* count only kept items
      json kept = json::array();
      for (const auto& item : items) {
        scopes_.push_back(json::object());
        status s = bind(scopes_.back(), item);
        auto keep = s ? eval(*n.filter) : result<value>(s.take_error());
        scopes_.pop_back();
        if (!keep) return keep.take_error();
        if (truthy(*keep)) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const size_t count = items.size();
    for (size_t i = 0; i < count; ++i) {
      json scope = json::object();
      LLMESH_TRY(bind(scope, items[i]));
      scope["loop"] = {{"index", i + 1},       {"index0", i},        {"first", i == 0},
                       {"last", i + 1 == count}, {"length", count},  {"revindex", count - i},
                       {"revindex0", count - i - 1}};
      if (i > 0) scope["loop"]["previtem"] = items[i - 1];
      if (i + 1 < count) scope["loop"]["nextitem"] = items[i + 1];
      scopes_.push_back(std::move(scope));
      status s = run(n.body, out);
      scopes_.pop_back();
      LLMESH_TRY(s);
    }
    if (count == 0) return run(n.else_body, out);
    return ok_status();
  }

  value lookup(const std::string& name) const {
    for (size_t i = scopes_.size(); i-- > 0;) {
      if (i < floor_ && i > 0) i = 0;  // a macro's caller's scopes are hidden
      auto f = scopes_[i].find(name);
      if (f != scopes_[i].end()) return {*f};
    }
    return {json(), true};
  }

  result<std::vector<value>> eval_args(const expr& e) {
    std::vector<value> out;
    for (const auto& a : e.args) {
      auto v = eval(*a);
      if (!v) return v.take_error();
      out.push_back(std::move(v.value()));
    }
    return out;
  }

  result<value> eval(const expr& e) {
    switch (e.type) {
      case expr::kind::literal: return value{e.value};
      case expr::kind::name: return lookup(e.text);
      case expr::kind::list:
      case expr::kind::dict: {
        json out = e.type == expr::kind::list ? json::array() : json::object();
        for (size_t i = 0; i < e.args.size(); ++i) {
          auto v = eval(*e.args[i]);
          if (!v) return v.take_error();
          if (e.type == expr::kind::list) {
            out.push_back(v->j);
          } else {
            auto val = eval(*e.args[++i]);
            if (!val) return val.take_error();
            out[to_str(*v)] = val->j;
          }
        }
        return value{out};
      }
      case expr::kind::attr: {
        auto obj = eval(*e.a);
        if (!obj) return obj;
        if (obj->j.is_object() && obj->j.contains(e.text)) return value{obj->j[e.text]};
        return value{json(), true};
      }
      case expr::kind::index: return index(e);
      case expr::kind::slice: return slice(e);
      case expr::kind::call: return call(e);
      case expr::kind::filter: return filter(e);
      case expr::kind::test: return test(e);
      case expr::kind::unary: {
        auto v = eval(*e.a);
        if (!v) return v;
        if (e.text == "not") return value{!truthy(*v)};
        if (!v->j.is_number()) return fail("unary " + e.text + " on a non-number");
        if (e.text == "+") return value{v->j};
        return v->j.is_number_integer() ? value{json(-v->j.get<int64_t>())} : value{json(-v->j.get<double>())};
      }
      case expr::kind::binary: return binary(e);
      case expr::kind::ternary: {
        auto c = eval(*e.a);
        if (!c) return c;
        if (truthy(*c)) return eval(*e.b);
        if (e.c) return eval(*e.c);
        return value{json(), true};
      }
    }
    return fail("bad expression");
  }

  result<value> index(const expr& e) {
    auto obj = eval(*e.a);
    if (!obj) return obj;
    auto key = eval(*e.b);
    if (!key) return key;
    const json& o = obj->j;
    if (o.is_object()) {
      std::string k = to_str(*key);
      if (o.contains(k)) return value{o[k]};
      return value{json(), true};
    }
    if ((o.is_array() || o.is_string()) && key->j.is_number_integer()) {
      int64_t n = o.is_array() ? static_cast<int64_t>(o.size()) : static_cast<int64_t>(o.get<std::string>().size());
      int64_t i = key->j.get<int64_t>();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return value{json(), true};
      if (o.is_array()) return value{o[static_cast<size_t>(i)]};
      return value{json(o.get<std::string>().substr(static_cast<size_t>(i), 1))};
    }
    return value{json(), true};
  }

  result<value> slice(const expr& e) {
    auto obj = eval(*e.a);
    if (!obj) return obj;
    int64_t bounds[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    const expr* parts[3] = {e.b.get(), e.c.get(), e.d.get()};
    for (int k = 0; k < 3; ++k) {
      if (!parts[k]) continue;
      auto v = eval(*parts[k]);
      if (!v) return v;
      if (v->j.is_null() || v->undefined) continue;
      if (!v->j.is_number_integer()) return fail("slice bounds must be integers");
      bounds[k] = v->j.get<int64_t>();
      given[k] = true;
    }
    const json& o = obj->j;
    bool is_str = o.is_string();
    if (!o.is_array() && !is_str) return fail("cannot slice " + to_str(*obj));
    const int64_t n = is_str ? static_cast<int64_t>(o.get<std::string>().size()) : static_cast<int64_t>(o.size());
    const int64_t step = bounds[2];
    if (step == 0) return fail("slice step cannot be zero");
    auto norm = [&](int64_t x, bool g, int64_t def) {
      if (!g) return def;
      if (x < 0) x += n;
      return step > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
    };
    int64_t start = norm(bounds[0], given[0], step > 0 ? 0 : n - 1);
    int64_t stop = norm(bounds[1], given[1], step > 0 ? n : -1);
    json out = json::array();
    std::string s;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (is_str) s.push_back(o.get<std::string>()[static_cast<size_t>(i)]);
      else out.push_back(o[static_cast<size_t>(i)]);
    }
    return value{is_str ? json(s) : out};
  }

  /// A macro's call: its parameters bound from the arguments (positional, then keyword; a
  /// missing one takes its default, evaluated now, or stays undefined), its body rendered in a
  /// scope of its own over the template's top level (a macro does not see its caller's loop
  /// variables), the text returned.
  result<value> call_macro(const node& m, const expr& e, std::vector<value>& a) {
    if (a.size() > m.targets.size()) {
      return fail("macro '" + m.text + "' takes " + std::to_string(m.targets.size()) + " arguments, " + std::to_string(a.size()) + " given");
    }
    if (macro_depth_ >= max_macro_depth) return fail("macro '" + m.text + "' recursion deeper than " + std::to_string(max_macro_depth));
    json scope = json::object();
    std::vector<bool> bound(m.targets.size(), false);
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].undefined) scope[m.targets[i]] = a[i].j;
      bound[i] = true;
    }
    for (const auto& [k, v] : e.kwargs) {
      const auto at = std::find(m.targets.begin(), m.targets.end(), k);
      if (at == m.targets.end()) return fail("macro '" + m.text + "' has no parameter '" + k + "'");
      const size_t i = static_cast<size_t>(at - m.targets.begin());
      if (bound[i]) return fail("macro '" + m.text + "' got parameter '" + k + "' twice");
      auto x = eval(*v);
      if (!x) return x;
      if (!x->undefined) scope[k] = x->j;
      bound[i] = true;
    }
    // The body sees the top level (scope 0: the context and the top level's assignments) and
    // the scopes from its own up: the caller's between stay hidden, uncopied.
    const size_t saved_floor = floor_;
    floor_ = scopes_.size();
    scopes_.push_back(std::move(scope));
    status s = ok_status();
    for (size_t i = 0; i < m.targets.size() && s; ++i) {
      if (bound[i] || !m.defaults[i]) continue;
      auto d = eval(*m.defaults[i]);
      if (!d) {
        s = d.take_error();
      } else if (!d->undefined) {
        scopes_.back()[m.targets[i]] = d->j;
      }
    }
    std::string out;
    ++macro_depth_;
    if (s) s = run(m.body, out);
    --macro_depth_;
    scopes_.resize(floor_);
    floor_ = saved_floor;
    LLMESH_TRY(s);
    return value{json(std::move(out))};
  }

  result<value> call(const expr& e) {
    auto args = eval_args(e);
    if (!args) return args.take_error();
    auto& a = *args;
    if (e.a->type == expr::kind::name) {
      const std::string& f = e.a->text;
      if (auto m = macros_.find(f); m != macros_.end() && lookup(f).undefined) return call_macro(*m->second, e, a);
      if (f == "raise_exception") return fail(a.empty() ? "raise_exception" : to_str(a[0]));
      if (f == "namespace") {
        json ns = json::object();
        for (const auto& [k, v] : e.kwargs) {
          auto x = eval(*v);
          if (!x) return x;
          ns[k] = x->j;
        }
        return value{ns};
      }
      if (f == "range") {
        if (a.empty() || a.size() > 3) return fail("range takes 1 to 3 arguments");
        int64_t start = a.size() > 1 ? a[0].j.get<int64_t>() : 0, stop = a.size() > 1 ? a[1].j.get<int64_t>() : a[0].j.get<int64_t>();
        int64_t step = a.size() > 2 ? a[2].j.get<int64_t>() : 1;
        if (step == 0) return fail("range step cannot be zero");
        json out = json::array();
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(i);
        return value{out};
      }
      if (f == "strftime_now") {
        std::time_t now = std::time(nullptr);
        char buf[128];
        std::tm local{};
        localtime_r(&now, &local);  // renders run on many threads at once
        if (std::strftime(buf, sizeof buf, a.empty() ? "%Y-%m-%d" : to_str(a[0]).c_str(), &local) == 0) buf[0] = '\0';
        return value{json(std::string(buf))};
      }
      return unsupported("function '" + f + "'");
    }
    if (e.a->type == expr::kind::attr) return method(e, a);
    return unsupported("call expression");
  }

  result<value> method(const expr& e, std::vector<value>& a) {
    auto objr = eval(*e.a->a);
    if (!objr) return objr;
    const json& o = objr->j;
    const std::string& m = e.a->text;
    if (o.is_string()) {
      const std::string s = o.get<std::string>();
      std::string arg0 = a.empty() ? "" : to_str(a[0]);
      if (m == "strip") return value{json(strip_chars(s, arg0, true, true))};
      if (m == "lstrip") return value{json(strip_chars(s, arg0, true, false))};
      if (m == "rstrip") return value{json(strip_chars(s, arg0, false, true))};
      if (m == "startswith") return value{json(s.rfind(arg0, 0) == 0)};
      if (m == "endswith") return value{json(s.size() >= arg0.size() && s.compare(s.size() - arg0.size(), arg0.size(), arg0) == 0)};
      if (m == "upper" || m == "lower") return value{json(change_case(s, m == "upper"))};
      if (m == "split") {
        json out = json::array();
        for (auto& part : split(s, a.empty() ? nullptr : &arg0)) out.push_back(part);
        return value{out};
      }
      if (m == "replace" && a.size() >= 2) return value{json(replace_all(s, arg0, to_str(a[1])))};
    }
    if (o.is_object()) {
      if (m == "items") {
        json out = json::array();
        for (const auto& [k, v] : o.items()) out.push_back(json::array({k, v}));
        return value{out};
      }
      if (m == "keys" || m == "values") {
        json out = json::array();
        for (const auto& [k, v] : o.items()) out.push_back(m == "keys" ? json(k) : v);
        return value{out};
      }
      if (m == "get") {
        std::string k = a.empty() ? "" : to_str(a[0]);
        if (o.contains(k)) return value{o[k]};
        return a.size() > 1 ? a[1] : value{json(nullptr)};
      }
    }
    return unsupported("method '" + m + "'");
  }

  result<value> filter(const expr& e) {
    auto vr = eval(*e.a);
    if (!vr) return vr;
    auto args = eval_args(e);
    if (!args) return args.take_error();
    const value& v = *vr;
    const json& j = v.j;
    const std::string& f = e.text;
    if (f == "trim") return value{json(strip_chars(to_str(v), "", true, true))};
    if (f == "upper" || f == "lower") return value{json(change_case(to_str(v), f == "upper"))};
    if (f == "capitalize") {
      std::string r = to_str(v);
      for (size_t i = 0; i < r.size(); ++i) r[i] = static_cast<char>(i == 0 ? std::toupper(static_cast<unsigned char>(r[i])) : std::tolower(static_cast<unsigned char>(r[i])));
      return value{json(r)};
    }
    if (f == "length" || f == "count") {
      if (j.is_string()) {  // Python's len: code points, not UTF-8 bytes
        const auto& s = j.get_ref<const std::string&>();
        return value{json(static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; })))};
      }
      if (j.is_array() || j.is_object()) return value{json(j.size())};
      return value{json(0)};
    }
    if (f == "string") return value{json(to_str(v))};
    if (f == "int") return value{json(j.is_number() ? static_cast<int64_t>(j.get<double>()) : static_cast<int64_t>(std::atoll(to_str(v).c_str())))};
    if (f == "float") return value{json(j.is_number() ? j.get<double>() : std::atof(to_str(v).c_str()))};
    if (f == "abs" && j.is_number()) return value{j.is_number_integer() ? json(std::llabs(j.get<int64_t>())) : json(std::fabs(j.get<double>()))};
    if (f == "first" || f == "last") {
      if (j.is_array() && !j.empty()) return value{f == "first" ? j.front() : j.back()};
      if (j.is_string() && !j.get<std::string>().empty()) {
        const std::string s = j.get<std::string>();
        return value{json(f == "first" ? s.substr(0, 1) : s.substr(s.size() - 1))};
      }
      return value{json(), true};
    }
    if (f == "join") {
      std::string sep = args->empty() ? "" : to_str((*args)[0]), out;
      if (j.is_array()) {
        for (size_t i = 0; i < j.size(); ++i) out += (i ? sep : "") + to_str(value{j[i]});
      }
      return value{json(out)};
    }
    if (f == "default" || f == "d") {
      bool use_default = v.undefined || (args->size() > 1 && truthy((*args)[1]) && !truthy(v));
      if (use_default) return args->empty() ? value{json("")} : (*args)[0];
      return v;
    }
    if (f == "items" && j.is_object()) {
      json out = json::array();
      for (const auto& [k, x] : j.items()) out.push_back(json::array({k, x}));
      return value{out};
    }
    if (f == "list") {
      if (j.is_array()) return v;
      json out = json::array();
      if (j.is_object()) for (const auto& [k, x] : j.items()) out.push_back(k);
      return value{out};
    }
    if (f == "reverse") {
      if (j.is_array()) {
        json out = json::array();
        for (auto it = j.rbegin(); it != j.rend(); ++it) out.push_back(*it);
        return value{out};
      }
      std::string s = to_str(v);
      return value{json(std::string(s.rbegin(), s.rend()))};
    }
    if (f == "replace" && args->size() >= 2) return value{json(replace_all(to_str(v), to_str((*args)[0]), to_str((*args)[1])))};
    if (f == "tojson") {
      int indent = -1;
      for (const auto& [k, x] : e.kwargs) {
        if (k != "indent") continue;
        auto iv = eval(*x);
        if (!iv) return iv;
        if (iv->j.is_number_integer()) indent = static_cast<int>(iv->j.get<int64_t>());
      }
      if (!args->empty() && (*args)[0].j.is_number_integer()) indent = static_cast<int>((*args)[0].j.get<int64_t>());
      return value{json(to_json(j, indent))};
    }
    if (f == "safe" || f == "e" || f == "escape") {
      if (f == "safe") return v;
      return unsupported("filter '" + f + "'");
    }
    return unsupported("filter '" + f + "'");
  }

  result<value> test(const expr& e) {
    auto vr = eval(*e.a);
    if (!vr) return vr;
    auto args = eval_args(e);
    if (!args) return args.take_error();
    const value& v = *vr;
    const json& j = v.j;
    const std::string& t = e.text;
    bool r;
    if (t == "defined") r = !v.undefined;
    else if (t == "undefined") r = v.undefined;
    else if (t == "none") r = !v.undefined && j.is_null();
    else if (t == "string") r = !v.undefined && j.is_string();
    else if (t == "number") r = !v.undefined && j.is_number() && !j.is_boolean();
    else if (t == "integer") r = !v.undefined && j.is_number_integer();
    else if (t == "float") r = !v.undefined && j.is_number_float();
    else if (t == "boolean") r = !v.undefined && j.is_boolean();
    else if (t == "true") r = j.is_boolean() && j.get<bool>();
    else if (t == "false") r = j.is_boolean() && !j.get<bool>();
    else if (t == "mapping") r = !v.undefined && j.is_object();
    else if (t == "sequence" || t == "iterable") r = !v.undefined && (j.is_array() || j.is_string() || (t == "iterable" && j.is_object()));
    else if (t == "even" || t == "odd") r = j.is_number_integer() && (j.get<int64_t>() % 2 == 0) == (t == "even");
    else if ((t == "equalto" || t == "eq" || t == "sameas") && !args->empty()) r = j == (*args)[0].j;
    else return unsupported("test '" + t + "'");
    return value{json(e.negate ? !r : r)};
  }

  result<value> binary(const expr& e) {
    const std::string& op = e.text;
    auto lr = eval(*e.a);
    if (!lr) return lr;
    if (op == "and") return truthy(*lr) ? eval(*e.b) : lr;
    if (op == "or") return truthy(*lr) ? lr : eval(*e.b);
    auto rr = eval(*e.b);
    if (!rr) return rr;
    const json& l = lr->j;
    const json& r = rr->j;
    if (op == "~") return value{json(to_str(*lr) + to_str(*rr))};
    if (op == "==") return value{json(!lr->undefined && !rr->undefined ? l == r : lr->undefined == rr->undefined)};
    if (op == "!=") return value{json(!(!lr->undefined && !rr->undefined ? l == r : lr->undefined == rr->undefined))};
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r.is_string()) found = r.get<std::string>().find(to_str(*lr)) != std::string::npos;
      else if (r.is_array()) found = std::find(r.begin(), r.end(), l) != r.end();
      else if (r.is_object()) found = l.is_string() && r.contains(l.get<std::string>());
      return value{json(op == "in" ? found : !found)};
    }
    if (op == "+" && l.is_string() && r.is_string()) return value{json(l.get<std::string>() + r.get<std::string>())};
    if (op == "+" && l.is_array() && r.is_array()) {
      json out = l;
      for (const auto& x : r) out.push_back(x);
      return value{out};
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      if (!((l.is_number() && r.is_number()) || (l.is_string() && r.is_string()))) return fail("cannot compare " + to_str(*lr) + " " + op + " " + to_str(*rr));
      bool res = op == "<" ? l < r : op == ">" ? r < l : op == "<=" ? !(r < l) : !(l < r);
      return value{json(res)};
    }
    if (!l.is_number() || !r.is_number() || l.is_boolean() || r.is_boolean()) {
      return fail("unsupported operands for '" + op + "': " + py_repr(l) + " and " + py_repr(r));
    }
    const bool ints = l.is_number_integer() && r.is_number_integer();
    if (ints && op != "/" && op != "**") {
      int64_t x = l.get<int64_t>(), y = r.get<int64_t>();
      if ((op == "//" || op == "%") && y == 0) return fail("division by zero");
      if (op == "+") return value{json(x + y)};
      if (op == "-") return value{json(x - y)};
      if (op == "*") return value{json(x * y)};
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;  // Python floors
      if (op == "//") return value{json(q)};
      return value{json(x - q * y)};
    }
    double x = l.get<double>(), y = r.get<double>();
    if (op == "+") return value{json(x + y)};
    if (op == "-") return value{json(x - y)};
    if (op == "*") return value{json(x * y)};
    if (op == "**") return ints && y >= 0 ? value{json(static_cast<int64_t>(std::llround(std::pow(x, y))))} : value{json(std::pow(x, y))};
    if (y == 0) return fail("division by zero");
    if (op == "/") return value{json(x / y)};
    if (op == "//") return value{json(std::floor(x / y))};
    return value{json(x - std::floor(x / y) * y)};
  }

  std::vector<json> scopes_;
  std::map<std::string, const node*> macros_;
  size_t floor_ = 0;  ///< in a macro's body: its scope's index (scopes 1 .. floor_ − 1 are its callers')
  static constexpr int max_macro_depth = 64;  ///< a recursive macro (a schema's nested types) deeper than this is refused
  int macro_depth_ = 0;
};

}  // namespace

result<std::string> render(const node_list& nodes, const json& context) {
  evaluator ev(context);
  std::string out;
  LLMESH_TRY(ev.run(nodes, out));
  return out;
}

}  // namespace llmesh::model::jinja
