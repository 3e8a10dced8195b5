// server/http_server.cpp — routes, authentication, request limits, JSON and SSE responses,
// client disconnects and graceful shutdown.
#include "server/http_server.h"

#include <httplib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/hash.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/embedder.h"
#include "engine/prompt_scorer.h"
#include "model/lora.h"
#include "server/async_engine.h"
#include "server/embeddings_api.h"
#include "server/harmony.h"
#include "server/openai_api.h"
#include "server/reasoning.h"
#include "server/responses_api.h"
#include "server/tokenize_api.h"
#include "server/tool_calls.h"

namespace fp {

namespace {

using nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string new_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  const uint64_t n = ++counter;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%llx%06llx", prefix, static_cast<unsigned long long>(unix_time()),
                static_cast<unsigned long long>(n));
  return buf;
}

// Debian's cpp-httplib is built with a listen backlog of 5: a burst of connections beyond
// that is dropped by the kernel and clients see resets. httplib does not expose its socket,
// so find our listening socket by its port and listen() again with a deep backlog (Linux
// updates the backlog of a listening socket in place).
void raise_listen_backlog(int port) {
  for (int fd = 3; fd < 4096; ++fd) {
    int accepting = 0;
    socklen_t len = sizeof accepting;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || !accepting) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof addr;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int p = -1;
    if (addr.ss_family == AF_INET) p = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6) p = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    if (p == port) ::listen(fd, 4096);
  }
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(e.body()), "application/json");
}

// One choice while its events arrive.
struct Choice {
  std::unique_ptr<ChoiceText> text;
  std::string content;
  std::string finish_reason;
  bool done = false;
  int64_t cached_tokens = 0;      // prompt tokens the prefix cache held (with the first token)
  json logprobs = json::array();  // entries, in token order
  ToolCallStream tool_stream;     // tool_choice auto, streamed: text goes out, a call waits for the end
  ReasoningSplitter reasoning;    // streamed with a thinking template: <think> ... </think> apart
  std::string answer;             // ... and the text after it
  HarmonyStream harmony;          // streamed with a harmony template: channels apart
};

// One API call: its parsed request, engine stream and choices.
struct Call {
  ApiRequest req;
  // POST /v1/responses: the Response's header, and its stream's events made from the chat chunks.
  std::optional<ResponseHeader> response;
  std::unique_ptr<ResponseStream> response_stream;
  std::shared_ptr<RequestStream> stream;
  std::vector<Choice> choices;
  std::string id, model;
  int64_t created = 0;
  bool role_sent = false;
  bool echo_pending = false;  // streamed echo: the prompts' text (and log-probabilities) go out first
  bool wrote_any = false;
  int idle_polls = 0;
  int64_t completion_tokens() const {
    int64_t n = 0;
    for (auto& c : choices) n += c.text->tokens();
    return n;
  }
  bool all_done() const {
    for (auto& c : choices)
      if (!c.done) return false;
    return true;
  }
  json usage() const {
    const int64_t p = req.prompt_tokens() * static_cast<int64_t>(choices.size() ? 1 : 0);
    int64_t cached = 0;  // each prompt once, as its first choice found it
    for (size_t i = 0; i < choices.size(); i += static_cast<size_t>(req.n)) cached += choices[i].cached_tokens;
    return {{"prompt_tokens", p},
            {"completion_tokens", completion_tokens()},
            {"total_tokens", p + completion_tokens()},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }
};

std::string map_reason(const std::string& engine_reason) {
  if (engine_reason == "stop" || engine_reason == "length") return engine_reason;
  return "abort";  // cancelled by shutdown, or an engine error
}

}  // namespace

struct HttpServer::Impl {
  Model& model;
  const Tokenizer& tok;
  ChatTemplate tmpl;
  ServerConfig cfg;
  std::unique_ptr<AsyncEngine> engine;
  httplib::Server svr;
  ApiLimits limits;
  std::atomic<bool> stopping{false};
  std::atomic<int> bound_port{0};
  std::atomic<int> active_calls{0};  // generate handlers and streams not yet finished

  Pooling pooling = Pooling::Last;  // POST /v1/embeddings

  // The LoRA adapters requests may name: --lora's at start; with --allow-runtime-lora,
  // /v1/load_lora_adapter and /v1/unload_lora_adapter add and remove them (one at a time).
  struct Adapter {
    std::string name, path;
    int32_t id;
  };
  mutable std::mutex adapters_mu;
  std::vector<Adapter> adapters;
  std::mutex lora_admin_mu;  // serialises loads and unloads

  Impl(Model& m, ChatTemplate t, const ServerConfig& c)
      : model(m), tok(*m.tokenizer()), tmpl(std::move(t)), cfg(c),
        pooling(c.pooling.empty() ? default_pooling(m.file().path) : pooling_from_name(c.pooling)) {
    for (size_t i = 0; i < c.lora.size(); ++i) adapters.push_back({c.lora[i].name, c.lora[i].path, static_cast<int32_t>(i + 1)});
  }

  // Feeds one event into its choice; returns the text to send now (may be empty).
  std::string apply(Call& call, const TokenEvent& ev, json* lp_entry) {
    Choice& ch = call.choices[static_cast<size_t>(ev.index)];
    if (ev.cached_tokens >= 0) ch.cached_tokens = ev.cached_tokens;
    if (ch.done) return {};
    std::string piece;
    if (ev.token >= 0) {
      piece = ch.text->push(ev.token);
      if (call.req.base.logprobs >= 0) {
        json e = call.req.chat ? chat_logprob_entry(tok, ev.token, ev.logprob, ev.top_logprobs)
                               : completion_logprob_entry(tok, ev.token, ev.logprob, ev.top_logprobs);
        ch.logprobs.push_back(e);
        if (lp_entry) *lp_entry = e;
      }
      if (ch.text->stopped()) {
        ch.done = true;
        ch.finish_reason = "stop";
        engine->cancel(call.stream, ev.index);  // the rest of this choice is not wanted
      }
    }
    if (ev.finished && !ch.done) {
      piece += ch.text->finish();
      ch.done = true;
      ch.finish_reason = ch.text->stopped() ? "stop" : map_reason(ev.finish_reason);
    }
    ch.content += piece;
    return piece;
  }

  json completion_logprobs(const json& entries) const {
    json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    int64_t off = 0;
    for (auto& e : entries) {
      tokens.push_back(e["token"]);
      lps.push_back(e["logprob"]);
      tops.push_back(e["top_logprobs"]);
      offsets.push_back(off);
      off += static_cast<int64_t>(e["token"].get<std::string>().size());
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  // What a finished choice's text holds as tool calls: the tool_calls entries and the text beside
  // them (no calls: the choice is plain text). A called function (named, required) is the whole
  // text when it ended whole; with tool_choice auto the template's format finds them.
  struct ToolReply {
    std::string content;
    json calls = json::array();
  };
  ToolReply tool_reply(const Call& call, size_t i, const std::string& text) const {
    ToolReply r;
    const ApiRequest::ToolMode m = call.req.tool_mode;
    if (m == ApiRequest::ToolMode::Auto) {
      const SplitReply split = split_tool_calls(limits.tool_call_format, text, call.req.tools);
      r.content = split.content;
      for (size_t k = 0; k < split.calls.size(); ++k)
        r.calls.push_back({{"id", tool_call_id(call, i, k)}, {"type", "function"},
                           {"function", {{"name", split.calls[k].name}, {"arguments", split.calls[k].arguments}}}});
    } else if (m != ApiRequest::ToolMode::None && call.choices[i].finish_reason == "stop") {
      if (auto tc = tool_call_of(call.req, text, tool_call_id(call, i, 0))) r.calls.push_back(*tc);
    }
    return r;
  }

  // Call k of choice i's id: "call_<call>_<i>_<k>", or under a Mistral template nine letters and
  // digits (its templates refuse any other id when the client sends the call back).
  std::string tool_call_id(const Call& call, size_t i, size_t k) const {
    const std::string plain = "call_" + call.id.substr(call.id.find('-') + 1) + "_" + std::to_string(i) + "_" + std::to_string(k);
    if (limits.tool_call_format != ToolCallFormat::Mistral) return plain;
    uint64_t h = fnv1a64(plain);  // distinct per call, choice and index
    static const char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::string id(9, 'a');
    for (char& c : id) {
      c = kAlnum[h % 62];
      h /= 62;
    }
    return id;
  }

  json final_response(const Call& call) const {
    json choices = json::array();
    for (size_t i = 0; i < call.choices.size(); ++i) {
      const Choice& c = call.choices[i];
      json lp = nullptr;
      if (call.req.base.logprobs >= 0)
        lp = call.req.chat ? json{{"content", c.logprobs}} : completion_logprobs(c.logprobs);
      ReasoningPiece split = call.req.split_reasoning ? ReasoningSplitter::split(c.content, call.req.thinking_opened)
                                                      : ReasoningPiece{"", c.content};
      std::string tool_text = split.content;
      if (call.req.harmony) {  // the channels apart; the calls come from the whole reply
        HarmonyReply h = parse_harmony(c.content);
        split = ReasoningPiece{std::move(h.reasoning), std::move(h.content)};
        tool_text = c.content;
      }
      const ToolReply t = tool_reply(call, i, tool_text);
      json message = {{"role", "assistant"}, {"content", split.content}};
      if (!t.calls.empty()) message = {{"role", "assistant"}, {"content", t.content.empty() ? json(nullptr) : json(t.content)}, {"tool_calls", t.calls}};
      if (!split.reasoning.empty()) message["reasoning_content"] = split.reasoning;
      if (call.req.chat)
        choices.push_back({{"index", i}, {"message", message}, {"logprobs", lp}, {"finish_reason", t.calls.empty() ? c.finish_reason : "tool_calls"}});
      else
        choices.push_back({{"index", i}, {"text", c.content}, {"logprobs", lp}, {"finish_reason", c.finish_reason}});
    }
    return {{"id", call.id}, {"object", call.req.chat ? "chat.completion" : "text_completion"}, {"created", call.created},
            {"model", call.model}, {"choices", choices}, {"usage", call.usage()}};
  }

  json chunk(const Call& call, json choices) const {
    return {{"id", call.id}, {"object", call.req.chat ? "chat.completion.chunk" : "text_completion"}, {"created", call.created},
            {"model", call.model}, {"choices", std::move(choices)}};
  }

  // One chat chunk as SSE: "data: ..." or, for /v1/responses, the Responses events it makes.
  std::string sse_chunk(Call& call, const json& c) const {
    return call.response_stream ? call.response_stream->chunk(c) : "data: " + dump(c) + "\n\n";
  }

  // SSE events for one engine event (content and/or the choice's end).
  std::string sse_for(Call& call, const TokenEvent& ev) {
    json lp_entry = nullptr;
    const bool was_done = call.choices[static_cast<size_t>(ev.index)].done;
    std::string piece = apply(call, ev, &lp_entry);
    const Choice& ch = call.choices[static_cast<size_t>(ev.index)];
    std::string out;
    auto emit = [&](const json& choice) { out += sse_chunk(call, chunk(call, json::array({choice}))); };
    json lp = nullptr;
    if (call.req.base.logprobs >= 0 && !lp_entry.is_null())
      lp = call.req.chat ? json{{"content", json::array({lp_entry})}} : completion_logprobs(json::array({lp_entry}));
    if (call.req.split_reasoning || call.req.harmony) {
      // Thinking goes out as reasoning_content deltas; only the answer goes on, to the tool-call
      // parser or as content.
      Choice& mut = call.choices[static_cast<size_t>(ev.index)];
      ReasoningPiece rp = call.req.harmony ? mut.harmony.push(piece) : mut.reasoning.push(piece);
      if (ch.done && !was_done) {
        const ReasoningPiece rest = call.req.harmony ? mut.harmony.finish() : mut.reasoning.finish();
        rp.reasoning += rest.reasoning;
        rp.content += rest.content;
      }
      piece = rp.content;
      mut.answer += rp.content;
      if (!rp.reasoning.empty()) {
        emit({{"index", ev.index}, {"delta", {{"reasoning_content", rp.reasoning}}}, {"logprobs", lp}, {"finish_reason", nullptr}});
        lp = nullptr;
      }
    }
    if (call.req.harmony && call.req.tool_mode == ApiRequest::ToolMode::Auto) {
      // Harmony's calls are messages of their own: the content went out above, the calls go whole
      // at the end.
      Choice& mut = call.choices[static_cast<size_t>(ev.index)];
      if (!piece.empty() || !lp.is_null())
        emit({{"index", ev.index}, {"delta", {{"content", piece}}}, {"logprobs", lp}, {"finish_reason", nullptr}});
      piece.clear();
      lp = nullptr;
      if (ch.done && !was_done && !mut.harmony.calls().empty()) {
        ToolReply t = tool_reply(call, static_cast<size_t>(ev.index), ch.content);
        for (size_t k = 0; k < t.calls.size(); ++k) t.calls[k]["index"] = k;
        emit({{"index", ev.index}, {"delta", {{"tool_calls", t.calls}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
        emit({{"index", ev.index}, {"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", "tool_calls"}});
        return out;
      }
    } else if (call.req.tool_mode != ApiRequest::ToolMode::None) {
      // A call is sent whole when the choice ends (under `required` its name comes last). With
      // auto, text goes out as it comes and only what may be a call is held; a called function
      // holds everything.
      const bool is_auto = call.req.tool_mode == ApiRequest::ToolMode::Auto;
      Choice& mut = call.choices[static_cast<size_t>(ev.index)];
      piece = is_auto ? mut.tool_stream.push(piece) : std::string();
      if (ch.done && !was_done) {
        const std::string held = is_auto ? mut.tool_stream.held() : call.req.split_reasoning ? mut.answer : ch.content;
        ToolReply t = tool_reply(call, static_cast<size_t>(ev.index), held);
        if (!t.calls.empty()) {
          if (!piece.empty() || !t.content.empty())
            emit({{"index", ev.index}, {"delta", {{"content", piece + t.content}}}, {"logprobs", lp}, {"finish_reason", nullptr}});
          for (size_t k = 0; k < t.calls.size(); ++k) t.calls[k]["index"] = k;
          emit({{"index", ev.index}, {"delta", {{"tool_calls", t.calls}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
          emit({{"index", ev.index}, {"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", "tool_calls"}});
          return out;
        }
        piece += held;  // no whole call after all: the held text is text
      }
    }
    if (!piece.empty() || !lp.is_null()) {
      if (call.req.chat)
        emit({{"index", ev.index}, {"delta", {{"content", piece}}}, {"logprobs", lp}, {"finish_reason", nullptr}});
      else
        emit({{"index", ev.index}, {"text", piece}, {"logprobs", lp}, {"finish_reason", nullptr}});
    }
    if (ch.done && !was_done) {
      if (call.req.chat)
        emit({{"index", ev.index}, {"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", ch.finish_reason}});
      else
        emit({{"index", ev.index}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", ch.finish_reason}});
    }
    return out;
  }

  // The adapter a request's "model" names: 0 for the base model (or no name), i + 1 for
  // the adapter of that name, -1 for a name this server does not serve.
  int32_t adapter_of(const std::string& name) const {
    if (name.empty() || name == cfg.served_model_name) return 0;
    std::lock_guard<std::mutex> lock(adapters_mu);
    for (const Adapter& a : adapters)
      if (a.name == name) return a.id;
    return -1;
  }
  ApiError unknown_model(const std::string& name) const {
    std::string served = "`" + cfg.served_model_name + "`";
    std::lock_guard<std::mutex> lock(adapters_mu);
    for (const Adapter& a : adapters) served += ", `" + a.name + "`";
    return ApiError{404, "The model `" + name + "` does not exist (this server serves " + served + ")", "NotFoundError", "model"};
  }

  void handle_generate(const httplib::Request& hreq, httplib::Response& res, bool chat) {
    json body;
    try {
      body = json::parse(hreq.body);
    } catch (const std::exception& e) {
      reject(res, ApiError{400, std::string("the body is not valid JSON: ") + e.what(), "invalid_request_error", ""});
      return;
    }
    // A schema or tools: the body read again with its keys in order (a schema's properties keep theirs).
    std::optional<nlohmann::ordered_json> ordered;
    if (needs_ordered_body(body)) ordered = nlohmann::ordered_json::parse(hreq.body);
    generate(body, ordered, res, chat, std::nullopt);
  }

  // POST /v1/responses: the request as a chat completion (server/responses_api.h), its reply as
  // a Response (streamed as the Responses' events).
  void handle_responses(const httplib::Request& hreq, httplib::Response& res) {
    const nlohmann::ordered_json body = nlohmann::ordered_json::parse(hreq.body, nullptr, false);
    if (body.is_discarded()) {
      reject(res, ApiError{400, "the body is not valid JSON", "invalid_request_error", ""});
      return;
    }
    nlohmann::ordered_json chat;
    if (auto err = responses_to_chat(body, &chat)) {
      reject(res, *err);
      return;
    }
    const json chat_body = json::parse(chat.dump());
    std::optional<nlohmann::ordered_json> ordered;
    if (needs_ordered_body(chat_body)) ordered = chat;
    ResponseHeader h;
    h.request = json::parse(body.dump());
    generate(chat_body, ordered, res, true, std::move(h));
  }

  void generate(const json& body, const std::optional<nlohmann::ordered_json>& ordered, httplib::Response& res, bool chat,
                std::optional<ResponseHeader> response) {
    auto call = std::make_shared<Call>();
    if (auto err = parse_request(body, chat, tok, &tmpl, limits, call->req, ordered ? &*ordered : nullptr)) {
      reject(res, *err);
      return;
    }
    if (ordered)
      if (auto err = parse_constraint(*ordered, tok, call->req)) {
        reject(res, *err);
        return;
      }
    if (call->req.base.min_tokens > 0 && call->req.base.constraint) {
      reject(res, ApiError{400, "'min_tokens' with a constrained output is not supported (the grammar decides where the reply ends)",
                           "invalid_request_error", "min_tokens"});
      return;
    }
    const int32_t lora = adapter_of(call->req.model);
    if (lora < 0) {
      reject(res, unknown_model(call->req.model));
      return;
    }
    call->req.base.lora = lora;
    if (stopping) {
      reject(res, ApiError{503, "the server is shutting down", "server_error", ""});
      return;
    }
    call->id = new_id(chat ? "chatcmpl" : "cmpl");
    call->model = lora > 0 ? call->req.model : cfg.served_model_name;
    if (response) {
      response->id = "resp_" + call->id.substr(call->id.find('-') + 1);
      response->created_at = unix_time();
      response->model = call->model;
      call->response = std::move(response);
      if (call->req.stream) call->response_stream = std::make_unique<ResponseStream>(*call->response);
    }
    if (lora > 0) {
      std::lock_guard<std::mutex> lock(engine->metrics().mu);
      ++engine->metrics().lora_requests[call->model];
    }
    call->created = unix_time();
    if (scores_prompt(call->req) && (model.tp_size() > 1 || model.device() != Device::CPU)) {
      reject(res, ApiError{400, "the prompt's log-probabilities ('echo' with 'logprobs', 'prompt_logprobs') are computed on one CPU rank here (this server runs on " +
                                    std::to_string(model.tp_size()) + " ranks, " + device_name(model.device()) + ")",
                           "invalid_request_error", call->req.prompt_logprobs >= 0 ? "prompt_logprobs" : "echo"});
      return;
    }
    const size_t n_prompts = std::max<size_t>(1, call->req.prompts.size());
    for (size_t i = 0; i < n_prompts * static_cast<size_t>(call->req.n); ++i) {
      const std::vector<int32_t>& prompt = call->req.prompts.empty() ? call->req.prompt : call->req.prompts[i / static_cast<size_t>(call->req.n)];
      Choice c;
      // Control tokens decode to their text where the reply's format is made of them: harmony's
      // channel headers, Mistral's [TOOL_CALLS] marker (tool_choice auto).
      const bool render_special = call->req.harmony || (call->req.tool_mode == ApiRequest::ToolMode::Auto &&
                                                        limits.tool_call_format == ToolCallFormat::Mistral);
      c.text = std::make_unique<ChoiceText>(tok, prompt, call->req.stop, render_special || !call->req.skip_special_tokens,
                                            call->req.base.min_tokens, call->req.include_stop_str);
      c.tool_stream = ToolCallStream(limits.tool_call_format);
      c.reasoning = ReasoningSplitter(call->req.thinking_opened);
      call->choices.push_back(std::move(c));
    }
    // Streamed echo: the prompts scored before their generation starts, so that each choice's
    // first chunk is its prompt (vLLM sends it with the first token; here it goes as soon as the
    // stream opens). Without streaming they are scored after the generation, below.
    if (call->req.stream && call->req.echo) {
      try {
        score_prompts(*call);
      } catch (const std::exception& e) {
        send_error(res, ApiError{500, std::string("scoring the prompt failed: ") + e.what(), "server_error", ""});
        return;
      }
      call->echo_pending = true;
    }
    // echo with max_tokens 0: the prompt alone (scored), nothing to generate.
    const bool generates = !(call->req.echo && call->req.base.max_new_tokens == 0);
    if (generates) call->stream = engine->submit(call->req.group());
    for (Choice& c : call->choices) {
      if (generates) break;
      c.done = true;
      c.finish_reason = "length";
    }
    ++active_calls;

    if (!call->req.stream) {
      struct Done {
        std::atomic<int>& n;
        ~Done() { --n; }
      } done{active_calls};
      while (!call->all_done()) {
        for (const TokenEvent& ev : call->stream->wait(100)) apply(*call, ev, nullptr);
        if (call->stream->all_finished() && !call->all_done()) break;  // cannot happen; never spin
      }
      if (call->stream && !call->stream->error().empty()) {
        res.status = 500;
        res.set_content(dump(ApiError{500, call->stream->error(), "server_error", ""}.body()), "application/json");
        return;
      }
      json prompt_lps;
      if (call->req.echo || call->req.prompt_logprobs >= 0) {
        try {
          prompt_lps = score_prompts(*call);
        } catch (const std::exception& e) {
          send_error(res, ApiError{500, std::string("scoring the prompt failed: ") + e.what(), "server_error", ""});
          return;
        }
      }
      json reply = final_response(*call);
      if (call->req.prompt_logprobs >= 0) {  // vLLM's places: each completion choice, the chat reply
        if (call->req.chat) reply["prompt_logprobs"] = prompt_lps[0];
        else
          for (size_t i = 0; i < reply["choices"].size(); ++i) reply["choices"][i]["prompt_logprobs"] = prompt_lps[i / static_cast<size_t>(call->req.n)];
      }
      res.set_content(dump(call->response ? response_from_chat(*call->response, reply) : reply), "application/json");
      return;
    }

    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, call](size_t, httplib::DataSink& sink) {
          std::string out;
          if (call->response_stream && !call->role_sent) {
            call->role_sent = true;
            out += call->response_stream->start();
          }
          if (call->req.chat && !call->role_sent) {
            call->role_sent = true;
            for (size_t i = 0; i < call->choices.size(); ++i)
              out += "data: " +
                     dump(chunk(*call, json::array({{{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                                    {"logprobs", nullptr}, {"finish_reason", nullptr}}}))) +
                     "\n\n";
          }
          if (call->echo_pending) {  // each choice's prompt text and log-probabilities (score_prompts put them first)
            call->echo_pending = false;
            for (size_t i = 0; i < call->choices.size(); ++i) {
              const Choice& c = call->choices[i];
              const json lp = call->req.base.logprobs >= 0 ? completion_logprobs(c.logprobs) : json(nullptr);
              out += sse_chunk(*call, chunk(*call, json::array({{{"index", i}, {"text", c.content}, {"logprobs", lp}, {"finish_reason", nullptr}}})));
              if (c.done)  // max_tokens 0: the prompt is all
                out += sse_chunk(*call, chunk(*call, json::array({{{"index", i}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", c.finish_reason}}})));
            }
          }
          if (call->stream)
            for (const TokenEvent& ev : call->stream->wait(out.empty() ? 50 : 0)) out += sse_for(*call, ev);
          if (call->all_done()) {
            if (call->req.include_usage) {
              json u = chunk(*call, json::array());
              u["usage"] = call->usage();
              out += sse_chunk(*call, u);
            }
            out += call->response_stream ? call->response_stream->finish() : "data: [DONE]\n\n";
          }
          if (!out.empty() && !sink.write(out.data(), out.size())) {
            if (call->stream) engine->cancel(call->stream);  // the client went away: free its KV now
            return false;
          }
          if (!out.empty()) {
            call->wrote_any = true;
            call->idle_polls = 0;
          } else if (call->wrote_any && ++call->idle_polls % 20 == 0 && !sink.is_writable()) {
            // Nothing to send for a second: make sure the client is still there. (Not before the
            // first write: a hang-up then is caught by that write.)
            if (call->stream) engine->cancel(call->stream);
            return false;
          }
          if (call->all_done()) sink.done();
          return true;
        },
        [this, call](bool success) {
          if (call->stream && (!success || !call->all_done())) engine->cancel(call->stream);
          --active_calls;
        });
  }

  // Whether a request needs its prompt's tokens scored (echo with logprobs, prompt_logprobs).
  static bool scores_prompt(const ApiRequest& req) { return (req.echo && req.base.logprobs >= 0) || req.prompt_logprobs >= 0; }

  // The prompt's scores where asked, computed on the engine thread between steps, one prompt at a
  // time, under the request's adapter. echo: each choice's text and log-probabilities start with
  // its prompt's (the first token has no context: null). Returns vLLM's prompt_logprobs per
  // prompt (null first, then {"<id>": {logprob, rank, decoded_token}} for the prompt's token and
  // the top alternatives) when asked.
  json score_prompts(Call& call) {
    const ApiRequest& req = call.req;
    const size_t n = static_cast<size_t>(req.n);
    const size_t n_prompts = std::max<size_t>(1, req.prompts.size());
    const int top = std::max(req.base.logprobs, req.prompt_logprobs);
    json per_prompt = json::array();
    for (size_t p = 0; p < n_prompts; ++p) {
      const std::vector<int32_t>& ids = req.prompts.empty() ? req.prompt : req.prompts[p];
      std::vector<ScoredToken> scores;
      if (scores_prompt(req))
        engine->run_between_steps([&] {
          model.set_single_lora(req.base.lora);
          try {
            scores = score_prompt(model, ids, top);
          } catch (...) {
            model.set_single_lora(0);
            throw;
          }
          model.set_single_lora(0);
        });
      if (req.prompt_logprobs >= 0) {
        json list = json::array({nullptr});
        for (size_t i = 0; i < scores.size(); ++i) {
          const int32_t id = ids[i + 1];
          json pos = json::object();
          auto add = [&](int32_t t, float lp, int64_t rank) {
            pos[std::to_string(t)] = {{"logprob", lp}, {"rank", rank}, {"decoded_token", tok.token_to_bytes(t, true)}};
          };
          add(id, scores[i].logprob, scores[i].rank);
          for (int k = 0; k < req.prompt_logprobs && k < static_cast<int>(scores[i].top.size()); ++k)
            if (!pos.contains(std::to_string(scores[i].top[static_cast<size_t>(k)].first)))
              add(scores[i].top[static_cast<size_t>(k)].first, scores[i].top[static_cast<size_t>(k)].second, k + 1);
          list.push_back(std::move(pos));
        }
        per_prompt.push_back(std::move(list));
      }
      if (!req.echo) continue;
      const std::string given = p < req.prompt_texts.size() ? req.prompt_texts[p] : std::string();
      const std::string text = given.empty() ? tok.decode(ids) : given;
      json entries = json::array();
      if (req.base.logprobs >= 0) {
        entries.push_back({{"token", tok.token_to_bytes(ids[0], true)}, {"logprob", nullptr}, {"top_logprobs", nullptr}});
        for (size_t i = 0; i < scores.size(); ++i) {
          std::vector<std::pair<int32_t, float>> alts(scores[i].top.begin(),
                                                      scores[i].top.begin() + std::min<size_t>(scores[i].top.size(), static_cast<size_t>(req.base.logprobs)));
          entries.push_back(completion_logprob_entry(tok, ids[i + 1], scores[i].logprob, alts));
        }
      }
      for (size_t j = 0; j < n; ++j) {
        Choice& c = call.choices[p * n + j];
        c.content = text + c.content;
        if (req.base.logprobs >= 0) {
          json all = entries;
          for (auto& e : c.logprobs) all.push_back(e);
          c.logprobs = std::move(all);
        }
      }
    }
    return per_prompt;
  }

  // POST /v1/embeddings: the inputs embedded one after another on the engine thread, between two
  // of its steps (the model is that thread's; generation pauses meanwhile).
  void handle_embeddings(const httplib::Request& hreq, httplib::Response& res) {
    json body = json::parse(hreq.body, nullptr, false);
    if (body.is_discarded()) {
      reject(res, ApiError{400, "the body is not valid JSON", "invalid_request_error", ""});
      return;
    }
    EmbeddingRequest req;
    const ModelConfig& c = model.config();
    if (auto err = parse_embedding_request(body, tok, c.n_vocab, engine->config().max_model_len, c.dim, cfg.max_embedding_inputs, req)) {
      reject(res, *err);
      return;
    }
    if (const int32_t lora = adapter_of(req.model); lora != 0) {
      reject(res, lora < 0 ? unknown_model(req.model)
                           : ApiError{400, "embeddings run with the base model only, not with the LoRA adapter `" + req.model + "`",
                                      "invalid_request_error", "model"});
      return;
    }
    if (model.tp_size() > 1 || model.device() != Device::CPU) {
      reject(res, ApiError{400, "embeddings run on one CPU rank here (this server runs on " + std::to_string(model.tp_size()) +
                                    " ranks, " + device_name(model.device()) + ")",
                           "invalid_request_error", "input"});
      return;
    }
    if (stopping) {
      reject(res, ApiError{503, "the server is shutting down", "server_error", ""});
      return;
    }
    ++active_calls;
    std::vector<std::vector<float>> vectors(req.inputs.size());
    try {
      engine->run_between_steps([&] {
        Embedder embedder(model);
        EmbeddingOptions o;
        o.pooling = pooling;
        vectors = embedder.embed_batch(req.inputs, o);
      });
    } catch (const std::exception& e) {
      --active_calls;
      send_error(res, ApiError{500, std::string("embedding failed: ") + e.what(), "server_error", ""});
      return;
    }
    --active_calls;
    int64_t tokens = 0;
    for (const auto& ids : req.inputs) tokens += static_cast<int64_t>(ids.size());
    {
      std::lock_guard<std::mutex> lock(engine->metrics().mu);
      ++engine->metrics().embedding_requests;
      engine->metrics().embedding_tokens += tokens;
    }
    res.set_content(dump(embedding_response(req, std::move(vectors), cfg.served_model_name, true)), "application/json");
  }

  // POST /tokenize and /detokenize (server/tokenize_api.h): the tokenizer alone, on the HTTP
  // thread; "model" may name the base model or an adapter (one tokenizer serves them all).
  void handle_tokenize(const httplib::Request& hreq, httplib::Response& res, bool encode) {
    const json body = json::parse(hreq.body, nullptr, false);
    if (body.is_discarded()) {
      reject(res, ApiError{400, "the body is not valid JSON", "invalid_request_error", ""});
      return;
    }
    json out;
    std::string name;
    std::optional<nlohmann::ordered_json> ordered;
    if (encode && needs_ordered_body(body)) ordered = nlohmann::ordered_json::parse(hreq.body);
    auto err = encode ? tokenize_response(body, ordered ? &*ordered : nullptr, tok, &tmpl, limits, &out, &name)
                      : detokenize_response(body, tok, &out, &name);
    if (!err && adapter_of(name) < 0) err = unknown_model(name);
    if (err) {
      reject(res, *err);
      return;
    }
    res.set_content(dump(out), "application/json");
  }

  // POST /v1/load_lora_adapter {"lora_name", "lora_path"} and /v1/unload_lora_adapter
  // {"lora_name"} (vLLM's routes and replies). The model changes on the engine thread between
  // steps; an adapter that requests still run with is not unloaded.
  bool lora_body(const httplib::Request& hreq, httplib::Response& res, bool load, std::string* name, std::string* path) {
    const json body = json::parse(hreq.body, nullptr, false);
    if (!body.is_object()) {
      reject(res, ApiError{400, "the body must be a JSON object", "invalid_request_error", ""});
      return false;
    }
    for (auto [key, out] : {std::pair{"lora_name", name}, std::pair{"lora_path", path}}) {
      if (!load && out == path) continue;
      auto it = body.find(key);
      if (it == body.end() || !it->is_string() || it->get<std::string>().empty()) {
        reject(res, ApiError{400, std::string("'") + key + "' must be a non-empty string", "invalid_request_error", key});
        return false;
      }
      *out = it->get<std::string>();
    }
    if (model.tp_size() > 1) {
      reject(res, ApiError{400, "adapters load at start (--lora) when the model runs on several ranks", "invalid_request_error", ""});
      return false;
    }
    return true;
  }

  void handle_load_lora(const httplib::Request& hreq, httplib::Response& res) {
    std::string name, path;
    if (!lora_body(hreq, res, true, &name, &path)) return;
    if (name.find_first_of("\"\\\n") != std::string::npos) {
      reject(res, ApiError{400, "'lora_name' must not hold quotes, backslashes or newlines", "invalid_request_error", "lora_name"});
      return;
    }
    std::lock_guard<std::mutex> admin(lora_admin_mu);
    if (adapter_of(name) >= 0) {
      reject(res, ApiError{400, "The lora adapter '" + name + "' has already been loaded.", "invalid_request_error", "lora_name"});
      return;
    }
    int32_t id = 0;
    try {
      engine->run_between_steps([&] { id = model.add_lora(read_lora_adapter(path, name, model.file())); });
    } catch (const std::exception& e) {
      reject(res, ApiError{400, e.what(), "invalid_request_error", "lora_path"});
      return;
    }
    {
      std::lock_guard<std::mutex> lock(adapters_mu);
      adapters.push_back({name, path, id});
    }
    log_info("LoRA adapter '", name, "' (", path, ") loaded: id ", id);
    res.set_content("Success: LoRA adapter '" + name + "' added successfully.", "text/plain");
  }

  void handle_unload_lora(const httplib::Request& hreq, httplib::Response& res) {
    std::string name, path;
    if (!lora_body(hreq, res, false, &name, &path)) return;
    std::lock_guard<std::mutex> admin(lora_admin_mu);
    const int32_t id = adapter_of(name);
    if (id <= 0) {
      reject(res, ApiError{404, "The lora adapter '" + name + "' cannot be found.", "NotFoundError", "lora_name"});
      return;
    }
    int64_t busy = 0;
    try {
      engine->run_between_steps([&] {
        busy = engine->engine().requests_with_lora(id);
        if (busy == 0) model.remove_lora(id);
      });
    } catch (const std::exception& e) {
      send_error(res, ApiError{500, e.what(), "server_error", ""});
      return;
    }
    if (busy > 0) {
      reject(res, ApiError{400, "The lora adapter '" + name + "' has " + std::to_string(busy) +
                                    " requests in flight; unload it once they finish.",
                           "invalid_request_error", "lora_name"});
      return;
    }
    {
      std::lock_guard<std::mutex> lock(adapters_mu);
      std::erase_if(adapters, [&](const Adapter& a) { return a.id == id; });
    }
    log_info("LoRA adapter '", name, "' unloaded");
    res.set_content("Success: LoRA adapter '" + name + "' removed successfully.", "text/plain");
  }

  void reject(httplib::Response& res, const ApiError& e) {
    {
      std::lock_guard<std::mutex> lock(engine->metrics().mu);
      ++engine->metrics().rejected;
    }
    send_error(res, e);
  }

  void setup_routes() {
    svr.new_task_queue = [n = cfg.http_threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
    svr.set_payload_max_length(static_cast<size_t>(cfg.max_body_bytes));
    svr.set_tcp_nodelay(true);  // SSE chunks go out at once (no Nagle / delayed-ACK stall)
    svr.set_read_timeout(30, 0);
    svr.set_write_timeout(30, 0);
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      // The key guards /v1/* and the tokenizer routes (vLLM leaves those open; they cost CPU time).
      const bool guarded = req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize";
      if (cfg.api_key.empty() || !guarded) return httplib::Server::HandlerResponse::Unhandled;
      const std::string auth = req.get_header_value("Authorization");
      if (auth == "Bearer " + cfg.api_key) return httplib::Server::HandlerResponse::Unhandled;
      send_error(res, ApiError{401, auth.empty() ? "missing API key: send 'Authorization: Bearer <key>'" : "invalid API key",
                               "authentication_error", ""});
      return httplib::Server::HandlerResponse::Handled;
    });
    svr.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_generate(q, r, false); });
    svr.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_generate(q, r, true); });
    svr.Post("/v1/responses", [this](const httplib::Request& q, httplib::Response& r) { handle_responses(q, r); });
    svr.Post("/v1/embeddings", [this](const httplib::Request& q, httplib::Response& r) { handle_embeddings(q, r); });
    svr.Post("/tokenize", [this](const httplib::Request& q, httplib::Response& r) { handle_tokenize(q, r, true); });
    svr.Post("/detokenize", [this](const httplib::Request& q, httplib::Response& r) { handle_tokenize(q, r, false); });
    if (cfg.allow_runtime_lora) {
      svr.Post("/v1/load_lora_adapter", [this](const httplib::Request& q, httplib::Response& r) { handle_load_lora(q, r); });
      svr.Post("/v1/unload_lora_adapter", [this](const httplib::Request& q, httplib::Response& r) { handle_unload_lora(q, r); });
    }
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json m = {{"id", cfg.served_model_name}, {"object", "model"}, {"created", unix_time()}, {"owned_by", "fastpath"},
                {"max_model_len", engine->config().max_model_len}};
      json data = json::array({m});
      std::lock_guard<std::mutex> lock(adapters_mu);
      for (const Adapter& a : adapters)  // as vLLM lists its LoRA modules
        data.push_back({{"id", a.name}, {"object", "model"}, {"created", unix_time()}, {"owned_by", "fastpath"},
                        {"root", a.path}, {"parent", cfg.served_model_name}, {"max_model_len", engine->config().max_model_len}});
      res.set_content(dump({{"object", "list"}, {"data", std::move(data)}}), "application/json");
    });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      res.status = stopping ? 503 : 200;
      res.set_content(stopping ? "{\"status\":\"shutting down\"}" : "{\"status\":\"ok\"}", "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(engine->metrics_text(), "text/plain; version=0.0.4");
    });
    auto ledger = [this](const httplib::Request&, httplib::Response& res) { res.set_content(engine->ledger_json(), "application/json"); };
    svr.Get("/v1/ledger", ledger);
    svr.Get("/ledger", ledger);
    svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      std::string msg = res.status == 404 ? "no such route" : res.status == 413 ? "the request body is too large" : "request failed";
      res.set_content(dump(ApiError{res.status, msg, "invalid_request_error", ""}.body()), "application/json");
    });
    svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string msg = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        msg = e.what();
      } catch (...) {
      }
      res.status = 500;
      res.set_content(dump(ApiError{500, msg, "server_error", ""}.body()), "application/json");
    });
  }
};

HttpServer::HttpServer(Model& model, ChatTemplate chat_template, const ServerConfig& cfg)
    : impl_(std::make_unique<Impl>(model, std::move(chat_template), cfg)) {
  FP_CHECK(model.tokenizer(), "serve: the model has no tokenizer");
  Impl& s = *impl_;
  s.engine = std::make_unique<AsyncEngine>(model, cfg.engine);
  s.limits.max_model_len = s.engine->config().max_model_len;
  s.limits.priority = s.engine->config().scheduler.policy == SchedulingPolicy::Priority;
  s.limits.tool_call_format = s.tmpl.is_fallback() ? ToolCallFormat::None : tool_call_format_of(s.tmpl.source());
  log_info("tool calls in free text (tool_choice auto): ", to_string(s.limits.tool_call_format),
           s.limits.tool_call_format == ToolCallFormat::None ? " (no parser for this chat template; required and named calls work)" : "");
  s.limits.harmony = !s.tmpl.is_fallback() && template_is_harmony(s.tmpl.source());
  if (s.limits.harmony) log_info("chat replies in harmony (gpt-oss): analysis -> reasoning_content, final -> content, "
                                 "commentary to functions.* -> tool_calls");
  s.limits.reasoning = cfg.reasoning_parser == "auto" && !s.tmpl.is_fallback() && template_thinks(s.tmpl.source());
  log_info("reasoning: ", s.limits.reasoning ? "<think> blocks go out as reasoning_content" : "none split off",
           cfg.reasoning_parser == "none" ? " (--reasoning-parser none)" : (s.limits.reasoning ? "" : " (the chat template does not think)"));
  s.setup_routes();
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::port() const { return impl_->bound_port.load(); }

void HttpServer::stop() {
  Impl& s = *impl_;
  if (s.stopping.exchange(true)) return;
  s.engine->shutdown();  // in-flight requests end as "cancelled"; their handlers return
  // Give the handlers a moment to send their last events ("abort" and [DONE]) before the
  // listener closes (httplib ends chunked responses as soon as it is shutting down).
  for (int i = 0; i < 200 && s.active_calls.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  s.svr.stop();
}

void block_shutdown_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int HttpServer::run(bool handle_signals, const std::function<void(int)>& on_listening) {
  Impl& s = *impl_;
  std::thread signal_thread;
  sigset_t set;
  if (handle_signals) {
    // SIGINT/SIGTERM are taken by one thread with sigwait; every thread blocks them
    // (block_shutdown_signals() ran before any thread was started). SIGUSR1 wakes it at exit.
    block_shutdown_signals();
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    signal_thread = std::thread([this, set] {
      int sig = 0;
      sigwait(&set, &sig);
      if (sig != SIGUSR1) log_info("signal ", sig, ": finishing in-flight requests as cancelled and shutting down");
      stop();
    });
  }
  const int port = s.cfg.port == 0 ? s.svr.bind_to_any_port(s.cfg.host) : (s.svr.bind_to_port(s.cfg.host, s.cfg.port) ? s.cfg.port : -1);
  if (port < 0) {
    if (signal_thread.joinable()) {
      pthread_kill(signal_thread.native_handle(), SIGUSR1);
      signal_thread.join();
    }
    fail("serve: cannot listen on ", s.cfg.host, ":", s.cfg.port, " (address in use or not allowed)");
  }
  s.bound_port = port;
  raise_listen_backlog(port);
  log_info("serving ", s.cfg.served_model_name, " on http://", s.cfg.host, ":", port, " (", s.engine->capacity().describe(), ")");
  if (on_listening) on_listening(port);
  const bool ok = s.svr.listen_after_bind();
  stop();
  if (signal_thread.joinable()) {
    pthread_kill(signal_thread.native_handle(), SIGUSR1);
    signal_thread.join();
  }
  log_info("server stopped");
  return ok || s.stopping ? 0 : 1;
}

}  // namespace fp
