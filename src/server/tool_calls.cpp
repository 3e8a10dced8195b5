// server/tool_calls.cpp — splitting replies into text and tool calls (Hermes, Llama-3 JSON,
// DeepSeek-V3, GLM-4.5, Qwen3-Coder XML, Mistral).
#include "server/tool_calls.h"

#include <algorithm>
#include <cctype>
#include <set>

#include <nlohmann/json.hpp>

#include "server/harmony.h"

namespace fp {

namespace {
const std::string kOpen = "<tool_call>", kClose = "</tool_call>";
const std::string kArgKey = "<arg_key>", kArgKeyEnd = "</arg_key>", kArgValue = "<arg_value>", kArgValueEnd = "</arg_value>";
const std::string kFunction = "<function=", kFunctionEnd = "</function>", kParameter = "<parameter=", kParameterEnd = "</parameter>";
const std::string kMistralCalls = "[TOOL_CALLS]", kMistralArgs = "[ARGS]", kMistralCallId = "[CALL_ID]";
const std::string kDsCallsBegin = "<｜tool▁calls▁begin｜>", kDsCallsEnd = "<｜tool▁calls▁end｜>";
const std::string kDsCallBegin = "<｜tool▁call▁begin｜>", kDsCallEnd = "<｜tool▁call▁end｜>", kDsSep = "<｜tool▁sep｜>";

// The tag from which a streamed reply is held (Hermes, DeepSeek, Mistral, ...).
const std::string& opening_tag(ToolCallFormat f) {
  return f == ToolCallFormat::DeepSeekV3 ? kDsCallsBegin : f == ToolCallFormat::Mistral ? kMistralCalls : kOpen;
}

// A tool name as the templates write it (letters, digits, _ - . :).
bool tool_name_ok(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == ':';
  });
}

// Walks JSON text from t[at] keeping the bracket depth outside strings: the first index whose
// character, outside strings, makes stop(c, depth) true (depth after that character), or npos.
template <class Stop>
size_t scan_json(const std::string& t, size_t at, Stop stop) {
  int depth = 0;
  bool in_str = false, esc = false;
  for (size_t i = at; i < t.size(); ++i) {
    const char c = t[i];
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') --depth;
    if (stop(c, depth)) return i;
  }
  return std::string::npos;
}

// Where the JSON object or array opening at t[at] ends (one past its closing bracket), or npos
// when it does not close.
size_t json_value_end(const std::string& t, size_t at) {
  const size_t close = scan_json(t, at, [](char c, int depth) { return (c == '}' || c == ']') && depth == 0; });
  return close == std::string::npos ? close : close + 1;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return {};
  const size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

// {"name": "...", <args_key>: {...}} as a call (arguments may be left out: none).
bool as_call(const nlohmann::json& j, std::initializer_list<const char*> args_keys, ToolCallText& out) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  out.name = j["name"].get<std::string>();
  out.arguments = "{}";
  for (const char* k : args_keys)
    if (j.contains(k)) {
      if (!j[k].is_object()) return false;
      out.arguments = j[k].dump();
    }
  return true;
}

// Calls between <tool_call> and </tool_call> anywhere in the reply (Hermes, GLM-4.5): each body
// is read by `read_call` (`closed`: its closing tag was found; else the body runs to the end).
// A body that is not a call stays text, tags and all.
template <typename ReadCall>
SplitReply split_tagged_calls(const std::string& text, ReadCall read_call) {
  SplitReply out;
  std::string content;
  size_t at = 0;
  while (at < text.size()) {
    const size_t open = text.find(kOpen, at);
    if (open == std::string::npos) break;
    const size_t body = open + kOpen.size();
    const size_t close = text.find(kClose, body);
    const std::string inner = text.substr(body, close == std::string::npos ? std::string::npos : close - body);
    const size_t end = close == std::string::npos ? text.size() : close + kClose.size();
    ToolCallText call;
    if (read_call(inner, close != std::string::npos, call)) {
      content += text.substr(at, open - at);
      out.calls.push_back(std::move(call));
    } else {
      content += text.substr(at, end - at);  // not a call: it stays text
    }
    at = end;
  }
  if (at < text.size()) content += text.substr(at);
  out.content = trim(content);
  return out;
}

SplitReply split_hermes(const std::string& text) {
  return split_tagged_calls(text, [](const std::string& inner, bool, ToolCallText& call) {
    return as_call(nlohmann::json::parse(inner, nullptr, false), {"arguments"}, call);
  });
}

// The whole reply is one or more calls separated by ';', or it is text.
SplitReply split_llama3_json(const std::string& text) {
  SplitReply out;
  const std::string t = trim(text);
  if (t.empty() || t[0] != '{') {
    out.content = t;
    return out;
  }
  size_t at = 0;
  while (at < t.size()) {
    // The next object ends where a ';' (outside strings and brackets) or the text ends: let the
    // parser find it.
    size_t end = scan_json(t, at, [](char c, int depth) { return c == ';' && depth == 0; });
    if (end == std::string::npos) end = t.size();
    ToolCallText call;
    if (!as_call(nlohmann::json::parse(t.substr(at, end - at), nullptr, false), {"parameters", "arguments"}, call)) {
      out.calls.clear();  // not calls after all: the reply is text
      out.content = t;
      return out;
    }
    out.calls.push_back(std::move(call));
    at = end + 1;
    while (at < t.size() && (t[at] == ' ' || t[at] == '\n' || t[at] == '\t' || t[at] == '\r')) ++at;
  }
  return out;
}
// <｜tool▁calls▁begin｜> ... <｜tool▁calls▁end｜>: each <｜tool▁call▁begin｜>TYPE<｜tool▁sep｜>NAME
// ```json ARGS ```<｜tool▁call▁end｜> a call. Text before and after the block is content; a block
// with any call that does not parse stays text whole.
SplitReply split_deepseek(const std::string& text) {
  SplitReply out;
  const size_t begin = text.find(kDsCallsBegin);
  if (begin == std::string::npos) {
    out.content = trim(text);
    return out;
  }
  const size_t body = begin + kDsCallsBegin.size();
  const size_t end = text.find(kDsCallsEnd, body);
  const std::string block = text.substr(body, end == std::string::npos ? std::string::npos : end - body);
  const std::string after = end == std::string::npos ? "" : text.substr(end + kDsCallsEnd.size());
  size_t at = 0;
  for (;;) {
    const size_t cb = block.find(kDsCallBegin, at);
    if (cb == std::string::npos) break;
    const size_t sep = block.find(kDsSep, cb);
    const size_t ce = block.find(kDsCallEnd, cb);
    const size_t call_end = ce == std::string::npos ? block.size() : ce;
    if (sep == std::string::npos || sep > call_end) return SplitReply{trim(text), {}};
    const std::string rest = block.substr(sep + kDsSep.size(), call_end - sep - kDsSep.size());
    const size_t nl = rest.find('\n');
    ToolCallText call;
    call.name = trim(rest.substr(0, nl));
    std::string args = nl == std::string::npos ? "" : rest.substr(nl + 1);
    const size_t fence = args.find("```");
    if (fence != std::string::npos) {
      const size_t line = args.find('\n', fence);
      args = line == std::string::npos ? "" : args.substr(line + 1);
      const size_t close = args.rfind("```");
      if (close != std::string::npos) args = args.substr(0, close);
    }
    const nlohmann::json j = nlohmann::json::parse(args, nullptr, false);
    if (call.name.empty() || j.is_discarded() || !j.is_object()) return SplitReply{trim(text), {}};
    call.arguments = j.dump();
    out.calls.push_back(std::move(call));
    at = call_end + (ce == std::string::npos ? 0 : kDsCallEnd.size());
  }
  if (out.calls.empty()) return SplitReply{trim(text), {}};
  out.content = trim(text.substr(0, begin) + after);
  return out;
}

// [TOOL_CALLS] and what follows it: a JSON array of calls, or NAME[ARGS]{...} (with an optional
// [CALL_ID]ID before [ARGS]); several markers may follow one another. Text before the first marker
// is content; anything after the calls that is not another marker, or a call that does not
// parse, leaves the whole reply as text.
SplitReply split_mistral(const std::string& text) {
  const size_t first = text.find(kMistralCalls);
  if (first == std::string::npos) return SplitReply{trim(text), {}};
  SplitReply out;
  auto blanks = [&](size_t at) {
    const size_t n = text.find_first_not_of(" \t\r\n", at);
    return n == std::string::npos ? text.size() : n;
  };
  size_t at = first;
  while (at < text.size()) {
    if (text.compare(at, kMistralCalls.size(), kMistralCalls) != 0) return SplitReply{trim(text), {}};
    at = blanks(at + kMistralCalls.size());
    if (at < text.size() && text[at] == '[') {  // [{"name": ..., "arguments": {...}}, ...]
      const size_t end = json_value_end(text, at);
      if (end == std::string::npos) return SplitReply{trim(text), {}};
      const nlohmann::json arr = nlohmann::json::parse(text.substr(at, end - at), nullptr, false);
      if (!arr.is_array() || arr.empty()) return SplitReply{trim(text), {}};
      for (const auto& j : arr) {
        ToolCallText call;
        nlohmann::json c = j;
        // Some replies write the arguments as a JSON string: taken when it holds an object.
        if (c.is_object() && c.contains("arguments") && c["arguments"].is_string()) {
          nlohmann::json inner = nlohmann::json::parse(c["arguments"].get<std::string>(), nullptr, false);
          if (inner.is_object()) c["arguments"] = inner;
        }
        if (!as_call(c, {"arguments"}, call)) return SplitReply{trim(text), {}};
        out.calls.push_back(std::move(call));
      }
      at = blanks(end);
      continue;
    }
    const size_t args = text.find(kMistralArgs, at);
    if (args == std::string::npos) return SplitReply{trim(text), {}};
    ToolCallText call;
    call.name = text.substr(at, args - at);
    if (const size_t id = call.name.find(kMistralCallId); id != std::string::npos) call.name.resize(id);
    call.name = trim(call.name);
    if (!tool_name_ok(call.name)) return SplitReply{trim(text), {}};
    const size_t body = blanks(args + kMistralArgs.size());
    const size_t end = body < text.size() && text[body] == '{' ? json_value_end(text, body) : std::string::npos;
    if (end == std::string::npos) return SplitReply{trim(text), {}};
    const nlohmann::json j = nlohmann::json::parse(text.substr(body, end - body), nullptr, false);
    if (!j.is_object()) return SplitReply{trim(text), {}};
    call.arguments = j.dump();
    out.calls.push_back(std::move(call));
    at = blanks(end);
  }
  out.content = trim(text.substr(0, first));
  return out;
}

// Whether a tool's parameter is declared a string (its value is then taken as written).
bool string_parameter(const nlohmann::json& tools, const std::string& tool, const std::string& param) {
  if (!tools.is_array()) return false;
  for (const auto& t : tools) {
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const auto& f = t["function"];
    if (!f.contains("name") || f["name"] != tool) continue;
    if (!f.contains("parameters") || !f["parameters"].is_object() || !f["parameters"].contains("properties")) return false;
    const auto& props = f["parameters"]["properties"];
    if (!props.is_object() || !props.contains(param) || !props[param].is_object()) return false;
    // The types the parameter may take, through anyOf/oneOf (pydantic's Optional[str] is
    // {"anyOf": [{"type": "string"}, {"type": "null"}]}) and string enums.
    std::set<std::string> types;
    std::vector<const nlohmann::json*> todo = {&props[param]};
    while (!todo.empty() && types.size() < 16) {
      const nlohmann::json& p = *todo.back();
      todo.pop_back();
      if (!p.is_object()) continue;
      for (const char* k : {"anyOf", "oneOf"})
        if (p.contains(k) && p[k].is_array() && todo.size() < 64)
          for (const auto& alt : p[k]) todo.push_back(&alt);
      if (p.contains("type") && p["type"].is_string()) types.insert(p["type"].get<std::string>());
      if (p.contains("type") && p["type"].is_array())
        for (const auto& one : p["type"])
          if (one.is_string()) types.insert(one.get<std::string>());
      if (!p.contains("type") && p.contains("enum") && p["enum"].is_array() && !p["enum"].empty() &&
          std::all_of(p["enum"].begin(), p["enum"].end(), [](const nlohmann::json& v) { return v.is_string(); }))
        types.insert("string");
    }
    // A string, and no other type that a bare value could be meant as.
    return types.count("string") && !types.count("number") && !types.count("integer") && !types.count("boolean") &&
           !types.count("object") && !types.count("array");
  }
  return false;
}

// A tool argument as written in the reply: JSON where it parses as JSON (numbers, booleans,
// null, objects, arrays), except for a parameter the tool declares a string, which is taken as
// written; anything else is a string too.
template <class Json>
Json typed_argument(const nlohmann::json& tools, const std::string& tool, const std::string& key, const std::string& value) {
  if (string_parameter(tools, tool, key)) return Json(value);
  Json parsed = Json::parse(trim(value), nullptr, false);
  return parsed.is_discarded() ? Json(value) : parsed;
}

// One GLM-4.5 call body (between <tool_call> and </tool_call>): NAME, then <arg_key>K</arg_key>
// <arg_value>V</arg_value> pairs with only blanks between them. A value is JSON where it parses
// as JSON (numbers, booleans, objects), except for a parameter the tool declares a string, which
// is taken as written; anything else is a string too.
bool glm45_call(const std::string& inner, const nlohmann::json& tools, ToolCallText& out) {
  const size_t first_key = inner.find(kArgKey);
  out.name = trim(inner.substr(0, first_key));
  if (!tool_name_ok(out.name)) return false;
  nlohmann::ordered_json args = nlohmann::ordered_json::object();
  size_t at = first_key == std::string::npos ? inner.size() : first_key;
  while (at < inner.size()) {
    if (inner.compare(at, kArgKey.size(), kArgKey) != 0) return false;
    const size_t key_end = inner.find(kArgKeyEnd, at);
    if (key_end == std::string::npos) return false;
    const std::string key = trim(inner.substr(at + kArgKey.size(), key_end - at - kArgKey.size()));
    size_t v = inner.find_first_not_of(" \t\r\n", key_end + kArgKeyEnd.size());
    if (key.empty() || v == std::string::npos || inner.compare(v, kArgValue.size(), kArgValue) != 0) return false;
    v += kArgValue.size();
    const size_t value_end = inner.find(kArgValueEnd, v);
    if (value_end == std::string::npos) return false;
    args[key] = typed_argument<nlohmann::ordered_json>(tools, out.name, key, inner.substr(v, value_end - v));
    at = inner.find_first_not_of(" \t\r\n", value_end + kArgValueEnd.size());
    if (at == std::string::npos) at = inner.size();
  }
  out.arguments = args.dump();
  return true;
}

SplitReply split_glm45(const std::string& text, const nlohmann::json& tools) {
  return split_tagged_calls(text, [&](const std::string& inner, bool closed, ToolCallText& call) {
    return closed && glm45_call(inner, tools, call);
  });
}

// One Qwen3-Coder call body (between <tool_call> and </tool_call>): <function=NAME>, then
// <parameter=KEY>VALUE</parameter> per argument with only blanks between, then </function>.
// A value loses one newline at each end (the template writes it on lines of its own) and is
// typed as typed_argument says. Lenient where a reply was cut short: a parameter without its
// closing tag ends at the next <parameter= or </function> (or the body's end), and a missing
// </function> is forgiven.
bool qwen3_coder_call(const std::string& inner, const nlohmann::json& tools, ToolCallText& out) {
  size_t at = inner.find_first_not_of(" \t\r\n");
  if (at == std::string::npos || inner.compare(at, kFunction.size(), kFunction) != 0) return false;
  const size_t name_end = inner.find('>', at);
  if (name_end == std::string::npos) return false;
  out.name = trim(inner.substr(at + kFunction.size(), name_end - at - kFunction.size()));
  if (!tool_name_ok(out.name)) return false;
  nlohmann::ordered_json args = nlohmann::ordered_json::object();
  at = name_end + 1;
  for (;;) {
    at = inner.find_first_not_of(" \t\r\n", at);
    if (at == std::string::npos) break;
    if (inner.compare(at, kFunctionEnd.size(), kFunctionEnd) == 0) {
      at = inner.find_first_not_of(" \t\r\n", at + kFunctionEnd.size());
      if (at != std::string::npos) return false;  // text after the function
      break;
    }
    if (inner.compare(at, kParameter.size(), kParameter) != 0) return false;
    const size_t key_end = inner.find('>', at);
    if (key_end == std::string::npos) return false;
    const std::string key = trim(inner.substr(at + kParameter.size(), key_end - at - kParameter.size()));
    if (key.empty()) return false;
    const size_t v = key_end + 1;
    size_t value_end = inner.find(kParameterEnd, v), next = value_end;
    if (value_end != std::string::npos) {
      next = value_end + kParameterEnd.size();
    } else {
      value_end = std::min({inner.find(kParameter, v), inner.find(kFunctionEnd, v), inner.size()});
      next = value_end;
    }
    std::string value = inner.substr(v, value_end - v);
    if (value.starts_with('\n')) value.erase(0, 1);
    if (value.ends_with('\n')) value.pop_back();
    args[key] = typed_argument<nlohmann::ordered_json>(tools, out.name, key, value);
    at = next;
  }
  out.arguments = args.dump();
  return true;
}

SplitReply split_qwen3_coder(const std::string& text, const nlohmann::json& tools) {
  return split_tagged_calls(text, [&](const std::string& inner, bool, ToolCallText& call) {
    return qwen3_coder_call(inner, tools, call);
  });
}
}  // namespace

ToolCallFormat tool_call_format_of(const std::string& src) {
  if (template_is_harmony(src)) return ToolCallFormat::Harmony;
  // GLM-4.5 writes <tool_call> too, then the name and <arg_key>/<arg_value> pairs.
  if (src.find(kOpen) != std::string::npos && src.find(kArgKey) != std::string::npos) return ToolCallFormat::Glm45;
  // Qwen3-Coder writes <tool_call> too, then <function=NAME> and <parameter=KEY> blocks.
  if (src.find(kOpen) != std::string::npos && src.find(kFunction) != std::string::npos &&
      src.find(kParameter) != std::string::npos)
    return ToolCallFormat::Qwen3CoderXml;
  if (src.find(kOpen) != std::string::npos) return ToolCallFormat::Hermes;
  if (src.find(kDsCallsBegin) != std::string::npos) return ToolCallFormat::DeepSeekV3;
  if (src.find(kMistralCalls) != std::string::npos) return ToolCallFormat::Mistral;
  // Llama 3.1-3.3's templates tell the model to answer with {"name": ..., "parameters": ...}
  // and mark calls with <|python_tag|>.
  if (src.find("<|python_tag|>") != std::string::npos || src.find("\"parameters\": dictionary of argument name") != std::string::npos)
    return ToolCallFormat::Llama3Json;
  return ToolCallFormat::None;
}

const char* to_string(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::Hermes: return "hermes";
    case ToolCallFormat::Llama3Json: return "llama3_json";
    case ToolCallFormat::DeepSeekV3: return "deepseek_v3";
    case ToolCallFormat::Glm45: return "glm45";
    case ToolCallFormat::Qwen3CoderXml: return "qwen3_coder";
    case ToolCallFormat::Mistral: return "mistral";
    case ToolCallFormat::Harmony: return "harmony";
    default: return "none";
  }
}

SplitReply split_tool_calls(ToolCallFormat f, const std::string& text, const nlohmann::json& tools) {
  if (f == ToolCallFormat::Hermes) return split_hermes(text);
  if (f == ToolCallFormat::Glm45) return split_glm45(text, tools);
  if (f == ToolCallFormat::Qwen3CoderXml) return split_qwen3_coder(text, tools);
  if (f == ToolCallFormat::Llama3Json) return split_llama3_json(text);
  if (f == ToolCallFormat::DeepSeekV3) return split_deepseek(text);
  if (f == ToolCallFormat::Mistral) return split_mistral(text);
  if (f == ToolCallFormat::Harmony) {
    HarmonyReply h = parse_harmony(text);
    return SplitReply{trim(h.content), std::move(h.calls)};
  }
  return SplitReply{trim(text), {}};
}

std::string ToolCallStream::push(const std::string& piece) {
  if (format_ == ToolCallFormat::Llama3Json) {
    if (decided_) {
      if (in_call_) held_ += piece;
      return in_call_ ? std::string() : piece;
    }
    held_ += piece;  // blanks before the first character are held until it shows what the reply is
    const size_t first = held_.find_first_not_of(" \t\r\n");
    if (first == std::string::npos) return {};
    decided_ = true;
    in_call_ = held_[first] == '{';
    if (in_call_) return {};
    std::string now;
    now.swap(held_);
    return now;
  }
  if (format_ != ToolCallFormat::Hermes && format_ != ToolCallFormat::DeepSeekV3 && format_ != ToolCallFormat::Glm45 &&
      format_ != ToolCallFormat::Qwen3CoderXml && format_ != ToolCallFormat::Mistral)
    return piece;
  const std::string& tag = opening_tag(format_);
  held_ += piece;
  if (in_call_) return {};
  const size_t open = held_.find(tag);
  if (open != std::string::npos) {
    in_call_ = true;
    std::string now = held_.substr(0, open);
    held_.erase(0, open);
    return now;
  }
  // Hold back the longest tail that could still become the tag.
  size_t keep = 0;
  for (size_t n = std::min(held_.size(), tag.size() - 1); n > 0; --n)
    if (held_.compare(held_.size() - n, n, tag, 0, n) == 0) {
      keep = n;
      break;
    }
  std::string now = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return now;
}

}  // namespace fp
