// tokenizer/jinja_parser.cpp — the Jinja parser: tokens to statements and expression trees, with
// jinja2's grammar and operator precedence (condexpr < or < and < not < compare < + - < ~ <
// * / // % < ** < unary < postfix/filters/tests) and bounded nesting.
#include <algorithm>

#include "core/error.h"
#include "tokenizer/jinja_ast.h"

namespace fp::jinja {
namespace {

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& name) : toks_(tokens), name_(name) {}

  Body parse_template() {
    Body body;
    const std::string end = subparse(body, {});
    if (!end.empty()) fail_at(cur(), "encountered unknown tag '" + end + "'");
    return body;
  }

 private:
  const std::vector<Token>& toks_;
  const std::string& name_;
  size_t pos_ = 0;
  int nesting_ = 0;                 // expression recursion (parentheses, unary chains)
  int block_depth_ = 0;             // open block statements
  std::vector<std::string> open_;   // open block tags, innermost last (for messages)
  int loop_depth_ = 0;              // open for loops (break/continue need one)

  struct Guard {
    int& n;
    Guard(Parser& p, int& counter, int limit, const Token& at) : n(counter) {
      if (++n > limit) p.fail_at(at, "template nested too deeply (more than " + std::to_string(limit) + " levels)");
    }
    ~Guard() { --n; }
  };

  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[pos_];
    if (pos_ + 1 < toks_.size()) ++pos_;
    return t;
  }

  [[noreturn]] void fail_at(const Token& t, const std::string& what) const {
    fail(name_, ":", t.line, ":", t.col, ": ", what);
  }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Token::Data: return "template data";
      case Token::VarBegin: return "begin of print statement";
      case Token::VarEnd: return "end of print statement";
      case Token::BlockBegin: return "begin of statement block";
      case Token::BlockEnd: return "end of statement block";
      case Token::Name: return "name '" + t.text + "'";
      case Token::String: return "string";
      case Token::Int: return "integer";
      case Token::Float: return "float";
      case Token::Op: return "'" + t.text + "'";
      case Token::Eof: return "end of template";
    }
    return "?";
  }

  bool is_op(const char* op) const { return cur().kind == Token::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().kind == Token::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail_at(cur(), std::string("expected '") + op + "', got " + describe(cur()));
  }
  const Token& expect_kind(Token::Kind k, const char* what) {
    if (cur().kind != k) fail_at(cur(), std::string("expected ") + what + ", got " + describe(cur()));
    return next();
  }
  std::string expect_name() { return expect_kind(Token::Name, "a name").text; }
  void expect_block_end() { expect_kind(Token::BlockEnd, "end of statement block"); }

  ExprPtr make(Expr::Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->col = at.col;
    return e;
  }
  // Computes the subtree height once the children are in place; rejects overly deep trees.
  ExprPtr seal(ExprPtr e) {
    int d = 0;
    for (const auto& a : e->args)
      if (a) d = std::max(d, a->depth);
    for (const auto& kv : e->kwargs) d = std::max(d, kv.second->depth);
    e->depth = d + 1;
    if (e->depth > kMaxExprDepth)
      fail(name_, ":", e->line, ":", e->col, ": expression nested too deeply (more than ", kMaxExprDepth, " levels)");
    return e;
  }

  // ---- statements ----

  // Parses until a block tag named in `ends` (returned, positioned on the name) or the end.
  std::string subparse(Body& body, const std::vector<std::string>& ends) {
    for (;;) {
      const Token& t = cur();
      switch (t.kind) {
        case Token::Eof: return {};
        case Token::Data: {
          auto s = std::make_unique<Stmt>();
          s->kind = Stmt::Text;
          s->line = t.line;
          s->col = t.col;
          s->text = t.text;
          body.push_back(std::move(s));
          next();
          break;
        }
        case Token::VarBegin: {
          next();
          auto s = std::make_unique<Stmt>();
          s->kind = Stmt::Output;
          s->line = t.line;
          s->col = t.col;
          s->expr = parse_tuple(true, false, {});
          expect_kind(Token::VarEnd, "end of print statement");
          body.push_back(std::move(s));
          break;
        }
        case Token::BlockBegin: {
          next();
          if (cur().kind != Token::Name) fail_at(cur(), "tag name expected");
          if (std::find(ends.begin(), ends.end(), cur().text) != ends.end()) return cur().text;
          if (auto s = statement()) body.push_back(std::move(s));
          break;
        }
        default: fail_at(t, "unexpected " + describe(t));
      }
    }
  }

  // Parses a body up to one of `ends`; leaves the end tag's name consumed and returns it.
  std::string body_until(Body& body, const std::vector<std::string>& ends, const Token& opener) {
    Guard g(*this, block_depth_, kMaxBlockDepth, opener);
    const std::string end = subparse(body, ends);
    if (end.empty()) {
      std::string want;
      for (const auto& e : ends) want += (want.empty() ? "'" : " or '") + e + "'";
      fail_at(cur(), "unexpected end of template; looking for " + want + " to close '" + open_.back() + "' (line " +
                         std::to_string(opener.line) + ")");
    }
    next();
    return end;
  }

  std::unique_ptr<Stmt> new_stmt(Stmt::Kind kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = at.line;
    s->col = at.col;
    return s;
  }

  std::unique_ptr<Stmt> statement() {
    const Token& t = cur();
    const std::string tag = t.text;
    open_.push_back(tag);
    std::unique_ptr<Stmt> s;
    if (tag == "for") s = parse_for();
    else if (tag == "if") s = parse_if();
    else if (tag == "set") s = parse_set();
    else if (tag == "macro") s = parse_macro();
    else if (tag == "filter") s = parse_filter_block();
    else if (tag == "with") s = parse_with();
    else if (tag == "generation") s = parse_group("endgeneration");
    else if (tag == "print") {
      s = new_stmt(Stmt::Output, next());
      s->expr = parse_tuple(true, false, {});
      expect_block_end();
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail_at(t, "'" + tag + "' outside of a loop");
      s = new_stmt(tag == "break" ? Stmt::Break : Stmt::Continue, next());
      expect_block_end();
    } else {
      fail_at(t, "encountered unknown or unsupported tag '" + tag + "'");
    }
    open_.pop_back();
    return s;
  }

  // Assignment targets: a name, `ns.attr` (when allowed) or a tuple of names.
  void parse_targets(Stmt& s, bool allow_ns, const char* end_name) {
    const bool paren = skip_op("(");
    for (;;) {
      if (paren && is_op(")")) break;
      std::string n = expect_name();
      if (allow_ns && !paren && s.targets.empty() && is_op(".")) {
        next();
        s.kind = Stmt::SetAttr;
        s.targets.push_back(std::move(n));
        s.text = expect_name();
        return;
      }
      if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None")
        fail_at(cur(), "can't assign to const");
      s.targets.push_back(std::move(n));
      if (!skip_op(",")) break;
      s.unpack = true;
      if (!paren && (is_name(end_name) || is_op("=") || cur().kind == Token::BlockEnd)) break;
    }
    if (paren) {
      expect_op(")");
      s.unpack = true;
    }
  }

  std::unique_ptr<Stmt> parse_for() {
    const Token& at = next();
    auto s = new_stmt(Stmt::For, at);
    parse_targets(*s, false, "in");
    if (!skip_name("in")) fail_at(cur(), "expected 'in', got " + describe(cur()));
    s->expr = parse_tuple(false, false, {"recursive", "if"});
    if (skip_name("if")) s->cond = parse_expression(true);
    s->recursive = skip_name("recursive");
    expect_block_end();
    ++loop_depth_;
    const std::string end = body_until(s->body, {"endfor", "else"}, at);
    --loop_depth_;
    expect_block_end();
    if (end == "else") {
      body_until(s->else_body, {"endfor"}, at);
      expect_block_end();
    }
    return s;
  }

  std::unique_ptr<Stmt> parse_if() {
    const Token& at = next();
    auto s = new_stmt(Stmt::If, at);
    ExprPtr test = parse_tuple(false, false, {});
    for (;;) {
      expect_block_end();
      Body body;
      const std::string end = body_until(body, {"elif", "else", "endif"}, at);
      s->branches.emplace_back(std::move(test), std::move(body));
      if (end == "elif") {
        test = parse_tuple(false, false, {});
        continue;
      }
      if (end == "else") {
        expect_block_end();
        Body else_body;
        body_until(else_body, {"endif"}, at);
        s->branches.emplace_back(nullptr, std::move(else_body));
      }
      expect_block_end();
      return s;
    }
  }

  std::unique_ptr<Stmt> parse_set() {
    const Token& at = next();
    auto s = new_stmt(Stmt::Set, at);
    parse_targets(*s, true, "");
    if (skip_op("=")) {
      s->expr = parse_tuple(true, false, {});
      expect_block_end();
      return s;
    }
    if (s->kind == Stmt::SetAttr) fail_at(cur(), "expected '=' after a namespace attribute");
    s->kind = Stmt::SetBlock;
    parse_filter_chain(s->filters);
    expect_block_end();
    body_until(s->body, {"endset"}, at);
    expect_block_end();
    return s;
  }

  std::unique_ptr<Stmt> parse_macro() {
    const Token& at = next();
    auto s = new_stmt(Stmt::Macro, at);
    s->text = expect_name();
    expect_op("(");
    bool defaults = false;
    while (!is_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string p = expect_name();
      ExprPtr def;
      if (skip_op("=")) {
        def = parse_expression(true);
        defaults = true;
      } else if (defaults) {
        fail_at(cur(), "non-default argument follows default argument");
      }
      s->params.emplace_back(std::move(p), std::move(def));
    }
    expect_op(")");
    expect_block_end();
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    body_until(s->body, {"endmacro"}, at);
    loop_depth_ = saved_loops;
    expect_block_end();
    return s;
  }

  std::unique_ptr<Stmt> parse_filter_block() {
    const Token& at = next();
    auto s = new_stmt(Stmt::FilterBlock, at);
    parse_filter_chain(s->filters, true);
    expect_block_end();
    body_until(s->body, {"endfilter"}, at);
    expect_block_end();
    return s;
  }

  std::unique_ptr<Stmt> parse_with() {
    const Token& at = next();
    auto s = new_stmt(Stmt::With, at);
    while (cur().kind != Token::BlockEnd) {
      if (!s->params.empty()) expect_op(",");
      std::string n = expect_name();
      expect_op("=");
      s->params.emplace_back(std::move(n), parse_expression(true));
    }
    expect_block_end();
    body_until(s->body, {"endwith"}, at);
    expect_block_end();
    return s;
  }

  std::unique_ptr<Stmt> parse_group(const char* end) {
    const Token& at = next();
    auto s = new_stmt(Stmt::Group, at);
    expect_block_end();
    body_until(s->body, {end}, at);
    expect_block_end();
    return s;
  }

  // `| name(args) | name ...` with a null input (filter blocks and block sets); `first_inline`:
  // the first filter has no leading pipe.
  void parse_filter_chain(std::vector<ExprPtr>& out, bool first_inline = false) {
    while (first_inline || is_op("|")) {
      if (!first_inline) next();
      first_inline = false;
      out.push_back(parse_filter_call(nullptr));
    }
  }

  // ---- expressions ----

  bool tuple_end(const std::vector<std::string>& extra) const {
    const Token& t = cur();
    if (t.kind == Token::VarEnd || t.kind == Token::BlockEnd || (t.kind == Token::Op && t.text == ")")) return true;
    return t.kind == Token::Name && std::find(extra.begin(), extra.end(), t.text) != extra.end();
  }

  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens, const std::vector<std::string>& extra_end) {
    const Token& at = cur();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    for (;;) {
      if (!items.empty()) expect_op(",");
      if (tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail_at(cur(), "expected an expression, got " + describe(cur()));
    }
    auto e = make(Expr::TupleLit, at);
    e->args = std::move(items);
    return seal(std::move(e));
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Guard g(*this, nesting_, kMaxExprDepth / 2, cur());
    if (!with_condexpr) return parse_or();
    const Token& at = cur();
    ExprPtr e = parse_or();
    while (skip_name("if")) {
      auto c = make(Expr::Cond, at);
      ExprPtr cond = parse_or();
      ExprPtr other = skip_name("else") ? parse_expression(true) : nullptr;
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = seal(std::move(c));
    }
    return e;
  }

  ExprPtr binary(Expr::Kind kind, const Token& at, std::string op, ExprPtr l, ExprPtr r) {
    auto e = make(kind, at);
    e->name = std::move(op);
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return seal(std::move(e));
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const Token& at = next();
      e = binary(Expr::Or, at, "or", std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const Token& at = next();
      e = binary(Expr::And, at, "and", std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      Guard g(*this, nesting_, kMaxExprDepth / 2, cur());
      const Token& at = next();
      auto e = make(Expr::Not, at);
      e->args.push_back(parse_not());
      return seal(std::move(e));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token& at = cur();
    ExprPtr first = parse_math1();
    std::unique_ptr<Expr> cmp;
    for (;;) {
      std::string op;
      if (cur().kind == Token::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().kind == Token::Name && peek().text == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Compare, at);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? seal(std::move(cmp)) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& at = next();
      e = binary(Expr::Binary, at, at.text, std::move(e), parse_concat());
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token& at = next();
      e = binary(Expr::Binary, at, "~", std::move(e), parse_math2());
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = next();
      e = binary(Expr::Binary, at, at.text, std::move(e), parse_pow());
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& at = next();
      e = binary(Expr::Binary, at, "**", std::move(e), parse_unary(true));
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      Guard g(*this, nesting_, kMaxExprDepth / 2, cur());
      const Token& at = next();
      e = make(at.text == "-" ? Expr::Neg : Expr::Pos, at);
      e->args.push_back(parse_unary(false));
      e = seal(std::move(e));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.kind) {
      case Token::Name: {
        next();
        auto e = make(Expr::Const, t);
        if (t.text == "true" || t.text == "True") e->value = Value::boolean(true);
        else if (t.text == "false" || t.text == "False") e->value = Value::boolean(false);
        else if (t.text == "none" || t.text == "None") e->value = Value::none();
        else {
          e->kind = Expr::Name;
          e->name = t.text;
        }
        return e;
      }
      case Token::String: {
        auto e = make(Expr::Const, t);
        std::string s;
        while (cur().kind == Token::String) s += next().text;
        e->value = Value::str(std::move(s));
        return e;
      }
      case Token::Int: {
        auto e = make(Expr::Const, next());
        e->value = Value::integer(t.i);
        return e;
      }
      case Token::Float: {
        auto e = make(Expr::Const, next());
        e->value = Value::number(t.f);
        return e;
      }
      case Token::Op:
        if (t.text == "(") {
          Guard g(*this, nesting_, kMaxExprDepth / 2, t);
          next();
          ExprPtr e = parse_tuple(true, true, {});
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          Guard g(*this, nesting_, kMaxExprDepth / 2, t);
          next();
          auto e = make(Expr::ListLit, t);
          while (!is_op("]")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("]")) break;
            e->args.push_back(parse_expression(true));
          }
          expect_op("]");
          return seal(std::move(e));
        }
        if (t.text == "{") {
          Guard g(*this, nesting_, kMaxExprDepth / 2, t);
          next();
          auto e = make(Expr::DictLit, t);
          while (!is_op("}")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("}")) break;
            e->args.push_back(parse_expression(true));
            expect_op(":");
            e->args.push_back(parse_expression(true));
          }
          expect_op("}");
          return seal(std::move(e));
        }
        break;
      default: break;
    }
    fail_at(t, "unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".") || is_op("[")) e = parse_subscript(std::move(e));
      else if (is_op("(")) e = parse_call(std::move(e));
      else return e;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        next();
        e = parse_filter_call(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const Token& at = next();
    if (at.text == ".") {
      const Token& attr = next();
      if (attr.kind == Token::Name) {
        auto e = make(Expr::Attr, at);
        e->name = attr.text;
        e->args.push_back(std::move(obj));
        return seal(std::move(e));
      }
      if (attr.kind != Token::Int) fail_at(attr, "expected name or number");
      auto e = make(Expr::Item, at);
      auto k = make(Expr::Const, attr);
      k->value = Value::integer(attr.i);
      e->args.push_back(std::move(obj));
      e->args.push_back(std::move(k));
      return seal(std::move(e));
    }
    Guard g(*this, nesting_, kMaxExprDepth / 2, at);
    std::vector<ExprPtr> subs;
    while (!is_op("]")) {
      if (!subs.empty()) expect_op(",");
      subs.push_back(parse_subscribed());
    }
    expect_op("]");
    if (subs.empty()) fail_at(at, "expected subscript expression");
    ExprPtr key;
    if (subs.size() == 1) {
      key = std::move(subs[0]);
    } else {
      key = make(Expr::TupleLit, at);
      key->args = std::move(subs);
      key = seal(std::move(key));
    }
    if (key->kind == Expr::Slice) {  // a slice node carries its object as args[0]
      key->args[0] = std::move(obj);
      return seal(std::move(key));
    }
    auto e = make(Expr::Item, at);
    e->args.push_back(std::move(obj));
    e->args.push_back(std::move(key));
    return seal(std::move(e));
  }

  // One subscript: an expression or a slice start:stop:step (parts optional).
  ExprPtr parse_subscribed() {
    const Token& at = cur();
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) return start;
    }
    next();  // ':'
    auto e = make(Expr::Slice, at);
    e->args.push_back(nullptr);  // the object, filled in by parse_subscript
    e->args.push_back(std::move(start));
    e->args.push_back(is_op(":") || is_op("]") || is_op(",") ? nullptr : parse_expression(true));
    ExprPtr step;
    if (skip_op(":") && !is_op("]") && !is_op(",")) step = parse_expression(true);
    e->args.push_back(std::move(step));
    return e;
  }

  void parse_call_args(Expr& e) {
    const Token& at = cur();
    Guard g(*this, nesting_, kMaxExprDepth / 2, at);
    expect_op("(");
    bool need_comma = false;
    while (!is_op(")")) {
      if (need_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) fail_at(cur(), "*args and **kwargs in calls are not supported");
      if (cur().kind == Token::Name && peek().kind == Token::Op && peek().text == "=") {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail_at(cur(), "invalid syntax for function call expression");
        e.args.push_back(parse_expression(true));
      }
      need_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(Expr::Call, cur());
    e->args.push_back(std::move(callee));
    parse_call_args(*e);
    return seal(std::move(e));
  }

  ExprPtr parse_filter_call(ExprPtr input) {
    const Token& at = expect_kind(Token::Name, "a filter name");
    auto e = make(Expr::Filter, at);
    e->name = at.text;
    e->args.push_back(std::move(input));
    if (is_op("(")) parse_call_args(*e);
    return seal(std::move(e));
  }

  ExprPtr parse_test(ExprPtr input) {
    const Token& at = next();  // 'is'
    const bool negated = skip_name("not");
    const Token& name = expect_kind(Token::Name, "a test name");
    auto e = make(Expr::Test, at);
    e->name = name.text;
    e->negated = negated;
    e->args.push_back(std::move(input));
    const Token& c = cur();
    if (c.kind == Token::Op && c.text == "(") {
      parse_call_args(*e);
    } else if ((c.kind == Token::Name || c.kind == Token::String || c.kind == Token::Int || c.kind == Token::Float ||
                (c.kind == Token::Op && (c.text == "[" || c.text == "{"))) &&
               !(c.kind == Token::Name && (c.text == "else" || c.text == "or" || c.text == "and"))) {
      if (c.kind == Token::Name && c.text == "is") fail_at(c, "you cannot chain multiple tests with is");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    return seal(std::move(e));
  }
};

}  // namespace

Body parse(const std::vector<Token>& tokens, const std::string& name) { return Parser(tokens, name).parse_template(); }

}  // namespace fp::jinja
