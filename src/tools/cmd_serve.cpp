// tools/cmd_serve.cpp — `fastpath serve`: the OpenAI-compatible server.
#include <fstream>

#include "engine/followers.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/ledger.h"
#include "server/http_server.h"
#include "tools/common.h"
#include "tools/engine_options.h"

namespace fp::tools {

void add_serve(CLI::App& app) {
  struct Opts {
    CommonOptions common;
    EngineOptions engine;
    ServerConfig server;
    std::string chat_template, port_file;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("serve", "serve the model over an OpenAI-compatible HTTP API");
  add_common(cmd, o->common, false);
  add_lora_option(cmd, o->common, true);
  cmd->add_flag("--allow-runtime-lora", o->server.allow_runtime_lora,
                "serve POST /v1/load_lora_adapter {lora_name, lora_path} and /v1/unload_lora_adapter {lora_name} (vLLM's "
                "routes; a request then names a path on this machine for the server to read)");
  add_engine_options(cmd, o->engine);
  cmd->add_option("--host", o->server.host, "address to listen on");
  cmd->add_option("--port", o->server.port, "port to listen on (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--port-file", o->port_file, "write the bound port to this file once listening");
  cmd->add_option("--api-key", o->server.api_key, "require 'Authorization: Bearer KEY' on /v1/*");
  cmd->add_option("--served-model-name", o->server.served_model_name, "model id in the API (default: the file name)");
  cmd->add_option("--max-body-bytes", o->server.max_body_bytes, "largest request body accepted")->check(CLI::Range(1024, 1 << 30));
  cmd->add_option("--http-threads", o->server.http_threads, "connections served at once")->check(CLI::Range(2, 4096));
  cmd->add_option("--reasoning-parser", o->server.reasoning_parser,
                  "auto: a chat reply's <think> block goes out as reasoning_content when the template thinks; none: all in content")
      ->check(CLI::IsMember({"auto", "none"}));
  cmd->add_option("--pooling", o->server.pooling,
                  "POST /v1/embeddings: last (the last token's final hidden state) or mean (over the tokens); default: the "
                  "model directory's 1_Pooling/config.json, else last")
      ->check(CLI::IsMember({"last", "mean"}));
  cmd->add_option("--chat-template", o->chat_template,
                  "chat template source: a .jinja file, a tokenizer_config.json, a model directory or .gguf (default: the model's own)");
  cmd->callback([o] {
    block_shutdown_signals();  // before the kernel and engine threads start
    o->common.mtp = o->engine.speculative.mtp();
    auto model = load_with(o->common, o->engine.max_model_len);
    // Several ranks: rank 0 owns the HTTP server and the engine, the others follow its steps.
    if (!is_output_rank()) return follow_engines(*model);
    FP_CHECK(model->tokenizer(), o->common.model, ": the model has no tokenizer (for llama2.c pass --tokenizer)");
    const std::string path = model->file().path;
    ServerConfig cfg = o->server;
    cfg.engine = engine_config(o->engine, *model);
    if (cfg.served_model_name.empty()) {
      std::string base = path;
      while (base.size() > 1 && base.back() == '/') base.pop_back();
      cfg.served_model_name = base.substr(base.find_last_of('/') + 1);
    }
    for (const std::string& text : o->common.lora) {  // adapter ids 1, 2, ... in this order (load_with)
      const LoraSpec spec = parse_lora_spec(text);
      FP_CHECK(spec.name != cfg.served_model_name, "--lora: the adapter '", spec.name, "' has the served model's name");
      cfg.lora.push_back({spec.name, spec.path});
    }
    ChatTemplate tmpl = ChatTemplate::from_path(o->chat_template.empty() ? path : o->chat_template);
    log_info("chat template: ", tmpl.is_fallback() ? "none found, using the plain fallback" : tmpl.origin());
    HttpServer server(*model, std::move(tmpl), cfg);
    const int rc = server.run(/*handle_signals=*/true, [pf = o->port_file](int port) {
      if (!pf.empty()) std::ofstream(pf) << port << "\n";
    });
    release_followers(*model);
    log_info(Ledger::global().summary_line());
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace fp::tools
