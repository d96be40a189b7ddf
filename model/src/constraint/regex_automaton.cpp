// The back half of the regex compiler (regex_ast.hpp): a pattern's tree becomes a Thompson NFA
// over bytes (code-point classes become their UTF-8 byte sequences, or their canonical JSON
// string forms, with shared suffix states), a DFA by subset construction, and one right-linear
// rule per live DFA state: state ::= [bytes] next-state | ... | "" (when accepting). A DFA keeps
// the matcher on one stack however ambiguous the pattern; the price is states, so the NFA, the
// DFA and the subset work are bounded and a pattern past them is refused as too complex.
#include <map>
#include <tuple>
#include <unordered_map>

#include "regex_ast.hpp"

namespace llmesh::model::constraint_detail {

namespace {

using node = regex_node;

/// Why these bounds: `.{0,1000}` takes ~8000 DFA states; an exponential pattern such as
/// (a|b)*a(a|b){20} hits max_dfa_states quickly and is refused instead of stalling a request.
constexpr size_t max_nfa_states = 100000;
constexpr size_t max_dfa_states = 10000;
/// Sum of the sizes of the NFA-state sets and edge lists the subset construction goes through:
/// bounds its time (about a second at this bound) where the states alone would not, e.g. for
/// (a?){5000}, whose every DFA state holds thousands of NFA states.
constexpr size_t max_subset_work = 2000000;

// ---- NFA ----------------------------------------------------------------------------------

class nfa {
 public:
  struct edge {
    uint8_t lo, hi;
    uint32_t to;
  };

  explicit nfa(regex_mode mode) : mode_(mode) {}

  uint32_t add_state() {
    if (edges_.size() >= max_nfa_states) {
      over_ = true;
      return 0;
    }
    edges_.emplace_back();
    eps_.emplace_back();
    return static_cast<uint32_t>(edges_.size() - 1);
  }
  bool over() const { return over_; }
  size_t size() const { return edges_.size(); }
  const std::vector<edge>& edges(uint32_t s) const { return edges_[s]; }
  const std::vector<uint32_t>& eps(uint32_t s) const { return eps_[s]; }

  /// Paths from `from` to `to` spelling the strings of n.
  void build(const node& n, uint32_t from, uint32_t to) {
    if (over_) return;
    switch (n.type) {
      case node::kind::set:
        add_set(n.set, from, to);
        return;
      case node::kind::alt:
        for (const auto& k : n.kids) build(k, from, to);
        return;
      case node::kind::concat: {
        if (n.kids.empty()) {
          eps_[from].push_back(to);
          return;
        }
        uint32_t cur = from;
        for (size_t i = 0; i < n.kids.size() && !over_; ++i) {
          const uint32_t next = i + 1 == n.kids.size() ? to : add_state();
          build(n.kids[i], cur, next);
          cur = next;
        }
        return;
      }
      case node::kind::repeat:
        build_repeat(n.kids[0], n.min, n.max, from, to);
        return;
    }
  }

 private:
  void build_repeat(const node& x, int min, int max, uint32_t from, uint32_t to) {
    uint32_t cur = from;
    for (int i = 0; i < min && !over_; ++i) {
      const uint32_t next = i + 1 == min && max == min ? to : add_state();
      build(x, cur, next);
      cur = next;
    }
    if (over_) return;
    if (max == min) {
      if (min == 0) eps_[from].push_back(to);
      return;
    }
    if (max < 0) {
      // A fresh loop state: only x's paths come back to it.
      const uint32_t loop = add_state();
      if (over_) return;
      eps_[cur].push_back(loop);
      build(x, loop, loop);
      eps_[loop].push_back(to);
      return;
    }
    for (int i = min; i < max && !over_; ++i) {
      eps_[cur].push_back(to);
      const uint32_t next = i + 1 == max ? to : add_state();
      build(x, cur, next);
      cur = next;
    }
  }

  void add_set(const code_point_set& s, uint32_t from, uint32_t to) {
    std::vector<std::vector<byte_range>> seqs;
    if (mode_ == regex_mode::whole) {
      for (const auto& [lo, hi] : s.ranges()) utf8_sequences(lo, hi, seqs);
    } else {
      // Inside a JSON string: raw UTF-8 for what may stand raw, the canonical escape otherwise.
      for (auto [lo, hi] : s.ranges()) {
        for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x5C); ++c) {
          if (c < 0x20 || c == '"' || c == '\\') seqs.push_back(escape_path(c));
        }
        const std::pair<uint32_t, uint32_t> raw[] = {
            {0x20, 0x21}, {0x23, 0x5B}, {0x5D, code_point_set::max_code_point}};
        for (auto [rlo, rhi] : raw) utf8_sequences(std::max(lo, rlo), std::min(hi, rhi), seqs);
      }
    }
    for (const auto& seq : seqs) add_path(seq, from, to);
  }

  static std::vector<byte_range> escape_path(uint32_t c) {
    std::string e;
    switch (c) {
      case '"': e = "\\\""; break;
      case '\\': e = "\\\\"; break;
      case '\b': e = "\\b"; break;
      case '\f': e = "\\f"; break;
      case '\n': e = "\\n"; break;
      case '\r': e = "\\r"; break;
      case '\t': e = "\\t"; break;
      default: {
        static const char* hex = "0123456789abcdef";
        e = std::string("\\u00") + hex[c >> 4] + hex[c & 15];
      }
    }
    std::vector<byte_range> path;
    for (char ch : e) path.push_back({static_cast<uint8_t>(ch), static_cast<uint8_t>(ch)});
    return path;
  }

  /// from --seq--> to, sharing suffix states: a state with a single edge (range, target) is made
  /// once, so the continuation bytes of every UTF-8 class lead through the same few states.
  void add_path(const std::vector<byte_range>& seq, uint32_t from, uint32_t to) {
    uint32_t target = to;
    for (size_t i = seq.size() - 1; i >= 1; --i) {
      const auto key = std::make_tuple(seq[i].lo, seq[i].hi, target);
      auto it = suffix_.find(key);
      if (it == suffix_.end()) {
        const uint32_t s = add_state();
        if (over_) return;
        edges_[s].push_back({seq[i].lo, seq[i].hi, target});
        it = suffix_.emplace(key, s).first;
      }
      target = it->second;
    }
    edges_[from].push_back({seq[0].lo, seq[0].hi, target});
  }

  regex_mode mode_;
  std::vector<std::vector<edge>> edges_;
  std::vector<std::vector<uint32_t>> eps_;
  std::map<std::tuple<uint8_t, uint8_t, uint32_t>, uint32_t> suffix_;
  bool over_ = false;
};

// ---- DFA ----------------------------------------------------------------------------------

struct dfa {
  struct transition {
    uint8_t lo, hi;
    uint32_t to;
  };
  std::vector<std::vector<transition>> out;
  std::vector<bool> accepting;
};

class subset_builder {
 public:
  subset_builder(const nfa& n, uint32_t accept, size_t spent)
      : n_(n), accept_(accept), work_(spent), mark_(n.size(), 0), count_(n.size(), 0) {}
  size_t work() const { return work_; }

  result<dfa> run(uint32_t start) {
    intern(closure({start}));
    for (size_t d = 0; d < sets_.size(); ++d) {
      if (sets_.size() > max_dfa_states || work_ > max_subset_work) break;
      step(d);
    }
    if (sets_.size() > max_dfa_states || work_ > max_subset_work) {
      return invalid("regex: the pattern is too complex (its DFA would pass " + std::to_string(max_dfa_states) +
                     " states, or its construction a work bound)");
    }
    return std::move(dfa_);
  }

 private:
  std::vector<uint32_t> closure(std::vector<uint32_t> todo) {
    ++stamp_;
    std::vector<uint32_t> out;
    for (uint32_t s : todo) mark_[s] = stamp_;
    while (!todo.empty()) {
      const uint32_t s = todo.back();
      todo.pop_back();
      out.push_back(s);
      for (uint32_t t : n_.eps(s)) {
        if (mark_[t] != stamp_) {
          mark_[t] = stamp_;
          todo.push_back(t);
        }
      }
    }
    std::sort(out.begin(), out.end());
    work_ += out.size();
    return out;
  }

  uint32_t intern(std::vector<uint32_t> set) {
    auto it = ids_.find(set);
    if (it != ids_.end()) return it->second;
    const auto id = static_cast<uint32_t>(sets_.size());
    dfa_.accepting.push_back(std::binary_search(set.begin(), set.end(), accept_));
    dfa_.out.emplace_back();
    ids_.emplace(set, id);
    sets_.push_back(std::move(set));
    return id;
  }

  /// The transitions of DFA state d: a sweep over the byte boundaries of its members' edges.
  void step(size_t d) {
    std::vector<std::tuple<int, int, uint32_t>> events;  // (byte, +1 / -1, NFA target)
    for (uint32_t s : sets_[d]) {
      for (const auto& e : n_.edges(s)) {
        events.push_back({e.lo, 1, e.to});
        events.push_back({e.hi + 1, -1, e.to});
      }
    }
    work_ += events.size();
    std::sort(events.begin(), events.end());
    // count_[t]: how many of the edges covering the current byte lead to t; touched: every t
    // whose count went up in this step (filtered by count when a set is read off).
    std::vector<uint32_t> touched;
    size_t active = 0;
    for (size_t i = 0; i < events.size();) {
      const int at = std::get<0>(events[i]);
      for (; i < events.size() && std::get<0>(events[i]) == at; ++i) {
        const auto [byte, delta, t] = events[i];
        if (delta > 0 && count_[t]++ == 0) {
          ++active;
          touched.push_back(t);
        } else if (delta < 0 && --count_[t] == 0) {
          --active;
        }
      }
      if (active == 0 || i == events.size()) continue;
      const int until = std::get<0>(events[i]) - 1;
      std::vector<uint32_t> targets;
      for (uint32_t t : touched) {
        if (count_[t] > 0) targets.push_back(t);
      }
      std::sort(targets.begin(), targets.end());
      targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
      work_ += touched.size();
      const uint32_t to = intern(closure(std::move(targets)));
      auto& out = dfa_.out[d];
      if (!out.empty() && out.back().to == to && out.back().hi + 1 == at) {
        out.back().hi = static_cast<uint8_t>(until);
      } else {
        out.push_back({static_cast<uint8_t>(at), static_cast<uint8_t>(until), to});
      }
      if (sets_.size() > max_dfa_states || work_ > max_subset_work) break;
    }
    for (uint32_t t : touched) count_[t] = 0;
  }

  struct set_hash {
    size_t operator()(const std::vector<uint32_t>& v) const {
      uint64_t h = 1469598103934665603ULL;  // FNV-1a
      for (uint32_t x : v) h = (h ^ x) * 1099511628211ULL;
      return static_cast<size_t>(h);
    }
  };

  const nfa& n_;
  uint32_t accept_;
  size_t work_ = 0;  ///< from the spec's work so far (spec_budget)
  std::vector<uint32_t> mark_;
  uint32_t stamp_ = 0;
  std::vector<int> count_;
  std::unordered_map<std::vector<uint32_t>, uint32_t, set_hash> ids_;
  std::vector<std::vector<uint32_t>> sets_;
  dfa dfa_;
};

/// One rule per DFA state that can still reach an accepting one; returns the start's rule.
result<rule_id> emit_rules(grammar_builder& b, const dfa& a, const std::string& name) {
  const size_t n = a.out.size();
  std::vector<std::vector<uint32_t>> in(n);
  for (size_t s = 0; s < n; ++s) {
    for (const auto& t : a.out[s]) in[t.to].push_back(static_cast<uint32_t>(s));
  }
  std::vector<bool> live(n, false);
  std::vector<uint32_t> todo;
  for (size_t s = 0; s < n; ++s) {
    if (a.accepting[s]) live[s] = true, todo.push_back(static_cast<uint32_t>(s));
  }
  while (!todo.empty()) {
    const uint32_t s = todo.back();
    todo.pop_back();
    for (uint32_t p : in[s]) {
      if (!live[p]) live[p] = true, todo.push_back(p);
    }
  }
  if (!live[0]) return invalid("regex: the pattern matches no string");
  std::vector<rule_id> rule(n, 0);
  std::vector<bool> has_out(n, false);
  for (size_t s = 0; s < n; ++s) {
    if (!live[s]) continue;
    rule[s] = b.declare(name + "-" + std::to_string(s));
    for (const auto& t : a.out[s]) has_out[s] = has_out[s] || live[t.to];
  }
  for (size_t s = 0; s < n; ++s) {
    if (!live[s]) continue;
    std::map<uint32_t, byte_set> by_target;
    for (const auto& t : a.out[s]) {
      if (live[t.to]) by_target[t.to].add_range(t.lo, t.hi);
    }
    std::vector<sequence> alts;
    if (a.accepting[s]) alts.push_back({});
    for (const auto& [t, set] : by_target) {
      // A target that can only end the match needs no rule of its own.
      if (has_out[t]) {
        alts.push_back({grammar_builder::bytes(set), grammar_builder::ref(rule[t])});
      } else {
        alts.push_back({grammar_builder::bytes(set)});
      }
    }
    b.define(rule[s], std::move(alts));
  }
  return rule[0];
}

}  // namespace

result<rule_id> automaton_rules(grammar_builder& b, const regex_node& top, regex_mode mode, const std::string& name) {
  nfa n(mode);
  const uint32_t start = n.add_state(), accept = n.add_state();
  n.build(top, start, accept);
  if (n.over()) {
    return invalid("regex: the pattern is too complex (its automaton passes " + std::to_string(max_nfa_states) +
                   " NFA states)");
  }
  size_t* spent = spec_budget::spent();
  subset_builder sb(n, accept, spent ? *spent : 0);
  auto d = sb.run(start);
  if (spent) *spent = sb.work();
  if (!d.ok()) return d.take_error();
  if (b.rule_count() + d.value().out.size() > max_rules) return invalid("regex: the grammar would be too large");
  return emit_rules(b, d.value(), name);
}

}  // namespace llmesh::model::constraint_detail
