// server/tool_calls.h — tool calls in free text (tool_choice "auto"), in the format the model's
// chat template teaches it:
//  - Hermes (Qwen2.5, Qwen3 and others): each call a JSON object {"name": ..., "arguments":
//    {...}} between <tool_call> and </tool_call>, anywhere in the reply;
//  - Llama-3 JSON (Llama 3.1-3.3 instruct): the whole reply is the call(s), {"name": ...,
//    "parameters": {...}}, several separated by ';' (after <|python_tag|>, a control token that
//    decodes to nothing);
//  - DeepSeek-V3: <｜tool▁calls▁begin｜>, then per call <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
//    and the arguments in a ```json fence, <｜tool▁call▁end｜>; then <｜tool▁calls▁end｜>;
//  - GLM-4.5 (and 4.6): <tool_call>NAME, then <arg_key>K</arg_key><arg_value>V</arg_value> per
//    argument, </tool_call>; values are JSON where they parse, strings where the tool declares
//    a string parameter or they do not (the tools are needed to tell "42" the string from 42);
//  - Qwen3-Coder XML: <tool_call>, then <function=NAME>, per argument <parameter=K>\nV\n</parameter>
//    (the value as written, multi-line), </function></tool_call>; values typed as GLM-4.5's;
//  - Mistral: the control token [TOOL_CALLS], then a JSON array of {"name", "arguments"} (Mistral
//    7B v0.3, Nemo, Small 3.0/3.1), or NAME[ARGS]{...} per call, each after its own [TOOL_CALLS]
//    (the v11+ tokenizers: Small 3.2, Magistral, Devstral); replies are decoded with their control
//    tokens so that the marker reaches the parser;
//  - harmony (gpt-oss): a commentary message to functions.NAME (server/harmony.h), in a reply
//    decoded with its control tokens; split_tool_calls gives the reply's content and calls.
// A reply splits into its text and its calls; while streaming, text goes out at once and a call
// is held until the reply ends, then sent whole (as vLLM's hermes and llama3_json parsers send it).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp {

enum class ToolCallFormat { None, Hermes, Llama3Json, DeepSeekV3, Glm45, Qwen3CoderXml, Mistral, Harmony };

// The format a chat template writes calls in (None: no parser here for it).
ToolCallFormat tool_call_format_of(const std::string& template_source);
const char* to_string(ToolCallFormat f);

struct ToolCallText {
  std::string name, arguments;  // arguments: compact JSON text
};

struct SplitReply {
  std::string content;               // the text outside the calls (trimmed)
  std::vector<ToolCallText> calls;   // in order; what is not a valid call stays in content
};

// `tools`: the request's tools array (OpenAI's shape), for formats whose values need the types.
SplitReply split_tool_calls(ToolCallFormat f, const std::string& text, const nlohmann::json& tools = nlohmann::json());

// A reply as it streams: push() returns the text safe to send now; what may be a call is held
// (held()) for split_tool_calls at the end.
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat f = ToolCallFormat::Hermes) : format_(f) {}
  std::string push(const std::string& piece);
  const std::string& held() const { return held_; }

 private:
  ToolCallFormat format_;
  std::string held_;
  bool in_call_ = false;  // the tagged formats: the opening tag was seen; Llama-3 JSON: the reply began with '{'
  bool decided_ = false;  // Llama-3 JSON: the first non-blank character was seen
};

}  // namespace fp
