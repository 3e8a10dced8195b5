// server/tool_calls.h — tool calls in free text (tool_choice "auto"), in the format the model's
// chat template teaches it:
//  - Hermes (Qwen2.5, Qwen3 and others): each call a JSON object {"name": ..., "arguments":
//    {...}} between <tool_call> and </tool_call>, anywhere in the reply;
//  - Llama-3 JSON (Llama 3.1-3.3 instruct): the whole reply is the call(s), {"name": ...,
//    "parameters": {...}}, several separated by ';' (after <|python_tag|>, a control token that
//    decodes to nothing);
//  - DeepSeek-V3: <｜tool▁calls▁begin｜>, then per call <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
//    and the arguments in a ```json fence, <｜tool▁call▁end｜>; then <｜tool▁calls▁end｜>.
// A reply splits into its text and its calls; while streaming, text goes out at once and a call
// is held until the reply ends, then sent whole (as vLLM's hermes and llama3_json parsers send it).
#pragma once
#include <string>
#include <vector>

namespace fp {

enum class ToolCallFormat { None, Hermes, Llama3Json, DeepSeekV3 };

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

SplitReply split_tool_calls(ToolCallFormat f, const std::string& text);

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
  bool in_call_ = false;  // Hermes, DeepSeek: the opening tag was seen; Llama-3 JSON: the reply began with '{'
  bool decided_ = false;  // Llama-3 JSON: the first non-blank character was seen
};

}  // namespace fp
