// server/tokenize_api.cpp — see tokenize_api.h.
#include "server/tokenize_api.h"

#include <string>
#include <vector>

namespace fp {
namespace {

ApiError bad_field(const std::string& param, const std::string& msg) { return ApiError{400, msg, "invalid_request_error", param}; }

// body[key] as a bool, `fallback` when absent or null.
std::optional<ApiError> flag(const nlohmann::json& body, const char* key, bool fallback, bool* out) {
  *out = fallback;
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_boolean()) return bad_field(key, std::string("'") + key + "' must be true or false");
  *out = body[key].get<bool>();
  return std::nullopt;
}

std::optional<ApiError> model_of(const nlohmann::json& body, std::string* model) {
  model->clear();
  if (!body.contains("model") || body["model"].is_null()) return std::nullopt;
  if (!body["model"].is_string()) return bad_field("model", "'model' must be a string");
  *model = body["model"].get<std::string>();
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> tokenize_response(const nlohmann::json& body, const nlohmann::ordered_json* ordered, const Tokenizer& tok,
                                          const ChatTemplate* tmpl, const ApiLimits& limits, nlohmann::json* out,
                                          std::string* model) {
  if (!body.is_object()) return bad_field("", "the request body must be a JSON object");
  if (auto e = model_of(body, model)) return e;
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    ApiRequest r;
    if (auto e = parse_prompt(body, /*chat=*/true, tok, tmpl, limits, r, ordered)) return e;
    ids = std::move(r.prompt);
  } else {
    const char* key = body.contains("prompt") ? "prompt" : body.contains("content") ? "content" : nullptr;
    if (!key) return bad_field("prompt", "'prompt' (or llama.cpp's 'content') or 'messages' is required");
    if (!body[key].is_string()) return bad_field(key, std::string("'") + key + "' must be a string");
    bool add_special = false;
    // Each server's own default: vLLM adds BOS to a prompt, llama.cpp not to content.
    const bool llama_cpp = std::string(key) == "content";
    if (auto e = flag(body, llama_cpp ? "add_special" : "add_special_tokens", !llama_cpp, &add_special)) return e;
    ids = tok.encode(body[key].get<std::string>(), add_special, /*parse_special=*/true);
  }
  bool strs = false;
  if (auto e = flag(body, "return_token_strs", false, &strs)) return e;
  *out = {{"count", ids.size()}, {"max_model_len", limits.max_model_len}, {"tokens", ids}};
  if (strs) {
    nlohmann::json pieces = nlohmann::json::array();
    for (int32_t id : ids) pieces.push_back(tok.spec().tokens[static_cast<size_t>(id)]);
    (*out)["token_strs"] = std::move(pieces);
  }
  return std::nullopt;
}

std::optional<ApiError> detokenize_response(const nlohmann::json& body, const Tokenizer& tok, nlohmann::json* out,
                                            std::string* model) {
  if (!body.is_object()) return bad_field("", "the request body must be a JSON object");
  if (auto e = model_of(body, model)) return e;
  if (!body.contains("tokens") || !body["tokens"].is_array())
    return bad_field("tokens", "'tokens' is required: an array of token ids");
  const nlohmann::json& t = body["tokens"];
  std::vector<int32_t> ids;
  ids.reserve(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    const std::string where = "tokens[" + std::to_string(i) + "]";
    if (!t[i].is_number_integer()) return bad_field("tokens", "'" + where + "' is not an integer token id");
    const int64_t id = t[i].get<int64_t>();
    if (id < 0 || id >= tok.n_vocab())
      return bad_field("tokens", "'" + where + "' is " + std::to_string(id) + ", outside the vocabulary [0, " +
                                     std::to_string(tok.n_vocab()) + ")");
    ids.push_back(static_cast<int32_t>(id));
  }
  const std::string text = tok.decode(ids, /*render_special=*/true);
  *out = {{"prompt", text}, {"content", text}};
  return std::nullopt;
}

}  // namespace fp
