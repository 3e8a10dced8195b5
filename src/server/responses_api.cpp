// server/responses_api.cpp — see responses_api.h.
#include "server/responses_api.h"

#include <string>
#include <utility>

namespace fp {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

ApiError responses_error(const std::string& param, const std::string& msg) { return ApiError{400, msg, "invalid_request_error", param}; }

std::string quote_field(const std::string& where) { return "'" + where + "'"; }

// A message's content (a string, or parts of text) as one text.
std::optional<ApiError> content_text(const ordered_json& c, const std::string& where, std::string* out) {
  out->clear();
  if (c.is_null()) return std::nullopt;
  if (c.is_string()) {
    *out = c.get<std::string>();
    return std::nullopt;
  }
  if (!c.is_array()) return responses_error(where, quote_field(where) + " must be a string or an array of content parts");
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    const ordered_json& part = c[i];
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      return responses_error(at + ".type", quote_field(at) + " must be an object with a string 'type'");
    const std::string type = part["type"].get<std::string>();
    const char* key = type == "refusal" ? "refusal" : "text";
    if (type != "input_text" && type != "output_text" && type != "text" && type != "refusal")
      return responses_error(at + ".type", quote_field(at + ".type") + " is '" + type + "': only text parts (input_text, output_text) are supported here");
    if (!part.contains(key) || !part[key].is_string()) return responses_error(at + "." + key, quote_field(at + "." + key) + " must be a string");
    *out += part[key].get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> string_field(const ordered_json& o, const char* key, const std::string& where, std::string* out) {
  if (!o.contains(key) || !o[key].is_string()) return responses_error(where + "." + key, quote_field(where + "." + key) + " must be a string");
  *out = o[key].get<std::string>();
  return std::nullopt;
}

// The request's input items as chat messages.
std::optional<ApiError> input_messages(const ordered_json& input, ordered_json& msgs) {
  if (input.is_string()) {
    msgs.push_back({{"role", "user"}, {"content", input.get<std::string>()}});
    return std::nullopt;
  }
  if (!input.is_array()) return responses_error("input", "'input' must be a string or an array of input items");
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string where = "input[" + std::to_string(i) + "]";
    const ordered_json& item = input[i];
    if (!item.is_object()) return responses_error(where, quote_field(where) + " must be an object");
    std::string type = item.contains("role") ? "message" : "";
    if (item.contains("type")) {
      if (!item["type"].is_string()) return responses_error(where + ".type", quote_field(where + ".type") + " must be a string");
      type = item["type"].get<std::string>();
    }
    if (type == "message") {
      std::string role, text;
      if (auto e = string_field(item, "role", where, &role)) return e;
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        return responses_error(where + ".role", quote_field(where + ".role") + " is '" + role + "' (user, assistant, system or developer)");
      if (auto e = content_text(item.contains("content") ? item["content"] : ordered_json(), where + ".content", &text)) return e;
      msgs.push_back({{"role", role == "developer" ? "system" : role}, {"content", text}});
    } else if (type == "function_call") {
      std::string call_id, name, arguments;
      if (auto e = string_field(item, "call_id", where, &call_id)) return e;
      if (auto e = string_field(item, "name", where, &name)) return e;
      if (auto e = string_field(item, "arguments", where, &arguments)) return e;
      ordered_json call = {{"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
      // Calls after an assistant message (or after other calls) belong to that message.
      if (!msgs.empty() && msgs.back()["role"] == "assistant") {
        if (!msgs.back().contains("tool_calls")) msgs.back()["tool_calls"] = ordered_json::array();
        msgs.back()["tool_calls"].push_back(std::move(call));
      } else {
        msgs.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", ordered_json::array({std::move(call)})}});
      }
    } else if (type == "function_call_output") {
      std::string call_id, text;
      if (auto e = string_field(item, "call_id", where, &call_id)) return e;
      if (!item.contains("output")) return responses_error(where + ".output", quote_field(where + ".output") + " is required");
      if (auto e = content_text(item["output"], where + ".output", &text)) return e;
      msgs.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", text}});
    } else if (type == "reasoning") {
      continue;  // an earlier turn's thinking: chat templates drop it from the history too
    } else {
      return responses_error(where + ".type", quote_field(where + ".type") + " is '" + type +
                                      "': input items are message, function_call, function_call_output or reasoning");
    }
  }
  return std::nullopt;
}

// body[key] when present and not null, else `fallback`.
json echoed(const json& body, const char* key, json fallback) {
  return body.contains(key) && !body[key].is_null() ? body[key] : std::move(fallback);
}

json usage_of(const json& chat_usage) {
  if (!chat_usage.is_object()) return nullptr;
  int64_t cached = 0;
  if (chat_usage.contains("prompt_tokens_details") && chat_usage["prompt_tokens_details"].is_object())
    cached = chat_usage["prompt_tokens_details"].value("cached_tokens", int64_t{0});
  return {{"input_tokens", chat_usage.value("prompt_tokens", 0)},
          {"input_tokens_details", {{"cached_tokens", cached}}},
          {"output_tokens", chat_usage.value("completion_tokens", 0)},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", chat_usage.value("total_tokens", 0)}};
}

json response_object(const ResponseHeader& h, const std::string& status, json output, json usage) {
  const json& r = h.request;
  return {{"id", h.id},
          {"object", "response"},
          {"created_at", h.created_at},
          {"status", status},
          {"error", nullptr},
          {"incomplete_details", status == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
          {"instructions", echoed(r, "instructions", nullptr)},
          {"max_output_tokens", echoed(r, "max_output_tokens", nullptr)},
          {"model", h.model},
          {"output", std::move(output)},
          {"parallel_tool_calls", echoed(r, "parallel_tool_calls", true)},
          {"previous_response_id", nullptr},
          {"reasoning", echoed(r, "reasoning", json{{"effort", nullptr}, {"summary", nullptr}})},
          {"store", false},
          {"temperature", echoed(r, "temperature", 1.0)},
          {"text", echoed(r, "text", json{{"format", {{"type", "text"}}}})},
          {"tool_choice", echoed(r, "tool_choice", "auto")},
          {"tools", echoed(r, "tools", json::array())},
          {"top_p", echoed(r, "top_p", 1.0)},
          {"truncation", "disabled"},
          {"usage", std::move(usage)},
          {"user", echoed(r, "user", nullptr)},
          {"metadata", echoed(r, "metadata", json::object())}};
}

// Output item ids: "<prefix>_<the response id's suffix>_<index>".
std::string item_id(const ResponseHeader& h, const char* prefix, size_t index) {
  const size_t cut = h.id.find('_');
  return std::string(prefix) + "_" + (cut == std::string::npos ? h.id : h.id.substr(cut + 1)) + "_" + std::to_string(index);
}

json text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
}
json message_item(const std::string& id, const std::string& text, const char* status) {
  return {{"type", "message"}, {"id", id}, {"status", status}, {"role", "assistant"},
          {"content", text.empty() && std::string(status) == "in_progress" ? json::array() : json::array({text_part(text)})}};
}
json reasoning_item(const std::string& id, const std::string& text, const char* status) {
  return {{"type", "reasoning"}, {"id", id}, {"summary", json::array()}, {"status", status},
          {"content", text.empty() ? json::array() : json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}
json function_call_item(const std::string& id, const json& tool_call, const char* status, bool with_arguments) {
  return {{"type", "function_call"}, {"id", id}, {"call_id", tool_call["id"]}, {"name", tool_call["function"]["name"]},
          {"arguments", with_arguments ? tool_call["function"]["arguments"] : json("")}, {"status", status}};
}

}  // namespace

std::optional<ApiError> responses_to_chat(const ordered_json& b, ordered_json* chat) {
  if (!b.is_object()) return responses_error("", "the request body must be a JSON object");
  ordered_json out = ordered_json::object();
  if (b.contains("previous_response_id") && !b["previous_response_id"].is_null())
    return responses_error("previous_response_id", "'previous_response_id': this server stores no responses; send the conversation in 'input'");
  if (b.contains("background") && b["background"].is_boolean() && b["background"].get<bool>())
    return responses_error("background", "'background': responses run in the foreground here");
  if (b.contains("top_logprobs") && b["top_logprobs"].is_number() && b["top_logprobs"].get<double>() > 0)
    return responses_error("top_logprobs", "'top_logprobs': log-probabilities are served by /v1/chat/completions here");
  if (b.contains("model")) out["model"] = b["model"];
  ordered_json msgs = ordered_json::array();
  if (b.contains("instructions") && !b["instructions"].is_null()) {
    if (!b["instructions"].is_string()) return responses_error("instructions", "'instructions' must be a string");
    msgs.push_back({{"role", "system"}, {"content", b["instructions"]}});
  }
  if (!b.contains("input") || b["input"].is_null()) return responses_error("input", "'input' is required");
  if (auto e = input_messages(b["input"], msgs)) return e;
  if (msgs.empty() || (msgs.size() == 1 && msgs[0]["role"] == "system")) return responses_error("input", "'input' holds no messages");
  out["messages"] = std::move(msgs);
  if (b.contains("max_output_tokens") && !b["max_output_tokens"].is_null()) {
    const auto& m = b["max_output_tokens"];
    if (!m.is_number_integer() || m.get<int64_t>() < 1) return responses_error("max_output_tokens", "'max_output_tokens' must be a positive integer");
    out["max_tokens"] = m;
  }
  for (const char* key : {"temperature", "top_p", "stream", "seed", "stop", "top_k", "min_p", "repetition_penalty"})
    if (b.contains(key)) out[key] = b[key];
  if (b.contains("stream") && b["stream"].is_boolean() && b["stream"].get<bool>()) out["stream_options"] = {{"include_usage", true}};
  if (b.contains("tools") && !b["tools"].is_null()) {
    const auto& tools = b["tools"];
    if (!tools.is_array()) return responses_error("tools", "'tools' must be an array");
    ordered_json chat_tools = ordered_json::array();
    for (size_t i = 0; i < tools.size(); ++i) {
      const std::string where = "tools[" + std::to_string(i) + "]";
      const auto& t = tools[i];
      if (!t.is_object() || !t.contains("type") || !t["type"].is_string())
        return responses_error(where + ".type", quote_field(where) + " must be an object with a string 'type'");
      if (t["type"] != "function")
        return responses_error(where + ".type", quote_field(where + ".type") + " is '" + t["type"].get<std::string>() +
                                        "': only function tools run here (the client runs them)");
      std::string name;
      if (auto e = string_field(t, "name", where, &name)) return e;
      ordered_json f = {{"name", name}};
      for (const char* key : {"description", "parameters", "strict"})
        if (t.contains(key) && !t[key].is_null()) f[key] = t[key];
      chat_tools.push_back({{"type", "function"}, {"function", std::move(f)}});
    }
    if (!chat_tools.empty()) out["tools"] = std::move(chat_tools);
  }
  if (b.contains("tool_choice") && !b["tool_choice"].is_null()) {
    const auto& c = b["tool_choice"];
    if (c.is_string()) {
      out["tool_choice"] = c;
    } else if (c.is_object() && c.contains("type") && c["type"] == "function" && c.contains("name") && c["name"].is_string()) {
      out["tool_choice"] = {{"type", "function"}, {"function", {{"name", c["name"]}}}};
    } else {
      return responses_error("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}");
    }
  }
  if (b.contains("text") && !b["text"].is_null()) {
    const auto& t = b["text"];
    if (!t.is_object()) return responses_error("text", "'text' must be an object like {\"format\": {\"type\": \"text\"}}");
    if (t.contains("format") && !t["format"].is_null()) {
      const auto& f = t["format"];
      const std::string type = f.is_object() && f.contains("type") && f["type"].is_string() ? f["type"].get<std::string>() : "";
      if (type == "json_object") {
        out["response_format"] = {{"type", "json_object"}};
      } else if (type == "json_schema") {
        if (!f.contains("schema") || !f["schema"].is_object())
          return responses_error("text.format.schema", "'text.format.schema' must be a JSON schema object");
        ordered_json js = {{"name", f.contains("name") && f["name"].is_string() ? f["name"] : ordered_json("response")},
                           {"schema", f["schema"]}};
        if (f.contains("strict")) js["strict"] = f["strict"];
        out["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
      } else if (type != "text") {
        return responses_error("text.format.type", "'text.format.type' must be \"text\", \"json_object\" or \"json_schema\"");
      }
    }
  }
  *chat = std::move(out);
  return std::nullopt;
}

json response_from_chat(const ResponseHeader& h, const json& chat) {
  const json& choice = chat["choices"][0];
  const json& msg = choice["message"];
  json output = json::array();
  if (msg.contains("reasoning_content") && msg["reasoning_content"].is_string() && !msg["reasoning_content"].get<std::string>().empty())
    output.push_back(reasoning_item(item_id(h, "rs", output.size()), msg["reasoning_content"].get<std::string>(), "completed"));
  const json calls = msg.contains("tool_calls") ? msg["tool_calls"] : json::array();
  const std::string text = msg.contains("content") && msg["content"].is_string() ? msg["content"].get<std::string>() : "";
  const std::string status = choice.value("finish_reason", "") == "length" ? "incomplete" : "completed";
  if (!text.empty() || calls.empty()) output.push_back(message_item(item_id(h, "msg", output.size()), text, status.c_str()));
  for (const json& tc : calls) output.push_back(function_call_item(item_id(h, "fc", output.size()), tc, "completed", true));
  return response_object(h, status, std::move(output), usage_of(chat.value("usage", json())));
}

std::string ResponseStream::event(const std::string& type, json data) {
  data["type"] = type;
  data["sequence_number"] = seq_++;
  return "event: " + type + "\ndata: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

json ResponseStream::response(const std::string& status) const {
  return response_object(h_, status, output_, status == "in_progress" ? json(nullptr) : usage_of(usage_));
}

std::string ResponseStream::start() {
  std::string out = event("response.created", {{"response", response("in_progress")}});
  return out + event("response.in_progress", {{"response", response("in_progress")}});
}

std::string ResponseStream::close_open() {
  std::string out;
  const size_t index = output_.size();
  if (open_ == Open::Reasoning) {
    const std::string id = item_id(h_, "rs", index);
    out += event("response.reasoning_text.done", {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"text", text_}});
    json item = reasoning_item(id, text_, "completed");
    out += event("response.output_item.done", {{"output_index", index}, {"item", item}});
    output_.push_back(std::move(item));
  } else if (open_ == Open::Message) {
    const std::string id = item_id(h_, "msg", index);
    out += event("response.output_text.done",
                 {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"text", text_}, {"logprobs", json::array()}});
    out += event("response.content_part.done", {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"part", text_part(text_)}});
    json item = message_item(id, text_, finish_reason_ == "length" ? "incomplete" : "completed");
    out += event("response.output_item.done", {{"output_index", index}, {"item", item}});
    output_.push_back(std::move(item));
  }
  open_ = Open::None;
  text_.clear();
  return out;
}

std::string ResponseStream::chunk(const json& c) {
  std::string out;
  if (c.contains("usage") && c["usage"].is_object()) usage_ = c["usage"];
  if (!c.contains("choices")) return out;
  for (const json& ch : c["choices"]) {
    const json delta = ch.contains("delta") ? ch["delta"] : json::object();
    if (delta.contains("reasoning_content") && delta["reasoning_content"].is_string()) {
      const std::string piece = delta["reasoning_content"].get<std::string>();
      if (!piece.empty()) {
        if (open_ != Open::Reasoning) {
          out += close_open();
          out += event("response.output_item.added", {{"output_index", output_.size()}, {"item", reasoning_item(item_id(h_, "rs", output_.size()), "", "in_progress")}});
          open_ = Open::Reasoning;
        }
        text_ += piece;
        out += event("response.reasoning_text.delta",
                     {{"item_id", item_id(h_, "rs", output_.size())}, {"output_index", output_.size()}, {"content_index", 0}, {"delta", piece}});
      }
    }
    if (delta.contains("content") && delta["content"].is_string()) {
      const std::string piece = delta["content"].get<std::string>();
      if (!piece.empty()) {
        if (open_ != Open::Message) {
          out += close_open();
          const std::string id = item_id(h_, "msg", output_.size());
          out += event("response.output_item.added", {{"output_index", output_.size()}, {"item", message_item(id, "", "in_progress")}});
          out += event("response.content_part.added",
                       {{"item_id", id}, {"output_index", output_.size()}, {"content_index", 0}, {"part", text_part("")}});
          open_ = Open::Message;
        }
        text_ += piece;
        out += event("response.output_text.delta", {{"item_id", item_id(h_, "msg", output_.size())},
                                                     {"output_index", output_.size()},
                                                     {"content_index", 0},
                                                     {"delta", piece},
                                                     {"logprobs", json::array()}});
      }
    }
    if (delta.contains("tool_calls") && delta["tool_calls"].is_array()) {
      out += close_open();
      for (const json& tc : delta["tool_calls"]) {  // whole calls: the chat stream sends each at once
        const size_t at = output_.size();
        const std::string id = item_id(h_, "fc", at);
        out += event("response.output_item.added", {{"output_index", at}, {"item", function_call_item(id, tc, "in_progress", false)}});
        out += event("response.function_call_arguments.delta",
                     {{"item_id", id}, {"output_index", at}, {"delta", tc["function"]["arguments"]}});
        out += event("response.function_call_arguments.done",
                     {{"item_id", id}, {"output_index", at}, {"name", tc["function"]["name"]}, {"arguments", tc["function"]["arguments"]}});
        json item = function_call_item(id, tc, "completed", true);
        out += event("response.output_item.done", {{"output_index", at}, {"item", item}});
        output_.push_back(std::move(item));
      }
    }
    if (ch.contains("finish_reason") && ch["finish_reason"].is_string()) finish_reason_ = ch["finish_reason"].get<std::string>();
  }
  return out;
}

std::string ResponseStream::finish() {
  std::string out = close_open();
  bool answered = false;  // a message or a call: a reply of thinking alone still gets an (empty) message
  for (const json& item : output_) answered = answered || item["type"] != "reasoning";
  if (!answered) {
    const size_t at = output_.size();
    const std::string id = item_id(h_, "msg", at);
    out += event("response.output_item.added", {{"output_index", at}, {"item", message_item(id, "", "in_progress")}});
    out += event("response.content_part.added", {{"item_id", id}, {"output_index", at}, {"content_index", 0}, {"part", text_part("")}});
    open_ = Open::Message;
    out += close_open();
  }
  const std::string status = finish_reason_ == "length" ? "incomplete" : "completed";
  return out + event("response." + status, {{"response", response(status)}});
}

}  // namespace fp
