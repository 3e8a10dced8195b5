// tools/cmd_bench_serve.cpp — `fastpath bench-serve`: a load generator against any
// OpenAI-compatible server (fastpath serve, vLLM, llama.cpp / llama-cpp-python), in the manner
// of `vllm bench serve`. The pieces live in tools/bench_serve/ (dataset, SSE, client, runner,
// statistics, report, SVG); this file is the command line and the run over levels.
#include <cerrno>
#include <cstring>
#include <cmath>
#include <ctime>
#include <fstream>
#include <iostream>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "model/model_file.h"
#include "tools/bench_serve/compare.h"
#include "tools/bench_serve/report.h"
#include "tools/bench_serve/runner.h"
#include "tools/bench_serve/svg.h"
#include "tools/common.h"

namespace fp::tools {

namespace {

using namespace fp::bench_serve;

struct BenchServeOptions {
  std::string base_url, host = "127.0.0.1", endpoint = "/v1/completions", model, api_key;
  int port = 8080;
  std::string model_path, tokenizer_path;
  DatasetOptions data;
  std::string concurrency, rate = "inf";
  std::string num_prompts = "100";  // one count for every level, or one per level (8,16,32)
  int num_warmups = 0;
  bool ignore_eos = false;
  double temperature = 0, request_timeout = 600, connect_timeout = 10;
  std::string json_path, svg_path;
  std::string compare, labels;  // --compare a.json,b.json [--labels fastpath,llama.cpp]
  bool no_requests_in_json = false, quiet = false;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// "1,4,16" -> {1, 4, 16}; any item that is not an integer >= min is an error naming the flag.
std::vector<int> int_list(const std::string& text, const char* flag, int min, const char* expected) {
  std::vector<int> out;
  for (const std::string& c : split_list(text)) {
    size_t used = 0;
    int v = min - 1;
    try {
      v = std::stoi(c, &used);
    } catch (const std::exception&) {
    }
    FP_CHECK(used == c.size() && v >= min, flag, " '", text, "': expected ", expected);
    out.push_back(v);
  }
  return out;
}

std::vector<Level> levels_from(const BenchServeOptions& o) {
  std::vector<int> conc = int_list(o.concurrency, "--max-concurrency", 1, "positive integers like 1,4,16");
  if (conc.empty()) conc.push_back(0);
  std::vector<double> rates;
  for (const std::string& r : split_list(o.rate)) {
    if (r == "inf") {
      rates.push_back(INFINITY);
      continue;
    }
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(r, &used);
    } catch (const std::exception&) {
    }
    FP_CHECK(used == r.size() && v > 0, "--request-rate '", o.rate, "': expected positive numbers or inf");
    rates.push_back(v);
  }
  if (rates.empty()) rates.push_back(INFINITY);
  FP_CHECK(conc.size() == 1 || rates.size() == 1, "give several --max-concurrency levels or several --request-rate "
                                                  "values, not both");
  std::vector<Level> levels;
  for (int c : conc)
    for (double r : rates) levels.push_back({c, r});
  return levels;
}

// The served model's tokenizer, when -m or --tokenizer names one.
struct TokenizerHandle {
  std::unique_ptr<ModelFile> file;
  std::unique_ptr<Tokenizer> own;
  const Tokenizer* get() const { return own ? own.get() : file ? file->tokenizer.get() : nullptr; }
};

TokenizerHandle load_tokenizer(const BenchServeOptions& o) {
  TokenizerHandle h;
  if (!o.model_path.empty()) {
    LoadOptions lo;
    lo.tokenizer_path = o.tokenizer_path;  // llama2.c: tokenizer.bin
    lo.prefault = false;                   // only the vocabulary is read
    h.file = load_model_file(o.model_path, lo);
    FP_CHECK(h.file->tokenizer, o.model_path, ": the model carries no tokenizer (pass --tokenizer)");
  } else if (!o.tokenizer_path.empty()) {
    h.own = Tokenizer::from_path(o.tokenizer_path);
  }
  return h;
}

std::string utc_now() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  FP_CHECK(f, path, ": cannot open for writing");
  f << text;
  f.flush();  // a full disk shows here, not in a destructor that cannot report it
  FP_CHECK(f, path, ": write failed: ", std::strerror(errno));
}

// Requests per level: one count for all, or a list as long as the list of levels.
std::vector<int> prompts_per_level(const BenchServeOptions& o, size_t levels) {
  std::vector<int> n = int_list(o.num_prompts, "--num-prompts", 0, "counts >= 0 like 100 or 8,16,32");
  FP_CHECK(!n.empty(), "--num-prompts '", o.num_prompts, "': expected a count");
  if (n.size() == 1) n.resize(levels, n.front());
  FP_CHECK(n.size() == levels, "--num-prompts '", o.num_prompts, "' has ", n.size(), " counts for ", levels,
           " levels: give one count, or one per level");
  return n;
}

nlohmann::json per_level_json(const std::vector<int>& n) {
  bool same = std::all_of(n.begin(), n.end(), [&](int v) { return v == n.front(); });
  return same && !n.empty() ? nlohmann::json(n.front()) : nlohmann::json(n);
}

// --compare: no load, only the side-by-side view of earlier --json results.
void compare_runs(const BenchServeOptions& o) {
  std::vector<std::string> files = split_list(o.compare), names = split_list(o.labels);
  FP_CHECK(!files.empty(), "--compare '", o.compare, "': expected result files like a.json,b.json");
  FP_CHECK(names.empty() || names.size() == files.size(), "--labels '", o.labels, "' has ", names.size(), " names for ",
           files.size(), " files");
  std::vector<RunSummary> runs;
  for (size_t i = 0; i < files.size(); ++i) runs.push_back(read_run(files[i], names.empty() ? "" : names[i]));
  print_runs(std::cout, runs);
  if (!o.svg_path.empty()) {
    write_file(o.svg_path, render_svg(runs_chart(runs, "bench-serve: output throughput per level")));
    log_info("bench-serve: wrote ", o.svg_path);
  }
}

void run(const BenchServeOptions& o) {
  if (o.quiet) set_log_level(LogLevel::Error);
  if (!o.compare.empty()) return compare_runs(o);
  Target t;
  parse_base_url(o.base_url.empty() ? "http://" + o.host + ":" + std::to_string(o.port) : o.base_url, t.origin,
                 t.path_prefix);
  FP_CHECK(!o.endpoint.empty() && o.endpoint[0] == '/', "--endpoint '", o.endpoint, "': expected a path like /v1/completions");
  FP_CHECK(o.request_timeout > 0 && o.connect_timeout > 0, "timeouts must be > 0 s");
  t.endpoint = o.endpoint;
  t.api_key = o.api_key;
  t.request_timeout_s = o.request_timeout;
  t.connect_timeout_s = std::min(o.connect_timeout, o.request_timeout);
  std::vector<Level> levels = levels_from(o);
  const std::vector<int> n_prompts = prompts_per_level(o, levels.size());
  t.model = o.model;
  if (t.model.empty()) {
    std::vector<std::string> ids = list_models(t);
    FP_CHECK(!ids.empty(), "GET ", t.origin, t.path_prefix, "/v1/models lists no model; pass --model NAME");
    t.model = ids.front();
  }
  TokenizerHandle tok = load_tokenizer(o);
  if (!tok.get()) log_warn("no tokenizer (-m MODEL or --tokenizer PATH): prompts are random words, token counts approximate");

  SamplingOptions s;
  s.temperature = o.temperature;
  s.ignore_eos = o.ignore_eos;
  std::cout << "bench-serve: " << t.origin << t.path_prefix << t.endpoint << ", model '" << t.model << "', "
            << o.num_prompts << " prompts per level" << (o.ignore_eos ? ", ignore_eos" : "") << "\n";

  nlohmann::json out;
  out["date"] = utc_now();
  out["base_url"] = t.origin + t.path_prefix;
  out["endpoint"] = t.endpoint;
  out["model"] = t.model;
  out["dataset"] = {{"name", o.data.name},          {"num_prompts", per_level_json(n_prompts)},
                    {"input_len", o.data.input_len}, {"output_len", o.data.output_len},
                    {"range_ratio", o.data.range_ratio}, {"prefix_len", o.data.prefix_len},
                    {"seed", o.data.seed}};
  out["ignore_eos"] = o.ignore_eos;
  out["temperature"] = o.temperature;
  out["num_warmups"] = o.num_warmups;
  out["levels"] = nlohmann::json::array();

  std::vector<LevelResult> results;
  int64_t completed = 0;
  for (size_t i = 0; i < levels.size(); ++i) {
    // Each level gets its own prompts (seeded by level), so a server's prefix cache does not
    // carry one level's prompts into the next; warm-up prompts are different again.
    DatasetOptions d = o.data;
    d.num_prompts = n_prompts[i];
    d.seed = o.data.seed + 1000003ull * (i + 1);
    Dataset data = make_dataset(d, tok.get());
    if (i == 0) {
      std::cout << "dataset: " << data.note << "\n";
      out["dataset"]["note"] = data.note;
    }
    std::vector<Prompt> warm;
    if (o.num_warmups > 0) {
      DatasetOptions w = d;
      w.num_prompts = o.num_warmups;
      w.seed = o.data.seed + 7919ull * (i + 1) + 17;
      warm = make_dataset(w, tok.get()).prompts;
    }
    std::string label = level_label(levels[i].concurrency, levels[i].request_rate);
    log_info("bench-serve: ", label, ": ", warm.size(), " warm-up + ", data.prompts.size(), " requests");
    int warm_failed = 0;
    LevelResult r = run_level(t, s, data.prompts, warm, levels[i], o.data.seed + i, &warm_failed);
    if (warm_failed) log_warn("bench-serve: ", label, ": ", warm_failed, " of ", warm.size(), " warm-up requests failed");
    r.label = label;
    print_level(std::cout, r);
    std::cout.flush();
    completed += r.completed;
    out["levels"].push_back(level_json(r, !o.no_requests_in_json));
    results.push_back(std::move(r));
  }
  if (results.size() > 1) {
    std::cout << "\n";
    print_comparison(std::cout, results);
  }
  if (!o.json_path.empty()) {
    write_file(o.json_path, out.dump(2) + "\n");
    log_info("bench-serve: wrote ", o.json_path);
  }
  if (!o.svg_path.empty()) {
    std::string title = "bench-serve: " + t.model + " (" + o.data.name + " " + std::to_string(o.data.input_len) +
                        " in / " + std::to_string(o.data.output_len) + " out)";
    Chart c = results.size() > 1 ? levels_chart(results, title) : cdf_chart(results.front(), title + ", " + results.front().label);
    write_file(o.svg_path, render_svg(c));
    log_info("bench-serve: wrote ", o.svg_path);
  }
  if (completed == 0 && std::accumulate(n_prompts.begin(), n_prompts.end(), 0) > 0) {
    log_error("bench-serve: every request failed (first error: ", results.front().first_error, ")");
    throw CLI::RuntimeError(1);
  }
}

}  // namespace

void add_bench_serve(CLI::App& app) {
  auto o = std::make_shared<BenchServeOptions>();
  auto* cmd = app.add_subcommand("bench-serve",
                                 "load-test an OpenAI-compatible server (streaming): TTFT, TPOT, ITL, latency, throughput");
  cmd->add_option("--base-url", o->base_url, "server URL, e.g. http://127.0.0.1:8080 (overrides --host/--port)");
  cmd->add_option("--host", o->host, "server host")->capture_default_str();
  cmd->add_option("--port", o->port, "server port")->capture_default_str();
  cmd->add_option("--endpoint", o->endpoint, "/v1/completions or /v1/chat/completions")->capture_default_str();
  cmd->add_option("--model", o->model, "model name sent in requests (default: the first id of GET /v1/models)");
  cmd->add_option("--api-key", o->api_key, "Bearer token");
  cmd->add_option("-m,--model-path", o->model_path,
                  "the served model file (.gguf, HF dir, llama2.c .bin): its tokenizer makes prompts of exact token counts");
  cmd->add_option("--tokenizer", o->tokenizer_path,
                  "a tokenizer (.gguf, tokenizer.json, or a directory); with -m on a llama2.c .bin, its tokenizer.bin");
  cmd->add_option("--dataset-name", o->data.name, "random or shared-prefix")->capture_default_str();
  cmd->add_option("--num-prompts", o->num_prompts, "requests per level; a list like 8,16,32 gives each level its own count")
      ->capture_default_str();
  cmd->add_option("--random-input-len", o->data.input_len, "input tokens (the suffix after a shared prefix)")->capture_default_str();
  cmd->add_option("--random-output-len", o->data.output_len, "max_tokens per request")->capture_default_str();
  cmd->add_option("--random-range-ratio", o->data.range_ratio,
                  "lengths drawn uniformly from [len*(1-r), len*(1+r)], 0 <= r < 1")->capture_default_str();
  cmd->add_option("--prefix-len", o->data.prefix_len, "shared-prefix: tokens every prompt starts with")->capture_default_str();
  cmd->add_option("--max-concurrency", o->concurrency, "requests in flight at most; a list like 1,4,16 runs one level each (default: unlimited)");
  cmd->add_option("--request-rate", o->rate, "Poisson arrivals per second, or inf (all at once); a list runs one level each")->capture_default_str();
  cmd->add_option("--num-warmups", o->num_warmups, "untimed requests before each level")->capture_default_str();
  cmd->add_flag("--ignore-eos", o->ignore_eos, "send ignore_eos and min_tokens = max_tokens (every request generates its full length)");
  cmd->add_option("--temperature", o->temperature, "sampling temperature sent")->capture_default_str();
  cmd->add_option("--seed", o->data.seed, "seed of prompts, lengths and arrivals")->capture_default_str();
  cmd->add_option("--request-timeout", o->request_timeout, "seconds a request may take (and stay silent) before it counts as failed")->capture_default_str();
  cmd->add_option("--connect-timeout", o->connect_timeout, "seconds to wait for a connection")->capture_default_str();
  cmd->add_option("--json", o->json_path, "write every figure per level, with per-request records, to FILE");
  cmd->add_flag("--no-request-records", o->no_requests_in_json, "leave the per-request records out of --json");
  cmd->add_option("--svg", o->svg_path,
                  "write a chart to FILE: throughput and p95 TTFT per level, or the latency CDFs of a single level");
  cmd->add_option("--compare", o->compare,
                  "no load: print earlier --json results side by side (a.json,b.json; the first is the baseline) and chart them with --svg");
  cmd->add_option("--labels", o->labels, "names for the --compare files (fastpath,llama.cpp)");
  cmd->add_flag("-q,--quiet", o->quiet, "only errors on stderr");
  cmd->callback([o] { run(*o); });
}

}  // namespace fp::tools
