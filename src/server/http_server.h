// server/http_server.h — `fastpath serve`: the OpenAI-compatible HTTP front end over the
// AsyncEngine. Routes: POST /v1/completions, POST /v1/chat/completions (JSON or SSE),
// POST /v1/responses (server/responses_api.h),
// POST /v1/embeddings (run on the engine thread between steps), POST /tokenize and /detokenize,
// GET /v1/models, GET /health, GET /metrics (Prometheus), GET /v1/ledger (fast-path ledger).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "model/model.h"
#include "tokenizer/chat_template.h"

namespace fp {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;               // when set, /v1/* needs "Authorization: Bearer <key>"
  std::string served_model_name;     // default: the model file's name
  int64_t max_body_bytes = 8 << 20;  // bigger bodies get 413
  int http_threads = 256;            // connections served at once
  // Chat replies' <think> blocks as reasoning_content (server/reasoning.h): "auto" when the chat
  // template writes </think>, "none" to keep them in content.
  std::string reasoning_parser = "auto";
  // POST /v1/embeddings: "last" or "mean" pooling of the final hidden states (engine/embedder.h);
  // empty: the model directory's sentence-transformers config, else last.
  std::string pooling;
  size_t max_embedding_inputs = 256;  // inputs per embeddings request
  // LoRA adapters (--lora NAME=PATH), adapter i + 1 of the model: a request whose "model" is a
  // name runs with that adapter; /v1/models lists them beside the base model.
  struct Adapter {
    std::string name, path;
  };
  std::vector<Adapter> lora;
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's, behind its
  // VLLM_ALLOW_RUNTIME_LORA_UPDATING): off by default, since a request then names a path on this
  // machine for the server to read.
  bool allow_runtime_lora = false;
  EngineConfig engine;
};

// Blocks SIGINT/SIGTERM (and SIGUSR1) in the calling thread and every thread it starts later,
// so that HttpServer::run can take them with sigwait. Call before any thread is created.
void block_shutdown_signals();

class HttpServer {
 public:
  HttpServer(Model& model, ChatTemplate chat_template, const ServerConfig& cfg);
  ~HttpServer();
  // Binds, calls on_listening(port), and serves until stop() (or SIGINT/SIGTERM when
  // handle_signals). Returns the exit code.
  int run(bool handle_signals, const std::function<void(int)>& on_listening = nullptr);
  // Finishes: cancels in-flight requests (their clients get what was generated so far and a
  // "cancelled" end) and stops listening.
  void stop();
  int port() const;  // the bound port (after run() started listening)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp
