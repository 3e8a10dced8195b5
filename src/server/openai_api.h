// server/openai_api.h — the OpenAI request/response formats: validating a JSON body into
// engine requests (400s name the offending field), detokenizing each choice with stop strings
// matched across token boundaries, and building the response and SSE chunk objects.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sequence.h"
#include "server/tool_calls.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace fp {

// An OpenAI-style error: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message, type = "invalid_request_error", param;
  nlohmann::json body() const;
};

struct ApiRequest {
  bool chat = false;
  std::string model;
  std::vector<int32_t> prompt;  // the (first) prompt
  // /v1/completions: a batch's prompts ('prompt' as a list of strings or of id lists; one
  // otherwise), each with n choices: choice p * n + j is prompt p's j-th. prompt_texts: each
  // prompt's text as given (empty for ids).
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;
  bool echo = false;  // completions: each choice's text (and logprobs) starts with its prompt's
  // vLLM's prompt_logprobs: each prompt token's log-probability, rank and this many alternatives
  // (-1: not asked).
  int prompt_logprobs = -1;
  Request base;                 // prompt, max_new_tokens, sampling, stop_at_eog, logprobs
  int n = 1;
  bool seed_given = false;
  std::vector<std::string> stop;
  bool include_stop_str = false;    // vLLM's include_stop_str_in_output
  bool skip_special_tokens = true;  // vLLM's skip_special_tokens (false: control tokens as text)
  bool stream = false, include_usage = false;
  bool chat_logprobs = false;   // chat: logprobs true (top_logprobs alternatives)
  // Tool calling (chat, `tools` + `tool_choice`): with "required" or a named function the reply
  // is a call, written under the function's parameter schema (constrained decoding) and
  // returned as message.tool_calls. "auto" (the default with tools) lets the model write text,
  // calls or both, found afterwards by the parser of the template's call format
  // (server/tool_calls.h: Hermes, Llama-3 JSON, DeepSeek-V3, GLM-4.5); a template without a known format
  // refuses it by name.
  // "none" renders the tools and writes text.
  enum class ToolMode { None, Named, Required, Auto };
  ToolMode tool_mode = ToolMode::None;
  std::string tool_name;        // ToolMode::Named: the function
  nlohmann::json tools;         // the request's tools (parameter types for the parsers that need them)
  // Chat with a thinking template (ApiLimits::reasoning): the reply's <think> block is split off
  // as reasoning_content, and a constraint applies after it (the model thinks first);
  // `thinking_opened` when the prompt opened the block.
  bool split_reasoning = false, thinking_opened = false;
  // Chat with a harmony template (gpt-oss, server/harmony.h): the reply is decoded with its
  // control tokens and split into reasoning_content, content and tool calls by channel.
  bool harmony = false;
  // The engine requests: n per prompt, in choice order (seeds seed, seed+1, ... when a seed was
  // given, counting on across the prompts).
  std::vector<Request> group() const;
  int64_t prompt_tokens() const;  // every prompt's tokens, counted once (usage)
};

struct ApiLimits {
  int64_t max_model_len = 0;
  int max_n = 16;
  int max_choices = 256;  // prompts x n of one completions request
  int max_stop = 4;
  int max_logprobs = 20;
  ToolCallFormat tool_call_format = ToolCallFormat::None;  // how the chat template writes tool calls
  bool reasoning = false;  // the chat template thinks in <think> blocks and the parser is on
  bool harmony = false;    // the chat template speaks harmony (gpt-oss)
  bool priority = false;   // the engine schedules by priority (--scheduling-policy priority)
};

// Parses and validates a /v1/completions (chat=false) or /v1/chat/completions body. Returns an
// error instead of throwing for any problem with the request.
// `ordered`: the same body read with its keys in order (needs_ordered_body), for the tools
// given to the chat template.
std::optional<ApiError> parse_request(const nlohmann::json& body, bool chat, const Tokenizer& tok, const ChatTemplate* tmpl,
                                      const ApiLimits& limits, ApiRequest& out, const nlohmann::ordered_json* ordered = nullptr);

// The prompt of such a body alone, as parse_request reads it (model, messages through the chat
// template with the tools, or prompt as text or token ids), into out.prompt and out.model; no
// length check, and an empty prompt stays empty (POST /tokenize counts what it is given).
std::optional<ApiError> parse_prompt(const nlohmann::json& body, bool chat, const Tokenizer& tok, const ChatTemplate* tmpl,
                                     const ApiLimits& limits, ApiRequest& out, const nlohmann::ordered_json* ordered = nullptr);

// Constrained decoding: response_format ({"type": "text" | "json_object" | "json_schema"}),
// llama.cpp's `grammar` (GBNF) and `json_schema`, vLLM's `guided_json`, or a tool call that
// parse_request chose (at most one of them). Sets out.base.constraint; the body is read with its
// keys in order (a schema's properties are written in the order given). A schema or grammar that
// cannot be compiled is a 400 naming the field.
std::optional<ApiError> parse_constraint(const nlohmann::ordered_json& body, const Tokenizer& tok, ApiRequest& out);
// Whether a body holds a schema, grammar or tools (whose key order matters: parse it ordered too).
bool needs_ordered_body(const nlohmann::json& body);
// The tokens that open a harmony (gpt-oss) reply's answer, <|channel|>final<|message|>: a
// constraint's gate (engine/token_constraint.h). Empty when the vocabulary has no such control
// tokens.
std::vector<int32_t> harmony_gate(const Tokenizer& tok);
// A finished tool-call choice's text as OpenAI's tool_calls entry: {id, type, function: {name,
// arguments}}; nullopt when the text is not a whole call (it ran out of tokens).
std::optional<nlohmann::json> tool_call_of(const ApiRequest& req, const std::string& text, const std::string& id);

// One choice's text as it streams: StreamDecoder primed with the prompt, plus stop strings.
// Text that could still be the start of a stop string is held back until it cannot be.
class ChoiceText {
 public:
  // render_special: control tokens decode to their text (harmony replies keep their markers).
  // min_tokens: no stop string ends the text before this many tokens, nor one wholly written
  // before them (vLLM's min_tokens); include_stop: the matched stop string ends the text
  // instead of being cut (vLLM's include_stop_str_in_output).
  ChoiceText(const Tokenizer& tok, const std::vector<int32_t>& prompt, std::vector<std::string> stop,
             bool render_special = false, int64_t min_tokens = 0, bool include_stop = false);
  // Text now safe to send. After a stop string matched, stopped() is true and later tokens
  // are ignored.
  std::string push(int32_t token);
  std::string finish();  // the held-back rest (no stop matched)
  bool stopped() const { return stopped_; }
  int64_t tokens() const { return tokens_; }  // tokens consumed up to the stop

 private:
  std::string release(bool all);
  StreamDecoder dec_;
  std::vector<std::string> stop_;
  size_t max_stop_ = 0;
  std::string held_;
  bool stopped_ = false;
  int64_t tokens_ = 0;
  int64_t min_tokens_ = 0;
  bool include_stop_ = false;
  size_t written_early_ = 0;  // leading bytes of held_ written before min_tokens
};

// Log-probability entries in the formats the two endpoints use.
nlohmann::json completion_logprob_entry(const Tokenizer& tok, int32_t token, float lp,
                                        const std::vector<std::pair<int32_t, float>>& top);
nlohmann::json chat_logprob_entry(const Tokenizer& tok, int32_t token, float lp, const std::vector<std::pair<int32_t, float>>& top);

}  // namespace fp
