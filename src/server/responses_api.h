// server/responses_api.h — POST /v1/responses (OpenAI's Responses API, which vLLM also serves and
// agents such as Codex and the Agents SDK speak) on top of the chat path: a request becomes a
// chat completions body (input items -> messages, function tools -> chat tools, text.format ->
// response_format), the chat reply becomes a Response object (reasoning, message and
// function_call output items), and a chat stream's chunks become the Responses' typed SSE events.
// Stateless: previous_response_id is refused (nothing is stored), as are non-function tools and
// image or file inputs.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/openai_api.h"

namespace fp {

// The chat completions body for a Responses request (`body` read with its keys in order, so that
// tools' and schemas' keys keep theirs). Errors name the Responses field ("input[2].content[0].type").
std::optional<ApiError> responses_to_chat(const nlohmann::ordered_json& body, nlohmann::ordered_json* chat);

// A Response object in progress or finished: the request's settings echoed, id and creation time.
struct ResponseHeader {
  std::string id;  // "resp_..."
  int64_t created_at = 0;
  std::string model;
  nlohmann::json request;  // the Responses body as received
};

// The finished Response for a non-streaming chat completion (one choice).
nlohmann::json response_from_chat(const ResponseHeader& h, const nlohmann::json& chat_completion);

// Turns a chat stream's chunks (one choice, with a final usage chunk) into Responses events, each
// "event: TYPE\ndata: JSON\n\n" with a running sequence_number.
class ResponseStream {
 public:
  explicit ResponseStream(ResponseHeader h) : h_(std::move(h)) {}
  std::string start();                              // response.created, response.in_progress
  std::string chunk(const nlohmann::json& chunk);   // a chat.completion.chunk
  std::string finish();                             // closes open items; response.completed / .incomplete

 private:
  std::string event(const std::string& type, nlohmann::json data);
  std::string close_open();
  nlohmann::json response(const std::string& status) const;
  ResponseHeader h_;
  int64_t seq_ = 0;
  nlohmann::json output_ = nlohmann::json::array();  // finished items
  enum class Open { None, Reasoning, Message } open_ = Open::None;
  std::string text_;             // the open item's text so far
  std::string finish_reason_;
  nlohmann::json usage_;
};

}  // namespace fp
