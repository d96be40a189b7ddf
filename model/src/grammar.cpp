// grammar_builder and grammar_matcher (grammar.hpp).
#include "llmesh/model/grammar.hpp"

#include <algorithm>
#include <map>

namespace llmesh::model {

// ---- builder ----------------------------------------------------------------------------

grammar_builder::rule_id grammar_builder::declare(std::string name) {
  rules_.push_back({std::move(name), {}, false});
  return static_cast<rule_id>(rules_.size() - 1);
}

void grammar_builder::define(rule_id r, std::vector<sequence> alternatives) {
  if (r >= rules_.size()) {
    if (error_.empty()) error_ = "rule #" + std::to_string(r) + " was never declared";
    return;
  }
  if (rules_[r].defined) {
    if (error_.empty()) error_ = "rule '" + rules_[r].name + "' is defined twice";
    return;
  }
  size_t n = alternatives.size();
  for (const auto& alt : alternatives) n += alt.size();
  if (elements_ + n > max_elements) {
    if (error_.empty()) error_ = "more than " + std::to_string(max_elements) + " elements: the grammar is too large";
    rules_[r].defined = true;  // no "never defined" error on top
    return;
  }
  elements_ += n;
  rules_[r].alternatives = std::move(alternatives);
  rules_[r].defined = true;
}

grammar_builder::rule_id grammar_builder::add(std::string name, std::vector<sequence> alternatives) {
  const rule_id r = declare(std::move(name));
  define(r, std::move(alternatives));
  return r;
}

grammar_builder::sequence grammar_builder::literal(std::string_view s) {
  sequence out;
  out.reserve(s.size());
  for (char c : s) out.push_back(byte(static_cast<uint8_t>(c)));
  return out;
}

grammar_builder::rule_id grammar_builder::optional(std::string name, sequence x) {
  return add(std::move(name), {std::move(x), {}});
}

grammar_builder::rule_id grammar_builder::star(std::string name, sequence x) {
  const rule_id r = declare(std::move(name));
  x.push_back(ref(r));
  define(r, {std::move(x), {}});
  return r;
}

grammar_builder::rule_id grammar_builder::plus(std::string name, sequence x) {
  const rule_id rest = star(name + "-rest", x);
  x.push_back(ref(rest));
  return add(std::move(name), {std::move(x)});
}

grammar_builder::rule_id grammar_builder::repeat(std::string name, sequence x, int min, int max) {
  constexpr int limit = 100000;
  if (min >= 0 && elements_ + static_cast<size_t>(min) > max_elements) {
    if (error_.empty()) error_ = "more than " + std::to_string(max_elements) + " elements: the grammar is too large";
    return add(std::move(name), {});
  }
  if (min < 0 || (max >= 0 && max < min) || min > limit || max > limit) {
    if (error_.empty()) {
      error_ = "rule '" + name + "': repetition bounds {" + std::to_string(min) + "," + std::to_string(max) +
               "} are invalid or above " + std::to_string(limit);
    }
    return add(std::move(name), {});
  }
  // One rule for the item, so that each copy below is one element.
  const rule_id item = add(name + "-item", {std::move(x)});
  sequence seq(static_cast<size_t>(min), ref(item));
  if (max < 0) {
    seq.push_back(ref(star(name + "-more", {ref(item)})));
  } else if (max > min) {
    // up_to(k) ::= item up_to(k - 1) | empty: right-recursive, at most k more items.
    rule_id up_to = optional(name + "-upto1", {ref(item)});
    for (int k = 2; k <= max - min; ++k) up_to = optional(name + "-upto" + std::to_string(k), {ref(item), ref(up_to)});
    seq.push_back(ref(up_to));
  }
  return add(std::move(name), {std::move(seq)});
}

result<std::shared_ptr<const grammar>> grammar_builder::build(rule_id root) && {
  auto bad = [](std::string m) { return make_error(errc::invalid_request, "grammar: " + std::move(m)); };
  if (!error_.empty()) return bad(error_);
  if (root >= rules_.size()) return bad("the root rule does not exist");
  const size_t n = rules_.size();
  for (const auto& r : rules_) {
    if (!r.defined) return bad("rule '" + r.name + "' is used but never defined");
    for (const auto& alt : r.alternatives) {
      for (const auto& e : alt) {
        if (e.is_rule && e.rule >= n) return bad("rule '" + r.name + "' refers to a rule that does not exist");
        if (!e.is_rule && e.set.empty()) return bad("rule '" + r.name + "' holds an empty character set");
      }
    }
  }
  // Nullable rules (derive the empty string), by a worklist (linear in the elements): an
  // alternative of rule references only waits for each to become nullable.
  std::vector<bool> nullable(n, false);
  {
    struct alt_ref {
      size_t rule;
      size_t* waiting;
    };
    std::vector<size_t> waiting;  // per such alternative: its references not yet nullable
    size_t count = 0;
    for (const auto& r : rules_) count += r.alternatives.size();
    waiting.reserve(count);
    std::vector<std::vector<alt_ref>> users(n);  // rule -> the alternatives waiting on it
    std::vector<size_t> work;
    for (size_t i = 0; i < n; ++i) {
      for (const auto& alt : rules_[i].alternatives) {
        if (!std::all_of(alt.begin(), alt.end(), [](const element& e) { return e.is_rule; })) continue;
        waiting.push_back(alt.size());
        for (const auto& e : alt) users[e.rule].push_back({i, &waiting.back()});
        if (alt.empty() && !nullable[i]) nullable[i] = true, work.push_back(i);
      }
    }
    while (!work.empty()) {
      const size_t r = work.back();
      work.pop_back();
      for (const auto& u : users[r]) {
        if (--*u.waiting == 0 && !nullable[u.rule]) nullable[u.rule] = true, work.push_back(u.rule);
      }
    }
  }
  // Left recursion: a rule that reaches itself through leading elements that may be empty
  // would make the matcher's expansion loop. Iterative DFS over "may start with" edges.
  std::vector<std::vector<rule_id>> starts(n);
  for (size_t i = 0; i < n; ++i) {
    for (const auto& alt : rules_[i].alternatives) {
      for (const auto& e : alt) {
        if (!e.is_rule) break;
        starts[i].push_back(e.rule);
        if (!nullable[e.rule]) break;
      }
    }
  }
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
  std::vector<size_t> finished;       // post-order: a rule after every rule it may start with
  for (size_t s = 0; s < n; ++s) {
    if (color[s] != 0) continue;
    std::vector<std::pair<size_t, size_t>> path{{s, 0}};
    color[s] = 1;
    while (!path.empty()) {
      auto& [v, next] = path.back();
      if (next == starts[v].size()) {
        color[v] = 2;
        finished.push_back(v);
        path.pop_back();
        continue;
      }
      const rule_id w = starts[v][next++];
      if (color[w] == 1) return bad("rule '" + rules_[w].name + "' is left-recursive");
      if (color[w] == 0) {
        color[w] = 1;
        path.push_back({w, 0});
      }
    }
  }
  // The longest chain of leading references: how deep a matcher's expansion may recurse.
  {
    std::vector<size_t> depth(n, 1);
    for (size_t v : finished) {
      for (rule_id w : starts[v]) depth[v] = std::max(depth[v], depth[w] + 1);
      if (depth[v] > max_leading_depth) {
        return bad("rule '" + rules_[v].name + "' opens more than " + std::to_string(max_leading_depth) +
                   " rules before its first byte");
      }
    }
  }
  // Flatten.
  auto g = std::make_shared<grammar>();
  std::map<std::array<uint64_t, 4>, uint32_t> set_index;
  g->rules_.resize(n);
  g->names_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    g->names_[i] = rules_[i].name;
    for (const auto& alt : rules_[i].alternatives) {
      g->rules_[i].push_back(static_cast<uint32_t>(g->elements_.size()));
      for (const auto& e : alt) {
        if (e.is_rule) {
          g->elements_.push_back({grammar::element::kind::rule, e.rule});
          continue;
        }
        auto [it, fresh] = set_index.emplace(e.set.bits, static_cast<uint32_t>(g->sets_.size()));
        if (fresh) g->sets_.push_back(e.set);
        g->elements_.push_back({grammar::element::kind::bytes, it->second});
      }
      g->elements_.push_back({grammar::element::kind::end, 0});
    }
  }
  g->root_ = root;
  rules_.clear();
  std::shared_ptr<const grammar> out = std::move(g);
  // A grammar whose start alone holds more parse stacks than a matcher follows could never be
  // followed: refuse it here rather than truncate it there.
  if (grammar_matcher start(out); start.stacks_.size() > grammar_matcher::max_stacks) {
    return bad("more than " + std::to_string(grammar_matcher::max_stacks) +
               " ways to begin (the alternatives share prefixes: write them as a tree)");
  }
  return out;
}

// ---- matcher ----------------------------------------------------------------------------

namespace {
void sort_unique(std::vector<grammar_matcher::stack>& stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
}
}  // namespace

grammar_matcher::grammar_matcher(std::shared_ptr<const grammar> g) : g_(std::move(g)) {
  for (uint32_t start : g_->alternatives(g_->root())) expand(stack{start}, stacks_);
  sort_unique(stacks_);
}

void grammar_matcher::expand(stack s, std::vector<stack>& out) const {
  const auto elements = g_->elements();
  // Finished sequences pop back to their callers' continuations.
  while (!s.empty() && elements[s.back()].type == grammar::element::kind::end) s.pop_back();
  if (s.empty() || elements[s.back()].type == grammar::element::kind::bytes) {
    if (out.size() <= max_stacks) out.push_back(std::move(s));
    return;
  }
  // A rule: its continuation stays (unless the rule ends its sequence: a tail call keeps the
  // stack flat), then each alternative is tried from its first element.
  const uint32_t at = s.back();
  const uint32_t rule = elements[at].arg;
  s.pop_back();
  if (elements[at + 1].type != grammar::element::kind::end) s.push_back(at + 1);
  const auto alts = g_->alternatives(rule);
  for (size_t i = 0; i < alts.size() && out.size() <= max_stacks; ++i) {
    stack t = i + 1 == alts.size() ? std::move(s) : s;
    t.push_back(alts[i]);
    expand(std::move(t), out);
  }
}

std::vector<grammar_matcher::stack> grammar_matcher::advance(const std::vector<stack>& from, uint8_t b) const {
  std::vector<stack> out;
  const auto elements = g_->elements();
  for (const auto& s : from) {
    if (s.empty()) continue;
    const auto& e = elements[s.back()];
    if (!g_->set(e.arg).has(b)) continue;
    stack t = s;
    ++t.back();
    expand(std::move(t), out);
    if (out.size() > max_stacks) return {};
  }
  sort_unique(out);
  return out;
}

bool grammar_matcher::accept(uint8_t b) {
  auto next = advance(stacks_, b);
  if (next.empty()) return false;
  stacks_ = std::move(next);
  return true;
}

bool grammar_matcher::accept(std::string_view bytes) {
  std::vector<stack> cur = stacks_;
  for (char c : bytes) {
    cur = advance(cur, static_cast<uint8_t>(c));
    if (cur.empty()) return false;
  }
  stacks_ = std::move(cur);
  return true;
}

bool grammar_matcher::accepting() const { return !stacks_.empty() && stacks_.front().empty(); }

bool grammar_matcher::can_continue() const { return !stacks_.empty() && !stacks_.back().empty(); }

std::string grammar_matcher::key() const {
  std::string k;
  for (const auto& s : stacks_) {
    const auto n = static_cast<uint32_t>(s.size());
    k.append(reinterpret_cast<const char*>(&n), sizeof n);
    k.append(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(uint32_t));
  }
  return k;
}

}  // namespace llmesh::model
