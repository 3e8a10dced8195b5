// server/tokenize_api.h — POST /tokenize and POST /detokenize (vLLM's routes, which llama.cpp's
// server also has): a prompt's token ids as the server itself would tokenize it (text, or chat
// messages through the chat template), and ids back to text. Clients use them to count tokens
// against max_model_len and to check a template before sending a request.
#pragma once
#include <optional>

#include <nlohmann/json.hpp>

#include "server/openai_api.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace fp {

// {"prompt": TEXT} (vLLM; "content" as llama.cpp names it) or {"messages": [...]} (through the
// chat template, with "tools", as a chat request's prompt is built), plus "add_special_tokens"
// (vLLM, default true for prompt) or "add_special" (llama.cpp, default false for content) and
// "return_token_strs". `ordered`: the body read with its keys in order where it has tools
// (needs_ordered_body), as the chat template gets them. Sets *out to {"count", "max_model_len",
// "tokens"[, "token_strs"]} and *model to the body's "model"; an error names the field.
std::optional<ApiError> tokenize_response(const nlohmann::json& body, const nlohmann::ordered_json* ordered, const Tokenizer& tok,
                                          const ChatTemplate* tmpl, const ApiLimits& limits, nlohmann::json* out,
                                          std::string* model);

// {"tokens": [ids]} -> {"prompt": TEXT, "content": TEXT} (vLLM's key and llama.cpp's; control
// tokens written as their text, as vLLM's detokenize does). Ids outside the vocabulary are
// refused by index.
std::optional<ApiError> detokenize_response(const nlohmann::json& body, const Tokenizer& tok, nlohmann::json* out,
                                            std::string* model);

}  // namespace fp
