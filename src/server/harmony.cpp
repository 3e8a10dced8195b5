// server/harmony.cpp — the harmony reply parser (see harmony.h): a two-state machine (reading
// a message's header, reading its body) over the decoded text, holding back only what may be
// the start of a marker.
#include "server/harmony.h"

#include <algorithm>
#include <array>
#include <string_view>

namespace fp {
namespace {

constexpr std::string_view kStart = "<|start|>", kChannel = "<|channel|>", kMessage = "<|message|>";
constexpr size_t kMaxHeader = 256;  // bytes of a header before it is taken for text
constexpr std::array<std::string_view, 4> kBodyEnds = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};
constexpr std::array<std::string_view, 7> kMarkers = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>",
                                                      "<|call|>", "<|return|>", "<|constrain|>"};

// Length of the longest suffix of s that is a proper prefix of a marker (it may become one).
size_t marker_prefix_at_end(std::string_view s) {
  const size_t from = s.size() > 16 ? s.size() - 16 : 0;
  for (size_t i = from; i < s.size(); ++i) {
    if (s[i] != '<') continue;
    const std::string_view tail = s.substr(i);
    for (std::string_view m : kMarkers)
      if (tail.size() < m.size() && m.substr(0, tail.size()) == tail) return s.size() - i;
  }
  return 0;
}

// The word after `key` in a header, up to a blank or a marker ("" when absent).
std::string word_after(std::string_view header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string_view::npos) return {};
  size_t b = at + key.size();
  while (b < header.size() && header[b] == ' ') ++b;
  size_t e = b;
  while (e < header.size() && header[e] != ' ' && header[e] != '\n' && header.compare(e, 2, "<|") != 0) ++e;
  return std::string(header.substr(b, e - b));
}

// Whether a reply's first text can be the start of a header (the prompt ended "<|start|>assistant").
bool may_open_header(std::string_view s) {
  for (std::string_view h : {kChannel, kStart, std::string_view(" to="), std::string_view("to=")}) {
    const size_t n = std::min(s.size(), h.size());
    if (s.substr(0, n) == h.substr(0, n)) return true;
  }
  return false;
}

}  // namespace

bool template_is_harmony(const std::string& template_source) {
  return template_source.find("<|channel|>") != std::string::npos && template_source.find("<|message|>") != std::string::npos;
}

ReasoningPiece HarmonyStream::push(const std::string& piece) {
  held_ += piece;
  return drain(false);
}

ReasoningPiece HarmonyStream::finish() { return drain(true); }

ReasoningPiece HarmonyStream::drain(bool final) {
  ReasoningPiece out;
  auto emit = [&](std::string_view text) {
    if (text.empty()) return;
    if (channel_ == Channel::Call) {
      call_args_.append(text);
      return;
    }
    if (channel_ == Channel::Analysis) {
      if (separate_) out.reasoning += '\n';  // messages of thinking, one per line (as vLLM joins them)
      out.reasoning.append(text);
      had_reasoning_ = true;
    } else {
      out.content.append(text);
    }
    separate_ = false;
  };
  // A body ends: a call is complete only when its message ended (<|call|>, <|end|>, ...); one
  // cut off (max_tokens, a stop string) is no call, and its text goes out as content.
  auto end_body = [&](bool complete) {
    if (channel_ == Channel::Call) {
      if (complete) calls_.push_back({recipient_.substr(std::string_view("functions.").size()), call_args_});
      else out.content += call_args_;
    }
    call_args_.clear();
    header_.clear();
    state_ = State::Header;
  };
  for (;;) {
    if (state_ == State::Header) {
      const bool not_harmony = !seen_header_ && header_.empty() && !held_.empty() && !may_open_header(held_);
      const size_t at = held_.find(kMessage);
      // A header is a few words; text that runs on without <|message|> is not one (and would be
      // searched again with every piece).
      const bool runaway = at == std::string::npos && held_.size() > kMaxHeader;
      if (not_harmony || runaway) {  // a reply (or a stretch of one) that ignores the format: content
        seen_header_ = true;
        channel_ = Channel::Content;
        state_ = State::Body;
        continue;
      }
      if (at == std::string::npos) {
        if (final) held_.clear();  // cut off inside a header: no message began, nothing to send
        break;
      }
      header_ += held_.substr(0, at);
      held_.erase(0, at + kMessage.size());
      // "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json": the channel's
      // first word, and the recipient wherever "to=" stands.
      const std::string channel = word_after(header_, kChannel);
      recipient_ = word_after(header_, "to=");
      if (recipient_.rfind("functions.", 0) == 0 && recipient_.size() > std::string_view("functions.").size())
        channel_ = Channel::Call;  // on commentary as the format teaches, or analysis as the model sometimes writes
      else if (channel == "analysis" || !recipient_.empty()) channel_ = Channel::Analysis;  // thinking, or a built-in tool's call
      else channel_ = Channel::Content;  // final, or a commentary preamble
      if (channel_ == Channel::Analysis) separate_ = had_reasoning_;
      seen_header_ = true;
      state_ = State::Body;
      continue;
    }
    // Body: up to the first end marker; hold what may still become one.
    size_t end = std::string::npos, end_len = 0;
    for (std::string_view m : kBodyEnds) {
      const size_t at = held_.find(m);
      if (at < end) end = at, end_len = m.size();
    }
    if (end == std::string::npos) {
      const size_t keep = final ? 0 : marker_prefix_at_end(held_);
      emit(std::string_view(held_).substr(0, held_.size() - keep));
      held_.erase(0, held_.size() - keep);
      if (final) end_body(false);
      break;
    }
    emit(std::string_view(held_).substr(0, end));
    const bool restart = held_.compare(end, end_len, kStart) == 0;  // "<|start|>" begins the next header
    held_.erase(0, restart ? end : end + end_len);
    end_body(true);
    if (held_.rfind(kStart, 0) == 0) held_.erase(0, kStart.size());
  }
  return out;
}

HarmonyReply parse_harmony(const std::string& text) {
  HarmonyStream s;
  ReasoningPiece a = s.push(text), b = s.finish();
  HarmonyReply r;
  r.reasoning = a.reasoning + b.reasoning;
  r.content = a.content + b.content;
  r.calls = s.calls();
  return r;
}

}  // namespace fp
