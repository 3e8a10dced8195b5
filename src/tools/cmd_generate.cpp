// tools/cmd_generate.cpp — `fastpath generate`: prompt in, continuation out (stdout only);
// with --batch-file, many prompts (JSON lines) through the batching engine, results as JSON
// lines in the same order.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/followers.h"
#include "engine/generator.h"
#include "engine/json_schema.h"
#include "engine/token_constraint.h"
#include "kernels/ledger.h"
#include "tools/common.h"
#include "tools/engine_options.h"

namespace fp::tools {

namespace {

// The text of `generated` as it reads after `prompt` (the stream decoder primed with the prompt).
std::string continuation_text(const Tokenizer& tok, const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated) {
  StreamDecoder d(tok);
  for (int32_t t : prompt) (void)d.push(t);
  (void)d.flush();
  std::string out;
  for (int32_t t : generated) out += d.push(t);
  return out + d.flush();
}

// Reads and checks every line before anything runs, so a bad line costs no work.
std::vector<nlohmann::json> read_batch_file(const std::string& path) {
  std::ifstream f(path);
  FP_CHECK(f, path, ": cannot open the batch file");
  std::vector<nlohmann::json> out;
  std::string line;
  for (int64_t no = 1; std::getline(f, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      fail(path, ":", no, ": not valid JSON (", e.what(), ")");
    }
    FP_CHECK(j.is_object(), path, ":", no, ": expected a JSON object per line");
    FP_CHECK(j.contains("prompt") && j["prompt"].is_string(), path, ":", no, ": field 'prompt' (a string) is required");
    auto check_num = [&](const char* k) {
      FP_CHECK(!j.contains(k) || j[k].is_number(), path, ":", no, ": field '", k, "' must be a number");
    };
    for (const char* k : {"max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty"}) check_num(k);
    if (j.contains("max_tokens"))
      FP_CHECK(j["max_tokens"].is_number_integer() && j["max_tokens"].get<int64_t>() >= 0 && j["max_tokens"].get<int64_t>() <= (1 << 24),
               path, ":", no, ": field 'max_tokens' must be an integer in [0, 16777216], got ", j["max_tokens"].dump());
    FP_CHECK(!j.contains("ignore_eos") || j["ignore_eos"].is_boolean(), path, ":", no, ": field 'ignore_eos' must be true or false");
    j["_line"] = no;
    out.push_back(std::move(j));
  }
  return out;
}

// --json-schema (a file or the schema itself), --json, --grammar-file: the constraint every
// request of this run writes under, or none.
std::shared_ptr<TokenConstraint> make_constraint(const std::string& json_schema, bool json_object, const std::string& grammar_file,
                                                 const Tokenizer& tok) {
  FP_CHECK((!json_schema.empty()) + json_object + (!grammar_file.empty()) <= 1,
           "--json-schema, --json and --grammar-file each constrain the output; give one of them");
  if (json_object) return std::make_shared<TokenConstraint>(Grammar::parse(json_object_gbnf()), tok, "json_object");
  if (!grammar_file.empty()) {
    std::ifstream f(grammar_file);
    FP_CHECK(f, grammar_file, ": cannot open the grammar file");
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    try {
      return std::make_shared<TokenConstraint>(Grammar::parse(text), tok, "grammar");
    } catch (const Error& e) {
      fail(grammar_file, ": ", e.what());
    }
  }
  if (json_schema.empty()) return nullptr;
  std::string text = json_schema, where = "--json-schema";
  const size_t first = json_schema.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || (json_schema[first] != '{' && json_schema.substr(first) != "true")) {  // a file
    std::ifstream f(json_schema);
    FP_CHECK(f, json_schema, ": cannot open the JSON schema file (or pass the schema itself, starting with '{')");
    text.assign((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    where = json_schema;
  }
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(text);
  } catch (const std::exception& e) {
    fail(where, ": the schema is not valid JSON (", e.what(), ")");
  }
  try {
    return std::make_shared<TokenConstraint>(Grammar::parse(json_schema_to_gbnf(schema)), tok, "json_schema");
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
}

template <class Opts>
std::shared_ptr<TokenConstraint> constraint_from(const Opts& o, const Tokenizer& tok) {
  return make_constraint(o.json_schema, o.json_object, o.grammar_file, tok);
}

}  // namespace

template <class Opts>
void run_batch_file(Model& model, const Opts& o) {
  const Tokenizer& tok = *model.tokenizer();
  const std::shared_ptr<TokenConstraint> constraint = constraint_from(o, tok);
  const std::vector<nlohmann::json> lines = read_batch_file(o.batch_file);
  Engine engine(model, engine_config(o.engine, model));
  log_info(engine.capacity().describe());
  std::vector<int64_t> ids;
  std::vector<std::vector<int32_t>> prompts;
  const uint64_t base_seed = o.seed >= 0 ? static_cast<uint64_t>(o.seed) : std::random_device{}();
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json& j = lines[i];
    Request r;
    r.lora = model.n_loras() > 0 ? 1 : 0;  // --lora: every request runs with it
    r.prompt = tok.encode(j["prompt"].get<std::string>(), true, true);
    if (r.prompt.empty()) {
      FP_CHECK(tok.bos_id() >= 0, o.batch_file, ":", j["_line"].get<int64_t>(), ": empty prompt and no BOS token");
      r.prompt.push_back(tok.bos_id());
    }
    r.max_new_tokens = j.value("max_tokens", o.n);
    r.constraint = constraint;
    r.stop_at_eog = !j.value("ignore_eos", o.ignore_eos);
    SamplingParams& s = r.sampling;
    s.temperature = j.value("temperature", o.temp);
    s.top_k = j.value("top_k", o.top_k);
    s.top_p = j.value("top_p", o.top_p);
    s.min_p = j.value("min_p", o.min_p);
    s.repetition_penalty = j.value("repeat_penalty", o.repeat_penalty);
    s.repetition_window = o.repeat_last_n;
    s.seed = j.contains("seed") ? j["seed"].get<uint64_t>() : base_seed + i;
    try {
      ids.push_back(engine.add_request(r));
    } catch (const Error& e) {
      fail(o.batch_file, ":", j["_line"].get<int64_t>(), ": ", e.what());
    }
    prompts.push_back(r.prompt);
  }
  auto t0 = std::chrono::steady_clock::now();
  while (engine.has_work()) engine.step();
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < ids.size(); ++i) {
    const Sequence* s = engine.sequence(ids[i]);
    std::vector<int32_t> gen(s->tokens.begin() + s->n_prompt, s->tokens.end());
    nlohmann::json r;
    r["index"] = i;
    if (lines[i].contains("id")) r["id"] = lines[i]["id"];
    r["text"] = continuation_text(tok, prompts[i], gen);
    r["prompt_tokens"] = s->n_prompt;
    r["completion_tokens"] = gen.size();
    r["finish_reason"] = s->finish_reason;
    std::cout << r.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  std::cout.flush();
  const EngineStats& st = engine.stats();
  log_info(ids.size(), " requests in ", sec, " s: ", st.prompt_tokens, " prompt tokens (", st.cached_prompt_tokens,
           " from the prefix cache), ", st.generated_tokens, " generated (", static_cast<double>(st.generated_tokens) / sec,
           " tok/s), ", st.steps, " steps, ", st.preemptions, " preemptions");
  if (o.engine.speculative.enabled()) log_info(st.speculative.describe());
  log_info(Ledger::global().summary_line());
}

void add_generate(CLI::App& app) {
  struct Opts {
    CommonOptions common;
    std::string prompt;
    int n = 128;
    float temp = 0.8f, top_p = 0.95f, min_p = 0.05f, repeat_penalty = 1.0f;
    int top_k = 40, repeat_last_n = 64;
    int64_t seed = -1;
    bool ignore_eos = false;
    std::string batch_file;
    std::string json_schema, grammar_file;  // constrained decoding
    bool json_object = false;
    EngineOptions engine;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("generate", "generate a continuation of a prompt (only the generated text goes to stdout)");
  add_common(cmd, o->common, false);
  add_lora_option(cmd, o->common, false);
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
  cmd->add_option("--batch-file", o->batch_file,
                  "JSON lines, one request each ({\"prompt\": ..., optional max_tokens, temperature, top_p, top_k, min_p, "
                  "seed, ignore_eos}); runs them together and prints one JSON result per line, in order");
  cmd->add_option("--json-schema", o->json_schema,
                  "write only JSON this schema accepts: a schema file, or the schema itself ({...}); see docs/design.md for the "
                  "keywords supported");
  cmd->add_flag("--json", o->json_object, "write only a JSON object");
  cmd->add_option("--grammar-file", o->grammar_file, "write only text this GBNF grammar (rule 'root') accepts");
  add_engine_options(cmd, o->engine);
  cmd->callback([o] {
    o->common.mtp = o->engine.speculative.mtp();
    auto model = load_with(o->common, o->engine.max_model_len);
    const Tokenizer* tok = model->tokenizer();
    FP_CHECK(tok, o->common.model, ": the model has no tokenizer (for llama2.c pass --tokenizer)");
    if (!o->batch_file.empty()) {
      // Several ranks: rank 0 runs the engine, the others follow its steps.
      if (!is_output_rank()) return follow_engines(*model);
      run_batch_file(*model, *o);
      release_followers(*model);
      return;
    }
    GenerateRequest req;
    req.prompt = tok->encode(o->prompt, /*add_special=*/true, /*parse_special=*/true);
    if (req.prompt.empty()) {
      FP_CHECK(tok->bos_id() >= 0, "the prompt is empty and the vocabulary has no BOS token to start from");
      req.prompt.push_back(tok->bos_id());
    }
    req.max_new_tokens = o->n;
    req.stop_at_eog = !o->ignore_eos;
    req.kv_dtype = kv_cache_dtype(o->engine.kv_cache_dtype, *model);
    req.speculative = o->engine.speculative;
    req.constraint = constraint_from(*o, *tok);
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
    if (req.speculative.enabled()) log_info(res.speculative.describe(), "; ", res.decode_forwards, " decode forwards");
    log_info(Ledger::global().summary_line());
  });
}

}  // namespace fp::tools
