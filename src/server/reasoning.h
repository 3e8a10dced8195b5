// server/reasoning.h — a reply's thinking apart from its answer, as DeepSeek's API and vLLM's
// and SGLang's reasoning parsers return it: `message.reasoning_content` beside `content` (and
// `delta.reasoning_content` while streaming). For models that think between <think> and
// </think> (Qwen3, DeepSeek-R1, GLM-4.5): the thinking is the text up to </think>, when the reply
// opens with <think> or when the prompt already opened the block (DeepSeek-R1's template ends the
// prompt with <think>); everything after </think> is the answer. A reply without the block is
// all answer; a reply cut off inside it is all thinking.
#pragma once
#include <string>

namespace fp {

// Whether a chat template's replies think in <think> blocks (it writes "</think>").
bool template_thinks(const std::string& template_source);
// Whether a rendered prompt leaves the reply inside an opened <think> block.
bool prompt_opens_thinking(const std::string& prompt_text);

// A grammar that lets the model think first: a <think> block of any text without </think>
// (required and already open when `opened`; optional otherwise, after up to 4 blanks, as GLM-4.5
// starts its reply with "\n<think>"), blanks, then `gbnf`'s `root` (so without a block the
// answer may start with those blanks).
// Returns GBNF whose start rule is kThinkFirstRoot.
inline constexpr const char* kThinkFirstRoot = "fastpath-think-root";
std::string think_first_gbnf(const std::string& gbnf, bool opened);

struct ReasoningPiece {
  std::string reasoning, content;
};

// The split, a piece at a time: push() returns what can be sent now; what may still be a tag is
// held until the next piece or finish().
class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(bool starts_inside = false) : state_(starts_inside ? State::Inside : State::Start) {}
  ReasoningPiece push(const std::string& piece);
  ReasoningPiece finish();
  // A whole reply at once.
  static ReasoningPiece split(const std::string& text, bool starts_inside);

 private:
  enum class State { Start, Inside, AfterClose, Answer };
  State state_;
  std::string held_;
};

}  // namespace fp
