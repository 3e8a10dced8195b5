// server/openai_api.cpp — request validation, stop-string matching and logprob entries.
#include "server/openai_api.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "core/error.h"
#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "engine/regex_grammar.h"
#include "engine/token_constraint.h"
#include "server/reasoning.h"

namespace fp {

nlohmann::json ApiError::body() const {
  return {{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
                     {"code", status}}}};
}

std::vector<Request> ApiRequest::group() const {
  std::vector<Request> out;
  const size_t n_prompts = std::max<size_t>(1, prompts.size());
  for (size_t p = 0; p < n_prompts; ++p)
    for (int j = 0; j < n; ++j) {
      const uint64_t i = p * static_cast<uint64_t>(n) + static_cast<uint64_t>(j);
      Request r = base;
      if (!prompts.empty()) r.prompt = prompts[p];
      if (seed_given) r.sampling.seed = base.sampling.seed + i;
      else r.sampling.seed = base.sampling.seed * 6364136223846793005ull + i + 1;
      out.push_back(std::move(r));
    }
  return out;
}

int64_t ApiRequest::prompt_tokens() const {
  if (prompts.empty()) return static_cast<int64_t>(prompt.size());
  int64_t total = 0;
  for (const auto& p : prompts) total += static_cast<int64_t>(p.size());
  return total;
}

namespace {

ApiError bad(const std::string& param, const std::string& msg) { return ApiError{400, msg, "invalid_request_error", param}; }

// Reads an optional number field in [lo, hi]; integer when `integer`.
std::optional<ApiError> number(const nlohmann::json& b, const char* key, double lo, double hi, bool integer, double& out) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  const auto& v = b[key];
  if (!v.is_number() || (integer && !v.is_number_integer()))
    return bad(key, std::string("'") + key + "' must be " + (integer ? "an integer" : "a number") + ", got " + v.dump());
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) {
    auto shown = [&](double bound) { return integer ? std::to_string(static_cast<long long>(bound)) : nlohmann::json(bound).dump(); };
    std::string range = "[" + shown(lo) + ", " + shown(hi) + "]";
    return bad(key, std::string("'") + key + "' must be in " + range + ", got " + v.dump());
  }
  out = x;
  return std::nullopt;
}

std::optional<ApiError> boolean(const nlohmann::json& b, const char* key, bool& out) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  if (!b[key].is_boolean()) return bad(key, std::string("'") + key + "' must be true or false, got " + b[key].dump());
  out = b[key].get<bool>();
  return std::nullopt;
}

// `tools` and `tool_choice` (chat): checks them, sets the mode, and gives the template its tools.
std::optional<ApiError> parse_tools(const nlohmann::json& b, const nlohmann::ordered_json* ordered, const ApiLimits& lim,
                                    ApiRequest& r, nlohmann::ordered_json& template_vars) {
  const bool has_tools = b.contains("tools") && !b["tools"].is_null();
  const bool has_choice = b.contains("tool_choice") && !b["tool_choice"].is_null();
  if (!has_tools) {
    if (has_choice && !(b["tool_choice"].is_string() && b["tool_choice"] == "none"))
      return bad("tool_choice", "'tool_choice' needs 'tools'");
    return std::nullopt;
  }
  const auto& tools = b["tools"];
  if (!tools.is_array() || tools.empty() || tools.size() > 128) return bad("tools", "'tools' must be a non-empty array of at most 128 tools");
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const auto& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") || !t["function"].is_object())
      return bad(where, "'" + where + "' must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}");
    const auto& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty() || f["name"].get<std::string>().size() > 64)
      return bad(where + ".function.name", "'" + where + ".function.name' must be a string of 1 to 64 characters");
    const std::string name = f["name"].get<std::string>();
    if (!std::all_of(name.begin(), name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }))
      return bad(where + ".function.name", "'" + where + ".function.name' may hold letters, digits, '_' and '-' only, got '" + name + "'");
    if (!names.insert(name).second) return bad(where + ".function.name", "two tools are named '" + name + "'");
    if (f.contains("parameters") && !f["parameters"].is_object() && !f["parameters"].is_null())
      return bad(where + ".function.parameters", "'" + where + ".function.parameters' must be a JSON schema object");
  }
  std::string choice = "auto";
  if (has_choice) {
    const auto& c = b["tool_choice"];
    if (c.is_string()) {
      choice = c.get<std::string>();
      if (choice != "none" && choice != "auto" && choice != "required")
        return bad("tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}, got '" + choice + "'");
    } else if (c.is_object() && c.value("type", "") == "function" && c.contains("function") && c["function"].is_object() &&
               c["function"].contains("name") && c["function"]["name"].is_string()) {
      r.tool_name = c["function"]["name"].get<std::string>();
      if (!names.count(r.tool_name)) return bad("tool_choice", "'tool_choice' names '" + r.tool_name + "', which is not among the tools");
      choice = "named";
    } else {
      return bad("tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
  }
  if (choice == "auto" && lim.tool_call_format == ToolCallFormat::None)
    return bad("tool_choice", "tool_choice 'auto' (the default with tools) needs a parser of this model's tool-call format in free "
                              "text, and this chat template uses none that the server knows (Hermes <tool_call>, Llama-3 JSON, DeepSeek-V3, GLM-4.5); pass tool_choice "
                              "'required' or {\"type\": \"function\", \"function\": {\"name\": ...}} (the call is then written "
                              "under the function's parameter schema), or 'none'");
  r.tool_mode = choice == "named"      ? ApiRequest::ToolMode::Named
                : choice == "required" ? ApiRequest::ToolMode::Required
                : choice == "auto"     ? ApiRequest::ToolMode::Auto
                                       : ApiRequest::ToolMode::None;
  template_vars["tools"] = ordered && ordered->contains("tools") ? (*ordered)["tools"] : nlohmann::ordered_json::parse(tools.dump());
  r.tools = tools;
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_prompt(const nlohmann::json& b, bool chat, const Tokenizer& tok, const ChatTemplate* tmpl,
                                     const ApiLimits& lim, ApiRequest& r, const nlohmann::ordered_json* ordered) {
  if (!b.is_object()) return bad("", "the request body must be a JSON object");
  r.chat = chat;
  if (b.contains("model") && !b["model"].is_null()) {
    if (!b["model"].is_string()) return bad("model", "'model' must be a string");
    r.model = b["model"].get<std::string>();
  }
  if (chat) {
    if (!b.contains("messages")) return bad("messages", "'messages' is required");
    const auto& m = b["messages"];
    if (!m.is_array() || m.empty()) return bad("messages", "'messages' must be a non-empty array of {role, content}");
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    for (size_t i = 0; i < m.size(); ++i) {
      const auto& x = m[i];
      const std::string where = "messages[" + std::to_string(i) + "]";
      if (!x.is_object() || !x.contains("role") || !x["role"].is_string())
        return bad(where + ".role", "'" + where + "' must be an object with a string 'role'");
      if (x.contains("content") && !x["content"].is_string() && !x["content"].is_array() && !x["content"].is_null())
        return bad(where + ".content", "'" + where + ".content' must be a string, an array of parts, or null");
      if (x.contains("content") && x["content"].is_array())
        for (const auto& part : x["content"])
          if (!part.is_object() || (part.contains("text") && !part["text"].is_string()))
            return bad(where + ".content", "'" + where + ".content' parts must be objects like {\"type\": \"text\", \"text\": ...}");
      msgs.push_back(ordered ? (*ordered)["messages"][i] : nlohmann::ordered_json::parse(x.dump()));
    }
    nlohmann::ordered_json vars = nlohmann::ordered_json::object();
    if (auto e = parse_tools(b, ordered, lim, r, vars)) return e;
    // vLLM's add_generation_prompt (the assistant's header after the messages; default true) and
    // continue_final_message (the reply continues the final assistant message instead).
    bool add_generation_prompt = true, continue_final = false;
    if (auto e = boolean(b, "add_generation_prompt", add_generation_prompt)) return e;
    if (auto e = boolean(b, "continue_final_message", continue_final)) return e;
    std::string final_text;  // continue_final_message: the final message's text
    if (continue_final) {
      if (b.contains("add_generation_prompt") && add_generation_prompt)
        return bad("continue_final_message", "'continue_final_message' and 'add_generation_prompt' cannot both be true");
      add_generation_prompt = false;
      const auto& last = m.back();
      if (last["role"] != "assistant")
        return bad("continue_final_message", "'continue_final_message' needs the final message to be the assistant's, got role '" +
                                                 last["role"].get<std::string>() + "'");
      if (last.contains("content")) final_text = chat_content_text(msgs.back()["content"]);
      if (final_text.empty()) return bad("continue_final_message", "'continue_final_message' needs the final message to have text");
    }
    std::string text;
    try {
      text = tmpl ? tmpl->render(msgs, add_generation_prompt, vars) : render_plain_chat(msgs, add_generation_prompt);
    } catch (const Error& e) {
      return bad("messages", std::string("the chat template refused the messages: ") + e.what());
    }
    if (continue_final) {  // cut what the template wrote after the final message's text (its end of turn)
      const size_t at = text.rfind(final_text);
      if (at == std::string::npos)
        return bad("continue_final_message", "the chat template did not write the final message's text as given, so the reply "
                                             "cannot continue it");
      text.resize(at + final_text.size());
    }
    r.harmony = lim.harmony;
    r.split_reasoning = lim.reasoning && !r.harmony;
    r.thinking_opened = r.split_reasoning && prompt_opens_thinking(text);
    r.prompt = tok.encode(text, /*add_special=*/false, /*parse_special=*/true);
    // Templates that do not write BOS themselves (most SPM ones do) get it from the tokenizer.
    if (tok.bos_id() >= 0 && (r.prompt.empty() || r.prompt[0] != tok.bos_id()) && (!tmpl || tmpl->is_fallback()))
      r.prompt.insert(r.prompt.begin(), tok.bos_id());
  } else {
    if (!b.contains("prompt")) return bad("prompt", "'prompt' is required");
    const auto& p = b["prompt"];
    auto ids_of = [&](const nlohmann::json& list, std::vector<int32_t>& out) -> std::optional<ApiError> {
      for (const auto& x : list) {
        const int64_t id = x.get<int64_t>();
        if (id < 0 || id >= tok.n_vocab())
          return bad("prompt", "token id " + std::to_string(id) + " in 'prompt' is outside the vocabulary [0, " +
                                   std::to_string(tok.n_vocab()) + ")");
        out.push_back(static_cast<int32_t>(id));
      }
      return std::nullopt;
    };
    auto all_ids = [](const nlohmann::json& list) {
      return list.is_array() && !list.empty() && std::all_of(list.begin(), list.end(), [](const auto& x) { return x.is_number_integer(); });
    };
    if (p.is_string()) {
      r.prompts.push_back(tok.encode(p.get<std::string>(), true, true));
      r.prompt_texts.push_back(p.get<std::string>());
    } else if (all_ids(p)) {
      r.prompts.emplace_back();
      r.prompt_texts.emplace_back();
      if (auto e = ids_of(p, r.prompts.back())) return e;
    } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](const auto& x) { return x.is_string(); })) {
      for (const auto& x : p) {  // a batch of texts
        r.prompts.push_back(tok.encode(x.get<std::string>(), true, true));
        r.prompt_texts.push_back(x.get<std::string>());
      }
    } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), all_ids)) {
      for (const auto& x : p) {  // a batch of id lists
        r.prompts.emplace_back();
        r.prompt_texts.emplace_back();
        if (auto e = ids_of(x, r.prompts.back())) return e;
      }
    } else {
      return bad("prompt", "'prompt' must be a string, an array of token ids, or a batch: an array of strings or of token-id arrays");
    }
    r.prompt = r.prompts[0];
  }
  return std::nullopt;
}

std::optional<ApiError> parse_request(const nlohmann::json& b, bool chat, const Tokenizer& tok, const ChatTemplate* tmpl,
                                      const ApiLimits& lim, ApiRequest& r, const nlohmann::ordered_json* ordered) {
  if (auto e = parse_prompt(b, chat, tok, tmpl, lim, r, ordered)) return e;
  // vLLM's truncate_prompt_tokens: keep a prompt's last k tokens (-1: as many as the context
  // holds with room for one more).
  double v = 0;
  if (auto e = number(b, "truncate_prompt_tokens", -1, 1e12, true, v = 0)) return e;
  if (v == 0 && b.contains("truncate_prompt_tokens") && !b["truncate_prompt_tokens"].is_null())
    return bad("truncate_prompt_tokens", "'truncate_prompt_tokens' must be -1 or at least 1, got 0");
  const int64_t keep_last = v < 0 ? lim.max_model_len - 1 : static_cast<int64_t>(v);
  int64_t n_prompt = 0;  // the longest prompt
  std::vector<std::vector<int32_t>*> all;
  if (r.prompts.empty()) all.push_back(&r.prompt);
  for (auto& p : r.prompts) all.push_back(&p);
  for (size_t i = 0; i < all.size(); ++i) {
    std::vector<int32_t>& p = *all[i];
    const std::string which = all.size() > 1 ? "prompt " + std::to_string(i) : "the prompt";
    if (p.empty()) {
      if (tok.bos_id() < 0) return bad("prompt", which + " is empty");
      p.push_back(tok.bos_id());
    }
    if (keep_last > 0 && static_cast<int64_t>(p.size()) > keep_last) {
      p.erase(p.begin(), p.end() - keep_last);
      if (!r.prompts.empty()) r.prompt_texts[i].clear();  // echo decodes what is left
    }
    if (static_cast<int64_t>(p.size()) >= lim.max_model_len)
      return bad(chat ? "messages" : "prompt", which + " has " + std::to_string(p.size()) +
                                                   " tokens; this server's maximum context length is " +
                                                   std::to_string(lim.max_model_len) + " tokens (--max-model-len)");
    n_prompt = std::max<int64_t>(n_prompt, static_cast<int64_t>(p.size()));
  }
  if (!r.prompts.empty()) r.prompt = r.prompts[0];
  // Lengths.
  int64_t max_tokens = chat ? lim.max_model_len - n_prompt : 16;
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    v = -1;
    if (auto e = number(b, key, 0, 1e12, true, v)) return e;
    if (v >= 0) {
      if (n_prompt + static_cast<int64_t>(v) > lim.max_model_len)
        return bad(key, "'" + std::string(key) + "' is " + std::to_string(static_cast<int64_t>(v)) + " but the prompt has " +
                            std::to_string(n_prompt) + " tokens and the maximum context length is " +
                            std::to_string(lim.max_model_len) + " tokens");
      max_tokens = static_cast<int64_t>(v);
    }
  }
  r.base.max_new_tokens = static_cast<int32_t>(max_tokens);
  if (auto e = number(b, "min_tokens", 0, static_cast<double>(max_tokens), true, v = 0)) return e;
  r.base.min_tokens = static_cast<int32_t>(v);
  if (auto e = boolean(b, "include_stop_str_in_output", r.include_stop_str)) return e;
  // vLLM's priority: lower runs first, under --scheduling-policy priority only.
  if (auto e = number(b, "priority", -1e9, 1e9, true, v = 0)) return e;
  if (v != 0 && !lim.priority)
    return bad("priority", "'priority' needs the server started with --scheduling-policy priority (it schedules in arrival order)");
  r.base.priority = static_cast<int32_t>(v);
  if (auto e = boolean(b, "skip_special_tokens", r.skip_special_tokens)) return e;
  // Sampling: OpenAI defaults (temperature 1, top_p 1), no top-k / min-p unless asked.
  SamplingParams& s = r.base.sampling;
  s.temperature = 1.0f;
  s.top_p = 1.0f;
  s.top_k = 0;
  s.min_p = 0.0f;
  s.repetition_penalty = 1.0f;
  if (auto e = number(b, "temperature", 0, 2, false, v = 1)) return e;
  s.temperature = static_cast<float>(v);
  if (auto e = number(b, "top_p", 1e-9, 1, false, v = 1)) return e;
  s.top_p = static_cast<float>(v);
  if (auto e = number(b, "top_k", -1, 1 << 30, true, v = 0)) return e;
  s.top_k = static_cast<int32_t>(std::max(0.0, v));
  if (auto e = number(b, "min_p", 0, 1, false, v = 0)) return e;
  s.min_p = static_cast<float>(v);
  if (auto e = number(b, "presence_penalty", -2, 2, false, v = 0)) return e;
  s.presence_penalty = static_cast<float>(v);
  if (auto e = number(b, "frequency_penalty", -2, 2, false, v = 0)) return e;
  s.frequency_penalty = static_cast<float>(v);
  if (auto e = number(b, "repetition_penalty", 1e-6, 100, false, v = 1)) return e;
  s.repetition_penalty = static_cast<float>(v);
  s.repetition_window = 1 << 30;
  r.seed_given = b.contains("seed") && !b["seed"].is_null();
  if (auto e = number(b, "seed", -9.2e18, 9.2e18, true, v = 0)) return e;
  s.seed = r.seed_given ? static_cast<uint64_t>(b["seed"].get<int64_t>()) : 0;
  if (auto e = number(b, "n", 1, lim.max_n, true, v = 1)) return e;
  r.n = static_cast<int>(v);
  if (r.prompts.size() * static_cast<size_t>(r.n) > static_cast<size_t>(lim.max_choices))
    return bad("prompt", "the batch asks for " + std::to_string(r.prompts.size()) + " prompts x " + std::to_string(r.n) +
                             " choices; at most " + std::to_string(lim.max_choices) + " per request");
  bool ignore_eos = false;
  if (auto e = boolean(b, "ignore_eos", ignore_eos)) return e;
  r.base.stop_at_eog = !ignore_eos;
  if (auto e = boolean(b, "stream", r.stream)) return e;
  if (!chat) {
    if (auto e = boolean(b, "echo", r.echo)) return e;
  }
  if (b.contains("prompt_logprobs") && !b["prompt_logprobs"].is_null()) {
    if (auto e = number(b, "prompt_logprobs", 0, lim.max_logprobs, true, v = 0)) return e;
    if (r.stream) return bad("prompt_logprobs", "'prompt_logprobs' is served without streaming here");
    r.prompt_logprobs = static_cast<int>(v);
  }
  if (b.contains("stream_options") && !b["stream_options"].is_null()) {
    if (!b["stream_options"].is_object()) return bad("stream_options", "'stream_options' must be an object");
    if (auto e = boolean(b["stream_options"], "include_usage", r.include_usage)) {
      e->param = "stream_options.include_usage";
      return e;
    }
  }
  if (b.contains("logit_bias") && !b["logit_bias"].is_null()) {  // {"token id": bias in [-100, 100]}
    const auto& lb = b["logit_bias"];
    if (!lb.is_object() || lb.size() > 1024)
      return bad("logit_bias", "'logit_bias' must be an object of at most 1024 \"token id\": bias pairs");
    for (const auto& [key, val] : lb.items()) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != key.size() || key.empty() || id < 0 || id >= tok.n_vocab())
        return bad("logit_bias", "'logit_bias' key '" + key + "' is not a token id in the vocabulary [0, " + std::to_string(tok.n_vocab()) + ")");
      if (!val.is_number() || !(val.get<double>() >= -100 && val.get<double>() <= 100))
        return bad("logit_bias", "'logit_bias' value for token " + key + " must be a number in [-100, 100], got " + val.dump());
      r.base.logit_bias.emplace_back(static_cast<int32_t>(id), val.get<float>());
    }
  }
  // Stop token ids (vLLM's extension): each ends the choice as the end-of-generation token does.
  if (b.contains("stop_token_ids") && !b["stop_token_ids"].is_null()) {
    const auto& st = b["stop_token_ids"];
    if (!st.is_array() || st.size() > 64) return bad("stop_token_ids", "'stop_token_ids' must be an array of at most 64 token ids");
    for (const auto& x : st) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= tok.n_vocab())
        return bad("stop_token_ids", "'stop_token_ids' must hold token ids in the vocabulary [0, " +
                                         std::to_string(tok.n_vocab()) + ")");
      r.base.stop_token_ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
  }
  // Stop strings.
  if (b.contains("stop") && !b["stop"].is_null()) {
    const auto& st = b["stop"];
    if (st.is_string()) {
      r.stop.push_back(st.get<std::string>());
    } else if (st.is_array() && static_cast<int>(st.size()) <= lim.max_stop) {
      for (const auto& x : st) {
        if (!x.is_string()) return bad("stop", "'stop' must be a string or an array of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      return bad("stop", "'stop' must be a string or an array of at most " + std::to_string(lim.max_stop) + " strings");
    }
    for (const auto& x : r.stop)
      if (x.empty()) return bad("stop", "stop strings must not be empty");
  }
  // Log-probabilities.
  r.base.logprobs = -1;
  if (chat) {
    if (auto e = boolean(b, "logprobs", r.chat_logprobs)) return e;
    if (auto e = number(b, "top_logprobs", 0, lim.max_logprobs, true, v = 0)) return e;
    if (b.contains("top_logprobs") && !b["top_logprobs"].is_null() && !r.chat_logprobs)
      return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (r.chat_logprobs) r.base.logprobs = static_cast<int32_t>(v);
  } else if (b.contains("logprobs") && !b["logprobs"].is_null()) {
    if (auto e = number(b, "logprobs", 0, lim.max_logprobs, true, v = 0)) return e;
    r.base.logprobs = static_cast<int32_t>(v);
  }
  r.base.prompt = r.prompt;
  return std::nullopt;
}

ChoiceText::ChoiceText(const Tokenizer& tok, const std::vector<int32_t>& prompt, std::vector<std::string> stop,
                       bool render_special, int64_t min_tokens, bool include_stop)
    : dec_(tok, render_special), stop_(std::move(stop)), min_tokens_(min_tokens), include_stop_(include_stop) {
  for (int32_t t : prompt) (void)dec_.push(t);
  (void)dec_.flush();
  for (const auto& s : stop_) max_stop_ = std::max(max_stop_, s.size());
}

std::string ChoiceText::release(bool all) {
  // Earliest stop string in what is held back (from min_tokens on, ending past what came before).
  size_t best = std::string::npos, best_len = 0;
  if (tokens_ >= min_tokens_)
    for (const auto& s : stop_) {
      const size_t at = held_.find(s, written_early_ >= s.size() ? written_early_ - s.size() + 1 : 0);
      if (at < best) best = at, best_len = s.size();
    }
  if (best != std::string::npos) {
    std::string out = held_.substr(0, best + (include_stop_ ? best_len : 0));
    held_.clear();
    stopped_ = true;
    return out;
  }
  std::string out;
  if (all || max_stop_ == 0) {
    out = std::exchange(held_, std::string());
  } else if (held_.size() >= max_stop_) {
    // Keep the last max_stop-1 bytes (they may begin a stop string), cut at a character start.
    size_t cut = held_.size() - (max_stop_ - 1);
    while (cut > 0 && (static_cast<unsigned char>(held_[cut]) & 0xC0) == 0x80) --cut;
    out = held_.substr(0, cut);
    held_.erase(0, cut);
  }
  written_early_ = tokens_ < min_tokens_ ? held_.size() : written_early_ > out.size() ? written_early_ - out.size() : 0;
  return out;
}

std::string ChoiceText::push(int32_t token) {
  if (stopped_) return {};
  ++tokens_;
  held_ += dec_.push(token);
  return release(false);
}

std::string ChoiceText::finish() {
  if (stopped_) return {};
  held_ += dec_.flush();
  return release(true);
}

nlohmann::json completion_logprob_entry(const Tokenizer& tok, int32_t token, float lp,
                                        const std::vector<std::pair<int32_t, float>>& top) {
  nlohmann::json alt = nlohmann::json::object();
  for (auto& [t, l] : top) alt[tok.token_to_bytes(t, true)] = l;
  return {{"token", tok.token_to_bytes(token, true)}, {"logprob", lp}, {"top_logprobs", alt}};
}

nlohmann::json chat_logprob_entry(const Tokenizer& tok, int32_t token, float lp, const std::vector<std::pair<int32_t, float>>& top) {
  auto bytes_of = [&](int32_t t) {
    std::string b = tok.token_to_bytes(t, true);
    nlohmann::json arr = nlohmann::json::array();
    for (unsigned char c : b) arr.push_back(static_cast<int>(c));
    return std::make_pair(b, arr);
  };
  auto [text, bytes] = bytes_of(token);
  nlohmann::json alts = nlohmann::json::array();
  for (auto& [t, l] : top) {
    auto [at, ab] = bytes_of(t);
    alts.push_back({{"token", at}, {"logprob", l}, {"bytes", ab}});
  }
  return {{"token", text}, {"logprob", lp}, {"bytes", bytes}, {"top_logprobs", alts}};
}

namespace {
// Fields that constrain the reply: OpenAI's response_format; llama.cpp's grammar and json_schema;
// vLLM's guided_* (before 0.12) and structured_outputs (after).
const char* const kConstraintFields[] = {"response_format", "grammar",       "json_schema",    "guided_json",
                                         "guided_regex",    "guided_choice", "guided_grammar", "structured_outputs"};
}

bool needs_ordered_body(const nlohmann::json& b) {
  if (!b.is_object()) return false;
  for (const char* k : kConstraintFields)
    if (b.contains(k) && !b[k].is_null()) return true;
  return b.contains("tools") && !b["tools"].is_null();
}

namespace {

// The schema a tool call is written under: the named function's parameters, or (required) any
// one function as {"name": ..., "arguments": {...}}.
nlohmann::ordered_json tool_call_schema(const nlohmann::ordered_json& tools, const ApiRequest& r) {
  using ojson = nlohmann::ordered_json;
  auto params = [](const ojson& f) { return f.contains("parameters") && f["parameters"].is_object() ? f["parameters"] : ojson{{"type", "object"}}; };
  if (r.tool_mode == ApiRequest::ToolMode::Named) {
    for (const auto& t : tools)
      if (t["function"]["name"] == r.tool_name) return params(t["function"]);
  }
  ojson any = ojson::array();
  for (const auto& t : tools) {
    const ojson& f = t["function"];
    any.push_back({{"type", "object"},
                   {"properties", {{"name", {{"const", f["name"]}}}, {"arguments", params(f)}}},
                   {"required", {"name", "arguments"}}});
  }
  ojson schema = {{"anyOf", any}};
  // $defs of the functions' own schemas stay resolvable from the top.
  for (const auto& t : tools)
    for (const char* section : {"$defs", "definitions"})
      if (t["function"].contains("parameters") && t["function"]["parameters"].contains(section))
        for (const auto& [k, v] : t["function"]["parameters"][section].items()) schema[section][k] = v;
  return schema;
}

}  // namespace

std::optional<nlohmann::json> tool_call_of(const ApiRequest& req, const std::string& text, const std::string& id) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  std::string name = req.tool_name, args = text;
  if (req.tool_mode == ApiRequest::ToolMode::Required) {
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || !j.contains("arguments")) return std::nullopt;
    name = j["name"].get<std::string>();
    args = j["arguments"].dump();
  } else {
    args = j.dump();  // compact, as OpenAI sends arguments
  }
  return nlohmann::json{{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}};
}

// The tokens that open a harmony reply's answer, <|channel|>final<|message|> (empty when the
// vocabulary lacks the control tokens).
std::vector<int32_t> harmony_gate(const Tokenizer& tok) {
  const int32_t channel = tok.find_token("<|channel|>"), message = tok.find_token("<|message|>");
  if (channel < 0 || message < 0 || tok.token_type(channel) != TokenType::Control || tok.token_type(message) != TokenType::Control)
    return {};
  std::vector<int32_t> gate = {channel};
  for (int32_t id : tok.encode("final", false, false)) gate.push_back(id);
  gate.push_back(message);
  return gate;
}

// The request's grammar; with a thinking template, after a <think> block the model writes freely.
std::shared_ptr<const Grammar> constraint_grammar(const std::string& gbnf, const ApiRequest& r) {
  if (!r.split_reasoning) return Grammar::parse(gbnf);
  return Grammar::parse(think_first_gbnf(gbnf, r.thinking_opened), kThinkFirstRoot);
}

namespace {

// The grammar of one constraint of vLLM's kinds: json (a schema or its text), regex (the whole
// reply matches it), choice (the reply is one of these strings) or grammar (GBNF). Throws for a
// schema, pattern or grammar that cannot be used (the caller names the field).
std::optional<ApiError> vllm_constraint(const std::string& kind, const nlohmann::ordered_json& v, const std::string& param,
                                        std::string& gbnf, std::string& what) {
  constexpr size_t kMaxChoices = 4096;
  what = kind == "json" ? "json_schema" : kind;
  if (kind == "json") {
    gbnf = json_schema_to_gbnf(v.is_string() ? nlohmann::ordered_json::parse(v.get<std::string>()) : v);
  } else if (kind == "grammar") {
    if (!v.is_string()) return bad(param, "'" + param + "' must be a string of GBNF rules with a 'root' rule");
    gbnf = v.get<std::string>();
  } else if (kind == "regex") {
    if (!v.is_string()) return bad(param, "'" + param + "' must be a string: a regular expression the whole reply matches");
    gbnf = "root ::= " + regex_text_gbnf(v.get<std::string>()) + "\n";
  } else {  // choice
    if (!v.is_array() || v.empty() || v.size() > kMaxChoices)
      return bad(param, "'" + param + "' must be a list of 1 to " + std::to_string(kMaxChoices) + " strings");
    gbnf = "root ::= ";
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string() || v[i].get<std::string>().empty())
        return bad(param, "'" + param + "' must be a list of non-empty strings; item " + std::to_string(i) + " is not");
      gbnf += (i ? " | " : "") + gbnf_literal(v[i].get<std::string>());
    }
    gbnf += "\n";
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_constraint(const nlohmann::ordered_json& b, const Tokenizer& tok, ApiRequest& r) {
  using ojson = nlohmann::ordered_json;
  Request& out = r.base;
  std::string given;
  for (const char* k : kConstraintFields)
    if (b.contains(k) && !b[k].is_null()) {
      if (!given.empty()) return bad(k, "'" + given + "' and '" + k + "' both constrain the output; give one of them");
      given = k;
    }
  const bool text_format = given == "response_format" && b[given].is_object() && b[given].contains("type") &&
                           b[given]["type"].is_string() && b[given]["type"].get<std::string>() == "text";
  // A harmony reply opens with its channel headers (control tokens) and may think before it
  // answers: the grammar applies from <|channel|>final<|message|> on (harmony_gate). A tool call
  // is a commentary message whose headers the grammar cannot write, so a forced call is refused.
  std::vector<int32_t> gate;
  if (r.harmony && (!given.empty() && !text_format)) {
    gate = harmony_gate(tok);
    if (gate.empty())
      return bad(given, "constrained output with a harmony (gpt-oss) chat template needs the vocabulary's <|channel|> and "
                        "<|message|> control tokens, and this one has none");
  }
  if (r.harmony && (r.tool_mode == ApiRequest::ToolMode::Named || r.tool_mode == ApiRequest::ToolMode::Required))
    return bad("tool_choice", "a tool_choice that names or requires a call is not supported with a harmony (gpt-oss) chat "
                              "template yet; tool_choice auto works");
  if (r.tool_mode == ApiRequest::ToolMode::Named || r.tool_mode == ApiRequest::ToolMode::Required) {
    if (!given.empty()) return bad(given, "'" + given + "' and a tool_choice that calls a tool both constrain the output; give one of them");
    try {
      const ojson schema = tool_call_schema(b["tools"], r);
      out.constraint = std::make_shared<TokenConstraint>(constraint_grammar(json_schema_to_gbnf(schema), r), tok, "tool call");
    } catch (const std::exception& e) {
      return bad("tools", std::string("the tools' parameter schemas cannot be used: ") + e.what());
    }
    return std::nullopt;
  }
  if (given.empty()) return std::nullopt;
  std::string gbnf, what, param = given;
  try {
    const ojson& v = b[given];
    if (given == "response_format") {
      if (!v.is_object() || !v.contains("type") || !v["type"].is_string())
        return bad(param, "'response_format' must be an object with a string 'type' (text, json_object or json_schema)");
      const std::string type = v["type"].get<std::string>();
      if (type == "text") return std::nullopt;
      if (type == "json_object") {
        gbnf = json_object_gbnf();
        what = "json_object";
      } else if (type == "json_schema") {
        param = "response_format.json_schema";
        if (!v.contains("json_schema") || !v["json_schema"].is_object())
          return bad(param, "'response_format' of type json_schema needs 'json_schema': {\"name\": ..., \"schema\": {...}}");
        const ojson& js = v["json_schema"];
        param = "response_format.json_schema.schema";
        if (!js.contains("schema")) return bad(param, "'response_format.json_schema' needs a 'schema'");
        gbnf = json_schema_to_gbnf(js["schema"]);
        what = "json_schema";
      } else {
        return bad("response_format.type", "'response_format.type' must be text, json_object or json_schema, got '" + type + "'");
      }
    } else if (given == "structured_outputs") {
      // vLLM's structured_outputs: one of json, regex, choice, grammar or json_object.
      if (!v.is_object()) return bad(param, "'structured_outputs' must be an object with one of json, regex, choice, grammar or json_object");
      std::string kind;
      for (const auto& [k, x] : v.items()) {
        if (k == "disable_fallback" || x.is_null() || (k == "json_object" && x.is_boolean() && !x.get<bool>())) continue;
        if (k != "json" && k != "regex" && k != "choice" && k != "grammar" && k != "json_object")
          return bad("structured_outputs." + k, "'structured_outputs." + k + "' is not supported (json, regex, choice, grammar and json_object are)");
        if (!kind.empty()) return bad("structured_outputs." + k, "'structured_outputs' has both '" + kind + "' and '" + k + "'; give one of them");
        kind = k;
      }
      if (kind.empty()) return bad(param, "'structured_outputs' needs one of json, regex, choice, grammar or json_object");
      param = "structured_outputs." + kind;
      if (kind == "json_object") {
        if (!v[kind].is_boolean()) return bad(param, "'structured_outputs.json_object' must be true or false");
        gbnf = json_object_gbnf();
        what = "json_object";
      } else if (auto e = vllm_constraint(kind, v[kind], param, gbnf, what)) {
        return e;
      }
    } else if (given == "grammar" || given == "guided_grammar") {
      if (auto e = vllm_constraint("grammar", v, param, gbnf, what)) return e;
    } else if (given == "guided_regex") {
      if (auto e = vllm_constraint("regex", v, param, gbnf, what)) return e;
    } else if (given == "guided_choice") {
      if (auto e = vllm_constraint("choice", v, param, gbnf, what)) return e;
    } else {  // json_schema (llama.cpp) or guided_json (vLLM): the schema itself, or its text
      if (auto e = vllm_constraint("json", v, param, gbnf, what)) return e;
    }
    auto c = std::make_shared<TokenConstraint>(constraint_grammar(gbnf, r), tok, what);
    c->set_gate(std::move(gate));
    out.constraint = std::move(c);
  } catch (const std::exception& e) {
    return bad(param, std::string("'") + param + "' cannot be used: " + e.what());
  }
  return std::nullopt;
}

}  // namespace fp
