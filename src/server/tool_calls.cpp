// server/tool_calls.cpp — splitting Hermes-format replies into text and tool calls.
#include "server/tool_calls.h"

#include <algorithm>

namespace fp {

namespace {
const std::string kOpen = "<tool_call>", kClose = "</tool_call>";

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return {};
  const size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}
}  // namespace

bool template_uses_hermes_tool_calls(const std::string& template_source) { return template_source.find(kOpen) != std::string::npos; }

SplitReply split_hermes_tool_calls(const std::string& text) {
  SplitReply out;
  std::string content;
  size_t at = 0;
  while (at < text.size()) {
    const size_t open = text.find(kOpen, at);
    if (open == std::string::npos) break;
    const size_t body = open + kOpen.size();
    const size_t close = text.find(kClose, body);
    const std::string inner = text.substr(body, close == std::string::npos ? std::string::npos : close - body);
    const nlohmann::json j = nlohmann::json::parse(inner, nullptr, false);
    const bool valid = !j.is_discarded() && j.is_object() && j.contains("name") && j["name"].is_string() &&
                       (!j.contains("arguments") || j["arguments"].is_object());
    const size_t end = close == std::string::npos ? text.size() : close + kClose.size();
    if (valid) {
      content += text.substr(at, open - at);
      out.calls.push_back({j["name"].get<std::string>(), j.contains("arguments") ? j["arguments"].dump() : "{}"});
    } else {
      content += text.substr(at, end - at);  // not a call: it stays text
    }
    at = end;
  }
  if (at < text.size()) content += text.substr(at);
  out.content = trim(content);
  return out;
}

std::string HermesToolStream::push(const std::string& piece) {
  if (in_call_) {
    held_ += piece;
    return {};
  }
  held_ += piece;
  const size_t open = held_.find(kOpen);
  if (open != std::string::npos) {
    in_call_ = true;
    std::string now = held_.substr(0, open);
    held_.erase(0, open);
    return now;
  }
  // Hold back the longest tail that could still become "<tool_call>".
  size_t keep = 0;
  for (size_t n = std::min(held_.size(), kOpen.size() - 1); n > 0; --n)
    if (held_.compare(held_.size() - n, n, kOpen, 0, n) == 0) {
      keep = n;
      break;
    }
  std::string now = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return now;
}

}  // namespace fp
