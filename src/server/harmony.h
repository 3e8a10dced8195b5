// server/harmony.h — gpt-oss's replies in OpenAI's harmony format, split as vLLM, SGLang and
// llama.cpp return them through the chat API. The prompt ends with "<|start|>assistant"; the
// reply is a run of messages, each a header and a body:
//   <|channel|>analysis<|message|>THINKING<|end|>
//   <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>
//   <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>
// (the recipient may also stand before the channel: "assistant to=functions.NAME<|channel|>...").
// analysis bodies are the reasoning_content; final bodies and commentary without a recipient
// (preambles to the user) are the content; a message to functions.NAME is a tool call (on the
// commentary channel, or analysis, which gpt-oss sometimes writes); messages to built-in tools
// (browser, python) are reasoning. Markers are found in the decoded text, so a model that writes
// "<|end|>" as plain text ends its message there (vLLM reads token ids); not an issue in practice
// as these strings are single control tokens a model emits as such.
// The markers are control tokens: the reply's text is decoded with them rendered.
#pragma once
#include <string>
#include <vector>

#include "server/reasoning.h"
#include "server/tool_calls.h"

namespace fp {

// Whether a chat template speaks harmony (it writes "<|channel|>").
bool template_is_harmony(const std::string& template_source);

struct HarmonyReply {
  std::string reasoning, content;
  std::vector<ToolCallText> calls;  // commentary to functions.NAME, arguments as written
};

// A whole reply. A reply that does not open with a header, or text that runs on for 256 bytes
// without closing one, is content; a reply cut off inside a header drops that header; a body cut
// off (length, a stop string) counts in its channel, except a call's, which is no call (its text
// is content). Consecutive thinking messages are joined by a newline.
HarmonyReply parse_harmony(const std::string& text);

// The same a piece at a time: push() returns the reasoning and content that can be sent now
// (tool calls are held and come whole from calls() at the end); what may still be a marker is
// held until the next piece or finish().
class HarmonyStream {
 public:
  ReasoningPiece push(const std::string& piece);
  ReasoningPiece finish();
  const std::vector<ToolCallText>& calls() const { return calls_; }

 private:
  // Consumes held_ as far as it can be decided; `final` at the reply's end.
  ReasoningPiece drain(bool final);
  enum class State { Header, Body };
  State state_ = State::Header;
  std::string held_, header_, call_args_;
  enum class Channel { Analysis, Content, Call } channel_ = Channel::Content;
  std::string recipient_;
  bool seen_header_ = false;    // a header was read (text before any is content)
  bool had_reasoning_ = false;  // some thinking went out ...
  bool separate_ = false;       // ... and a new thinking message starts: a newline first
  std::vector<ToolCallText> calls_;
};

}  // namespace fp
