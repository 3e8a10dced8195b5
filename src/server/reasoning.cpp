// server/reasoning.cpp — the <think> block split: a small state machine over the reply's text
// that holds only what may still be a tag.
#include "server/reasoning.h"

#include <algorithm>

namespace fp {

namespace {
const std::string kThinkOpen = "<think>", kThinkClose = "</think>";
const char* const kThinkBlanks = " \t\r\n";

// The length of the longest tail of `s` that `tag` starts with (a tag that may be arriving).
size_t partial_think_tag(const std::string& s, const std::string& tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.compare(s.size() - n, n, tag, 0, n) == 0) return n;
  return 0;
}
}  // namespace

bool template_thinks(const std::string& template_source) { return template_source.find(kThinkClose) != std::string::npos; }

bool prompt_opens_thinking(const std::string& prompt_text) {
  const size_t end = prompt_text.find_last_not_of(kThinkBlanks);
  return end != std::string::npos && end + 1 >= kThinkOpen.size() && prompt_text.compare(end + 1 - kThinkOpen.size(), kThinkOpen.size(), kThinkOpen) == 0;
}

std::string think_first_gbnf(const std::string& gbnf, bool opened) {
  // Text without "</think>": rule k means the last k characters are its first k (KMP over a tag
  // whose characters all differ, so a mismatch restarts at 0, or at 1 on '<'). Rule 7 ("</think"
  // so far) must not take '>'.
  std::string out = gbnf + "\n";
  for (size_t k = 0; k < kThinkClose.size() - 1; ++k) {
    const char want = kThinkClose[k];
    std::string rule = "fastpath-think-" + std::to_string(k) + " ::= \"\" | \"<\" fastpath-think-1";
    if (k == 0) {
      rule += " | [^<] fastpath-think-0";
    } else {
      const std::string w = want == '/' ? "/" : std::string(1, want);
      rule += " | \"" + w + "\" fastpath-think-" + std::to_string(k + 1) + " | [^<" + w + "] fastpath-think-0";
    }
    out += rule + "\n";
  }
  out += "fastpath-think-7 ::= \"\" | \"<\" fastpath-think-1 | [^<>] fastpath-think-0\n";
  const std::string block = "fastpath-think-0 \"</think>\" [ \\t\\r\\n]{0,8}";
  out += std::string(kThinkFirstRoot) + " ::= " + (opened ? block : "[ \\t\\r\\n]{0,4} (\"<think>\" " + block + ")?") + " root\n";
  return out;
}

ReasoningPiece ReasoningSplitter::push(const std::string& piece) {
  ReasoningPiece out;
  held_ += piece;
  for (;;) {
    switch (state_) {
      case State::Start: {  // blanks, then <think> or the answer
        const size_t first = held_.find_first_not_of(kThinkBlanks);
        if (first == std::string::npos) return out;
        const size_t n = std::min(held_.size() - first, kThinkOpen.size());
        if (held_.compare(first, n, kThinkOpen, 0, n) != 0) {
          state_ = State::Answer;
          break;
        }
        if (n < kThinkOpen.size()) return out;  // "<thi" so far
        held_.erase(0, first + kThinkOpen.size());
        state_ = State::Inside;
        break;
      }
      case State::Inside: {
        const size_t close = held_.find(kThinkClose);
        if (close == std::string::npos) {
          const size_t keep = partial_think_tag(held_, kThinkClose);
          out.reasoning += held_.substr(0, held_.size() - keep);
          held_.erase(0, held_.size() - keep);
          return out;
        }
        out.reasoning += held_.substr(0, close);
        held_.erase(0, close + kThinkClose.size());
        state_ = State::AfterClose;
        break;
      }
      case State::AfterClose: {  // the blanks between </think> and the answer belong to neither
        const size_t first = held_.find_first_not_of(kThinkBlanks);
        if (first == std::string::npos) {
          held_.clear();
          return out;
        }
        held_.erase(0, first);
        state_ = State::Answer;
        break;
      }
      case State::Answer:
        out.content += held_;
        held_.clear();
        return out;
    }
  }
}

ReasoningPiece ReasoningSplitter::finish() {
  ReasoningPiece out;
  if (state_ == State::Inside) out.reasoning = held_;  // cut off inside the block: "</thi" is thinking
  else if (state_ != State::AfterClose) out.content = held_;
  held_.clear();
  return out;
}

ReasoningPiece ReasoningSplitter::split(const std::string& text, bool starts_inside) {
  ReasoningSplitter s(starts_inside);
  ReasoningPiece out = s.push(text);
  const ReasoningPiece rest = s.finish();
  out.reasoning += rest.reasoning;
  out.content += rest.content;
  return out;
}

}  // namespace fp
