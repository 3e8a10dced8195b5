// tokenizer/jinja_ast.h — tokens and syntax tree of the Jinja interpreter, and the lexer/parser
// entry points. Internal to tokenizer/jinja_*.cpp.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace fp::jinja {

struct Token {
  enum Kind : uint8_t { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };
  Kind kind = Eof;
  std::string text;  // Data: the text; Name; String: unescaped; Op: the operator; Int/Float: source
  int64_t i = 0;
  double f = 0;
  int line = 1, col = 1;
};

// Splits a template into tokens the way jinja2's lexer does with trim_blocks and lstrip_blocks on:
// comments dropped, whitespace control applied to the Data tokens, {% raw %} turned into Data.
std::vector<Token> lex(std::string_view source, const std::string& name);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum Kind : uint8_t {
    Const, Name, ListLit, TupleLit, DictLit, Attr, Item, Slice, Call, Filter, Test,
    Neg, Pos, Not, Binary, Compare, And, Or, Cond
  };
  Kind kind = Const;
  int line = 0, col = 0;
  int depth = 1;       // height of this subtree (bounded by the parser)
  Value value;         // Const
  std::string name;    // Name; Attr: attribute; Filter/Test: its name; Binary: operator
  // Children. Attr: [obj]; Item: [obj, key]; Slice: [obj, start, stop, step] (null when absent);
  // Call: [callee, positional...]; Filter/Test: [input (null in filter blocks), positional...];
  // Neg/Pos/Not: [x]; Binary/And/Or: [lhs, rhs]; Compare: [first, rest...]; Cond: [then, cond, else?];
  // ListLit/TupleLit: items; DictLit: [k0, v0, k1, v1, ...].
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // Call/Filter/Test keyword arguments
  std::vector<std::string> ops;                         // Compare: one operator per `rest`
  bool negated = false;                                 // Test: `is not`
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum Kind : uint8_t { Text, Output, If, For, Set, SetAttr, SetBlock, Macro, Break, Continue, FilterBlock, With, Group };
  Kind kind = Text;
  int line = 0, col = 0;
  std::string text;    // Text: the data; Macro: its name; SetAttr: the attribute
  ExprPtr expr;        // Output; Set/SetAttr: the value; For: the iterable
  ExprPtr cond;        // For: the `if` filter
  std::vector<std::string> targets;  // Set/For/SetBlock: names; SetAttr: [namespace variable]
  bool unpack = false;               // Set/For: the target is a tuple
  bool recursive = false;            // For: `recursive` (rejected at render time)
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: (condition, body); a final else has no condition
  Body body, else_body;              // For/Macro/SetBlock/FilterBlock/With/Group bodies; For: else
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro parameters (default or null); With assignments
  std::vector<ExprPtr> filters;      // SetBlock/FilterBlock: Filter nodes applied in turn
};

struct TemplateProgram {
  std::string name;
  Body body;
};

// Parses the tokens into statements; throws fp::Error "NAME:LINE:COL: what".
Body parse(const std::vector<Token>& tokens, const std::string& name);

// Limits the parser enforces: nesting of blocks and height of expression trees.
constexpr int kMaxBlockDepth = 128;
constexpr int kMaxExprDepth = 256;

}  // namespace fp::jinja
