// tokenizer/jinja_eval.cpp — the Jinja renderer: runs statements over scoped frames (a fresh frame
// per loop iteration, macro call and `with`, as jinja2 scopes them), evaluates expressions with
// Python operator semantics, and enforces the output, step and call-depth limits.
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/jinja.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_builtins.h"

namespace fp::jinja {
namespace {

struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;

  const Value* find(const std::string& name) const {
    for (const Frame* f = this; f; f = f->parent.get()) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using FramePtr = std::shared_ptr<Frame>;

FramePtr child(const FramePtr& parent) {
  auto f = std::make_shared<Frame>();
  f->parent = parent;
  return f;
}

enum class Flow { Normal, Break, Continue };

[[noreturn]] void undefined_error(const Value& v) {
  raise(v.s.empty() ? std::string("value is undefined") : v.s);
}

// x op y on int64, raising where Python would have grown a big integer.
template <class Op>
int64_t checked(Op op, int64_t x, int64_t y) {
  int64_t r = 0;
  if (op(x, y, &r)) raise("integer overflow (beyond 64 bits)");
  return r;
}
constexpr auto kAdd = [](int64_t x, int64_t y, int64_t* r) { return __builtin_add_overflow(x, y, r); };
constexpr auto kSub = [](int64_t x, int64_t y, int64_t* r) { return __builtin_sub_overflow(x, y, r); };
constexpr auto kMul = [](int64_t x, int64_t y, int64_t* r) { return __builtin_mul_overflow(x, y, r); };

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = to_str(a);
    const std::string t = to_str(b);
    if (s.size() + t.size() > kMaxBuiltString) raise("string too long");
    return Value::str(s + t);
  }
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  auto unsupported = [&]() -> Value {
    raise("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  const bool ints = a.is_integral() && b.is_integral();
  const bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) return Value::integer(checked(kAdd, a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_double() + b.as_double());
    if (a.is_str() && b.is_str()) {
      if (a.s.size() + b.s.size() > kMaxBuiltString) raise("string too long");
      if (a.markup || b.markup)  // Markup + str escapes the plain side
        return Value::markup_str((a.markup ? a.s : html_escape(a.s)) + (b.markup ? b.s : html_escape(b.s)));
      return Value::str(a.s + b.s);
    }
    if (a.is_list() && b.is_list() && a.tuple == b.tuple) {
      if (a.list->size() + b.list->size() > kMaxListItems) raise("list too long");
      ValueList items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(items), a.tuple);
    }
    if (a.is_str()) raise("can only concatenate str (not \"" + type_name(b) + "\") to str");
    return unsupported();
  }
  if (op == "-") {
    if (ints) return Value::integer(checked(kSub, a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_double() - b.as_double());
    return unsupported();
  }
  if (op == "*") {
    if (ints) return Value::integer(checked(kMul, a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_double() * b.as_double());
    const Value* seq = a.is_integral() ? &b : &a;
    const Value* count = a.is_integral() ? &a : &b;
    if (!count->is_integral() || !(seq->is_str() || seq->is_list())) return unsupported();
    const int64_t n = std::max<int64_t>(0, count->as_int());
    const size_t unit = seq->is_str() ? seq->s.size() : seq->list->size();
    if (n > 0 && unit > (seq->is_str() ? kMaxBuiltString : kMaxListItems) / size_t(n)) raise("repeated sequence too long");
    if (seq->is_str()) {
      std::string s;
      for (int64_t k = 0; k < n; ++k) s += seq->s;
      Value out = Value::str(std::move(s));
      out.markup = seq->markup;
      return out;
    }
    ValueList items;
    for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq->list->begin(), seq->list->end());
    return Value::make_list(std::move(items), seq->tuple);
  }
  if (op == "/") {
    if (!nums) return unsupported();
    if (b.as_double() == 0) raise("division by zero");
    return Value::number(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (a.is_str() && op == "%") {
      if (b.is_list() && b.tuple) return percent_format(a.s, *b.list, nullptr);
      return percent_format(a.s, {b}, b.is_dict() ? &b : nullptr);
    }
    if (!nums) return unsupported();
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) raise(op == "%" ? "integer modulo by zero" : "integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) raise("integer overflow (beyond 64 bits)");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value::integer(op == "//" ? q : m);
    }
    const double x = a.as_double(), y = b.as_double();
    if (y == 0) raise("float modulo");
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    if (op == "%") return Value::number(m);
    return Value::number(std::floor((x - m) / y + 0.5));
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int(), e = b.as_int(), acc = 1;
      while (e > 0) {
        if (e & 1) acc = checked(kMul, acc, base);
        e >>= 1;
        if (e > 0) base = checked(kMul, base, base);
      }
      return Value::integer(acc);
    }
    if (!nums) return unsupported();
    if (a.as_double() == 0 && b.as_double() < 0) raise("0.0 cannot be raised to a negative power");
    return Value::number(std::pow(a.as_double(), b.as_double()));
  }
  raise("unknown operator " + op);
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "<") return less(a, b);
  if (op == ">") return less(b, a);
  if (op == "<=") return less(a, b) || equals(a, b);
  if (op == ">=") return less(b, a) || equals(a, b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  raise("unknown comparison " + op);
}

class Renderer {
 public:
  Renderer(const TemplateProgram& prog, const RenderLimits& limits) : prog_(prog), limits_(limits) {}

  std::string render(const nlohmann::ordered_json& vars) {
    auto globals = std::make_shared<Frame>();
    for (auto& [k, v] : make_globals()) globals->vars[k] = std::move(v);
    auto root = child(globals);
    try {
      for (const auto& [k, v] : vars.items()) root->vars[k] = from_json(v);
    } catch (const JinjaError& e) {
      fail(prog_.name, ": template variables: ", e.message);
    }
    std::string out;
    exec_body(prog_.body, root, out);
    return out;
  }

 private:
  const TemplateProgram& prog_;
  const RenderLimits& limits_;
  uint64_t steps_ = 0;
  int call_depth_ = 0;

  [[noreturn]] void fail_at(int line, int col, const std::string& what) const {
    fail(prog_.name, ":", line, ":", col, ": ", what);
  }

  void step() {
    if (++steps_ > limits_.max_steps)
      raise("template exceeded its work limit (" + std::to_string(limits_.max_steps) + " steps)");
  }

  void charge(uint64_t n) {
    steps_ += n;
    if (steps_ > limits_.max_steps)
      raise("template exceeded its work limit (" + std::to_string(limits_.max_steps) + " steps)");
  }

  void emit(std::string& out, const std::string& s) const {
    if (out.size() + s.size() > limits_.max_output_bytes)
      raise("template output exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
    out += s;
  }

  // ---- statements ----

  Flow exec_body(const Body& body, const FramePtr& frame, std::string& out) {
    for (const auto& s : body) {
      const Flow f = exec(*s, frame, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Stmt& s, const FramePtr& frame, std::string& out) {
    try {
      step();
      switch (s.kind) {
        case Stmt::Text: emit(out, s.text); return Flow::Normal;
        case Stmt::Output: emit(out, to_str(eval(*s.expr, frame))); return Flow::Normal;
        case Stmt::If:
          for (const auto& [cond, body] : s.branches)
            if (!cond || truthy(eval(*cond, frame))) return exec_body(body, frame, out);
          return Flow::Normal;
        case Stmt::For: exec_for(s, frame, out); return Flow::Normal;
        case Stmt::Set: assign(s, frame, eval(*s.expr, frame)); return Flow::Normal;
        case Stmt::SetAttr: {
          const Value* ns = frame->find(s.targets[0]);
          if (!ns || ns->kind != Value::Object || ns->dict->type_name != "Namespace")
            raise("cannot assign attribute on non-namespace object");
          Value v = eval(*s.expr, frame);
          ns->dict->set(Value::str(s.text), std::move(v));
          return Flow::Normal;
        }
        case Stmt::SetBlock: {
          std::string captured;
          exec_body(s.body, frame, captured);
          assign(s, frame, apply_chain(s.filters, Value::str(std::move(captured)), frame));
          return Flow::Normal;
        }
        case Stmt::FilterBlock: {
          std::string captured;
          exec_body(s.body, child(frame), captured);
          emit(out, to_str(apply_chain(s.filters, Value::str(std::move(captured)), frame)));
          return Flow::Normal;
        }
        case Stmt::Macro: frame->vars[s.text] = make_macro(s, frame); return Flow::Normal;
        case Stmt::With: {
          auto inner = child(frame);
          for (const auto& [name, e] : s.params) inner->vars[name] = eval(*e, frame);
          return exec_body(s.body, inner, out);
        }
        case Stmt::Group: return exec_body(s.body, frame, out);
        case Stmt::Break: return Flow::Break;
        case Stmt::Continue: return Flow::Continue;
      }
    } catch (const JinjaError& e) {
      fail_at(s.line, s.col, e.message);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {  // bad_alloc and the like: still an error with a position
      fail_at(s.line, s.col, e.what());
    }
    return Flow::Normal;
  }

  void assign(const Stmt& s, const FramePtr& frame, Value v) {
    if (!s.unpack) {
      frame->vars[s.targets[0]] = std::move(v);
      return;
    }
    ValueList items = iterate(v);
    if (items.size() != s.targets.size())
      raise(items.size() < s.targets.size()
                ? "not enough values to unpack (expected " + std::to_string(s.targets.size()) + ", got " +
                      std::to_string(items.size()) + ")"
                : "too many values to unpack (expected " + std::to_string(s.targets.size()) + ")");
    for (size_t k = 0; k < items.size(); ++k) frame->vars[s.targets[k]] = std::move(items[k]);
  }

  void exec_for(const Stmt& s, const FramePtr& frame, std::string& out) {
    if (s.recursive) raise("recursive for loops are not supported");
    ValueList items = iterate(eval(*s.expr, frame));
    if (s.cond) {  // the inline `if` filters before the loop counts anything
      ValueList kept;
      for (auto& item : items) {
        auto f = child(frame);
        assign(s, f, item);
        if (truthy(eval(*s.cond, f))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const int64_t n = int64_t(items.size());
    for (int64_t k = 0; k < n; ++k) {
      step();
      auto f = child(frame);
      assign(s, f, items[size_t(k)]);
      f->vars["loop"] = loop_object(items, k);
      const Flow flow = exec_body(s.body, f, out);
      if (flow == Flow::Break) break;
    }
    if (n == 0) exec_body(s.else_body, child(frame), out);
  }

  static Value loop_object(const ValueList& items, int64_t k) {
    const int64_t n = int64_t(items.size());
    Value loop = Value::make_object("LoopContext");
    auto& d = *loop.dict;
    d.set(Value::str("index"), Value::integer(k + 1));
    d.set(Value::str("index0"), Value::integer(k));
    d.set(Value::str("revindex"), Value::integer(n - k));
    d.set(Value::str("revindex0"), Value::integer(n - k - 1));
    d.set(Value::str("first"), Value::boolean(k == 0));
    d.set(Value::str("last"), Value::boolean(k == n - 1));
    d.set(Value::str("length"), Value::integer(n));
    d.set(Value::str("depth"), Value::integer(1));
    d.set(Value::str("depth0"), Value::integer(0));
    d.set(Value::str("previtem"), k > 0 ? items[size_t(k - 1)] : Value::undefined("there is no previous item"));
    d.set(Value::str("nextitem"), k + 1 < n ? items[size_t(k + 1)] : Value::undefined("there is no next item"));
    d.set(Value::str("cycle"), Value::function("loop.cycle", [k](CallArgs& a) -> Value {
            if (a.pos.empty()) raise("no items for cycling given");
            return a.pos[size_t(k) % a.pos.size()];
          }));
    return loop;
  }

  // The macro holds its defining frame weakly: the frame stores the macro, and a strong
  // reference both ways would never be freed.
  Value make_macro(const Stmt& s, const FramePtr& frame) {
    const Stmt* macro = &s;
    std::weak_ptr<Frame> scope = frame;
    return Value::function(s.text, [this, macro, scope](CallArgs& a) -> Value {
      FramePtr defined_in = scope.lock();
      if (!defined_in) raise("macro '" + macro->text + "' called after its scope ended");
      if (a.pos.size() > macro->params.size())
        raise("macro '" + macro->text + "' takes not more than " + std::to_string(macro->params.size()) +
              " argument(s)");
      if (++call_depth_ > limits_.max_call_depth) {
        --call_depth_;
        raise("macro calls nested deeper than " + std::to_string(limits_.max_call_depth));
      }
      struct Depth {
        int& d;
        ~Depth() { --d; }
      } guard{call_depth_};
      auto f = child(defined_in);
      for (const auto& [k, v] : a.kw) {
        bool known = false;
        for (const auto& p : macro->params) known |= p.first == k;
        if (!known) raise("macro '" + macro->text + "' takes no keyword argument '" + k + "'");
      }
      for (size_t k = 0; k < macro->params.size(); ++k) {
        const auto& [name, def] = macro->params[k];
        const Value missing = Value::undefined();
        const Value& given = a.get(k, name, missing);
        if (a.has(k, name)) f->vars[name] = given;
        else if (def) f->vars[name] = eval(*def, f);
        else f->vars[name] = Value::undefined("parameter '" + name + "' was not provided");
      }
      std::string out;
      exec_body(macro->body, f, out);
      return Value::str(std::move(out));
    });
  }

  Value apply_chain(const std::vector<ExprPtr>& filters, Value v, const FramePtr& frame) {
    for (const auto& f : filters) v = call_filter(*f, std::move(v), frame);
    return v;
  }

  // ---- expressions ----

  CallArgs eval_args(const Expr& e, size_t first, const FramePtr& frame, std::string callee) {
    CallArgs a;
    a.callee = std::move(callee);
    for (size_t k = first; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k], frame));
    for (const auto& [name, x] : e.kwargs) a.kw.emplace_back(name, eval(*x, frame));
    return a;
  }

  Value call_filter(const Expr& e, Value input, const FramePtr& frame) {
    CallArgs a = eval_args(e, 1, frame, e.name);
    return apply_filter(e.name, input, a);
  }

  // Work is counted per node, plus the size of what it builds: a string costs one step per 64
  // bytes, a freshly built list one per item, so copying and building loops stay bounded too.
  Value eval(const Expr& e, const FramePtr& frame) {
    try {
      step();
      Value v = eval_inner(e, frame);
      if (v.kind == Value::Str) {
        charge(v.s.size() / 64);
      } else if (v.kind == Value::List && e.kind != Expr::Name && e.kind != Expr::Attr && e.kind != Expr::Item &&
                 e.kind != Expr::Const) {
        charge(v.list->size());
      }
      return v;
    } catch (const JinjaError& err) {
      fail_at(e.line, e.col, err.message);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& err) {
      fail_at(e.line, e.col, err.what());
    }
  }

  Value eval_inner(const Expr& e, const FramePtr& frame) {
    switch (e.kind) {
      case Expr::Const: return e.value;
      case Expr::Name: {
        const Value* v = frame->find(e.name);
        return v ? *v : Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::ListLit:
      case Expr::TupleLit: {
        ValueList items;
        for (const auto& a : e.args) items.push_back(eval(*a, frame));
        return Value::make_list(std::move(items), e.kind == Expr::TupleLit);
      }
      case Expr::DictLit: {
        Value d = Value::make_dict();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k], frame);
          if (key.kind == Value::List && !key.tuple) raise("unhashable type: 'list'");
          if (key.kind == Value::Dict) raise("unhashable type: 'dict'");
          d.dict->set(std::move(key), eval(*e.args[k + 1], frame));
        }
        return d;
      }
      case Expr::Attr: return get_attr(eval(*e.args[0], frame), e.name);
      case Expr::Item: {
        Value obj = eval(*e.args[0], frame);
        if (obj.is_undefined()) undefined_error(obj);
        return get_item(obj, eval(*e.args[1], frame));
      }
      case Expr::Slice: {
        Value obj = eval(*e.args[0], frame);
        if (obj.is_undefined()) undefined_error(obj);
        auto part = [&](size_t k) { return e.args[k] ? eval(*e.args[k], frame) : Value::none(); };
        return get_slice(obj, part(1), part(2), part(3));
      }
      case Expr::Call: {
        Value fn = eval(*e.args[0], frame);
        if (fn.is_undefined()) undefined_error(fn);
        if (fn.kind != Value::Func) raise("'" + type_name(fn) + "' object is not callable");
        CallArgs a = eval_args(e, 1, frame, fn.fn->name);
        return fn.fn->call(a);
      }
      case Expr::Filter: return call_filter(e, eval(*e.args[0], frame), frame);
      case Expr::Test: {
        Value input = eval(*e.args[0], frame);
        CallArgs a = eval_args(e, 1, frame, e.name);
        return Value::boolean(apply_test(e.name, input, a) != e.negated);
      }
      case Expr::Not: return Value::boolean(!truthy(eval(*e.args[0], frame)));
      case Expr::Neg:
      case Expr::Pos: {
        Value v = eval(*e.args[0], frame);
        if (v.is_undefined()) undefined_error(v);
        if (!v.is_number()) raise("bad operand type for unary " + std::string(e.kind == Expr::Neg ? "-" : "+") + ": '" +
                                  type_name(v) + "'");
        if (e.kind == Expr::Pos) return v.kind == Value::Bool ? Value::integer(v.as_int()) : v;
        if (v.kind == Value::Float) return Value::number(-v.f);
        if (v.as_int() == INT64_MIN) raise("integer overflow (beyond 64 bits)");
        return Value::integer(-v.as_int());
      }
      case Expr::And: {
        Value l = eval(*e.args[0], frame);
        return truthy(l) ? eval(*e.args[1], frame) : l;
      }
      case Expr::Or: {
        Value l = eval(*e.args[0], frame);
        return truthy(l) ? l : eval(*e.args[1], frame);
      }
      case Expr::Binary: {
        Value l = eval(*e.args[0], frame);
        Value r = eval(*e.args[1], frame);
        return arithmetic(e.name, l, r);
      }
      case Expr::Compare: {
        Value l = eval(*e.args[0], frame);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value r = eval(*e.args[k + 1], frame);
          if (!compare(e.ops[k], l, r)) return Value::boolean(false);
          l = std::move(r);
        }
        return Value::boolean(true);
      }
      case Expr::Cond:
        if (truthy(eval(*e.args[1], frame))) return eval(*e.args[0], frame);
        if (e.args[2]) return eval(*e.args[2], frame);
        return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
    }
    raise("unknown expression");
  }
};

}  // namespace

Template::Template(std::string_view source, std::string name) : program_(std::make_unique<TemplateProgram>()) {
  program_->name = std::move(name);
  program_->body = parse(lex(source, program_->name), program_->name);
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

const std::string& Template::name() const { return program_->name; }

std::string Template::render(const nlohmann::ordered_json& vars, const RenderLimits& limits) const {
  if (!vars.is_object()) fail(program_->name, ": template variables must be a JSON object, got ", vars.type_name());
  return Renderer(*program_, limits).render(vars);
}

}  // namespace fp::jinja
