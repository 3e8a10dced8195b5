// server/tool_calls.h — tool calls in free text (tool_choice "auto"), for models whose chat
// template uses the Hermes format (Qwen2.5, Qwen3 and others): each call is a JSON object
// {"name": ..., "arguments": {...}} between <tool_call> and </tool_call>. A reply splits into its
// text and its calls; while streaming, text before a call goes out at once and the call is
// held until the reply ends (as vLLM's hermes parser sends it, whole).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp {

struct ToolCallText {
  std::string name, arguments;  // arguments: compact JSON text
};

struct SplitReply {
  std::string content;               // the text outside the calls (trimmed)
  std::vector<ToolCallText> calls;   // in order; a block that is not a valid call stays in content
};

// Whether a chat template writes tool calls in the Hermes format.
bool template_uses_hermes_tool_calls(const std::string& template_source);

SplitReply split_hermes_tool_calls(const std::string& text);

// A reply as it streams: push() returns the text safe to send now; from the first "<tool_call>"
// (or what may be its start, at the end of the text so far) everything is held for the end.
class HermesToolStream {
 public:
  std::string push(const std::string& piece);
  const std::string& held() const { return held_; }

 private:
  std::string held_;
  bool in_call_ = false;
};

}  // namespace fp
