// tools/cmd_generate.cpp — `fastpath generate`: prompt in, continuation out (stdout only).
#include <cstdio>
#include <random>

#include "core/error.h"
#include "core/log.h"
#include "engine/generator.h"
#include "kernels/ledger.h"
#include "tools/common.h"

namespace fp::tools {

void add_generate(CLI::App& app) {
  struct Opts {
    CommonOptions common;
    std::string prompt;
    int n = 128;
    float temp = 0.8f, top_p = 0.95f, min_p = 0.05f, repeat_penalty = 1.0f;
    int top_k = 40, repeat_last_n = 64;
    int64_t seed = -1;
    bool ignore_eos = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("generate", "generate a continuation of a prompt (only the generated text goes to stdout)");
  add_common(cmd, o->common, false);
  cmd->add_option("-p,--prompt", o->prompt, "prompt text (default: start from BOS)");
  cmd->add_option("-n,--n-predict", o->n, "tokens to generate")->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--temp", o->temp, "temperature; 0 is greedy");
  cmd->add_option("--top-k", o->top_k, "keep the k most likely tokens (0: off)");
  cmd->add_option("--top-p", o->top_p, "nucleus sampling mass (1: off)");
  cmd->add_option("--min-p", o->min_p, "drop tokens below min-p times the top probability (0: off)");
  cmd->add_option("--repeat-penalty", o->repeat_penalty, "repetition penalty (1: off)");
  cmd->add_option("--repeat-last-n", o->repeat_last_n, "tokens the repetition penalty looks back over");
  cmd->add_option("-s,--seed", o->seed, "random seed (default: random, logged)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "keep generating past end-of-generation tokens");
  cmd->callback([o] {
    auto model = load_with(o->common);
    const Tokenizer* tok = model->tokenizer();
    FP_CHECK(tok, o->common.model, ": the model has no tokenizer (for llama2.c pass --tokenizer)");
    GenerateRequest req;
    req.prompt = tok->encode(o->prompt, /*add_special=*/true, /*parse_special=*/true);
    if (req.prompt.empty()) {
      FP_CHECK(tok->bos_id() >= 0, "the prompt is empty and the vocabulary has no BOS token to start from");
      req.prompt.push_back(tok->bos_id());
    }
    req.max_new_tokens = o->n;
    req.stop_at_eog = !o->ignore_eos;
    SamplingParams& s = req.sampling;
    s.temperature = o->temp;
    s.top_k = o->top_k;
    s.top_p = o->top_p;
    s.min_p = o->min_p;
    s.repetition_penalty = o->repeat_penalty;
    s.repetition_window = o->repeat_last_n;
    s.seed = o->seed >= 0 ? static_cast<uint64_t>(o->seed) : std::random_device{}();
    log_info("prompt: ", req.prompt.size(), " tokens; sampling: temp ", s.temperature, " top-k ", s.top_k, " top-p ",
             s.top_p, " min-p ", s.min_p, " seed ", s.seed);
    auto res = generate(*model, req, [](const std::string& piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    });
    std::fputc('\n', stdout);
    std::fflush(stdout);
    double pf = res.prefill_seconds > 0 ? static_cast<double>(req.prompt.size()) / res.prefill_seconds : 0;
    double dc = res.decode_seconds > 0 && res.tokens.size() > 1 ? (res.tokens.size() - 1) / res.decode_seconds : 0;
    log_info("generated ", res.tokens.size(), " tokens (", res.finish_reason, "); prefill ", pf, " tok/s, decode ", dc, " tok/s");
    log_info(Ledger::global().summary_line());
  });
}

}  // namespace fp::tools
