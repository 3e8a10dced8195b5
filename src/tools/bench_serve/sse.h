// tools/bench_serve/sse.h — Server-Sent Events as an OpenAI-compatible server streams them:
// an incremental parser (bytes arrive split anywhere, even inside "\r\n") and the reading of
// one event's JSON payload from /v1/completions or /v1/chat/completions.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fp::bench_serve {

// Incremental SSE parser (the WHATWG event-stream grammar, "data" field only): lines end in
// "\n", "\r\n" or "\r"; consecutive "data:" lines join with "\n"; a blank line ends an event;
// lines starting with ":" are comments; other fields (event, id, retry) are ignored.
class SseParser {
 public:
  // Appends bytes; the data of every event they complete is pushed to `events`.
  // Returns false when one line grows past max_line_bytes (the stream is not SSE).
  bool feed(std::string_view bytes, std::vector<std::string>& events);
  // End of stream: an event whose closing blank line never came is completed.
  void finish(std::vector<std::string>& events);
  size_t max_line_bytes = 16u << 20;

 private:
  void end_line(std::vector<std::string>& events);
  std::string line_;  // the current, unfinished line
  std::string data_;  // data of the event being built
  bool has_data_ = false;
  bool after_cr_ = false;  // the previous byte was "\r": a following "\n" belongs to it
};

// One streamed chunk of an OpenAI-style response.
struct StreamChunk {
  bool done = false;        // the "[DONE]" sentinel
  std::string content;      // choices[0].text (completions) or choices[0].delta.content (chat)
  bool has_usage = false;   // a non-null "usage" object (stream_options.include_usage)
  int64_t prompt_tokens = -1, completion_tokens = -1;
  std::string error;        // an {"error": ...} event's message
};

// Reads one event payload. Returns false with *why set when it is not a JSON object or has
// fields of the wrong type; an error object is a successful parse with chunk.error set.
bool parse_chunk(const std::string& payload, bool chat, StreamChunk& chunk, std::string* why);

// The message of an OpenAI-style error body ({"error": {"message": ...}}, or {"detail": ...}
// as FastAPI servers write it), else the body itself cut to 300 bytes.
std::string error_message_of(const std::string& body);

}  // namespace fp::bench_serve
