// tests/server_test.cpp — `fastpath serve` over loopback: the OpenAI routes and formats, the
// robustness suite (malformed and hostile requests get the right 4xx; 50 clients that drop
// mid-stream beside 8 normal ones; the KV pool is fully free afterwards), API keys, metrics,
// and graceful shutdown on SIGTERM.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "model/lora.h"
#include "server/openai_api.h"
#include "tokenizer/chat_template.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

extern char** environ;

namespace fp {
namespace {

using nlohmann::json;

// A `fastpath serve` child process on a free port.
class ServerProcess {
 public:
  explicit ServerProcess(const std::vector<std::string>& extra, int max_model_len = 256) {
    dir_ = test::temp_dir("serve");
    port_file_ = dir_ + "/port";
    std::vector<std::string> args = {test::fastpath_bin(), "serve", "-q", "-m", test::stories_path(), "--port", "0", "--port-file", port_file_,
                                     "--kv-cache-memory", "64MiB", "--max-model-len", std::to_string(max_model_len)};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ), 0);
    for (int i = 0; i < 1000 && port_ == 0; ++i) {
      std::ifstream f(port_file_);
      if (!(f >> port_)) port_ = 0;
      if (port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_GT(port_, 0) << "the server did not start";
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }
  // SIGTERM, then the exit status (or -1 if it did not exit within 10 s).
  int terminate() {
    kill(pid_, SIGTERM);
    for (int i = 0; i < 1000; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

 private:
  std::string dir_, port_file_;
  pid_t pid_ = -1;
  int port_ = 0;
};

json post(httplib::Client& c, const std::string& path, const std::string& body, int* status, const httplib::Headers& h = {}) {
  auto res = c.Post(path, h, body, "application/json");
  if (!res) {
    *status = -1;
    return nullptr;
  }
  *status = res->status;
  return json::parse(res->body, nullptr, false);
}

std::string greedy_text(const std::string& prompt, int n) {
  int rc = -1;
  std::string out = test::run_command(test::fastpath_bin() + " generate -q --temp 0 -n " + std::to_string(n) + " -p '" + prompt +
                                          "' -m " + test::stories_path(), &rc);
  EXPECT_EQ(rc, 0);
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Reads an SSE stream; returns the concatenated text of choice 0 and the parsed events.
struct Streamed {
  std::string error;  // transport error, if any
  std::vector<json> events;
  bool done = false;
  std::map<int, std::string> text;
  std::map<int, std::string> reasoning;  // chat: delta.reasoning_content
  std::map<int, std::string> finish;
};

// Each body is a 400 whose error names `param` and says `needle`.
struct Refusal {
  std::string body, param, needle;
};
void expect_refusals(httplib::Client& c, const std::string& path, const std::vector<Refusal>& bad) {
  for (const Refusal& b : bad) {
    int st = 0;
    const json r = post(c, path, b.body, &st);
    EXPECT_EQ(st, 400) << b.body;
    EXPECT_EQ(r["error"]["param"], b.param) << r.dump();
    EXPECT_NE(r["error"]["message"].get<std::string>().find(b.needle), std::string::npos) << r.dump();
  }
}

Streamed stream(httplib::Client& c, const std::string& path, const json& body, int drop_after = -1) {
  Streamed s;
  std::string buf;
  int chunks = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buf.append(data, len);
    for (size_t pos; (pos = buf.find("\n\n")) != std::string::npos;) {
      std::string ev = buf.substr(0, pos);
      buf.erase(0, pos + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      std::string payload = ev.substr(6);
      if (payload == "[DONE]") {
        s.done = true;
        continue;
      }
      json j = json::parse(payload, nullptr, false);
      s.events.push_back(j);
      for (auto& ch : j["choices"]) {
        int i = ch["index"];
        if (ch.contains("text")) s.text[i] += ch["text"].get<std::string>();
        if (ch.contains("delta") && ch["delta"].contains("content")) s.text[i] += ch["delta"]["content"].get<std::string>();
        if (ch.contains("delta") && ch["delta"].contains("reasoning_content"))
          s.reasoning[i] += ch["delta"]["reasoning_content"].get<std::string>();
        if (!ch["finish_reason"].is_null()) s.finish[i] = ch["finish_reason"];
      }
      if (drop_after >= 0 && ++chunks >= drop_after) return false;  // hang up mid-stream
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  if (!c.send(req, res, err) && err != httplib::Error::Canceled) s.error = httplib::to_string(err);
  if (res.status != 200 && res.status != -1) s.error += " HTTP " + std::to_string(res.status) + " " + buf.substr(0, 300);
  return s;
}

// The value of one sample line "<name> <value>" of /metrics (-1 when absent).
double metric(httplib::Client& c, const std::string& name) {
  auto res = c.Get("/metrics");
  if (!res) return -1;
  const std::string key = "\n" + name + " ";
  const size_t at = res->body.find(key);
  if (at == std::string::npos) return -1;
  return std::stod(res->body.substr(at + key.size()));
}

TEST(Server, OpenAiRoutesAndFormats) {
  FP_REQUIRE_FILE(test::stories_path());
  ServerProcess srv({});
  auto c = srv.client();
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto models = json::parse(c.Get("/v1/models")->body);
  EXPECT_EQ(models["data"][0]["id"], "stories260K.gguf");

  // Non-streaming completion = the greedy text of `generate`.
  int st = 0;
  json r = post(c, "/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0})", &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], greedy_text("Once upon a time", 24));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 24);
  EXPECT_EQ(r["usage"]["prompt_tokens"], 5);

  // Streaming gives the same text; n = 2 gives two choices; usage at the end when asked.
  Streamed s = stream(c, "/v1/completions",
                      {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}, {"stream", true}, {"n", 2},
                       {"stream_options", {{"include_usage", true}}}});
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.text[0], r["choices"][0]["text"]);
  EXPECT_EQ(s.text[1], r["choices"][0]["text"]);  // greedy: both choices agree
  ASSERT_FALSE(s.events.empty());
  EXPECT_EQ(s.events.back()["usage"]["completion_tokens"], 48);

  // A stop string (matched across token boundaries) ends the text before it.
  const std::string full = r["choices"][0]["text"];
  const std::string stop = full.substr(10, 5);
  Streamed st2 = stream(c, "/v1/completions",
                        {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}, {"stream", true}, {"stop", {stop}}});
  EXPECT_EQ(st2.text[0], full.substr(0, full.find(stop)));
  EXPECT_EQ(st2.finish[0], "stop");

  // A stop token id ends the choice where that token would come, as the end-of-generation token
  // does: the greedy text up to the first "." (id 426 in stories260K's vocabulary: `fastpath tokenize`
  // of "a." gives 261 426).
  json stop_ids = post(c, "/v1/completions",
                       R"({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "stop_token_ids": [426]})", &st);
  ASSERT_EQ(st, 200) << stop_ids.dump();
  ASSERT_NE(full.find('.'), std::string::npos);
  EXPECT_EQ(stop_ids["choices"][0]["text"], full.substr(0, full.find('.')));
  EXPECT_EQ(stop_ids["choices"][0]["finish_reason"], "stop");

  // Chat: the plain fallback template, so the prompt is "user: ...\nassistant: ".
  json chat = post(c, "/v1/chat/completions",
                   R"({"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 16, "temperature": 0})", &st);
  ASSERT_EQ(st, 200) << chat.dump();
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], greedy_text("user: Tell me a story\nassistant: ", 16));

  // Logprobs: the chosen token's log-probability is the best of the top alternatives (greedy).
  json lp = post(c, "/v1/completions", R"({"prompt": "Once", "max_tokens": 3, "temperature": 0, "logprobs": 2})", &st);
  ASSERT_EQ(st, 200);
  auto& l = lp["choices"][0]["logprobs"];
  ASSERT_EQ(l["token_logprobs"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_LE(l["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_EQ(l["top_logprobs"][i].size(), 2u);
  }
  // Seeded sampling is reproducible.
  const char* sampled = R"({"prompt": "Once", "max_tokens": 12, "temperature": 0.9, "seed": 7})";
  EXPECT_EQ(post(c, "/v1/completions", sampled, &st)["choices"][0]["text"], post(c, "/v1/completions", sampled, &st)["choices"][0]["text"]);

  auto ledger = c.Get("/v1/ledger");
  ASSERT_TRUE(ledger);
  EXPECT_NE(ledger->body.find("matmul"), std::string::npos);
  EXPECT_EQ(srv.terminate(), 0);
}

// Speculative decoding behind the API: the greedy text of plain decoding, streamed or not, with
// several requests at once, and the drafts counted in /metrics.
// RFC 4648 base64 to bytes (the test's own decoder, for encoding_format "base64").
std::vector<uint8_t> base64_decode(const std::string& s) {
  auto value = [](char ch) -> int {
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    return ch == '+' ? 62 : ch == '/' ? 63 : -1;
  };
  std::vector<uint8_t> out;
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : s) {
    const int v = value(ch);
    if (v < 0) break;  // '=' padding
    acc = acc << 6 | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>(acc >> bits & 0xff));
    }
  }
  return out;
}

// POST /v1/embeddings beside the completions: the vectors `fastpath embed` prints, in float and
// base64, cut to `dimensions` and normalised again, token-id inputs, the refusals by field, and
// completions that still give the greedy text afterwards (the model is back to logits).
TEST(Server, EmbeddingsBesideCompletions) {
  FP_REQUIRE_FILE(test::stories_path());
  ServerProcess srv({});
  auto c = srv.client();
  int st = 0;
  json r = post(c, "/v1/embeddings", R"({"input": ["Once upon a time", "The cat sat"], "model": "stories260K.gguf"})", &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["object"], "list");
  ASSERT_EQ(r["data"].size(), 2u);
  EXPECT_EQ(r["data"][1]["index"], 1);
  const auto v0 = r["data"][0]["embedding"].get<std::vector<float>>();
  ASSERT_EQ(v0.size(), 64u);
  double ss = 0;
  for (float x : v0) ss += static_cast<double>(x) * x;
  EXPECT_NEAR(ss, 1.0, 1e-5);
  int rc = 0;
  const std::string cli = test::run_command(
      test::fastpath_bin() + " embed -q -m " + test::stories_path() + " -p 'Once upon a time' -p 'The cat sat'", &rc);
  ASSERT_EQ(rc, 0) << cli;
  std::istringstream cli_lines(cli);
  std::string first, second;
  std::getline(cli_lines, first);
  std::getline(cli_lines, second);
  const auto want = json::parse(first)["embedding"].get<std::vector<float>>();
  ASSERT_EQ(want.size(), v0.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(v0[i], want[i], 1e-6) << i;
  EXPECT_EQ(r["usage"]["prompt_tokens"], json::parse(first)["tokens"].get<int>() + json::parse(second)["tokens"].get<int>());

  // base64: the float32 values of the same request, little-endian.
  json f = post(c, "/v1/embeddings", R"({"input": "Once upon a time", "encoding_format": "float"})", &st);
  ASSERT_EQ(st, 200) << f.dump();
  const auto single = f["data"][0]["embedding"].get<std::vector<float>>();
  json b = post(c, "/v1/embeddings", R"({"input": "Once upon a time", "encoding_format": "base64"})", &st);
  ASSERT_EQ(st, 200) << b.dump();
  const std::vector<uint8_t> bytes = base64_decode(b["data"][0]["embedding"].get<std::string>());
  ASSERT_EQ(bytes.size(), 64u * 4);
  std::vector<float> decoded(64);
  std::memcpy(decoded.data(), bytes.data(), bytes.size());
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(decoded[i], single[i]) << i;

  // dimensions: the first 16 values, normalised again; token ids as input.
  json d = post(c, "/v1/embeddings", R"({"input": [[1, 403, 407, 261]], "dimensions": 16})", &st);
  ASSERT_EQ(st, 200) << d.dump();
  const auto v16 = d["data"][0]["embedding"].get<std::vector<float>>();
  ASSERT_EQ(v16.size(), 16u);
  ss = 0;
  for (float x : v16) ss += static_cast<double>(x) * x;
  EXPECT_NEAR(ss, 1.0, 1e-5);
  EXPECT_EQ(d["usage"]["prompt_tokens"], 4);

  for (auto [body, status, param] : {std::tuple{R"({"input": 5})", 400, "input"}, std::tuple{R"({})", 400, "input"},
                                     std::tuple{R"({"input": []})", 400, "input"}, std::tuple{R"({"input": [[1, 999999]]})", 400, "input"},
                                     std::tuple{R"({"input": "x", "dimensions": 0})", 400, "dimensions"},
                                     std::tuple{R"({"input": "x", "dimensions": 65})", 400, "dimensions"},
                                     std::tuple{R"({"input": "x", "encoding_format": "hex"})", 400, "encoding_format"},
                                     std::tuple{R"({"input": "x", "model": "other"})", 404, "model"}}) {
    json e = post(c, "/v1/embeddings", body, &st);
    EXPECT_EQ(st, status) << body << " -> " << e.dump();
    EXPECT_EQ(e["error"]["param"], param) << body;
  }
  std::string long_input = "[[";
  for (int i = 0; i < 300; ++i) long_input += (i ? ", " : "") + std::string("5");
  long_input += "]]";
  json lg = post(c, "/v1/embeddings", R"({"input": )" + long_input + "}", &st);
  EXPECT_EQ(st, 400) << lg.dump();
  EXPECT_NE(lg["error"]["message"].get<std::string>().find("300 tokens, more than the maximum of 256"), std::string::npos) << lg.dump();

  json comp = post(c, "/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0})", &st);
  ASSERT_EQ(st, 200) << comp.dump();
  EXPECT_EQ(comp["choices"][0]["text"], greedy_text("Once upon a time", 16));

  // Embeddings while completions stream: each gets what it gets alone.
  std::vector<std::thread> streams;
  std::vector<std::string> texts(3);
  for (int i = 0; i < 3; ++i)
    streams.emplace_back([&, i] {
      auto sc = srv.client();
      texts[static_cast<size_t>(i)] =
          stream(sc, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 120}, {"temperature", 0}, {"stream", true}}).text[0];
    });
  for (int k = 0; k < 5; ++k) {
    json again = post(c, "/v1/embeddings", R"({"input": "Once upon a time"})", &st);
    ASSERT_EQ(st, 200) << again.dump();
    const auto v = again["data"][0]["embedding"].get<std::vector<float>>();
    for (size_t i = 0; i < v.size(); ++i) ASSERT_NEAR(v[i], single[i], 1e-6) << "request " << k << ", value " << i;
  }
  for (auto& t : streams) t.join();
  const std::string want_text = greedy_text("Once upon a time", 120);
  for (const std::string& t : texts) EXPECT_EQ(t, want_text);
  const std::string metrics = c.Get("/metrics")->body;
  EXPECT_NE(metrics.find("fastpath:embedding_requests_total 9"), std::string::npos) << metrics;
}

// LoRA adapters chosen by the request's "model" (--lora NAME=PATH): each name's text is what
// `generate --lora` gives alone, also while the other adapters' and the base model's requests
// stream beside it (one batch); /v1/models lists them; unknown names get 404 naming what is served.
TEST(Server, LoraAdaptersByModelName) {
  FP_REQUIRE_FILE(test::stories_path());
  const std::string dir = test::temp_dir("serve_lora");
  synth_lora(test::stories_path(), {{"r", 4}, {"lora_alpha", 16}, {"target_modules", {"q_proj", "v_proj", "down_proj"}}}, 1, dir + "/sad");
  synth_lora(test::stories_path(), {{"r", 8}, {"lora_alpha", 16}, {"target_modules", {"o_proj", "up_proj"}}}, 2, dir + "/odd");
  ServerProcess srv({"--lora", "sad=" + dir + "/sad", "--lora", dir + "/odd"});
  auto c = srv.client();
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  const json list = json::parse(models->body);
  ASSERT_EQ(list["data"].size(), 3u) << list.dump();
  EXPECT_EQ(list["data"][1]["id"], "sad");
  EXPECT_EQ(list["data"][2]["id"], "odd");  // named after its directory
  EXPECT_EQ(list["data"][2]["parent"], list["data"][0]["id"]);

  const std::string prompt = "Once upon a time";
  const int n = 40;
  auto alone = [&](const std::string& lora) {
    int rc = -1;
    std::string out = test::run_command(test::fastpath_bin() + " generate -q --temp 0 -n " + std::to_string(n) + " -p '" + prompt +
                                            "' -m " + test::stories_path() + (lora.empty() ? "" : " --lora " + dir + "/" + lora), &rc);
    EXPECT_EQ(rc, 0) << out;
    if (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  };
  const std::vector<std::string> names = {"sad", "stories260K.gguf", "odd"};
  const std::vector<std::string> want = {alone("sad"), alone(""), alone("odd")};
  EXPECT_NE(want[0], want[1]);
  EXPECT_NE(want[2], want[1]);
  int st = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    json r = post(c, "/v1/completions", json{{"model", names[i]}, {"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}}.dump(), &st);
    ASSERT_EQ(st, 200) << r.dump();
    EXPECT_EQ(r["choices"][0]["text"], want[i]) << names[i];
    EXPECT_EQ(r["model"], names[i]);
  }
  // All at once, twice each: rows of three adapters (and none) in the same steps.
  std::vector<std::thread> streams;
  std::vector<std::string> texts(6);
  for (size_t i = 0; i < texts.size(); ++i)
    streams.emplace_back([&, i] {
      auto sc = srv.client();
      texts[i] = stream(sc, "/v1/completions",
                        {{"model", names[i % 3]}, {"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"stream", true}})
                     .text[0];
    });
  for (auto& t : streams) t.join();
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(texts[i], want[i % 3]) << names[i % 3] << ", concurrent";
  const std::string metrics = c.Get("/metrics")->body;  // one plain call and two streams each
  EXPECT_NE(metrics.find("fastpath:lora_requests_total{lora_name=\"sad\"} 3\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("fastpath:lora_requests_total{lora_name=\"odd\"} 3\n"), std::string::npos) << metrics;

  json unknown = post(c, "/v1/completions", R"({"model": "happy", "prompt": "x", "max_tokens": 2})", &st);
  EXPECT_EQ(st, 404);
  EXPECT_EQ(unknown["error"]["param"], "model");
  EXPECT_NE(unknown["error"]["message"].get<std::string>().find("`sad`, `odd`"), std::string::npos) << unknown.dump();
  json emb = post(c, "/v1/embeddings", R"({"model": "sad", "input": "x"})", &st);
  EXPECT_EQ(st, 400) << emb.dump();
  EXPECT_NE(emb["error"]["message"].get<std::string>().find("LoRA adapter `sad`"), std::string::npos) << emb.dump();

  // A bad adapter stops the server at start, naming it.
  int rc = 0;
  const std::string err = test::run_command(test::fastpath_bin() + " serve -q -m " + test::stories_path() + " --port 0 --lora x=" + dir +
                                                "/missing 2>&1",
                                            &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find(dir + "/missing"), std::string::npos) << err;
}

// --allow-runtime-lora: vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter. A loaded
// adapter serves at once (its text is `generate --lora`'s), an unloaded one is gone from the
// routes and /v1/models; names, paths and unknown adapters are refused by field. Without the
// flag the routes do not exist.
TEST(Server, LoraAdaptersLoadAndUnloadAtRuntime) {
  FP_REQUIRE_FILE(test::stories_path());
  const std::string dir = test::temp_dir("serve_lora_runtime");
  synth_lora(test::stories_path(), {{"r", 4}, {"lora_alpha", 16}, {"target_modules", {"q_proj", "v_proj", "down_proj"}}}, 1, dir + "/sad");
  {
    ServerProcess plain({});
    auto c = plain.client();
    auto r = c.Post("/v1/load_lora_adapter", json{{"lora_name", "sad"}, {"lora_path", dir + "/sad"}}.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404) << "the route exists only with --allow-runtime-lora";
  }
  ServerProcess srv({"--allow-runtime-lora"});
  auto c = srv.client();
  const std::string prompt = "Once upon a time";
  int rc = -1;
  std::string want = test::run_command(test::fastpath_bin() + " generate -q --temp 0 -n 24 -p '" + prompt + "' -m " +
                                           test::stories_path() + " --lora " + dir + "/sad",
                                       &rc);
  ASSERT_EQ(rc, 0);
  if (!want.empty() && want.back() == '\n') want.pop_back();
  auto complete = [&](const std::string& model, int* st) {
    return post(c, "/v1/completions", json{{"model", model}, {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}}.dump(), st);
  };
  int st = 0;
  complete("late", &st);
  EXPECT_EQ(st, 404);
  auto admin = [&](const std::string& route, const json& body, int* status) {
    auto r = c.Post(route, body.dump(), "application/json");
    *status = r ? r->status : -1;
    return r ? r->body : std::string();
  };
  std::string body = admin("/v1/load_lora_adapter", {{"lora_name", "late"}, {"lora_path", dir + "/sad"}}, &st);
  ASSERT_EQ(st, 200) << body;
  EXPECT_EQ(body, "Success: LoRA adapter 'late' added successfully.");
  json r = complete("late", &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"], want);
  const json models = json::parse(c.Get("/v1/models")->body);
  ASSERT_EQ(models["data"].size(), 2u);
  EXPECT_EQ(models["data"][1]["id"], "late");
  EXPECT_EQ(models["data"][1]["root"], dir + "/sad");

  // Refusals: the same name again, a path that is no adapter, a body without the fields.
  body = admin("/v1/load_lora_adapter", {{"lora_name", "late"}, {"lora_path", dir + "/sad"}}, &st);
  EXPECT_EQ(st, 400);
  EXPECT_NE(body.find("has already been loaded"), std::string::npos) << body;
  body = admin("/v1/load_lora_adapter", {{"lora_name", "other"}, {"lora_path", dir + "/missing"}}, &st);
  EXPECT_EQ(st, 400);
  EXPECT_NE(body.find(dir + "/missing"), std::string::npos) << body;
  EXPECT_NE(body.find("lora_path"), std::string::npos) << body;
  body = admin("/v1/load_lora_adapter", {{"lora_name", "a\"b"}, {"lora_path", dir + "/sad"}}, &st);
  EXPECT_EQ(st, 400);
  EXPECT_NE(body.find("quotes"), std::string::npos) << body;
  body = admin("/v1/load_lora_adapter", {{"lora_name", "other"}}, &st);
  EXPECT_EQ(st, 400);
  EXPECT_NE(body.find("lora_path"), std::string::npos) << body;

  body = admin("/v1/unload_lora_adapter", {{"lora_name", "late"}}, &st);
  ASSERT_EQ(st, 200) << body;
  EXPECT_EQ(body, "Success: LoRA adapter 'late' removed successfully.");
  complete("late", &st);
  EXPECT_EQ(st, 404);
  EXPECT_EQ(json::parse(c.Get("/v1/models")->body)["data"].size(), 1u);
  body = admin("/v1/unload_lora_adapter", {{"lora_name", "late"}}, &st);
  EXPECT_EQ(st, 404) << body;
  // Loaded again under the same name: a new id, the same text (nothing cached under the old one is reused wrongly).
  body = admin("/v1/load_lora_adapter", {{"lora_name", "late"}, {"lora_path", dir + "/sad"}}, &st);
  ASSERT_EQ(st, 200) << body;
  r = complete("late", &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"], want);
  r = complete("stories260K.gguf", &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"], greedy_text(prompt, 24));
}

TEST(Server, SpeculativeDecodingServesThePlainGreedyText) {
  FP_REQUIRE_FILE(test::stories_path());
  ServerProcess srv({"--speculative-tokens", "5", "--prompt-lookup-min", "1", "--prompt-lookup-max", "3"});
  auto c = srv.client();
  const std::string want = greedy_text("Once upon a time", 100);
  int st = 0;
  json r = post(c, "/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 100, "temperature": 0})", &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"], want);
  EXPECT_EQ(r["usage"]["completion_tokens"], 100);
  std::vector<std::thread> clients;
  std::vector<Streamed> got(4);
  for (size_t i = 0; i < got.size(); ++i)
    clients.emplace_back([&, i] {
      auto ci = srv.client();
      got[i] = stream(ci, "/v1/completions",
                      {{"prompt", "Once upon a time"}, {"max_tokens", 100}, {"temperature", 0}, {"stream", true}});
    });
  for (auto& t : clients) t.join();
  for (const Streamed& g : got) {
    EXPECT_TRUE(g.error.empty()) << g.error;
    EXPECT_EQ(g.text.at(0), want);
  }
  const double drafted = metric(c, "fastpath:spec_decode_num_draft_tokens_total");
  const double accepted = metric(c, "fastpath:spec_decode_num_accepted_tokens_total");
  EXPECT_GT(metric(c, "fastpath:spec_decode_num_drafts_total"), 0);
  EXPECT_GT(accepted, 0);
  EXPECT_LE(accepted, drafted);
  EXPECT_EQ(srv.terminate(), 0);
}

// Constrained decoding over HTTP: response_format json_schema (plain and streamed, n = 2),
// json_object, llama.cpp's grammar; a schema or grammar that cannot be used is a 400 naming it.
TEST(Server, ResponseFormatAndGrammarConstrainTheOutput) {
  FP_REQUIRE_FILE(test::stories_path());
  ServerProcess srv({});
  auto c = srv.client();
  const json schema = json::parse(R"({"type": "object", "properties": {"mood": {"enum": ["happy", "sad"]}, "age": {"type": "integer"},
                                      "names": {"type": "array", "items": {"enum": ["Lily", "Tom"]}, "maxItems": 2}},
                                      "required": ["mood", "age", "names"]})");
  auto check = [](const std::string& text) {
    ASSERT_TRUE(json::accept(text)) << text;
    const json j = json::parse(text);
    EXPECT_TRUE(j["mood"] == "happy" || j["mood"] == "sad") << text;
    EXPECT_TRUE(j["age"].is_number_integer()) << text;
    EXPECT_TRUE(j["names"].is_array() && j["names"].size() <= 2) << text;
    EXPECT_EQ(j.size(), 3u) << text;
  };
  const json rf = {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", schema}, {"strict", true}}}};
  int st = 0;
  json r = post(c, "/v1/chat/completions",
                json({{"messages", {{{"role", "user"}, {"content", "Tell me about Lily."}}}}, {"response_format", rf}, {"temperature", 0},
                      {"max_tokens", 200}})
                    .dump(),
                &st);
  ASSERT_EQ(st, 200) << r.dump();
  check(r["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  Streamed sr = stream(c, "/v1/chat/completions",
                       {{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}, {"response_format", rf}, {"n", 2},
                        {"temperature", 1.0}, {"seed", 3}, {"max_tokens", 200}, {"stream", true}});
  EXPECT_TRUE(sr.error.empty()) << sr.error;
  for (int i = 0; i < 2; ++i) {
    check(sr.text[i]);
    EXPECT_EQ(sr.finish[i], "stop");
  }
  // Any object: it parses when it ended, and its log-probabilities are still the model's.
  r = post(c, "/v1/completions",
           json({{"prompt", "The cat"}, {"response_format", {{"type", "json_object"}}}, {"max_tokens", 60}, {"temperature", 0.7}, {"seed", 1}})
               .dump(),
           &st);
  ASSERT_EQ(st, 200) << r.dump();
  if (r["choices"][0]["finish_reason"] == "stop") {
    EXPECT_TRUE(json::parse(r["choices"][0]["text"].get<std::string>()).is_object()) << r.dump();
  }
  r = post(c, "/v1/completions", json({{"prompt", "Is the sky blue?"}, {"grammar", "root ::= \"yes\" | \"no\""}, {"temperature", 0}}).dump(), &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_TRUE(r["choices"][0]["text"] == "yes" || r["choices"][0]["text"] == "no") << r.dump();
  // Refusals name the field and the problem.
  const std::vector<Refusal> bad = {
      {R"x({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "(?=a)"}}}})x",
       "response_format.json_schema.schema", "lookaround"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "integer", "multipleOf": 3}}}})",
       "response_format.json_schema.schema", "'multipleOf'"},
      // Nesting that used to overflow the parser's stack and take the server down.
      {"{\"prompt\": \"x\", \"grammar\": \"root ::= " + std::string(100000, '(') + "\\\"a\\\"" + std::string(100000, ')') + "\"}",
       "grammar", "nested deeper"},
      {R"({"prompt": "x", "response_format": {"type": "xml"}})", "response_format.type", "xml"},
      {R"({"prompt": "x", "response_format": {"type": 5}})", "response_format", "string 'type'"},
      {R"({"prompt": "x", "response_format": {"type": null}})", "response_format", "string 'type'"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema"}})", "response_format.json_schema", "needs"},
      {R"({"prompt": "x", "grammar": "root ::= item"})", "grammar", "'item'"},
      {R"({"prompt": "x", "grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}})", "grammar", "give one"},
      {R"({"prompt": "x", "guided_json": "{not json"})", "guided_json", "cannot be used"},
  };
  expect_refusals(c, "/v1/completions", bad);
  EXPECT_EQ(srv.terminate(), 0);
}

// vLLM's constraints: guided_choice / guided_regex / guided_grammar (before vLLM 0.12) and
// structured_outputs {choice | regex | json | grammar | json_object} (after); sampled choices
// stay inside them. Refusals name the field.
TEST(Server, VllmStructuredOutputsConstrainTheOutput) {
  FP_REQUIRE_FILE(test::stories_path());
  ServerProcess srv({});
  auto c = srv.client();
  const json moods = {"happy", "sad", "very happy"};
  auto is_mood = [&](const json& t) { return t == "happy" || t == "sad" || t == "very happy"; };
  // Three digits, a dash, two lowercase letters: the whole reply.
  auto is_code = [](const std::string& t) {
    if (t.size() != 6 || t[3] != '-') return false;
    for (int i = 0; i < 3; ++i)
      if (!std::isdigit(static_cast<unsigned char>(t[static_cast<size_t>(i)]))) return false;
    return std::islower(static_cast<unsigned char>(t[4])) && std::islower(static_cast<unsigned char>(t[5]));
  };
  int st = 0;
  for (const json& field : {json{{"guided_choice", moods}}, json{{"structured_outputs", {{"choice", moods}}}}}) {
    json body = {{"prompt", "Lily felt"}, {"n", 4}, {"temperature", 1.0}, {"seed", 5}, {"max_tokens", 20}};
    body.update(field);
    json r = post(c, "/v1/completions", body.dump(), &st);
    ASSERT_EQ(st, 200) << r.dump();
    for (const json& ch : r["choices"]) {
      EXPECT_TRUE(is_mood(ch["text"])) << r.dump();
      EXPECT_EQ(ch["finish_reason"], "stop") << r.dump();
    }
  }
  for (const json& field : {json{{"guided_regex", "[0-9]{3}-[a-z]{2}"}}, json{{"structured_outputs", {{"regex", "^\\d{3}-[a-z]{2}$"}}}}}) {
    json body = {{"messages", {{{"role", "user"}, {"content", "A code?"}}}}, {"n", 3}, {"temperature", 1.0}, {"seed", 8}, {"max_tokens", 20}};
    body.update(field);
    json r = post(c, "/v1/chat/completions", body.dump(), &st);
    ASSERT_EQ(st, 200) << r.dump();
    for (const json& ch : r["choices"]) EXPECT_TRUE(is_code(ch["message"]["content"].get<std::string>())) << r.dump();
  }
  json r = post(c, "/v1/completions",
                json({{"prompt", "Tom"}, {"structured_outputs", {{"json", {{"type", "object"}, {"properties", {{"age", {{"type", "integer"}}}}},
                                                                                {"required", {"age"}}}}}},
                      {"temperature", 0}, {"max_tokens", 40}})
                    .dump(),
                &st);
  ASSERT_EQ(st, 200) << r.dump();
  const json obj = json::parse(r["choices"][0]["text"].get<std::string>(), nullptr, false);
  EXPECT_TRUE(obj.is_object() && obj.size() == 1 && obj["age"].is_number_integer()) << r.dump();
  for (const json& field : {json{{"guided_grammar", "root ::= \"yes\" | \"no\""}}, json{{"structured_outputs", {{"grammar", "root ::= \"yes\" | \"no\""}}}}}) {
    json body = {{"prompt", "Is the sky blue?"}, {"temperature", 0}};
    body.update(field);
    r = post(c, "/v1/completions", body.dump(), &st);
    ASSERT_EQ(st, 200) << r.dump();
    EXPECT_TRUE(r["choices"][0]["text"] == "yes" || r["choices"][0]["text"] == "no") << r.dump();
  }
  const std::vector<Refusal> bad = {
      {R"({"prompt": "x", "structured_outputs": {}})", "structured_outputs", "needs one of"},
      {R"({"prompt": "x", "structured_outputs": 3})", "structured_outputs", "must be an object"},
      {R"({"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["b"]}})", "structured_outputs.choice", "give one"},
      {R"({"prompt": "x", "structured_outputs": {"structural_tag": "{}"}})", "structured_outputs.structural_tag", "not supported"},
      {R"({"prompt": "x", "structured_outputs": {"json_object": "yes"}})", "structured_outputs.json_object", "true or false"},
      {R"({"prompt": "x", "structured_outputs": {"regex": "(?=a)b"}})", "structured_outputs.regex", "lookaround"},
      {R"({"prompt": "x", "guided_choice": []})", "guided_choice", "1 to"},
      {R"({"prompt": "x", "guided_choice": ["a", 1]})", "guided_choice", "item 1"},
      {R"({"prompt": "x", "guided_choice": ["a", ""]})", "guided_choice", "item 1"},
      {R"({"prompt": "x", "guided_regex": 7})", "guided_regex", "regular expression"},
      {R"({"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]})", "guided_choice", "give one"},
      {R"({"prompt": "x", "guided_grammar": "root ::= item"})", "guided_grammar", "'item'"},
  };
  expect_refusals(c, "/v1/completions", bad);
  EXPECT_EQ(srv.terminate(), 0);
}

// vLLM's sampling extras: min_tokens (the end held back, and a stop string written before it
// does not end the reply), include_stop_str_in_output, skip_special_tokens false,
// truncate_prompt_tokens; bad values are 400s naming the field.
TEST(Server, VllmSamplingExtras) {
  FP_REQUIRE_FILE(test::stories_path());
  ServerProcess srv({});
  auto c = srv.client();
  auto tok = Tokenizer::from_path(test::stories_path());
  const json eos_first = {{std::to_string(tok->eos_id()), 100}};
  int st = 0;
  json r = post(c, "/v1/completions",
                json({{"prompt", "Tom"}, {"temperature", 0}, {"max_tokens", 20}, {"logit_bias", eos_first}, {"min_tokens", 5}}).dump(), &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["usage"]["completion_tokens"], 5) << r.dump();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  // The end-of-generation token written as text when special tokens are not skipped.
  for (bool skip : {true, false}) {
    r = post(c, "/v1/completions",
             json({{"prompt", "Tom"}, {"temperature", 0}, {"max_tokens", 3}, {"logit_bias", eos_first}, {"ignore_eos", true},
                   {"skip_special_tokens", skip}})
                 .dump(),
             &st);
    ASSERT_EQ(st, 200) << r.dump();
    const std::string piece = tok->decode({tok->eos_id()}, true);
    ASSERT_FALSE(piece.empty());
    EXPECT_EQ(r["choices"][0]["text"], skip ? "" : piece + piece + piece) << r.dump();
  }
  // Stop strings: cut before the first '.', or after it, or (min_tokens) not at one written earlier.
  auto complete = [&](json extra) {
    json body = {{"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 60}};
    body.update(extra);
    json out = post(c, "/v1/completions", body.dump(), &st);
    EXPECT_EQ(st, 200) << out.dump();
    return out;
  };
  const std::string full = complete(json::object())["choices"][0]["text"].get<std::string>();
  const size_t dot = full.find('.');
  ASSERT_NE(dot, std::string::npos) << full;
  ASSERT_NE(full.find('.', dot + 1), std::string::npos) << full;
  EXPECT_EQ(complete({{"stop", "."}})["choices"][0]["text"], full.substr(0, dot));
  EXPECT_EQ(complete({{"stop", "."}, {"include_stop_str_in_output", true}})["choices"][0]["text"], full.substr(0, dot + 1));
  r = complete({{"stop", "."}, {"min_tokens", 30}});
  const std::string late = r["choices"][0]["text"].get<std::string>();
  EXPECT_GT(late.size(), dot + 1) << late;
  EXPECT_EQ(full.compare(0, late.size(), late), 0) << late;
  if (r["choices"][0]["finish_reason"] == "stop") {
    EXPECT_EQ(full[late.size()], '.');
  }
  EXPECT_GE(r["usage"]["completion_tokens"].get<int>(), 30);
  // truncate_prompt_tokens: the prompt's last k tokens, as if sent alone.
  const std::vector<int32_t> ids = tok->encode("Once upon a time, there was a little girl named Lily. She liked cats.", true, false);
  ASSERT_GT(ids.size(), 8u);
  const std::vector<int32_t> last5(ids.end() - 5, ids.end());
  r = post(c, "/v1/completions", json({{"prompt", ids}, {"truncate_prompt_tokens", 5}, {"temperature", 0}, {"max_tokens", 8}}).dump(), &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["usage"]["prompt_tokens"], 5);
  json alone = post(c, "/v1/completions", json({{"prompt", last5}, {"temperature", 0}, {"max_tokens", 8}}).dump(), &st);
  EXPECT_EQ(r["choices"][0]["text"], alone["choices"][0]["text"]);
  std::vector<int32_t> many;
  while (many.size() < 5000) many.insert(many.end(), ids.begin() + 1, ids.end());
  r = post(c, "/v1/completions", json({{"prompt", many}, {"max_tokens", 1}}).dump(), &st);
  EXPECT_EQ(st, 400) << r.dump();
  r = post(c, "/v1/completions", json({{"prompt", many}, {"truncate_prompt_tokens", -1}, {"max_tokens", 1}}).dump(), &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_LT(r["usage"]["prompt_tokens"].get<int64_t>(), 5000);
  const std::vector<Refusal> bad = {
      {R"({"prompt": "x", "max_tokens": 4, "min_tokens": 5})", "min_tokens", "[0, 4]"},
      {R"({"prompt": "x", "min_tokens": -1})", "min_tokens", "must be in"},
      {R"({"prompt": "x", "min_tokens": 2, "guided_choice": ["a", "b"]})", "min_tokens", "constrained"},
      {R"({"prompt": "x", "include_stop_str_in_output": "yes"})", "include_stop_str_in_output", "true or false"},
      {R"({"prompt": "x", "skip_special_tokens": 1})", "skip_special_tokens", "true or false"},
      {R"({"prompt": "x", "truncate_prompt_tokens": 0})", "truncate_prompt_tokens", "-1 or at least 1"},
      {R"({"prompt": "x", "truncate_prompt_tokens": -2})", "truncate_prompt_tokens", "must be in"},
      {R"({"prompt": "x", "priority": 1})", "priority", "--scheduling-policy priority"},
  };
  expect_refusals(c, "/v1/completions", bad);
  EXPECT_EQ(srv.terminate(), 0);
  // A server scheduling by priority takes it (the order itself: Engine.PriorityPolicy...).
  ServerProcess prio({"--scheduling-policy", "priority"});
  auto pc = prio.client();
  r = post(pc, "/v1/completions", R"({"prompt": "Tom", "priority": -3, "max_tokens": 4})", &st);
  EXPECT_EQ(st, 200) << r.dump();
  r = post(pc, "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "Hi"}], "priority": "high"})", &st);
  EXPECT_EQ(st, 400) << r.dump();
  EXPECT_EQ(r["error"]["param"], "priority");
  EXPECT_EQ(prio.terminate(), 0);
}

// OpenAI's logit_bias: +100 makes a token the greedy choice every time; bad keys and values are
// 400s naming the field.
TEST(Server, LogitBiasForcesATokenAndBadBiasesAreRefused) {
  FP_REQUIRE_FILE(test::stories_path());
  ServerProcess srv({});
  auto c = srv.client();
  auto tok = Tokenizer::from_path(test::stories_path());
  const std::string piece = tok->token_to_bytes(410);
  int st = 0;
  json r = post(c, "/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "logit_bias": {"410": 100}})", &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"], piece + piece + piece + piece + piece) << r.dump();
  for (const std::string bad : {R"({"abc": 1})", R"({"410": 101})", R"({"999999": 1})", R"({"-1": 1})", R"([1])", R"({"4x": 1})"}) {
    r = post(c, "/v1/completions", R"({"prompt": "x", "logit_bias": )" + bad + "}", &st);
    EXPECT_EQ(st, 400) << bad;
    EXPECT_EQ(r["error"]["param"], "logit_bias") << r.dump();
  }
  EXPECT_EQ(srv.terminate(), 0);
}

// Tool calling with tool_choice "required" or a named function: the reply is a call written
// under the function's parameter schema, as message.tool_calls (whole in one delta when
// streamed); "auto" is refused by name, "none" writes text.
TEST(Server, ToolChoiceRequiredOrNamedWritesACall) {
  FP_REQUIRE_FILE(test::stories_path());
  ServerProcess srv({}, 512);
  auto c = srv.client();
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
      "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer"}},
                     "required": ["city", "days"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "play", "parameters": {"type": "object", "properties": {"game": {"enum": ["tag", "ball"]}},
                                                                     "required": ["game"]}}}])");
  const json messages = {{{"role", "user"}, {"content", "What is the weather?"}}};
  auto check_weather = [](const json& call) {
    EXPECT_EQ(call["type"], "function");
    EXPECT_FALSE(call["id"].get<std::string>().empty());
    EXPECT_EQ(call["function"]["name"], "get_weather") << call.dump();
    const json args = json::parse(call["function"]["arguments"].get<std::string>());
    EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Oslo") << call.dump();
    EXPECT_TRUE(args["days"].is_number_integer()) << call.dump();
  };
  int st = 0;
  const json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  json r = post(c, "/v1/chat/completions",
                json({{"messages", messages}, {"tools", tools}, {"tool_choice", named}, {"temperature", 0}, {"max_tokens", 100}}).dump(), &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r.dump();
  EXPECT_TRUE(r["choices"][0]["message"]["content"].is_null());
  ASSERT_EQ(r["choices"][0]["message"]["tool_calls"].size(), 1u) << r.dump();
  check_weather(r["choices"][0]["message"]["tool_calls"][0]);
  // required: any one of the tools, sampled, n = 3.
  r = post(c, "/v1/chat/completions",
           json({{"messages", messages}, {"tools", tools}, {"tool_choice", "required"}, {"temperature", 1.0}, {"seed", 2}, {"n", 3},
                 {"max_tokens", 400}})
               .dump(),
           &st);
  ASSERT_EQ(st, 200) << r.dump();
  for (const auto& ch : r["choices"]) {
    ASSERT_EQ(ch["finish_reason"], "tool_calls") << r.dump();
    const json& call = ch["message"]["tool_calls"][0];
    if (call["function"]["name"] == "get_weather") {
      check_weather(call);
    } else {
      EXPECT_EQ(call["function"]["name"], "play") << r.dump();
      const json args = json::parse(call["function"]["arguments"].get<std::string>());
      EXPECT_TRUE(args["game"] == "tag" || args["game"] == "ball") << r.dump();
    }
  }
  // Streamed: the call arrives whole in one delta, then finish_reason tool_calls.
  Streamed sr = stream(c, "/v1/chat/completions",
                       {{"messages", messages}, {"tools", tools}, {"tool_choice", named}, {"temperature", 0}, {"max_tokens", 100},
                        {"stream", true}, {"logprobs", true}});
  EXPECT_TRUE(sr.error.empty()) << sr.error;
  EXPECT_TRUE(sr.done);
  EXPECT_EQ(sr.finish[0], "tool_calls");
  int deltas_with_calls = 0, logprob_entries = 0;
  for (const json& ev : sr.events)
    for (const auto& ch : ev["choices"]) {
      if (ch.contains("logprobs") && ch["logprobs"].is_object()) logprob_entries += static_cast<int>(ch["logprobs"]["content"].size());
      if (ch["delta"].contains("tool_calls")) {
        ++deltas_with_calls;
        EXPECT_EQ(ch["delta"]["tool_calls"][0]["index"], 0);
        check_weather(ch["delta"]["tool_calls"][0]);
      }
    }
  EXPECT_EQ(deltas_with_calls, 1);
  EXPECT_GT(logprob_entries, 0) << "the call's tokens' log-probabilities stream as they come";
  // none: text, with the tools only shown to the template.
  r = post(c, "/v1/chat/completions",
           json({{"messages", messages}, {"tools", tools}, {"tool_choice", "none"}, {"temperature", 0}, {"max_tokens", 8}}).dump(), &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_TRUE(r["choices"][0]["message"]["content"].is_string());
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls"));
  // Refusals.
  struct Bad {
    json body;
    std::string param, needle;
  };
  const std::vector<Bad> bad = {
      {json({{"messages", messages}, {"tools", tools}}), "tool_choice", "'auto'"},
      {json({{"messages", messages}, {"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "fly"}}}}}}), "tool_choice", "'fly'"},
      {json({{"messages", messages}, {"tool_choice", "required"}}), "tool_choice", "needs 'tools'"},
      {json({{"messages", messages}, {"tools", json::array({{{"type", "function"}, {"function", {{"name", "a b"}}}}})}, {"tool_choice", "required"}}),
       "tools[0].function.name", "letters"},
      {json({{"messages", messages}, {"tools", tools}, {"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}}),
       "response_format", "give one"},
      {json({{"messages", messages},
             {"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "integer"}, {"multipleOf", 2}}}}}}})},
             {"tool_choice", "required"}}),
       "tools", "'multipleOf'"},
  };
  for (const Bad& b : bad) {
    r = post(c, "/v1/chat/completions", b.body.dump(), &st);
    EXPECT_EQ(st, 400) << b.body.dump();
    EXPECT_EQ(r["error"]["param"], b.param) << r.dump();
    EXPECT_NE(r["error"]["message"].get<std::string>().find(b.needle), std::string::npos) << r.dump();
  }
  EXPECT_EQ(srv.terminate(), 0);
}

// tool_choice auto with a chat template that writes Hermes calls (Qwen3's, from the test data):
// the reply's <tool_call> blocks come back as tool_calls, the text beside them as content (a
// grammar makes the model write one here); without a call the reply is plain text.
TEST(Server, ToolChoiceAutoFindsHermesCallsInTheReply) {
  FP_REQUIRE_FILE(test::stories_path());
  const std::string qwen3 = test::testdata("tokenizers/qwen3/tokenizer_config.json");
  FP_REQUIRE_FILE(qwen3);
  ServerProcess srv({"--chat-template", qwen3}, 1024);
  auto c = srv.client();
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "play", "parameters": {"type": "object",
                                       "properties": {"game": {"type": "string"}}, "required": ["game"]}}}])");
  const json messages = {{{"role", "user"}, {"content", "Shall we play?"}}};
  const std::string forced = R"(root ::= "Let me see. <tool_call>\n{\"name\": \"play\", \"arguments\": {\"game\": \"tag\"}}\n</tool_call>")";
  int st = 0;
  json r = post(c, "/v1/chat/completions",
                json({{"messages", messages}, {"tools", tools}, {"grammar", forced}, {"temperature", 0}, {"max_tokens", 200}}).dump(), &st);
  ASSERT_EQ(st, 200) << r.dump();
  const json& msg = r["choices"][0]["message"];
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r.dump();
  EXPECT_EQ(msg["content"], "Let me see.") << r.dump();
  ASSERT_EQ(msg["tool_calls"].size(), 1u) << r.dump();
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "play");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"game":"tag"})");
  // Streamed: the text first, then the call in one delta, then finish_reason tool_calls.
  Streamed sr = stream(c, "/v1/chat/completions",
                       {{"messages", messages}, {"tools", tools}, {"grammar", forced}, {"temperature", 0}, {"max_tokens", 200}, {"stream", true}});
  EXPECT_TRUE(sr.error.empty()) << sr.error;
  EXPECT_EQ(sr.finish[0], "tool_calls");
  EXPECT_EQ(sr.text[0], "Let me see. ");
  int calls = 0;
  for (const json& ev : sr.events)
    for (const auto& ch : ev["choices"])
      if (ch["delta"].contains("tool_calls")) {
        ++calls;
        EXPECT_EQ(ch["delta"]["tool_calls"][0]["function"]["arguments"], R"({"game":"tag"})");
      }
  EXPECT_EQ(calls, 1);
  // No call written: the reply is text, streamed or not, as without tools.
  r = post(c, "/v1/chat/completions", json({{"messages", messages}, {"tools", tools}, {"temperature", 0}, {"max_tokens", 16}}).dump(), &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_TRUE(r["choices"][0]["message"]["content"].is_string()) << r.dump();
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls"));
  sr = stream(c, "/v1/chat/completions", {{"messages", messages}, {"tools", tools}, {"temperature", 0}, {"max_tokens", 16}, {"stream", true}});
  EXPECT_EQ(sr.text[0], r["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(srv.terminate(), 0);
}

// tool_choice auto with a template in Llama 3.1's manner (calls as JSON after <|python_tag|>):
// a reply that is a {"name", "parameters"} object comes back as a call; text stays text.
TEST(Server, ToolChoiceAutoFindsLlama3JsonCalls) {
  FP_REQUIRE_FILE(test::stories_path());
  const std::string dir = test::temp_dir("llama3_tools");
  test::write_file(dir + "/chat.jinja",
                   "{%- for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                   "{%- if tools %}(answer with a call as <|python_tag|>{\"name\": ..., \"parameters\": ...}){% endif %}assistant: ");
  ServerProcess srv({"--chat-template", dir + "/chat.jinja"}, 512);
  auto c = srv.client();
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "play", "parameters": {"type": "object",
                                       "properties": {"game": {"type": "string"}}}}}])");
  const json messages = {{{"role", "user"}, {"content", "Shall we play?"}}};
  const std::string forced = R"(root ::= "{\"name\": \"play\", \"parameters\": {\"game\": \"tag\"}}")";
  int st = 0;
  json r = post(c, "/v1/chat/completions",
                json({{"messages", messages}, {"tools", tools}, {"grammar", forced}, {"temperature", 0}, {"max_tokens", 100}}).dump(), &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r.dump();
  EXPECT_TRUE(r["choices"][0]["message"]["content"].is_null()) << r.dump();
  ASSERT_EQ(r["choices"][0]["message"]["tool_calls"].size(), 1u) << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], R"({"game":"tag"})");
  Streamed sr = stream(c, "/v1/chat/completions",
                       {{"messages", messages}, {"tools", tools}, {"grammar", forced}, {"temperature", 0}, {"max_tokens", 100}, {"stream", true}});
  EXPECT_EQ(sr.finish[0], "tool_calls");
  EXPECT_EQ(sr.text[0], "");
  r = post(c, "/v1/chat/completions", json({{"messages", messages}, {"tools", tools}, {"temperature", 0}, {"max_tokens", 16}}).dump(), &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_TRUE(r["choices"][0]["message"]["content"].is_string()) << r.dump();
  EXPECT_EQ(srv.terminate(), 0);
}

// One tool-calling format over HTTP: a chat template that teaches it (so the server picks its
// parser), a grammar that makes stories260K write "On my way. " and then `call` (the call
// spelled in the format), and the reply split into content and one call of `go` whose
// arguments come back as `want_args`, plain and streamed. Returns the call's id.
std::string expect_auto_call(const std::string& tag, const std::string& tmpl, const std::string& call,
                             const json& properties, const std::string& want_args) {
  const std::string dir = test::temp_dir(tag);
  test::write_file(dir + "/chat.jinja", tmpl);
  ServerProcess srv({"--chat-template", dir + "/chat.jinja"}, 512);
  auto c = srv.client();
  json gbnf_text = "On my way. " + call;
  const json body = {{"messages", {{{"role", "user"}, {"content", "Where to?"}}}},
                     {"tools", json::array({{{"type", "function"},
                                             {"function", {{"name", "go"}, {"parameters", {{"type", "object"}, {"properties", properties}}}}}}})},
                     {"grammar", "root ::= " + gbnf_text.dump()},
                     {"temperature", 0},
                     {"max_tokens", 160}};
  int st = 0;
  const json r = post(c, "/v1/chat/completions", body.dump(), &st);
  EXPECT_EQ(st, 200) << tag << ": " << r.dump();
  if (st != 200) return {};
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << tag << ": " << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["content"], "On my way.") << tag << ": " << r.dump();
  const json calls = r["choices"][0]["message"]["tool_calls"];
  EXPECT_EQ(calls.size(), 1u) << tag << ": " << r.dump();
  if (calls.size() != 1) return {};
  EXPECT_EQ(calls[0]["function"]["name"], "go") << tag;
  EXPECT_EQ(calls[0]["function"]["arguments"], want_args) << tag;
  json streamed = body;
  streamed["stream"] = true;
  Streamed sr = stream(c, "/v1/chat/completions", streamed);
  EXPECT_EQ(sr.finish[0], "tool_calls") << tag;
  EXPECT_EQ(sr.text[0], "On my way. ") << tag;
  EXPECT_EQ(srv.terminate(), 0);
  return calls[0]["id"].get<std::string>();
}

// GLM-4.5's tag format: the values come back typed by the request's tools.
TEST(Server, ToolChoiceAutoFindsGlm45Calls) {
  FP_REQUIRE_FILE(test::stories_path());
  expect_auto_call("glm45_tools",
                   "{%- for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                   "{%- if tools %}(call as <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>){% endif %}<|assistant|>",
                   "<tool_call>go\n<arg_key>to</arg_key><arg_value>7</arg_value><arg_key>km</arg_key><arg_value>7</arg_value></tool_call>",
                   {{"to", {{"type", "string"}}}, {"km", {{"type", "number"}}}}, R"({"to":"7","km":7})");
}

// Qwen3-Coder's XML format: multi-line values, typed by the request's tools.
TEST(Server, ToolChoiceAutoFindsQwen3CoderCalls) {
  FP_REQUIRE_FILE(test::stories_path());
  expect_auto_call("qwen3_coder_tools",
                   "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                   "{%- if tools %}(call as <tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>)"
                   "{% endif %}<|im_start|>assistant\n",
                   "<tool_call>\n<function=go>\n<parameter=to>\nthe big\npark\n</parameter>\n<parameter=km>\n7\n</parameter>\n"
                   "</function>\n</tool_call>",
                   {{"to", {{"type", "string"}}}, {"km", {{"type", "number"}}}}, R"({"to":"the big\npark","km":7})");
}

// Mistral's [TOOL_CALLS] format (stories260K spells the marker as text; a Mistral vocabulary's
// control token decodes to it because such replies keep their control tokens). Its templates
// take back only call ids of nine letters and digits.
TEST(Server, ToolChoiceAutoFindsMistralCalls) {
  FP_REQUIRE_FILE(test::stories_path());
  const std::string id = expect_auto_call("mistral_tools",
                                          "{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
                                          "{%- for m in messages %}[INST]{{ m['content'] }}[/INST]{% endfor %}"
                                          "{%- if false %}[TOOL_CALLS]{% endif %}",
                                          "[TOOL_CALLS]go[ARGS]{\"to\": \"the park\"}", {{"to", {{"type", "string"}}}},
                                          R"({"to":"the park"})");
  EXPECT_TRUE(id.size() == 9 && std::all_of(id.begin(), id.end(), [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)); }))
      << id;
}

// A thinking template whose prompt opens the <think> block (as DeepSeek-R1's does): the whole
// reply, never closed, is reasoning_content, plain and streamed; a constrained request thinks
// first; --reasoning-parser none keeps it all in content.
// A harmony template (gpt-oss's markers in it): the server says so, a reply that does not follow
// the format (stories260K knows no harmony tokens) is all content, plain and streamed, tools
// with tool_choice auto are taken, and constrained output is refused by name (the grammar would
// forbid the reply's channel headers). The channel split itself: tests/harmony_test.cpp.
TEST(Server, HarmonyTemplateRepliesAndRefusals) {
  FP_REQUIRE_FILE(test::stories_path());
  const std::string dir = test::temp_dir("harmony");
  test::write_file(dir + "/chat.jinja",
                   "{%- for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
                   "{%- if false %}<|channel|>{% endif %}<|start|>assistant Once upon a time");
  ServerProcess srv({"--chat-template", dir + "/chat.jinja"}, 512);
  auto c = srv.client();
  const json body = {{"messages", {{{"role", "user"}, {"content", "Tell me"}}}}, {"temperature", 0}, {"max_tokens", 24}};
  int st = 0;
  const json r = post(c, "/v1/chat/completions", body.dump(), &st);
  ASSERT_EQ(st, 200) << r.dump();
  const json& m = r["choices"][0]["message"];
  const std::string text = m["content"].get<std::string>();
  EXPECT_FALSE(text.empty()) << r.dump();
  EXPECT_FALSE(m.contains("reasoning_content")) << r.dump();
  json streamed = body;
  streamed["stream"] = true;
  Streamed sr = stream(c, "/v1/chat/completions", streamed);
  EXPECT_EQ(sr.text[0], text);
  EXPECT_EQ(sr.reasoning[0], "");
  json tools = body;
  tools["tools"] = json::array({{{"type", "function"},
                                 {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}, {"properties", json::object()}}}}}}});
  tools["tool_choice"] = "auto";
  const json tr = post(c, "/v1/chat/completions", tools.dump(), &st);
  ASSERT_EQ(st, 200) << tr.dump();
  EXPECT_EQ(tr["choices"][0]["message"]["content"], text) << tr.dump();
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"response_format", {{"type", "json_object"}}}, {"grammar", "root ::= \"yes\""}, {"tool_choice", "required"}}) {
    json constrained = field == "tool_choice" ? tools : body;
    constrained[field] = value;
    const json e = post(c, "/v1/chat/completions", constrained.dump(), &st);
    EXPECT_EQ(st, 400) << field << ": " << e.dump();
    EXPECT_NE(e.dump().find("harmony"), std::string::npos) << e.dump();
    // A schema or grammar waits for the answer's <|channel|>final<|message|>, which this
    // vocabulary cannot spell; a forced call is refused whatever the vocabulary.
    EXPECT_NE(e.dump().find(field == "tool_choice" ? "names or requires a call" : "<|channel|> and <|message|> control tokens"),
              std::string::npos)
        << e.dump();
  }
  json text_format = body;
  text_format["response_format"] = {{"type", "text"}};
  EXPECT_EQ(post(c, "/v1/chat/completions", text_format.dump(), &st)["choices"][0]["message"]["content"], text);
  EXPECT_EQ(st, 200);
  EXPECT_EQ(srv.terminate(), 0);
}

TEST(Server, ThinkingGoesOutAsReasoningContent) {
  FP_REQUIRE_FILE(test::stories_path());
  const std::string dir = test::temp_dir("reasoning");
  test::write_file(dir + "/chat.jinja",
                   "{%- for m in messages %}{{ m['content'] }}{% endfor %}"
                   "{%- if false %}</think>{% endif %} Once upon a time<think>");
  const json body = {{"messages", {{{"role", "user"}, {"content", "Tell me"}}}}, {"temperature", 0}, {"max_tokens", 24}};
  std::string plain_text;
  for (const std::string parser : {"auto", "none"}) {
    ServerProcess srv({"--chat-template", dir + "/chat.jinja", "--reasoning-parser", parser}, 512);
    auto c = srv.client();
    int st = 0;
    const json r = post(c, "/v1/chat/completions", body.dump(), &st);
    ASSERT_EQ(st, 200) << r.dump();
    const json& m = r["choices"][0]["message"];
    if (parser == "none") {
      EXPECT_FALSE(m.contains("reasoning_content")) << r.dump();
      EXPECT_EQ(m["content"], plain_text);
      continue;
    }
    plain_text = m["reasoning_content"].get<std::string>();
    EXPECT_FALSE(plain_text.empty()) << r.dump();
    EXPECT_EQ(m["content"], "") << r.dump();
    json streamed = body;
    streamed["stream"] = true;
    Streamed sr = stream(c, "/v1/chat/completions", streamed);
    EXPECT_EQ(sr.reasoning[0], plain_text);
    EXPECT_EQ(sr.text[0], "");
    // Constrained: the model thinks first (anything but the closing tag), then the grammar holds.
    json constrained = body;
    constrained["grammar"] = R"(root ::= "yes" | "no")";
    constrained["max_tokens"] = 60;
    const json cr = post(c, "/v1/chat/completions", constrained.dump(), &st);
    ASSERT_EQ(st, 200) << cr.dump();
    const json& cm = cr["choices"][0]["message"];
    EXPECT_EQ(cm["reasoning_content"].get<std::string>().find("</think>"), std::string::npos) << cr.dump();
    if (cr["choices"][0]["finish_reason"] == "stop") EXPECT_TRUE(cm["content"] == "yes" || cm["content"] == "no") << cr.dump();
    else EXPECT_EQ(cm["content"], "") << cr.dump();
    EXPECT_EQ(srv.terminate(), 0);
  }
  // A template that thinks but leaves opening the block to the model: the block is optional, the
  // answer under the grammar either way (this model answers at once), plain and streamed.
  test::write_file(dir + "/open.jinja", "{%- for m in messages %}{{ m['content'] }}{% endfor %}{%- if false %}</think>{% endif %} ");
  ServerProcess srv({"--chat-template", dir + "/open.jinja"}, 512);
  auto c = srv.client();
  json constrained = body;
  constrained["grammar"] = R"(root ::= "yes" | "no")";
  int st = 0;
  const json r = post(c, "/v1/chat/completions", constrained.dump(), &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << r.dump();
  std::string answer = r["choices"][0]["message"]["content"];
  EXPECT_TRUE(answer.find_first_not_of(' ') != std::string::npos) << r.dump();
  const std::string word = answer.substr(answer.find_first_not_of(" \n"));  // blanks may come first
  EXPECT_TRUE(word == "yes" || word == "no") << r.dump();
  constrained["stream"] = true;
  Streamed sr = stream(c, "/v1/chat/completions", constrained);
  EXPECT_EQ(sr.text[0], answer);
  EXPECT_EQ(srv.terminate(), 0);
}

TEST(Server, BadRequestsGetTheRight4xx) {
  FP_REQUIRE_FILE(test::stories_path());
  ServerProcess srv({});
  auto c = srv.client();
  struct Case {
    std::string path, body;
    int status;
    std::string param;  // the field the error names
  };
  const std::string long_prompt(3000, 'a');
  const std::vector<Case> cases = {
      {"/v1/completions", "{not json", 400, ""},
      {"/v1/completions", "[1, 2]", 400, ""},
      {"/v1/completions", R"({"max_tokens": 5})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": 42})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": "hi", "max_tokens": "ten"})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": "hi", "max_tokens": -5})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": "hi", "max_tokens": 100000000000})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": "hi", "max_tokens": 254})", 400, "max_tokens"},  // 3 prompt tokens + 254 > 256
      {"/v1/completions", R"({"prompt": "hi", "temperature": 7})", 400, "temperature"},
      {"/v1/completions", R"({"prompt": "hi", "top_p": 0})", 400, "top_p"},
      {"/v1/completions", R"({"prompt": "hi", "n": 0})", 400, "n"},
      {"/v1/completions", R"({"prompt": "hi", "stop": [1, 2]})", 400, "stop"},
      {"/v1/completions", R"({"prompt": "hi", "stop_token_ids": [1, 99999]})", 400, "stop_token_ids"},
      {"/v1/completions", R"({"prompt": "hi", "stop_token_ids": "."})", 400, "stop_token_ids"},
      {"/v1/completions", R"({"prompt": "hi", "stream": "yes"})", 400, "stream"},
      {"/v1/completions", R"({"prompt": "hi", "logprobs": 99})", 400, "logprobs"},
      {"/v1/completions", R"({"prompt": [1, 99999]})", 400, "prompt"},
      {"/v1/completions", "{\"prompt\": \"" + long_prompt + "\"}", 400, "prompt"},
      {"/v1/completions", "{\"prompt\": \"bad \xff\xfe utf8\"}", 400, ""},
      {"/v1/completions", R"({"prompt": "hi", "model": "gpt-4"})", 404, "model"},
      {"/v1/chat/completions", R"({"messages": "hello"})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages": [{"content": "no role"}]})", 400, "messages[0].role"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})", 400, "top_logprobs"},
      {"/v1/nothing", "{}", 404, ""},
  };
  for (const Case& k : cases) {
    int st = 0;
    json r = post(c, k.path, k.body, &st);
    EXPECT_EQ(st, k.status) << k.body.substr(0, 200) << " -> " << r.dump();
    ASSERT_TRUE(r.is_object() && r.contains("error")) << k.body.substr(0, 200);
    EXPECT_FALSE(r["error"]["message"].get<std::string>().empty());
    if (!k.param.empty()) {
      EXPECT_EQ(r["error"]["param"], k.param) << k.body.substr(0, 200);
    }
  }
  // A 10 MB body is refused (413) without reading it into a request.
  int st = 0;
  std::string huge = "{\"prompt\": \"" + std::string(10 << 20, 'x') + "\"}";
  post(c, "/v1/completions", huge, &st);
  EXPECT_EQ(st, 413);
  // The server is still up and serving.
  json ok = post(c, "/v1/completions", R"({"prompt": "Once", "max_tokens": 4})", &st);
  EXPECT_EQ(st, 200) << ok.dump();
  EXPECT_GT(metric(c, "fastpath:request_rejected_total"), 20);
  EXPECT_EQ(srv.terminate(), 0);
}

TEST(Server, ApiKeyIsEnforcedOnV1Only) {
  FP_REQUIRE_FILE(test::stories_path());
  ServerProcess srv({"--api-key", "sekret"});
  auto c = srv.client();
  int st = 0;
  json r = post(c, "/v1/completions", R"({"prompt": "Once", "max_tokens": 2})", &st);
  EXPECT_EQ(st, 401);
  EXPECT_EQ(r["error"]["type"], "authentication_error");
  post(c, "/v1/completions", R"({"prompt": "Once", "max_tokens": 2})", &st, {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(st, 401);
  post(c, "/v1/completions", R"({"prompt": "Once", "max_tokens": 2})", &st, {{"Authorization", "Bearer sekret"}});
  EXPECT_EQ(st, 200);
  EXPECT_EQ(c.Get("/health")->status, 200);  // outside /v1: open
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  post(c, "/tokenize", R"({"prompt": "Once"})", &st);  // the tokenizer routes are guarded too
  EXPECT_EQ(st, 401);
  post(c, "/detokenize", R"({"tokens": [1]})", &st);
  EXPECT_EQ(st, 401);
  post(c, "/tokenize", R"({"prompt": "Once"})", &st, {{"Authorization", "Bearer sekret"}});
  EXPECT_EQ(st, 200);
}

// Completions with echo and logprobs, as lm-evaluation-harness scores a continuation (prompt ids,
// max_tokens 1, echo, logprobs 1): the prompt's token log-probabilities against the log-softmax of
// `fastpath logits`' rows for the same ids; echo with max_tokens 0 returns the prompt alone; a
// batch of prompts gives each prompt's n choices in order, as the prompt alone does.
TEST(Server, EchoScoresThePromptAndBatchesOfPrompts) {
  FP_REQUIRE_FILE(test::stories_path());
  ServerProcess srv({});
  auto c = srv.client();
  int st = 0, rc = -1;
  const std::vector<int32_t> ids = {1, 403, 407, 261, 400, 297, 345, 291};
  std::string ids_text;
  for (int32_t id : ids) {
    if (!ids_text.empty()) ids_text += ' ';
    ids_text += std::to_string(id);
  }
  const std::string dir = test::temp_dir("echo");
  test::run_command(test::fastpath_bin() + " logits -q -m " + test::stories_path() + " --tokens '" + ids_text + "' --out " + dir + "/l.f32", &rc);
  ASSERT_EQ(rc, 0);
  const std::vector<float> logits = test::read_f32_file(dir + "/l.f32");
  const size_t V = 512;
  ASSERT_EQ(logits.size(), ids.size() * V);
  auto log_softmax = [&](size_t row, size_t token) {
    const float* x = logits.data() + row * V;
    const float mx = *std::max_element(x, x + V);
    double sum = 0;
    for (size_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(x[i] - mx));
    return static_cast<double>(x[token] - mx) - std::log(sum);
  };

  json r = post(c, "/v1/completions", json{{"prompt", ids}, {"max_tokens", 1}, {"echo", true}, {"logprobs", 3}, {"temperature", 0}}.dump(), &st);
  ASSERT_EQ(st, 200) << r.dump();
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), ids.size() + 1);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (size_t i = 1; i < ids.size(); ++i) {
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), log_softmax(i - 1, static_cast<size_t>(ids[i])), 1e-4) << "token " << i;
    ASSERT_EQ(lp["top_logprobs"][i].size(), 3u);
    double best = -1e9;
    for (const auto& [piece, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    double want_best = -1e9;
    for (size_t t = 0; t < V; ++t) want_best = std::max(want_best, log_softmax(i - 1, t));
    EXPECT_NEAR(best, want_best, 1e-4) << "token " << i;
  }
  // The generated token: the greedy one after the prompt, its log-probability the last row's.
  double want_next = -1e9;
  for (size_t t = 0; t < V; ++t) want_next = std::max(want_next, log_softmax(ids.size() - 1, t));
  EXPECT_NEAR(lp["token_logprobs"][ids.size()].get<double>(), want_next, 1e-4);
  // vLLM's prompt_logprobs: the same values with each token's rank, on completions and chat.
  json pl = post(c, "/v1/completions", json{{"prompt", ids}, {"max_tokens", 1}, {"prompt_logprobs", 2}, {"temperature", 0}}.dump(), &st);
  ASSERT_EQ(st, 200) << pl.dump();
  const json& plist = pl["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(plist.size(), ids.size());
  EXPECT_TRUE(plist[0].is_null());
  for (size_t i = 1; i < ids.size(); ++i) {
    const json& entry = plist[i][std::to_string(ids[i])];
    EXPECT_NEAR(entry["logprob"].get<double>(), log_softmax(i - 1, static_cast<size_t>(ids[i])), 1e-4) << "token " << i;
    int64_t rank = 1;
    for (size_t t = 0; t < V; ++t) rank += log_softmax(i - 1, t) > log_softmax(i - 1, static_cast<size_t>(ids[i])) + 1e-9;
    EXPECT_EQ(entry["rank"], rank) << "token " << i;
    EXPECT_GE(plist[i].size(), 2u);
    EXPECT_LE(plist[i].size(), 3u);
  }
  json chat_pl = post(c, "/v1/chat/completions",
                      json{{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 1}, {"prompt_logprobs", 0}}.dump(), &st);
  ASSERT_EQ(st, 200) << chat_pl.dump();
  EXPECT_EQ(chat_pl["prompt_logprobs"].size(), chat_pl["usage"]["prompt_tokens"]);
  json e0 = post(c, "/v1/completions", R"({"prompt": "x", "prompt_logprobs": 1, "stream": true})", &st);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(e0["error"]["param"], "prompt_logprobs");
  json plain = post(c, "/v1/completions", json{{"prompt", ids}, {"max_tokens", 1}, {"temperature", 0}}.dump(), &st);
  json prompt_only = post(c, "/v1/completions", json{{"prompt", ids}, {"max_tokens", 0}, {"echo", true}}.dump(), &st);
  ASSERT_EQ(st, 200) << prompt_only.dump();
  EXPECT_EQ(r["choices"][0]["text"], prompt_only["choices"][0]["text"].get<std::string>() + plain["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(prompt_only["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(prompt_only["usage"]["completion_tokens"], 0);
  EXPECT_EQ(prompt_only["usage"]["prompt_tokens"], ids.size());
  json text_echo = post(c, "/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 0, "echo": true})", &st);
  EXPECT_EQ(text_echo["choices"][0]["text"], "Once upon a time");

  // A batch: prompt p's choices are p * n .. p * n + n - 1, each the prompt's own greedy text.
  const std::vector<std::string> prompts = {"Once upon a time", "The cat sat", "Lily had a dog"};
  json batch = post(c, "/v1/completions", json{{"prompt", prompts}, {"max_tokens", 12}, {"temperature", 0}, {"n", 2}}.dump(), &st);
  ASSERT_EQ(st, 200) << batch.dump();
  ASSERT_EQ(batch["choices"].size(), 6u);
  int64_t prompt_tokens = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    json one = post(c, "/v1/completions", json{{"prompt", prompts[p]}, {"max_tokens", 12}, {"temperature", 0}}.dump(), &st);
    prompt_tokens += one["usage"]["prompt_tokens"].get<int64_t>();
    for (size_t j = 0; j < 2; ++j) {
      EXPECT_EQ(batch["choices"][p * 2 + j]["index"], p * 2 + j);
      EXPECT_EQ(batch["choices"][p * 2 + j]["text"], one["choices"][0]["text"]) << "prompt " << p;
    }
  }
  EXPECT_EQ(batch["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(batch["usage"]["completion_tokens"], 6 * 12);
  json id_batch = post(c, "/v1/completions", json{{"prompt", {std::vector<int32_t>{1, 403}, ids}}, {"max_tokens", 2}, {"temperature", 0}}.dump(), &st);
  ASSERT_EQ(st, 200) << id_batch.dump();
  EXPECT_EQ(id_batch["choices"].size(), 2u);
  EXPECT_EQ(id_batch["choices"][1]["text"], post(c, "/v1/completions", json{{"prompt", ids}, {"max_tokens", 2}, {"temperature", 0}}.dump(), &st)["choices"][0]["text"]);

  // Streamed echo: the first chunk of each choice is its prompt with the prompt's log-probabilities,
  // then the generated text; together the non-streamed reply's text and values. max_tokens 0: the
  // prompt, then the finish.
  for (int max_tokens : {4, 0}) {
    const json body = {{"prompt", ids}, {"max_tokens", max_tokens}, {"echo", true}, {"logprobs", 2}, {"temperature", 0}, {"n", 2}};
    json whole = body;
    whole.erase("n");
    const json want = post(c, "/v1/completions", whole.dump(), &st);
    ASSERT_EQ(st, 200) << want.dump();
    json streamed = body;
    streamed["stream"] = true;
    const Streamed s = stream(c, "/v1/completions", streamed);
    ASSERT_TRUE(s.error.empty()) << s.error;
    EXPECT_TRUE(s.done);
    std::vector<json> token_lps(2, json::array());
    for (const json& ev : s.events)
      for (const json& ch : ev["choices"])
        if (!ch["logprobs"].is_null())
          for (const json& v : ch["logprobs"]["token_logprobs"]) token_lps[ch["index"].get<size_t>()].push_back(v);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(s.text.at(i), want["choices"][0]["text"]) << "choice " << i << ", max_tokens " << max_tokens;
      EXPECT_EQ(s.finish.at(i), want["choices"][0]["finish_reason"]);
      const json& want_lps = want["choices"][0]["logprobs"]["token_logprobs"];
      ASSERT_EQ(token_lps[static_cast<size_t>(i)].size(), want_lps.size()) << "choice " << i;
      EXPECT_TRUE(token_lps[static_cast<size_t>(i)][0].is_null());
      for (size_t k = 1; k < want_lps.size(); ++k)
        EXPECT_NEAR(token_lps[static_cast<size_t>(i)][k].get<double>(), want_lps[k].get<double>(), 1e-5) << "token " << k;
    }
    const json& first = s.events.at(0)["choices"][0];
    EXPECT_EQ(first["text"], prompt_only["choices"][0]["text"]) << "the prompt comes first, whole";
    EXPECT_EQ(first["logprobs"]["tokens"].size(), ids.size());
  }

  // Refusals.
  json e = post(c, "/v1/completions", R"({"prompt": [1, "a"]})", &st);
  EXPECT_EQ(st, 400);
  e = post(c, "/v1/completions", R"({"prompt": [[1, 2], [3, 9999]]})", &st);
  EXPECT_EQ(st, 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("9999"), std::string::npos);
  e = post(c, "/v1/completions", json{{"prompt", std::vector<std::string>(129, "x")}, {"n", 2}}.dump(), &st);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(e["error"]["param"], "prompt");
  EXPECT_EQ(c.Get("/health")->status, 200);
}

// A Response's output items without their ids (which differ from response to response).
json without_ids(json items) {
  for (auto& item : items) {
    item.erase("id");
    item.erase("call_id");
  }
  return items;
}

// Reads a Responses SSE stream: the events' data objects, in order.
std::vector<json> response_events(httplib::Client& c, const json& body) {
  std::string raw;
  auto res = c.Post("/v1/responses", body.dump(), "application/json");
  EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no reply");
  if (!res) return {};
  std::vector<json> events;
  std::istringstream in(res->body);
  std::string line, type;
  while (std::getline(in, line)) {
    if (line.rfind("event: ", 0) == 0) type = line.substr(7);
    if (line.rfind("data: ", 0) == 0) {
      events.push_back(json::parse(line.substr(6)));
      EXPECT_EQ(events.back()["type"], type);
    }
  }
  return events;
}

// POST /v1/responses against /v1/chat/completions on the same conversation: instructions are
// the system message, input items (text parts, an earlier function call and its output) the
// messages; the text is the chat reply's, streamed as typed events whose deltas add up to it;
// a required function call comes back as a function_call item; unsupported fields are 400s
// naming them.
TEST(Server, ResponsesApiMatchesTheChatPath) {
  FP_REQUIRE_FILE(test::stories_path());
  ServerProcess srv({});
  auto c = srv.client();
  int st = 0;
  const json history = json::array({{{"role", "system"}, {"content", "Be kind."}},
                                    {{"role", "user"}, {"content", "Tell me a story"}},
                                    {{"role", "assistant"}, {"content", nullptr},
                                     {"tool_calls", json::array({{{"id", "call_1"}, {"type", "function"},
                                                                  {"function", {{"name", "look"}, {"arguments", "{}"}}}}})}},
                                    {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "a cat"}}});
  json chat = post(c, "/v1/chat/completions", json{{"messages", history}, {"max_tokens", 20}, {"temperature", 0}}.dump(), &st);
  ASSERT_EQ(st, 200) << chat.dump();
  const std::string want = chat["choices"][0]["message"]["content"];
  ASSERT_FALSE(want.empty());
  const json input = json::array({{{"role", "user"}, {"content", json::array({{{"type", "input_text"}, {"text", "Tell me "}},
                                                                                 {{"type", "input_text"}, {"text", "a story"}}})}},
                                  {{"type", "function_call"}, {"call_id", "call_1"}, {"name", "look"}, {"arguments", "{}"}},
                                  {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "a cat"}}});
  const json body = {{"instructions", "Be kind."}, {"input", input}, {"max_output_tokens", 20}, {"temperature", 0}};
  json r = post(c, "/v1/responses", body.dump(), &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  ASSERT_EQ(r["output"].size(), 1u);
  EXPECT_EQ(r["output"][0]["type"], "message");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], want);
  EXPECT_EQ(r["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
  EXPECT_EQ(r["usage"]["output_tokens"], 20);
  // The chat call computed this prompt first; the response found its blocks in the prefix cache.
  EXPECT_EQ(chat["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_GT(r["usage"]["input_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
  EXPECT_LT(r["usage"]["input_tokens_details"]["cached_tokens"].get<int64_t>(), r["usage"]["input_tokens"].get<int64_t>());
  EXPECT_EQ(r["instructions"], "Be kind.");

  json sb = body;
  sb["stream"] = true;
  const std::vector<json> events = response_events(c, sb);
  ASSERT_GE(events.size(), 4u);
  std::string text;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["sequence_number"], i);
    if (events[i]["type"] == "response.output_text.delta") text += events[i]["delta"].get<std::string>();
  }
  EXPECT_EQ(text, want);
  EXPECT_EQ(events.front()["type"], "response.created");
  EXPECT_EQ(events.back()["type"], "response.incomplete");
  EXPECT_EQ(without_ids(events.back()["response"]["output"]), without_ids(r["output"]));
  EXPECT_EQ(events.back()["response"]["usage"], r["usage"]);

  // A required call, plain and streamed.
  const json tool = {{"type", "function"}, {"name", "get_weather"},
                     {"parameters", {{"type", "object"}, {"properties", {{"city", {{"enum", {"Paris", "Rome"}}}}}}, {"required", {"city"}}}}};
  json tb = {{"input", "Weather?"}, {"tools", {tool}}, {"tool_choice", "required"}, {"max_output_tokens", 60}, {"temperature", 0}};
  r = post(c, "/v1/responses", tb.dump(), &st);
  ASSERT_EQ(st, 200) << r.dump();
  ASSERT_EQ(r["output"].size(), 1u) << r.dump();
  EXPECT_EQ(r["output"][0]["type"], "function_call");
  EXPECT_EQ(r["output"][0]["name"], "get_weather");
  const json args = json::parse(r["output"][0]["arguments"].get<std::string>());
  EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Rome") << args;
  tb["stream"] = true;
  const std::vector<json> call_events = response_events(c, tb);
  ASSERT_FALSE(call_events.empty());
  EXPECT_EQ(call_events.back()["type"], "response.completed");
  EXPECT_EQ(without_ids(call_events.back()["response"]["output"]), without_ids(r["output"]));

  // Refusals name the field.
  auto refused = [&](const json& b, const std::string& param) {
    json e = post(c, "/v1/responses", b.dump(), &st);
    EXPECT_EQ(st, 400) << b.dump();
    EXPECT_EQ(e["error"]["param"], param) << e.dump();
  };
  refused(json{{"max_output_tokens", 4}}, "input");
  refused(json{{"input", "x"}, {"previous_response_id", "resp_1"}}, "previous_response_id");
  refused(json{{"input", "x"}, {"tools", {{{"type", "web_search"}}}}}, "tools[0].type");
  refused(json{{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}, {"image_url", "x"}}}}}}}}, "input[0].content[0].type");
  refused(json{{"input", {{{"type", "item_reference"}, {"id", "x"}}}}}, "input[0].type");
  refused(json{{"input", "x"}, {"text", {{"format", {{"type", "yaml"}}}}}}, "text.format.type");
  refused(json{{"input", "x"}, {"max_output_tokens", 0}}, "max_output_tokens");
  json bad = post(c, "/v1/responses", "{oops", &st);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(c.Get("/health")->status, 200);
}

// POST /tokenize and /detokenize: the ids are the CLI tokenizer's and the ones a completion or
// chat request is charged for (usage.prompt_tokens); text comes back from the ids; BOS follows
// add_special_tokens (vLLM) / add_special (llama.cpp's content, off by default); bad bodies are
// 400s naming the field, an unknown model a 404.
// vLLM's add_generation_prompt and continue_final_message: the reply continues the assistant's
// final message (a ChatML template's end of turn cut), or follows the messages with no
// assistant header; the two together, or a final message not the assistant's, are refused.
TEST(ChatPrompt, ContinueFinalMessageAndNoGenerationPrompt) {
  FP_REQUIRE_FILE(test::stories_path());
  auto tok = Tokenizer::from_path(test::stories_path());
  const ChatTemplate chatml(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}{% else %}"
      "{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
      nlohmann::ordered_json::object(), "test");
  ApiLimits lim;
  lim.max_model_len = 4096;
  const json user = {{"role", "user"}, {"content", "Tell me a story."}};
  const json partial = {{"role", "assistant"}, {"content", "Once upon a time"}};
  auto text_of = [&](const json& body) {
    ApiRequest r;
    auto e = parse_prompt(body, true, *tok, &chatml, lim, r);
    EXPECT_FALSE(e) << (e ? e->message : "");
    return tok->decode(r.prompt);
  };
  EXPECT_EQ(text_of({{"messages", {user}}}), "<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(text_of({{"messages", {user}}, {"add_generation_prompt", false}}), "<|im_start|>user\nTell me a story.<|im_end|>\n");
  EXPECT_EQ(text_of({{"messages", {user, partial}}, {"continue_final_message", true}}),
            "<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\nOnce upon a time");
  const json parts = {{"role", "assistant"}, {"content", {{{"type", "text"}, {"text", "Once upon"}}, {{"type", "text"}, {"text", " a time"}}}}};
  EXPECT_EQ(text_of({{"messages", {user, parts}}, {"continue_final_message", true}, {"add_generation_prompt", false}}),
            "<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\nOnce upon a time");
  struct Bad {
    json body;
    std::string needle;
  };
  for (const Bad& b : std::vector<Bad>{{{{"messages", {user}}, {"continue_final_message", true}}, "role 'user'"},
                                       {{{"messages", {user, partial}}, {"continue_final_message", true}, {"add_generation_prompt", true}}, "both"},
                                       {{{"messages", {user, {{"role", "assistant"}, {"content", ""}}}}, {"continue_final_message", true}}, "text"},
                                       {{{"messages", {user}}, {"continue_final_message", 1}}, "true or false"},
                                       {{{"messages", {user}}, {"add_generation_prompt", "no"}}, "true or false"}}) {
    ApiRequest r;
    auto e = parse_prompt(b.body, true, *tok, &chatml, lim, r);
    ASSERT_TRUE(e) << b.body.dump();
    EXPECT_NE(e->message.find(b.needle), std::string::npos) << e->message;
  }
  // A template that rewrites the final message (trims it here) cannot be continued.
  const ChatTemplate trimming("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}",
                              nlohmann::ordered_json::object(), "test");
  ApiRequest r;
  auto e = parse_prompt({{"messages", {user, {{"role", "assistant"}, {"content", "Once upon a time "}}}}, {"continue_final_message", true}},
                        true, *tok, &trimming, lim, r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "continue_final_message");
}

TEST(Server, TokenizeAndDetokenize) {
  FP_REQUIRE_FILE(test::stories_path());
  ServerProcess srv({});
  auto c = srv.client();
  int st = 0, rc = -1;
  const std::string text = "Once upon a time, Lily saw a big dog.";
  std::vector<int32_t> cli;
  {
    std::istringstream ids(test::run_command("printf '%s' '" + text + "' | " + test::fastpath_bin() + " tokenize -m " +
                                                 test::stories_path(), &rc));
    for (int32_t id; ids >> id;) cli.push_back(id);
  }
  ASSERT_EQ(rc, 0);
  ASSERT_GT(cli.size(), 5u);

  json t = post(c, "/tokenize", json{{"prompt", text}, {"return_token_strs", true}}.dump(), &st);
  ASSERT_EQ(st, 200) << t.dump();
  EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), cli);
  EXPECT_EQ(t["count"], cli.size());
  EXPECT_EQ(t["max_model_len"], 256);
  ASSERT_EQ(t["token_strs"].size(), cli.size());
  EXPECT_EQ(t["token_strs"][1], "▁Once");
  json comp = post(c, "/v1/completions", json{{"prompt", text}, {"max_tokens", 1}}.dump(), &st);
  ASSERT_EQ(st, 200);
  EXPECT_EQ(comp["usage"]["prompt_tokens"], t["count"]);

  // Without BOS: vLLM's flag, and llama.cpp's field with its own default.
  json plain = post(c, "/tokenize", json{{"prompt", text}, {"add_special_tokens", false}}.dump(), &st);
  EXPECT_EQ(plain["tokens"].get<std::vector<int32_t>>(), std::vector<int32_t>(cli.begin() + 1, cli.end()));
  json content = post(c, "/tokenize", json{{"content", text}}.dump(), &st);
  EXPECT_EQ(content["tokens"], plain["tokens"]);
  EXPECT_EQ(post(c, "/tokenize", json{{"content", text}, {"add_special", true}}.dump(), &st)["tokens"], t["tokens"]);

  // Chat messages through the chat template: what a chat request is charged for.
  const json messages = json::array({{{"role", "user"}, {"content", "Tell me a story."}}});
  json chat_ids = post(c, "/tokenize", json{{"messages", messages}, {"model", "stories260K.gguf"}}.dump(), &st);
  ASSERT_EQ(st, 200) << chat_ids.dump();
  json chat = post(c, "/v1/chat/completions", json{{"messages", messages}, {"max_tokens", 1}}.dump(), &st);
  ASSERT_EQ(st, 200);
  EXPECT_EQ(chat["usage"]["prompt_tokens"], chat_ids["count"]);
  EXPECT_GT(chat_ids["count"].get<int>(), 5);

  // Back to text.
  json d = post(c, "/detokenize", json{{"tokens", plain["tokens"]}}.dump(), &st);
  ASSERT_EQ(st, 200) << d.dump();
  EXPECT_EQ(d["prompt"], text);
  EXPECT_EQ(d["content"], text);

  // Refusals.
  json e = post(c, "/tokenize", "{not json", &st);
  EXPECT_EQ(st, 400);
  e = post(c, "/tokenize", R"({"text": "x"})", &st);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(e["error"]["param"], "prompt");
  e = post(c, "/tokenize", R"({"prompt": 5})", &st);
  EXPECT_EQ(st, 400);
  e = post(c, "/tokenize", R"({"prompt": "x", "add_special_tokens": "yes"})", &st);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(e["error"]["param"], "add_special_tokens");
  e = post(c, "/tokenize", R"({"messages": []})", &st);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(e["error"]["param"], "messages");
  e = post(c, "/detokenize", R"({"tokens": [1, 99999]})", &st);
  EXPECT_EQ(st, 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("tokens[1]"), std::string::npos) << e.dump();
  e = post(c, "/detokenize", R"({"tokens": [1, "a"]})", &st);
  EXPECT_EQ(st, 400);
  e = post(c, "/detokenize", R"({"ids": [1]})", &st);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(e["error"]["param"], "tokens");
  e = post(c, "/tokenize", R"({"prompt": "x", "model": "nope"})", &st);
  EXPECT_EQ(st, 404);
  // Long prompts are counted, not refused: the client compares count with max_model_len.
  std::string long_text;
  for (int i = 0; i < 100; ++i) long_text += "Once upon a time. ";
  json lt = post(c, "/tokenize", json{{"prompt", long_text}}.dump(), &st);
  ASSERT_EQ(st, 200);
  EXPECT_GT(lt["count"].get<int>(), 256);
  EXPECT_EQ(c.Get("/health")->status, 200);
}

TEST(Server, DisconnectingClientsDoNotDisturbTheOthersAndFreeTheirKv) {
  FP_REQUIRE_FILE(test::stories_path());
  ServerProcess srv({});
  auto probe = srv.client();
  const double total_blocks = metric(probe, "fastpath:kv_cache_blocks_total");
  ASSERT_GT(total_blocks, 0);
  const std::vector<std::string> prompts = {"Once upon a time", "Lily had a dog", "The sun was hot", "Tom and Ben",
                                            "A little bird", "The big tree", "One day", "Mom said"};
  std::vector<std::string> want;
  for (auto& p : prompts) want.push_back(greedy_text(p, 64));
  std::vector<std::string> got(prompts.size());
  std::atomic<int> dropped{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 50; ++i)
    threads.emplace_back([&, i] {
      auto c = srv.client();
      Streamed s = stream(c, "/v1/completions",
                          {{"prompt", prompts[static_cast<size_t>(i) % prompts.size()]}, {"max_tokens", 240}, {"ignore_eos", true},
                           {"stream", true}},
                          2 + i % 5);
      if (!s.done) ++dropped;
      EXPECT_TRUE(s.error.empty()) << s.error;
      EXPECT_GE(s.events.size(), 2u) << "request " << i << " was dropped before it streamed";
    });
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] {
      auto c = srv.client();
      Streamed s = stream(c, "/v1/completions", {{"prompt", prompts[i]}, {"max_tokens", 64}, {"temperature", 0}, {"stream", true}});
      EXPECT_TRUE(s.done) << prompts[i] << " " << s.error;
      got[i] = s.text[0];
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(dropped.load(), 50);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], want[i]) << prompts[i];
  // Every request ends (dropped ones cancelled) and every block comes back.
  double free_blocks = -1, running = -1, ended = -1;
  auto ended_requests = [&] {
    return metric(probe, "fastpath:request_cancelled_total") +
           metric(probe, "fastpath:request_success_total{finished_reason=\"length\"}") +
           metric(probe, "fastpath:request_success_total{finished_reason=\"stop\"}");
  };
  for (int i = 0; i < 500; ++i) {
    free_blocks = metric(probe, "fastpath:kv_cache_blocks_free");
    running = metric(probe, "fastpath:num_requests_running");
    ended = ended_requests();
    if (free_blocks == total_blocks && running == 0 && ended == 58) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (ended != 58) fprintf(stderr, "%s\n", probe.Get("/metrics")->body.c_str());
  EXPECT_EQ(free_blocks, total_blocks);
  EXPECT_EQ(running, 0);
  // Every request is accounted for: most dropped ones were cancelled (a dropped request whose
  // last tokens were generated before the hang-up was noticed finishes as "length").
  EXPECT_GE(metric(probe, "fastpath:request_cancelled_total"), 25);
  EXPECT_EQ(ended, 58);
  EXPECT_EQ(probe.Get("/health")->status, 200);
  EXPECT_EQ(srv.terminate(), 0);
}

TEST(Server, SigtermEndsInFlightStreamsAndExitsZero) {
  FP_REQUIRE_FILE(test::stories_path());
  ServerProcess srv({}, 2048);
  Streamed s;
  std::thread t([&] {
    auto c = srv.client();
    s = stream(c, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2000}, {"ignore_eos", true}, {"stream", true}});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(srv.terminate(), 0);
  t.join();
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.finish[0], "abort");
}

}  // namespace
}  // namespace fp
