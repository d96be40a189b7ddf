// Jinja subset parser: a scanner that cuts the source into text and tags (applying
// whitespace control, trim_blocks and lstrip_blocks as HF's apply_chat_template does), a
// tokenizer for tag contents, and a recursive-descent parser with Jinja's precedence.
#include "parser.hpp"

#include <cctype>

namespace llmesh::model::jinja {
namespace {

struct segment {
  enum class kind { text, output, block } type;
  std::string text;  ///< text, or the tag's inner source
};

error syntax(const std::string& msg) { return make_error(errc::invalid_request, "chat template: " + msg); }

/// Splits the source into text / {{ }} / {% %} segments; comments are dropped.
result<std::vector<segment>> scan(const std::string& s) {
  std::vector<segment> out;
  std::string text;
  bool strip_next = false, trim_newline = false;
  bool text_at_line_start = true;  // the current text began at the start of a source line
  size_t i = 0;
  auto flush_text = [&](bool rstrip, bool lstrip_block) {
    if (rstrip) {
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    } else if (lstrip_block) {  // lstrip_blocks: drop spaces/tabs between a line start and the tag
      size_t k = text.size();
      while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
      if (k == 0 ? text_at_line_start : text[k - 1] == '\n') text.resize(k);
    }
    if (!text.empty()) out.push_back({segment::kind::text, text});
    text.clear();
  };
  while (i < s.size()) {
    if (s[i] == '{' && i + 1 < s.size() && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')) {
      const char open = s[i + 1];
      const std::string close = open == '{' ? "}}" : (open == '%' ? "%}" : "#}");
      size_t start = i + 2;
      bool lstrip = start < s.size() && s[start] == '-';
      if (lstrip || (start < s.size() && s[start] == '+')) ++start;
      // Find the closing delimiter, skipping string literals inside the tag.
      size_t j = start;
      char quote = 0;
      while (j < s.size()) {
        if (quote) {
          if (s[j] == '\\') ++j;
          else if (s[j] == quote) quote = 0;
        } else if (open != '#' && (s[j] == '\'' || s[j] == '"')) {
          quote = s[j];
        } else if (s.compare(j, 2, close) == 0) {
          break;
        }
        ++j;
      }
      if (j >= s.size()) return syntax(std::string("unclosed '{") + open + "' tag");
      size_t end = j;
      bool rstrip = end > start && s[end - 1] == '-';
      if (rstrip) --end;
      if (strip_next) {  // previous tag ended with '-': left-strip this text
        size_t k = 0;
        while (k < text.size() && std::isspace(static_cast<unsigned char>(text[k]))) ++k;
        text.erase(0, k);
      }
      flush_text(lstrip, open != '{');
      std::string inner = s.substr(start, end - start);
      if (open == '{') out.push_back({segment::kind::output, inner});
      if (open == '%') out.push_back({segment::kind::block, inner});
      strip_next = rstrip;
      trim_newline = open != '{';  // trim_blocks: one newline after a block or comment tag
      i = j + 2;
      if (trim_newline && !strip_next && i < s.size() && s[i] == '\n') ++i;
      text_at_line_start = i > 0 && s[i - 1] == '\n';
      continue;
    }
    if (strip_next && std::isspace(static_cast<unsigned char>(s[i])) && text.empty()) {
      ++i;
      continue;
    }
    strip_next = false;
    text.push_back(s[i++]);
  }
  flush_text(false, false);
  return out;
}

struct token {
  enum class kind { name, string, number, op, end } type = kind::end;
  std::string text;
  json value;
};

result<std::vector<token>> lex(const std::string& s) {
  std::vector<token> out;
  size_t i = 0;
  while (i < s.size()) {
    char c = s[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({token::kind::name, s.substr(i, j - i), {}});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || (s[j] == '.' && !is_float && j + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[j + 1]))))) {
        if (s[j] == '.') is_float = true;
        ++j;
      }
      std::string t = s.substr(i, j - i);
      out.push_back({token::kind::number, t, is_float ? json(std::stod(t)) : json(std::stoll(t))});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      while (j < s.size() && s[j] != c) {
        if (s[j] == '\\' && j + 1 < s.size()) {
          char e = s[++j];
          v.push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e);
        } else {
          v.push_back(s[j]);
        }
        ++j;
      }
      if (j >= s.size()) return syntax("unterminated string literal");
      out.push_back({token::kind::string, v, json(v)});
      i = j + 1;
    } else {
      static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                  "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
      bool found = false;
      for (const char* op : ops) {
        size_t n = std::char_traits<char>::length(op);
        if (s.compare(i, n, op) == 0) {
          out.push_back({token::kind::op, op, {}});
          i += n;
          found = true;
          break;
        }
      }
      if (!found) return syntax(std::string("unexpected character '") + c + "'");
    }
  }
  out.push_back({token::kind::end, "", {}});
  return out;
}

/// Recursive descent over one tag's tokens.
class expr_parser {
 public:
  explicit expr_parser(std::vector<token> t) : t_(std::move(t)) {}

  bool at_end() const { return t_[p_].type == token::kind::end; }
  bool is_op(const char* op) const { return t_[p_].type == token::kind::op && t_[p_].text == op; }
  bool is_name(const char* n) const { return t_[p_].type == token::kind::name && t_[p_].text == n; }
  const token& peek() const { return t_[p_]; }
  const token& next() { return t_[p_ < t_.size() - 1 ? p_++ : p_]; }

  result<std::string> name() {
    if (peek().type != token::kind::name) return syntax("expected a name, found '" + peek().text + "'");
    return next().text;
  }
  status expect(const char* op) {
    if (!is_op(op)) return syntax(std::string("expected '") + op + "', found '" + peek().text + "'");
    next();
    return ok_status();
  }

  result<expr_ptr> expression() { return ternary(); }

 private:
  static expr_ptr make(expr::kind k) {
    auto e = std::make_unique<expr>();
    e->type = k;
    return e;
  }
  static expr_ptr binary(std::string op, expr_ptr a, expr_ptr b) {
    auto e = make(expr::kind::binary);
    e->text = std::move(op);
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

#define LLMESH_PARSE(var, call)       \
  auto var##_r = (call);              \
  if (!var##_r) return var##_r.take_error(); \
  expr_ptr var = std::move(var##_r.value());

  result<expr_ptr> ternary() {
    LLMESH_PARSE(value, or_expr())
    if (!is_name("if")) return value;
    next();
    LLMESH_PARSE(cond, or_expr())
    auto e = make(expr::kind::ternary);
    e->a = std::move(cond);
    e->b = std::move(value);
    if (is_name("else")) {
      next();
      LLMESH_PARSE(other, ternary())
      e->c = std::move(other);
    }
    return e;
  }
  result<expr_ptr> or_expr() {
    LLMESH_PARSE(left, and_expr())
    while (is_name("or")) {
      next();
      LLMESH_PARSE(right, and_expr())
      left = binary("or", std::move(left), std::move(right));
    }
    return left;
  }
  result<expr_ptr> and_expr() {
    LLMESH_PARSE(left, not_expr())
    while (is_name("and")) {
      next();
      LLMESH_PARSE(right, not_expr())
      left = binary("and", std::move(left), std::move(right));
    }
    return left;
  }
  result<expr_ptr> not_expr() {
    if (is_name("not")) {
      next();
      LLMESH_PARSE(inner, not_expr())
      auto e = make(expr::kind::unary);
      e->text = "not";
      e->a = std::move(inner);
      return e;
    }
    return compare();
  }
  result<expr_ptr> compare() {
    LLMESH_PARSE(left, concat())
    while (true) {
      if (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">=")) {
        std::string op = next().text;
        LLMESH_PARSE(right, concat())
        left = binary(op, std::move(left), std::move(right));
      } else if (is_name("in")) {
        next();
        LLMESH_PARSE(right, concat())
        left = binary("in", std::move(left), std::move(right));
      } else if (is_name("not") && t_[p_ + 1].type == token::kind::name && t_[p_ + 1].text == "in") {
        next();
        next();
        LLMESH_PARSE(right, concat())
        left = binary("not in", std::move(left), std::move(right));
      } else if (is_name("is")) {
        next();
        auto e = make(expr::kind::test);
        if (is_name("not")) {
          next();
          e->negate = true;
        }
        auto test_name = name();
        if (!test_name) return test_name.take_error();
        e->text = *test_name;
        e->a = std::move(left);
        if (is_op("(")) {
          LLMESH_TRY(call_args(*e));
        } else if (peek().type == token::kind::string || peek().type == token::kind::number) {
          LLMESH_PARSE(arg, primary())  // "is equalto 3", "is sameas x" without parentheses
          e->args.push_back(std::move(arg));
        }
        left = std::move(e);
      } else {
        return left;
      }
    }
  }
  result<expr_ptr> concat() {
    LLMESH_PARSE(left, additive())
    while (is_op("~")) {
      next();
      LLMESH_PARSE(right, additive())
      left = binary("~", std::move(left), std::move(right));
    }
    return left;
  }
  result<expr_ptr> additive() {
    LLMESH_PARSE(left, multiplicative())
    while (is_op("+") || is_op("-")) {
      std::string op = next().text;
      LLMESH_PARSE(right, multiplicative())
      left = binary(op, std::move(left), std::move(right));
    }
    return left;
  }
  result<expr_ptr> multiplicative() {
    LLMESH_PARSE(left, unary())
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().text;
      LLMESH_PARSE(right, unary())
      left = binary(op, std::move(left), std::move(right));
    }
    return left;
  }
  result<expr_ptr> unary() {
    if (is_op("-") || is_op("+")) {
      std::string op = next().text;
      LLMESH_PARSE(inner, unary())
      auto e = make(expr::kind::unary);
      e->text = op;
      e->a = std::move(inner);
      return e;
    }
    LLMESH_PARSE(base, filtered())
    if (is_op("**")) {
      next();
      LLMESH_PARSE(exp, unary())
      return binary("**", std::move(base), std::move(exp));
    }
    return base;
  }
  result<expr_ptr> filtered() {
    LLMESH_PARSE(value, postfix())
    while (is_op("|")) {
      next();
      auto filter_name = name();
      if (!filter_name) return filter_name.take_error();
      auto e = make(expr::kind::filter);
      e->text = *filter_name;
      e->a = std::move(value);
      if (is_op("(")) LLMESH_TRY(call_args(*e));
      value = std::move(e);
    }
    return value;
  }
  status call_args(expr& e) {
    LLMESH_TRY(expect("("));
    while (!is_op(")")) {
      if (peek().type == token::kind::name && t_[p_ + 1].type == token::kind::op && t_[p_ + 1].text == "=") {
        std::string key = next().text;
        next();
        auto v = expression();
        if (!v) return v.take_error();
        e.kwargs.emplace_back(key, std::move(v.value()));
      } else {
        auto v = expression();
        if (!v) return v.take_error();
        e.args.push_back(std::move(v.value()));
      }
      if (!is_op(",")) break;
      next();
    }
    return expect(")");
  }
  result<expr_ptr> postfix() {
    LLMESH_PARSE(value, primary())
    while (true) {
      if (is_op(".")) {
        next();
        auto attr = name();
        if (!attr) return attr.take_error();
        auto e = make(expr::kind::attr);
        e->text = *attr;
        e->a = std::move(value);
        value = std::move(e);
      } else if (is_op("[")) {
        next();
        expr_ptr parts[3];
        int n = 0;
        bool is_slice = false;
        while (true) {
          if (!is_op(":") && !is_op("]")) {
            auto v = expression();
            if (!v) return v.take_error();
            parts[n] = std::move(v.value());
          }
          if (is_op(":") && n < 2) {
            next();
            is_slice = true;
            ++n;
            continue;
          }
          break;
        }
        LLMESH_TRY(expect("]"));
        auto e = make(is_slice ? expr::kind::slice : expr::kind::index);
        e->a = std::move(value);
        e->b = std::move(parts[0]);
        e->c = std::move(parts[1]);
        e->d = std::move(parts[2]);
        if (!is_slice && !e->b) return syntax("empty subscript");
        value = std::move(e);
      } else if (is_op("(")) {
        auto e = make(expr::kind::call);
        e->a = std::move(value);
        LLMESH_TRY(call_args(*e));
        value = std::move(e);
      } else {
        return value;
      }
    }
  }
  result<expr_ptr> primary() {
    const token& t = peek();
    if (t.type == token::kind::string || t.type == token::kind::number) {
      auto e = make(expr::kind::literal);
      e->value = next().value;
      while (e->value.is_string() && peek().type == token::kind::string) e->value = e->value.get<std::string>() + next().text;
      return e;
    }
    if (t.type == token::kind::name) {
      std::string n = next().text;
      if (n == "true" || n == "True" || n == "false" || n == "False" || n == "none" || n == "None") {
        auto e = make(expr::kind::literal);
        e->value = (n == "true" || n == "True") ? json(true) : (n == "false" || n == "False") ? json(false) : json(nullptr);
        return e;
      }
      auto e = make(expr::kind::name);
      e->text = n;
      return e;
    }
    if (is_op("(")) {
      next();
      LLMESH_PARSE(inner, expression())
      LLMESH_TRY(expect(")"));
      return inner;
    }
    if (is_op("[") || is_op("{")) {
      bool is_list = is_op("[");
      next();
      auto e = make(is_list ? expr::kind::list : expr::kind::dict);
      while (!is_op(is_list ? "]" : "}")) {
        LLMESH_PARSE(item, expression())
        e->args.push_back(std::move(item));
        if (!is_list) {
          LLMESH_TRY(expect(":"));
          LLMESH_PARSE(v, expression())
          e->args.push_back(std::move(v));
        }
        if (!is_op(",")) break;
        next();
      }
      LLMESH_TRY(expect(is_list ? "]" : "}"));
      return e;
    }
    return syntax("unexpected '" + t.text + "' in an expression");
  }
#undef LLMESH_PARSE

  std::vector<token> t_;
  size_t p_ = 0;
};

/// Builds statements from segments; stops at one of `enders` (returned through `ended`).
class stmt_parser {
 public:
  explicit stmt_parser(std::vector<segment> segs) : s_(std::move(segs)) {}

  result<node_list> parse_all() {
    std::string ended;
    node_list out;
    LLMESH_TRY(block(out, {}, ended));
    if (!ended.empty()) return syntax("unexpected '" + ended + "'");
    return out;
  }

 private:
  status block(node_list& out, const std::vector<std::string>& enders, std::string& ended) {
    while (i_ < s_.size()) {
      const segment& seg = s_[i_++];
      if (seg.type == segment::kind::text) {
        auto n = std::make_unique<node>();
        n->text = seg.text;
        out.push_back(std::move(n));
        continue;
      }
      auto toks = lex(seg.text);
      if (!toks) return toks.take_error();
      expr_parser p(std::move(toks.value()));
      if (seg.type == segment::kind::output) {
        auto v = p.expression();
        if (!v) return v.take_error();
        if (!p.at_end()) return syntax("unexpected '" + p.peek().text + "' in '{{" + seg.text + "}}'");
        auto n = std::make_unique<node>();
        n->type = node::kind::output;
        n->value = std::move(v.value());
        out.push_back(std::move(n));
        continue;
      }
      auto keyword = p.name();
      if (!keyword) return syntax("empty or malformed tag '{%" + seg.text + "%}'");
      const std::string& k = *keyword;
      for (const auto& e : enders) {
        if (k == e) {
          ended = k;
          if (k == "elif") pending_ = std::make_unique<expr_parser>(std::move(p));
          return ok_status();
        }
      }
      if (k == "if") {
        LLMESH_TRY(parse_if(p, out));
      } else if (k == "for") {
        LLMESH_TRY(parse_for(p, out));
      } else if (k == "set") {
        LLMESH_TRY(parse_set(p, out));
      } else if (k == "macro") {
        LLMESH_TRY(parse_macro(p, out));
      } else if (k == "endif" || k == "endfor" || k == "else" || k == "elif" || k == "endmacro") {
        return syntax("unexpected '{% " + k + " %}'");
      } else {
        return make_error(errc::unsupported, "chat template: unsupported construct '{% " + k + " %}'");
      }
    }
    if (!enders.empty()) return syntax("missing '{% " + enders.back() + " %}'");
    return ok_status();
  }

  status parse_if(expr_parser& p, node_list& out) {
    auto n = std::make_unique<node>();
    n->type = node::kind::if_;
    auto cond = p.expression();
    if (!cond) return cond.take_error();
    expr_ptr c = std::move(cond.value());
    while (true) {
      node_list body;
      std::string ended;
      LLMESH_TRY(block(body, {"elif", "else", "endif"}, ended));
      n->branches.emplace_back(std::move(c), std::move(body));
      if (ended == "endif") break;
      if (ended == "else") {
        node_list else_body;
        LLMESH_TRY(block(else_body, {"endif"}, ended));
        n->branches.emplace_back(nullptr, std::move(else_body));
        break;
      }
      auto next_cond = pending_->expression();  // elif
      if (!next_cond) return next_cond.take_error();
      c = std::move(next_cond.value());
    }
    out.push_back(std::move(n));
    return ok_status();
  }

  status parse_for(expr_parser& p, node_list& out) {
    auto n = std::make_unique<node>();
    n->type = node::kind::for_;
    while (true) {
      auto var = p.name();
      if (!var) return var.take_error();
      n->targets.push_back(*var);
      if (!p.is_op(",")) break;
      p.next();
    }
    if (!p.is_name("in")) return syntax("expected 'in' in a for loop");
    p.next();
    auto iterable = p.expression();  // the ternary parser stops at a bare "if" filter:
    if (!iterable) return iterable.take_error();
    n->value = std::move(iterable.value());
    if (n->value->type == expr::kind::ternary && !n->value->c) {  // "for x in xs if cond"
      n->filter = std::move(n->value->a);
      n->value = std::move(n->value->b);
    }
    if (p.is_name("recursive")) return make_error(errc::unsupported, "chat template: unsupported construct 'recursive' loops");
    std::string ended;
    LLMESH_TRY(block(n->body, {"else", "endfor"}, ended));
    if (ended == "else") LLMESH_TRY(block(n->else_body, {"endfor"}, ended));
    out.push_back(std::move(n));
    return ok_status();
  }

  /// {% macro name(a, b=default, ...) %} body {% endmacro %}
  status parse_macro(expr_parser& p, node_list& out) {
    auto n = std::make_unique<node>();
    n->type = node::kind::macro;
    auto name = p.name();
    if (!name) return name.take_error();
    n->text = *name;
    if (!p.is_op("(")) return syntax("expected '(' after macro " + n->text);
    p.next();
    while (!p.is_op(")")) {
      auto param = p.name();
      if (!param) return param.take_error();
      n->targets.push_back(*param);
      expr_ptr def;
      if (p.is_op("=")) {
        p.next();
        auto v = p.expression();
        if (!v) return v.take_error();
        def = std::move(v.value());
      }
      n->defaults.push_back(std::move(def));
      if (p.is_op(",")) {
        p.next();
      } else if (!p.is_op(")")) {
        return syntax("expected ',' or ')' in macro " + n->text + "'s parameters");
      }
    }
    p.next();
    if (!p.at_end()) return syntax("unexpected '" + p.peek().text + "' after macro " + n->text + "'s parameters");
    std::string ended;
    LLMESH_TRY(block(n->body, {"endmacro"}, ended));
    out.push_back(std::move(n));
    return ok_status();
  }

  status parse_set(expr_parser& p, node_list& out) {
    auto n = std::make_unique<node>();
    n->type = node::kind::set;
    auto target = p.name();
    if (!target) return target.take_error();
    std::string t = *target;
    if (p.is_op(".")) {
      p.next();
      auto attr = p.name();
      if (!attr) return attr.take_error();
      t += "." + *attr;
    }
    n->targets.push_back(t);
    if (!p.is_op("=")) return make_error(errc::unsupported, "chat template: unsupported construct 'set' block");
    p.next();
    auto v = p.expression();
    if (!v) return v.take_error();
    n->value = std::move(v.value());
    out.push_back(std::move(n));
    return ok_status();
  }

  std::vector<segment> s_;
  size_t i_ = 0;
  std::unique_ptr<expr_parser> pending_;
};

}  // namespace

result<node_list> parse(const std::string& source) {
  auto segs = scan(source);
  if (!segs) return segs.take_error();
  return stmt_parser(std::move(segs.value())).parse_all();
}

}  // namespace llmesh::model::jinja
