// tests/responses_api_test.cpp — server/responses_api without a model: a Responses request as the
// chat body it becomes (roles, function calls merged into the assistant turn, tools, tool_choice,
// text.format), and a chat stream's chunks (thinking, text, calls, usage) as the Responses events,
// whose final Response equals the one made from the same reply in one piece.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/responses_api.h"

namespace fp {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

TEST(ResponsesApi, RequestBecomesAChatBody) {
  const ordered_json body = ordered_json::parse(R"({
    "model": "m", "instructions": "Be brief.", "max_output_tokens": 64, "temperature": 0.5, "stream": true,
    "input": [
      {"role": "developer", "content": "Use tools."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Oslo?"}]},
      {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
      {"type": "reasoning", "id": "rs_1", "summary": []},
      {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\":\"Oslo\"}"},
      {"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "rain"},
      {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]}
    ],
    "tools": [{"type": "function", "name": "weather", "description": "d", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}],
    "tool_choice": {"type": "function", "name": "weather"},
    "text": {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object", "properties": {"b": {}, "a": {}}}, "strict": true}}
  })");
  ordered_json chat;
  ASSERT_FALSE(responses_to_chat(body, &chat));
  const ordered_json want = ordered_json::parse(R"({
    "model": "m",
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "system", "content": "Use tools."},
      {"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}},
        {"id": "c2", "type": "function", "function": {"name": "time", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "rain"},
      {"role": "tool", "tool_call_id": "c2", "content": "noon"}
    ],
    "max_tokens": 64, "temperature": 0.5, "stream": true, "stream_options": {"include_usage": true},
    "tools": [{"type": "function", "function": {"name": "weather", "description": "d", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}}],
    "tool_choice": {"type": "function", "function": {"name": "weather"}},
    "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object", "properties": {"b": {}, "a": {}}}, "strict": true}}
  })");
  EXPECT_EQ(chat, want) << chat.dump(1);
  // The schema's keys keep their order (b before a): constrained decoding writes them so.
  EXPECT_EQ(chat["response_format"]["json_schema"]["schema"]["properties"].begin().key(), "b");

  ordered_json plain;
  ASSERT_FALSE(responses_to_chat(ordered_json::parse(R"({"input": "hi", "text": {"format": {"type": "json_object"}}})"), &plain));
  EXPECT_EQ(plain, ordered_json::parse(R"({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}})"));
}

TEST(ResponsesApi, RefusesWhatItCannotServeByField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"([])", ""},
      {R"({})", "input"},
      {R"({"input": 5})", "input"},
      {R"({"input": []})", "input"},
      {R"({"input": [7]})", "input[0]"},
      {R"({"input": [{"role": "tool", "content": "x"}]})", "input[0].role"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]})", "input[0].content[0].type"},
      {R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})", "input[0].call_id"},
      {R"({"input": [{"type": "function_call_output", "call_id": "c"}]})", "input[0].output"},
      {R"({"input": "x", "instructions": 3})", "instructions"},
      {R"({"input": "x", "tools": [{"type": "function"}]})", "tools[0].name"},
      {R"({"input": "x", "tools": [{"type": "file_search"}]})", "tools[0].type"},
      {R"({"input": "x", "tool_choice": {"type": "web_search"}})", "tool_choice"},
      {R"({"input": "x", "tool_choice": {"type": 3, "name": "f"}})", "tool_choice"},
      {R"({"input": [{"type": 3}]})", "input[0].type"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]})", "input[0].content[0].text"},
      {R"({"input": "x", "tools": [{"type": "function", "name": 1}]})", "tools[0].name"},
      {R"({"input": "x", "text": {"format": {"type": 1}}})", "text.format.type"},
      {R"({"input": "x", "text": "json"})", "text"},
      {R"({"input": "x", "text": {"format": {"type": "json_schema"}}})", "text.format.schema"},
      {R"({"input": "x", "background": true})", "background"},
      {R"({"input": "x", "top_logprobs": 3})", "top_logprobs"},
      {R"({"input": "x", "max_output_tokens": 1.5})", "max_output_tokens"},
  };
  for (const auto& [body, param] : cases) {
    ordered_json chat;
    const auto err = responses_to_chat(ordered_json::parse(body), &chat);
    ASSERT_TRUE(err) << body;
    EXPECT_EQ(err->status, 400) << body;
    EXPECT_EQ(err->param, param) << body << ": " << err->message;
  }
}

// The events of a stream, parsed: (type, data).
std::vector<json> parse_events(const std::string& sse) {
  std::vector<json> out;
  size_t at = 0;
  while ((at = sse.find("data: ", at)) != std::string::npos) {
    const size_t end = sse.find('\n', at);
    out.push_back(json::parse(sse.substr(at + 6, end - at - 6)));
    at = end;
  }
  return out;
}

ResponseHeader header() {
  ResponseHeader h;
  h.id = "resp_abc";
  h.created_at = 1700000000;
  h.model = "m";
  h.request = {{"input", "x"}};
  return h;
}

json chunk(const json& delta, const json& finish = nullptr) {
  return {{"choices", json::array({{{"index", 0}, {"delta", delta}, {"finish_reason", finish}}})}};
}

TEST(ResponsesApi, StreamEventsAddUpToTheWholeResponse) {
  const json usage = {{"prompt_tokens", 7}, {"completion_tokens", 5}, {"total_tokens", 12}};
  const json call = {{"id", "call_1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{\"a\":1}"}}}};
  ResponseStream s(header());
  std::string sse = s.start();
  sse += s.chunk(chunk({{"reasoning_content", "Let me "}}));
  sse += s.chunk(chunk({{"reasoning_content", "think."}}));
  sse += s.chunk(chunk({{"content", "Hi "}}));
  sse += s.chunk(chunk({{"content", "there."}}));
  sse += s.chunk(chunk({{"tool_calls", json::array({call})}}));
  sse += s.chunk(chunk(json::object(), "tool_calls"));
  sse += s.chunk({{"choices", json::array()}, {"usage", usage}});
  sse += s.finish();
  const std::vector<json> events = parse_events(sse);
  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    types.push_back(events[i]["type"]);
    EXPECT_EQ(events[i]["sequence_number"], i);
  }
  const std::vector<std::string> want = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.reasoning_text.delta", "response.reasoning_text.delta",
      "response.reasoning_text.done", "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done",
      "response.output_item.done", "response.completed"};
  EXPECT_EQ(types, want);
  // Every SSE block names its event as its data's type does.
  EXPECT_NE(sse.find("event: response.output_text.delta\ndata: {"), std::string::npos);
  // The same reply in one piece gives the same Response.
  const json whole = {{"choices", json::array({{{"index", 0},
                                                 {"message", {{"role", "assistant"}, {"content", "Hi there."},
                                                              {"reasoning_content", "Let me think."}, {"tool_calls", {call}}}},
                                                 {"finish_reason", "tool_calls"}}})},
                      {"usage", usage}};
  const json r = response_from_chat(header(), whole);
  EXPECT_EQ(events.back()["response"], r);
  ASSERT_EQ(r["output"].size(), 3u);
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "Let me think.");
  EXPECT_EQ(r["output"][1]["content"][0]["text"], "Hi there.");
  EXPECT_EQ(r["output"][2]["call_id"], "call_1");
  EXPECT_EQ(r["output"][2]["id"], "fc_abc_2");
  EXPECT_EQ(r["usage"]["input_tokens"], 7);
  EXPECT_EQ(r["usage"]["output_tokens"], 5);
  EXPECT_EQ(r["status"], "completed");
}

TEST(ResponsesApi, AReplyCutShortIsIncompleteAndThinkingAloneGetsAnEmptyMessage) {
  ResponseStream s(header());
  std::string sse = s.start();
  sse += s.chunk(chunk({{"reasoning_content", "Hmm"}}));
  sse += s.chunk(chunk(json::object(), "length"));
  sse += s.finish();
  const std::vector<json> events = parse_events(sse);
  ASSERT_FALSE(events.empty());
  const json& r = events.back()["response"];
  EXPECT_EQ(events.back()["type"], "response.incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  ASSERT_EQ(r["output"].size(), 2u);
  EXPECT_EQ(r["output"][1]["type"], "message");
  EXPECT_EQ(r["output"][1]["content"][0]["text"], "");
  EXPECT_EQ(r["output"][1]["status"], "incomplete");
  const json whole = {{"choices", json::array({{{"index", 0},
                                                 {"message", {{"role", "assistant"}, {"content", ""}, {"reasoning_content", "Hmm"}}},
                                                 {"finish_reason", "length"}}})}};
  const json one = response_from_chat(header(), whole);
  EXPECT_EQ(one["output"], r["output"]);
}

}  // namespace
}  // namespace fp
