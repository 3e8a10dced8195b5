// tools/bench_serve/sse.cpp — SSE parsing and OpenAI stream chunks.
#include "tools/bench_serve/sse.h"

#include <nlohmann/json.hpp>

namespace fp::bench_serve {

bool SseParser::feed(std::string_view bytes, std::vector<std::string>& events) {
  for (char c : bytes) {
    if (after_cr_) {
      after_cr_ = false;
      if (c == '\n') continue;  // the "\n" of a "\r\n" split across two feeds or not
    }
    if (c == '\r' || c == '\n') {
      after_cr_ = c == '\r';
      end_line(events);
      continue;
    }
    if (line_.size() >= max_line_bytes) return false;
    line_.push_back(c);
  }
  return true;
}

void SseParser::finish(std::vector<std::string>& events) {
  if (!line_.empty()) end_line(events);
  if (has_data_) end_line(events);  // the blank line that never came
}

void SseParser::end_line(std::vector<std::string>& events) {
  std::string line;
  line.swap(line_);
  if (line.empty()) {  // blank line: dispatch
    if (has_data_) events.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line[0] == ':') return;  // comment (keep-alive pings)
  size_t colon = line.find(':');
  std::string_view field = std::string_view(line).substr(0, colon);
  if (field != "data") return;
  std::string_view value;
  if (colon != std::string::npos) {
    value = std::string_view(line).substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  }
  if (has_data_) data_.push_back('\n');
  data_.append(value);
  has_data_ = true;
}

namespace {

using nlohmann::json;

// A string field, or "" when absent/null; false when present with another type.
bool string_field(const json& obj, const char* key, std::string& out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return true;
  if (!it->is_string()) return false;
  out += it->get<std::string>();
  return true;
}

}  // namespace

bool parse_chunk(const std::string& payload, bool chat, StreamChunk& chunk, std::string* why) {
  chunk = StreamChunk{};
  if (payload == "[DONE]") {
    chunk.done = true;
    return true;
  }
  json j = json::parse(payload, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    if (why) *why = what + ": " + payload.substr(0, 200);
    return false;
  };
  if (j.is_discarded()) return bad("event data is not JSON");
  if (!j.is_object()) return bad("event data is not a JSON object");
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
    chunk.error = error_message_of(payload);
    return true;
  }
  if (auto u = j.find("usage"); u != j.end() && !u->is_null()) {
    if (!u->is_object()) return bad("'usage' is not an object");
    auto count = [&](const char* key, int64_t& out) {
      auto it = u->find(key);
      if (it == u->end() || it->is_null()) return true;
      if (!it->is_number_integer()) return false;
      out = it->get<int64_t>();
      return true;
    };
    if (!count("prompt_tokens", chunk.prompt_tokens) || !count("completion_tokens", chunk.completion_tokens))
      return bad("'usage' token counts are not integers");
    chunk.has_usage = true;
  }
  auto ch = j.find("choices");
  if (ch == j.end() || ch->is_null()) return true;  // e.g. the usage-only final chunk
  if (!ch->is_array()) return bad("'choices' is not an array");
  if (ch->empty()) return true;
  const json& c0 = (*ch)[0];
  if (!c0.is_object()) return bad("'choices[0]' is not an object");
  if (!chat) {
    if (!string_field(c0, "text", chunk.content)) return bad("'choices[0].text' is not a string");
    return true;
  }
  auto d = c0.find("delta");
  if (d == c0.end() || d->is_null()) return true;
  if (!d->is_object()) return bad("'choices[0].delta' is not an object");
  // Reasoning models stream their thinking in a separate field; it is generated output too.
  if (!string_field(*d, "reasoning_content", chunk.content) || !string_field(*d, "content", chunk.content))
    return bad("'choices[0].delta.content' is not a string");
  return true;
}

std::string error_message_of(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_object()) {
    for (const char* key : {"error", "detail", "message"}) {
      auto it = j.find(key);
      if (it == j.end()) continue;
      if (it->is_string()) return it->get<std::string>();
      if (it->is_object()) {
        auto m = it->find("message");
        if (m != it->end() && m->is_string()) return m->get<std::string>();
      }
      return it->dump().substr(0, 300);
    }
  }
  return body.substr(0, 300);
}

}  // namespace fp::bench_serve
