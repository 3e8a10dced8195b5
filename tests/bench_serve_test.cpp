// tests/bench_serve_test.cpp — `fastpath bench-serve`: SSE parsing at every split, stream
// chunks, percentiles, run-level aggregation, dataset lengths with a real tokenizer, SVG
// well-formedness, and whole runs against an in-process fake OpenAI server (timed chunks,
// 500s, dropped and stalled streams, malformed events) and against `fastpath serve`.
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <iterator>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tools/bench_serve/report.h"
#include "tools/bench_serve/runner.h"
#include "tools/bench_serve/svg.h"

namespace fp::bench_serve {
namespace {

using nlohmann::json;

// ---------------------------------------------------------------- SSE

std::vector<std::string> parse_split(const std::string& stream, const std::vector<size_t>& cuts) {
  SseParser p;
  std::vector<std::string> events;
  size_t at = 0;
  for (size_t c : cuts) {
    EXPECT_TRUE(p.feed(std::string_view(stream).substr(at, c - at), events));
    at = c;
  }
  EXPECT_TRUE(p.feed(std::string_view(stream).substr(at), events));
  p.finish(events);
  return events;
}

TEST(BenchServeSse, EventsAtEverySplitPoint) {
  // LF, CRLF and lone-CR line ends, a comment, a multi-line event, a non-data field, "data:"
  // without a space, an event with no closing blank line.
  const std::string stream =
      ": keep-alive\n\ndata: {\"a\":1}\n\r\ndata: one\r\ndata: two\r\n\r\nevent: x\nid: 7\ndata:{\"b\":2}\r\r"
      "retry: 10\n\ndata: [DONE]";
  const std::vector<std::string> want = {"{\"a\":1}", "one\ntwo", "{\"b\":2}", "[DONE]"};
  EXPECT_EQ(parse_split(stream, {}), want);
  for (size_t i = 0; i <= stream.size(); ++i) EXPECT_EQ(parse_split(stream, {i}), want) << "split at " << i;
  for (size_t i = 0; i <= stream.size(); ++i)
    for (size_t j = i; j <= stream.size(); j += 3) ASSERT_EQ(parse_split(stream, {i, j}), want) << i << "," << j;
  std::vector<size_t> bytes;  // one byte at a time
  for (size_t i = 1; i < stream.size(); ++i) bytes.push_back(i);
  EXPECT_EQ(parse_split(stream, bytes), want);
}

TEST(BenchServeSse, OverlongLineIsRejected) {
  SseParser p;
  p.max_line_bytes = 16;
  std::vector<std::string> ev;
  EXPECT_TRUE(p.feed("data: short\n\n", ev));
  EXPECT_FALSE(p.feed("data: " + std::string(64, 'x'), ev));
}

TEST(BenchServeSse, Chunks) {
  StreamChunk c;
  std::string why;
  ASSERT_TRUE(parse_chunk(R"({"choices":[{"index":0,"text":" hello","finish_reason":null}]})", false, c, &why));
  EXPECT_EQ(c.content, " hello");
  EXPECT_FALSE(c.has_usage);
  ASSERT_TRUE(parse_chunk(R"({"choices":[{"delta":{"role":"assistant","content":"hi"}}]})", true, c, &why));
  EXPECT_EQ(c.content, "hi");
  ASSERT_TRUE(parse_chunk(R"({"choices":[{"delta":{"reasoning_content":"hmm","content":null}}]})", true, c, &why));
  EXPECT_EQ(c.content, "hmm");
  ASSERT_TRUE(parse_chunk(R"({"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}})",
                          false, c, &why));
  EXPECT_TRUE(c.has_usage);
  EXPECT_EQ(c.prompt_tokens, 9);
  EXPECT_EQ(c.completion_tokens, 4);
  EXPECT_TRUE(c.content.empty());
  ASSERT_TRUE(parse_chunk(R"({"choices":[{"text":"x"}],"usage":null})", false, c, &why));
  EXPECT_FALSE(c.has_usage);
  ASSERT_TRUE(parse_chunk("[DONE]", false, c, &why));
  EXPECT_TRUE(c.done);
  ASSERT_TRUE(parse_chunk(R"({"error":{"message":"boom","type":"server_error"}})", false, c, &why));
  EXPECT_EQ(c.error, "boom");
  EXPECT_FALSE(parse_chunk("{not json", false, c, &why));
  EXPECT_NE(why.find("not JSON"), std::string::npos);
  EXPECT_FALSE(parse_chunk("[1,2]", false, c, &why));
  EXPECT_FALSE(parse_chunk(R"({"choices":[{"text":5}]})", false, c, &why));
  EXPECT_FALSE(parse_chunk(R"({"choices":{}})", false, c, &why));
  EXPECT_FALSE(parse_chunk(R"({"choices":[],"usage":{"completion_tokens":"4"}})", false, c, &why));
  EXPECT_EQ(error_message_of(R"({"error":{"message":"max_tokens must be >= 1"}})"), "max_tokens must be >= 1");
  EXPECT_EQ(error_message_of(R"({"detail":"Not Found"})"), "Not Found");
  EXPECT_EQ(error_message_of("plain text"), "plain text");
}

// ---------------------------------------------------------------- stream timing

TEST(BenchServeTrace, TimesFromChunkArrivals) {
  RequestRecord rec;
  StreamTrace tr(false, rec);
  auto ev = [](const std::string& text) { return "data: {\"choices\":[{\"text\":\"" + text + "\"}]}\n\n"; };
  EXPECT_TRUE(tr.on_bytes(ev(""), 0.010));  // empty content: not the first token
  EXPECT_TRUE(tr.on_bytes(ev("a"), 0.100));
  EXPECT_TRUE(tr.on_bytes(ev("b") + ev("c"), 0.130));  // two chunks in one read: a zero gap
  EXPECT_TRUE(tr.on_bytes(ev("d"), 0.190));
  EXPECT_TRUE(tr.on_bytes("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}\n\ndata: [DONE]\n\n", 0.2));
  tr.finish(200, "", "", 0.400);
  ASSERT_TRUE(rec.ok) << rec.error;
  EXPECT_DOUBLE_EQ(rec.ttft_s, 0.100);
  ASSERT_EQ(rec.itl_s.size(), 3u);
  EXPECT_NEAR(rec.itl_s[0], 0.030, 1e-12);
  EXPECT_NEAR(rec.itl_s[1], 0.0, 1e-12);
  EXPECT_NEAR(rec.itl_s[2], 0.060, 1e-12);
  EXPECT_EQ(rec.chunks, 4);
  EXPECT_EQ(rec.output_tokens, 5);  // usage wins over the chunk count
  EXPECT_TRUE(rec.output_from_usage);
  EXPECT_EQ(rec.server_prompt_tokens, 3);
  EXPECT_NEAR(rec.tpot_s, (0.400 - 0.100) / 4, 1e-12);
  EXPECT_DOUBLE_EQ(rec.e2e_s, 0.400);
}

TEST(BenchServeTrace, ChunksCountedWithoutUsage) {
  RequestRecord rec;
  StreamTrace tr(true, rec);
  EXPECT_TRUE(tr.on_bytes("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n", 0.1));
  EXPECT_TRUE(tr.on_bytes("data: {\"choices\":[{\"delta\":{\"content\":\"y\"}}]}\n\ndata: [DONE]\n\n", 0.2));
  tr.finish(200, "", "", 0.2);
  ASSERT_TRUE(rec.ok);
  EXPECT_EQ(rec.output_tokens, 2);
  EXPECT_FALSE(rec.output_from_usage);
}

TEST(BenchServeTrace, Failures) {
  {
    RequestRecord rec;
    StreamTrace tr(false, rec);
    EXPECT_TRUE(tr.on_bytes("data: {\"choices\":[{\"text\":\"a\"}]}\n\n", 0.1));
    tr.finish(200, "", "", 0.2);
    EXPECT_FALSE(rec.ok);
    EXPECT_NE(rec.error.find("[DONE]"), std::string::npos) << rec.error;
  }
  {
    RequestRecord rec;
    StreamTrace tr(false, rec);
    EXPECT_FALSE(tr.on_bytes("data: {\"choices\":[{\"text\":\"a\"}\n\n", 0.1));
    tr.finish(200, "", "HTTP client error: Canceled", 0.2);
    EXPECT_FALSE(rec.ok);
    EXPECT_NE(rec.error.find("malformed SSE"), std::string::npos) << rec.error;
  }
  {
    RequestRecord rec;
    StreamTrace tr(false, rec);
    tr.finish(400, R"({"error":{"message":"'max_tokens' must be positive"}})", "", 0.01);
    EXPECT_FALSE(rec.ok);
    EXPECT_EQ(rec.error, "HTTP 400: 'max_tokens' must be positive");
  }
  {
    RequestRecord rec;
    StreamTrace tr(false, rec);
    EXPECT_FALSE(tr.on_bytes("data: {\"error\":{\"message\":\"out of KV\"}}\n\n", 0.1));
    tr.finish(200, "", "", 0.1);
    EXPECT_EQ(rec.error, "error event in stream: out of KV");
  }
}

// ---------------------------------------------------------------- statistics

TEST(BenchServeStats, PercentilesInterpolateLikeNumpy) {
  // numpy.percentile([1, 2, 3, 4], [50, 95, 99]) = 2.5, 3.85, 3.97
  std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_NEAR(percentile(v, 95), 3.85, 1e-12);
  EXPECT_NEAR(percentile(v, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_TRUE(std::isnan(percentile({}, 50)));
  std::vector<double> h(101);
  for (int i = 0; i <= 100; ++i) h[static_cast<size_t>(i)] = i;
  EXPECT_DOUBLE_EQ(percentile(h, 95), 95);
  Summary s = summarize({1, 2, 3, 4});
  EXPECT_EQ(s.n, 4u);
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  EXPECT_DOUBLE_EQ(s.median, 2.5);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 4);
  EXPECT_NEAR(s.stdev, std::sqrt(1.25), 1e-12);
  EXPECT_TRUE(std::isnan(summarize({}).p99));
}

TEST(BenchServeStats, Aggregate) {
  std::vector<RequestRecord> recs(4);
  for (int i = 0; i < 4; ++i) {
    recs[static_cast<size_t>(i)].index = i;
    recs[static_cast<size_t>(i)].ok = true;
    recs[static_cast<size_t>(i)].input_tokens = 10;
    recs[static_cast<size_t>(i)].output_tokens = 5;
    recs[static_cast<size_t>(i)].output_from_usage = true;
    recs[static_cast<size_t>(i)].ttft_s = 0.1 * (i + 1);
    recs[static_cast<size_t>(i)].e2e_s = 1;
    recs[static_cast<size_t>(i)].tpot_s = 0.2;
    recs[static_cast<size_t>(i)].itl_s = {0.2, 0.2};
  }
  recs[1].ok = false;
  recs[1].error = "HTTP 500: boom";
  recs[3].ok = false;
  recs[3].error = "later";
  recs[2].output_from_usage = false;
  LevelResult r = aggregate(recs, 2.0);
  EXPECT_EQ(r.completed, 2);
  EXPECT_EQ(r.failed, 2);
  EXPECT_EQ(r.first_error, "HTTP 500: boom");
  EXPECT_EQ(r.total_input_tokens, 20);
  EXPECT_EQ(r.total_output_tokens, 10);
  EXPECT_DOUBLE_EQ(r.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(r.output_throughput, 5.0);
  EXPECT_DOUBLE_EQ(r.total_throughput, 15.0);
  EXPECT_EQ(r.ttft.n, 2u);
  EXPECT_NEAR(r.ttft.mean, 0.2, 1e-12);
  EXPECT_EQ(r.itl.n, 4u);
  EXPECT_EQ(r.output_count_source, "usage+chunks");
  EXPECT_EQ(r.requests.size(), 4u);
  json j = level_json(r, true);
  EXPECT_EQ(j["completed"], 2);
  EXPECT_NEAR(j["mean_ttft_ms"].get<double>(), 200, 1e-9);
  EXPECT_EQ(j["requests"].size(), 4u);
  EXPECT_EQ(j["requests"][1]["error"], "HTTP 500: boom");
  EXPECT_TRUE(aggregate({}, 0).ttft.n == 0);
  EXPECT_TRUE(level_json(aggregate({}, 0), false)["p99_ttft_ms"].is_null());
}

TEST(BenchServeStats, PoissonArrivals) {
  auto all = poisson_arrivals(5, INFINITY, 1);
  for (double a : all) EXPECT_EQ(a, 0.0);
  auto at = poisson_arrivals(20000, 50.0, 3);
  EXPECT_EQ(at.front(), 0.0);
  for (size_t i = 1; i < at.size(); ++i) ASSERT_GE(at[i], at[i - 1]);
  double mean_gap = at.back() / static_cast<double>(at.size() - 1);
  EXPECT_NEAR(mean_gap, 1.0 / 50, 0.001);
  EXPECT_EQ(poisson_arrivals(20000, 50.0, 3), at);  // seeded
}

// ---------------------------------------------------------------- datasets

TEST(BenchServeDataset, RangeRatioBounds) {
  EXPECT_EQ(length_bounds(100, 0), (std::pair<int64_t, int64_t>{100, 100}));
  EXPECT_EQ(length_bounds(100, 0.5), (std::pair<int64_t, int64_t>{50, 150}));
  EXPECT_EQ(length_bounds(10, 0.25), (std::pair<int64_t, int64_t>{7, 13}));  // floor 7.5, ceil 12.5
  EXPECT_EQ(length_bounds(1, 0.9), (std::pair<int64_t, int64_t>{1, 2}));    // never below 1
  DatasetOptions o;
  o.num_prompts = 400;
  o.input_len = 40;
  o.output_len = 20;
  o.range_ratio = 0.5;
  Dataset d = make_dataset(o, nullptr);
  ASSERT_EQ(d.prompts.size(), 400u);
  EXPECT_FALSE(d.exact_tokens);
  EXPECT_NE(d.note.find("approximate"), std::string::npos);
  int64_t in_min = 1 << 30, in_max = 0, out_min = 1 << 30, out_max = 0;
  for (const Prompt& p : d.prompts) {
    in_min = std::min(in_min, p.input_len), in_max = std::max(in_max, p.input_len);
    out_min = std::min(out_min, p.output_len), out_max = std::max(out_max, p.output_len);
    EXPECT_EQ(std::count(p.text.begin(), p.text.end(), ' ') + 1, p.input_len);  // words
  }
  EXPECT_EQ(in_min, 20);  // 400 draws from 41 values: both ends are reached
  EXPECT_EQ(in_max, 60);
  EXPECT_EQ(out_min, 10);
  EXPECT_EQ(out_max, 30);
  o.range_ratio = 1.0;
  EXPECT_THROW(make_dataset(o, nullptr), fp::Error);
  o.range_ratio = 0;
  o.name = "sharegpt";
  EXPECT_THROW(make_dataset(o, nullptr), fp::Error);
}

TEST(BenchServeDataset, ExactTokenCountsWithStoriesTokenizer) {
  const std::string path = test::testdata("models/stories260K/stories260K.gguf");
  FP_REQUIRE_FILE(path);
  auto tok = Tokenizer::from_path(path);
  DatasetOptions o;
  o.num_prompts = 30;
  o.input_len = 64;
  o.output_len = 16;
  o.range_ratio = 0.5;
  o.seed = 11;
  Dataset d = make_dataset(o, tok.get());
  EXPECT_TRUE(d.exact_tokens);
  EXPECT_EQ(d.inexact, 0) << d.note;
  for (const Prompt& p : d.prompts) {
    EXPECT_EQ(static_cast<int64_t>(tok->encode(p.text, false, false).size()), p.input_len) << p.text;
    EXPECT_GE(p.input_len, 32);
    EXPECT_LE(p.input_len, 96);
    EXPECT_GE(p.output_len, 8);
    EXPECT_LE(p.output_len, 24);
  }
  // Same seed, same prompts.
  Dataset again = make_dataset(o, tok.get());
  EXPECT_EQ(again.prompts[7].text, d.prompts[7].text);

  o.name = "shared-prefix";
  o.prefix_len = 48;
  o.input_len = 16;
  o.range_ratio = 0;
  Dataset s = make_dataset(o, tok.get());
  EXPECT_EQ(s.inexact, 0) << s.note;
  const std::string& first = s.prompts[0].text;
  std::string prefix_of_first;
  for (const Prompt& p : s.prompts) {
    EXPECT_EQ(p.input_len, 48 + 16);
    EXPECT_EQ(static_cast<int64_t>(tok->encode(p.text, false, false).size()), p.input_len);
  }
  // Every prompt starts with the same text, and the prompts differ after it.
  size_t common = first.size();
  for (const Prompt& p : s.prompts) {
    size_t k = 0;
    while (k < common && k < p.text.size() && p.text[k] == first[k]) ++k;
    common = k;
  }
  auto prefix_tokens = tok->encode(first.substr(0, common), false, false).size();
  EXPECT_GE(prefix_tokens, 46u);  // the shared text is the 48-token prefix (a boundary token may merge)
  EXPECT_NE(s.prompts[0].text, s.prompts[1].text);
}

// ---------------------------------------------------------------- SVG

// A small XML well-formedness check: every tag closed in order, quoted attributes, and no raw
// '<' or bare '&' in text.
bool well_formed(const std::string& s, std::string* why) {
  std::vector<std::string> stack;
  bool root = false;
  for (size_t i = 0; i < s.size();) {
    if (s[i] == '&') {
      size_t semi = s.find(';', i);
      std::string ent = semi == std::string::npos ? "" : s.substr(i, semi - i + 1);
      if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;" && ent != "&apos;")
        return *why = "bare & at " + std::to_string(i), false;
      i = semi + 1;
      continue;
    }
    if (s[i] != '<') {
      if (stack.empty() && !std::isspace(static_cast<unsigned char>(s[i])))
        return *why = "text outside the root at " + std::to_string(i), false;
      ++i;
      continue;
    }
    size_t end = s.find('>', i);
    if (end == std::string::npos) return *why = "unterminated tag", false;
    std::string tag = s.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty()) return *why = "empty tag", false;
    if (tag.find('<') != std::string::npos) return *why = "'<' inside a tag: " + tag, false;
    if (std::count(tag.begin(), tag.end(), '"') % 2) return *why = "unbalanced quotes: " + tag, false;
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) return *why = "mismatched </" + tag.substr(1) + ">", false;
      stack.pop_back();
      continue;
    }
    bool self_closing = tag.back() == '/';
    std::string name = tag.substr(0, tag.find_first_of(" /"));
    if (stack.empty()) {
      if (root) return *why = "second root element", false;
      root = true;
    }
    if (!self_closing) stack.push_back(name);
  }
  if (!stack.empty()) return *why = "unclosed <" + stack.back() + ">", false;
  if (!root) return *why = "no element", false;
  return true;
}

TEST(BenchServeSvg, ChartsAreWellFormed) {
  std::string why;
  EXPECT_FALSE(well_formed("<svg><g></svg></g>", &why));
  EXPECT_FALSE(well_formed("<svg>a & b</svg>", &why));
  EXPECT_TRUE(well_formed("<svg><g/><text>a &amp; b</text></svg>\n", &why)) << why;

  std::vector<LevelResult> levels;
  for (int c : {1, 4, 16}) {
    std::vector<RequestRecord> recs(3);
    for (size_t i = 0; i < recs.size(); ++i) {
      recs[i].ok = true;
      recs[i].output_tokens = 100;
      recs[i].ttft_s = 0.01 * c + 0.001 * static_cast<double>(i);
      recs[i].e2e_s = 0.5 + 0.1 * c;
    }
    LevelResult r = aggregate(recs, 1.0 + 0.05 * c);
    r.concurrency = c;
    r.request_rate = INFINITY;
    r.label = level_label(c, r.request_rate);
    levels.push_back(r);
  }
  std::string svg = render_svg(levels_chart(levels, "model <a & b>"));
  EXPECT_TRUE(well_formed(svg, &why)) << why << "\n" << svg;
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  for (const char* want : {"max concurrency", "output throughput (tok/s)", "p95 TTFT (ms)", ">16<", "model &lt;a &amp; b&gt;"})
    EXPECT_NE(svg.find(want), std::string::npos) << want;
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '\n') > 10, true);

  std::string cdf = render_svg(cdf_chart(levels[0], "one level"));
  EXPECT_TRUE(well_formed(cdf, &why)) << why;
  EXPECT_NE(cdf.find("latency (ms)"), std::string::npos);
  EXPECT_NE(cdf.find("fraction of requests"), std::string::npos);
  // An empty level (every request failed) still draws axes.
  EXPECT_TRUE(well_formed(render_svg(cdf_chart(aggregate({}, 0), "nothing")), &why)) << why;
  EXPECT_DOUBLE_EQ(nice_step(48), 10);
  EXPECT_DOUBLE_EQ(nice_step(3554), 1000);
  EXPECT_DOUBLE_EQ(nice_step(1), 0.2);
}

TEST(BenchServeClient, BaseUrl) {
  std::string origin, prefix;
  parse_base_url("http://127.0.0.1:8080", origin, prefix);
  EXPECT_EQ(origin, "http://127.0.0.1:8080");
  EXPECT_EQ(prefix, "");
  parse_base_url("localhost:9000/v1/", origin, prefix);
  EXPECT_EQ(origin, "http://localhost:9000");
  EXPECT_EQ(prefix, "");
  parse_base_url("https://example.com/api", origin, prefix);
  EXPECT_EQ(origin, "https://example.com");
  EXPECT_EQ(prefix, "/api");
  EXPECT_THROW(parse_base_url("ftp://x", origin, prefix), fp::Error);
  EXPECT_THROW(parse_base_url("http:///v1", origin, prefix), fp::Error);
  Target t;
  t.model = "m";
  Prompt p{"hello", 1, 7};
  json body = json::parse(request_body(t, p, {0.0, true}));
  EXPECT_EQ(body["prompt"], "hello");
  EXPECT_EQ(body["max_tokens"], 7);
  EXPECT_EQ(body["min_tokens"], 7);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  t.endpoint = "/v1/chat/completions";
  body = json::parse(request_body(t, p, {0.5, false}));
  EXPECT_EQ(body["messages"][0]["content"], "hello");
  EXPECT_FALSE(body.contains("ignore_eos"));
  EXPECT_FALSE(body.contains("prompt"));
}

// ---------------------------------------------------------------- against a fake server

// An OpenAI-style streaming server on a loopback port. Request number k (counted from 0 in
// arrival order) behaves by `mode(k)`: "ok" streams kChunks content chunks kGapMs apart after
// kFirstMs, then usage and [DONE]; "500" answers an error object; "drop" closes the connection
// after two chunks; "bad" sends a malformed event; "stall" sends nothing until the test ends;
// "nousage" is "ok" without the usage chunk.
class FakeServer {
 public:
  static constexpr int kChunks = 6, kGapMs = 8, kFirstMs = 30;

  explicit FakeServer(std::function<std::string(int)> mode) : mode_(std::move(mode)) {
    svr_.new_task_queue = [] { return new httplib::ThreadPool(24); };
    svr_.set_tcp_nodelay(true);  // each event leaves when written (no Nagle wait for the client's ACK)
    svr_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})", "application/json");
    });
    auto handler = [this](const httplib::Request& req, httplib::Response& res) { complete(req, res); };
    svr_.Post("/v1/completions", handler);
    svr_.Post("/v1/chat/completions", handler);
    port_ = svr_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
    while (!svr_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeServer() {
    stopping_ = true;
    svr_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  int requests() const { return count_; }
  std::string last_body() {
    std::lock_guard<std::mutex> lk(mu_);
    return last_body_;
  }

 private:
  void complete(const httplib::Request& req, httplib::Response& res) {
    int k = count_++;
    {
      std::lock_guard<std::mutex> lk(mu_);
      last_body_ = req.body;
    }
    std::string mode = mode_(k);
    json body = json::parse(req.body, nullptr, false);
    const bool chat = req.path.find("chat") != std::string::npos;
    if (mode == "500" || !body.is_object()) {
      res.status = 500;
      res.set_content(R"({"error":{"message":"fake failure )" + std::to_string(k) + R"(","type":"server_error"}})",
                      "application/json");
      return;
    }
    auto step = std::make_shared<int>(0);
    res.set_chunked_content_provider("text/event-stream", [this, step, mode, chat](size_t, httplib::DataSink& sink) {
      int s = (*step)++;
      if (mode == "stall") {
        while (!stopping_) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(s == 0 ? kFirstMs : kGapMs));
      if (mode == "drop" && s == 2) return false;  // connection closed mid-stream
      if (mode == "bad" && s == 1) {
        std::string e = "data: {\"choices\": [oops\n\n";
        sink.write(e.data(), e.size());
        return true;
      }
      std::string e;
      if (s < kChunks) {
        std::string piece = " w" + std::to_string(s);
        e = chat ? R"(data: {"choices":[{"index":0,"delta":{"content":")" + piece + R"("}}]})"
                 : R"(data: {"choices":[{"index":0,"text":")" + piece + R"("}]})";
        e += "\n\n";
      } else {
        if (mode != "nousage")
          e = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":" + std::to_string(kChunks) +
              "}}\n\n";
        e += "data: [DONE]\n\n";
        sink.write(e.data(), e.size());
        sink.done();
        return true;
      }
      sink.write(e.data(), e.size());
      return true;
    });
  }

  std::function<std::string(int)> mode_;
  httplib::Server svr_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> count_{0};
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::string last_body_;
};

// A loopback port that was free a moment ago and has nothing listening now.
int closed_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

Target target_for(int port) {
  Target t;
  t.origin = "http://127.0.0.1:" + std::to_string(port);
  t.model = "fake-model";
  t.request_timeout_s = 20;
  return t;
}

std::vector<Prompt> word_prompts(int n) {
  DatasetOptions o;
  o.num_prompts = n;
  o.input_len = 8;
  o.output_len = FakeServer::kChunks;
  return make_dataset(o, nullptr).prompts;
}

TEST(BenchServeRun, TimedChunksAgainstFakeServer) {
  FakeServer srv([](int) { return std::string("ok"); });
  Target t = target_for(srv.port());
  EXPECT_EQ(list_models(t), std::vector<std::string>{"fake-model"});
  auto prompts = word_prompts(12);
  int warm_failed = -1;
  LevelResult r = run_level(t, {}, prompts, word_prompts(2), {4, INFINITY}, 1, &warm_failed);
  EXPECT_EQ(warm_failed, 0);
  EXPECT_EQ(srv.requests(), 14);
  EXPECT_EQ(r.completed, 12);
  EXPECT_EQ(r.failed, 0) << r.first_error;
  EXPECT_EQ(r.total_output_tokens, 12 * FakeServer::kChunks);
  EXPECT_EQ(r.total_input_tokens, 12 * 8);
  EXPECT_EQ(r.output_count_source, "usage");
  // The fake's timing: first chunk after >= 30 ms, then 8 ms apart.
  EXPECT_GE(r.ttft.min, 0.029);
  EXPECT_GE(r.itl.median, 0.007);
  EXPECT_LT(r.itl.median, 0.5);
  EXPECT_EQ(r.itl.n, 12u * (FakeServer::kChunks - 1));
  EXPECT_GE(r.tpot.median, 0.007);
  EXPECT_GE(r.e2e.min, (FakeServer::kFirstMs + FakeServer::kChunks * FakeServer::kGapMs) / 1000.0 * 0.95);
  // 12 requests of ~80 ms, 4 at a time: about 3 rounds, well under 12 sequential ones.
  EXPECT_LT(r.duration_s, 12 * r.e2e.min);
  EXPECT_GT(r.output_throughput, 0);
  for (const RequestRecord& q : r.requests) EXPECT_EQ(q.server_prompt_tokens, 4);
  json body = json::parse(srv.last_body());
  EXPECT_EQ(body["model"], "fake-model");
  EXPECT_EQ(body["stream"], true);
}

TEST(BenchServeRun, ChatEndpointAndChunkCounting) {
  FakeServer srv([](int) { return std::string("nousage"); });
  Target t = target_for(srv.port());
  t.endpoint = "/v1/chat/completions";
  LevelResult r = run_level(t, {}, word_prompts(3), {}, {1, INFINITY}, 1);
  EXPECT_EQ(r.completed, 3) << r.first_error;
  EXPECT_EQ(r.total_output_tokens, 3 * FakeServer::kChunks);
  EXPECT_EQ(r.output_count_source, "chunks");
  EXPECT_TRUE(json::parse(srv.last_body()).contains("messages"));
}

TEST(BenchServeRun, FailuresAreCountedNotFatal) {
  // Of every 5 requests: 3 succeed, one gets HTTP 500, one is dropped mid-stream; then a
  // malformed event.
  FakeServer srv([](int k) {
    if (k == 12) return std::string("bad");
    return std::string(k % 5 == 3 ? "500" : k % 5 == 4 ? "drop" : "ok");
  });
  Target t = target_for(srv.port());
  LevelResult r = run_level(t, {}, word_prompts(13), {}, {3, 200.0}, 5);
  EXPECT_EQ(r.completed + r.failed, 13);
  EXPECT_EQ(r.failed, 5);
  EXPECT_EQ(r.completed, 8);
  int http500 = 0, dropped = 0, malformed = 0;
  for (const RequestRecord& q : r.requests) {
    if (q.ok) continue;
    if (q.error.rfind("HTTP 500: fake failure", 0) == 0) ++http500;
    else if (q.error.find("malformed SSE") != std::string::npos) ++malformed;
    else ++dropped;
  }
  EXPECT_EQ(http500, 2);
  EXPECT_EQ(dropped, 2);
  EXPECT_EQ(malformed, 1);
  EXPECT_FALSE(r.first_error.empty());
  EXPECT_EQ(r.total_output_tokens, 8 * FakeServer::kChunks);  // failed requests add nothing
}

TEST(BenchServeRun, TimeoutAndRefusedConnection) {
  FakeServer srv([](int k) { return std::string(k == 0 ? "stall" : "ok"); });
  Target t = target_for(srv.port());
  t.request_timeout_s = 0.5;
  auto start = std::chrono::steady_clock::now();
  LevelResult r = run_level(t, {}, word_prompts(3), {}, {1, INFINITY}, 1);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.failed, 1);
  EXPECT_EQ(r.completed, 2);
  EXPECT_FALSE(r.requests[0].ok);
  EXPECT_NE(r.requests[0].error.find("read failed"), std::string::npos) << r.requests[0].error;
  EXPECT_LT(took, 5.0);

  int free_port = closed_port();
  LevelResult refused = run_level(target_for(free_port), {}, word_prompts(4), {}, {2, INFINITY}, 1);
  EXPECT_EQ(refused.failed, 4);
  EXPECT_NE(refused.first_error.find("could not connect"), std::string::npos) << refused.first_error;
  EXPECT_THROW(list_models(target_for(free_port)), fp::Error);
}

// The command line end to end: levels, JSON and SVG files, against the fake server.
TEST(BenchServeRun, CommandLineWritesJsonAndSvg) {
  FakeServer srv([](int k) { return std::string(k == 5 ? "500" : "ok"); });
  std::string dir = test::temp_dir("bench_serve_cli");
  std::string cmd = test::fastpath_bin() + " bench-serve -q --request-timeout 60 --port " + std::to_string(srv.port()) +
                    " --num-prompts 6 --random-input-len 8 --random-output-len 6 --max-concurrency 1,3 --json " + dir +
                    "/r.json --svg " + dir + "/r.svg";
  int code = -1;
  std::string out = test::run_command(cmd, &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("Serving Benchmark Result (concurrency 3)"), std::string::npos) << out;
  EXPECT_NE(out.find("Median TTFT (ms):"), std::string::npos);
  EXPECT_NE(out.find("first error: HTTP 500: fake failure 5"), std::string::npos) << out;
  json j = json::parse(test::read_file(dir + "/r.json"));
  EXPECT_EQ(j["model"], "fake-model");  // from GET /v1/models
  ASSERT_EQ(j["levels"].size(), 2u);
  EXPECT_EQ(j["levels"][0]["max_concurrency"], 1);
  EXPECT_EQ(j["levels"][0]["completed"].get<int>() + j["levels"][1]["completed"].get<int>(), 11);
  EXPECT_EQ(j["levels"][1]["requests"].size(), 6u);
  EXPECT_TRUE(j["levels"][1].contains("p95_ttft_ms"));
  std::string why;
  std::string svg = test::read_file(dir + "/r.svg");
  EXPECT_TRUE(well_formed(svg, &why)) << why;
  EXPECT_NE(svg.find("max concurrency"), std::string::npos);

  // A count per level; a list whose length does not match the levels is refused.
  cmd = test::fastpath_bin() + " bench-serve -q --request-timeout 60 --port " + std::to_string(srv.port()) +
        " --num-prompts 2,5 --random-input-len 8 --random-output-len 6 --max-concurrency 1,3 --json " + dir + "/n.json";
  out = test::run_command(cmd, &code);
  ASSERT_EQ(code, 0) << out;
  j = json::parse(test::read_file(dir + "/n.json"));
  ASSERT_EQ(j["levels"].size(), 2u);
  EXPECT_EQ(j["levels"][0]["requests"].size(), 2u);
  EXPECT_EQ(j["levels"][1]["requests"].size(), 5u);
  EXPECT_EQ(j["dataset"]["num_prompts"], json::array({2, 5}));
  out = test::run_command(test::fastpath_bin() + " bench-serve -q --port 1 --model x --num-prompts 2,5,7 --max-concurrency 1,3 2>&1", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("has 3 counts for 2 levels"), std::string::npos) << out;

  // Every request failing exits non-zero with the error, and still writes the report.
  std::string bad = test::fastpath_bin() + " bench-serve -q --port 1 --model x --num-prompts 2 2>&1";
  out = test::run_command(bad, &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("could not connect"), std::string::npos) << out;
}

// --compare reads earlier results and prints them side by side with ratios to the first.
TEST(BenchServeRun, CompareResultsSideBySide) {
  std::string dir = test::temp_dir("bench_serve_compare");
  auto level = [](int c, double out_tps, double ttft) {
    return json{{"label", "concurrency " + std::to_string(c)}, {"max_concurrency", c}, {"output_throughput", out_tps},
                {"median_ttft_ms", ttft}, {"median_tpot_ms", nullptr}, {"completed", 8}, {"failed", 0}};
  };
  {
    std::ofstream(dir + "/a.json") << json{{"levels", {level(1, 10.0, 100.0), level(16, 80.0, 900.0)}}}.dump();
    std::ofstream(dir + "/b.json") << json{{"levels", {level(1, 5.0, 200.0), level(16, 20.0, 4000.0)}}}.dump();
    std::ofstream(dir + "/bad.json") << json{{"levels", {json{{"label", "x"}}}}}.dump();
  }
  int code = -1;
  std::string out = test::run_command(test::fastpath_bin() + " bench-serve -q --compare " + dir + "/a.json," + dir +
                                          "/b.json --labels ours,peer --svg " + dir + "/c.svg",
                                      &code);
  ASSERT_EQ(code, 0) << out;
  // Each row: level, server, output tok/s, ratio to the first server, TTFT p50, TPOT p50 (0: none), ok/failed.
  auto row_of = [&](const std::string& level_name, const std::string& server) {
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream w(line);
      std::vector<std::string> t{std::istream_iterator<std::string>(w), std::istream_iterator<std::string>()};
      if (t.size() == 8 && t[0] + " " + t[1] == level_name && t[2] == server) return std::vector<std::string>(t.begin() + 3, t.end());
    }
    return std::vector<std::string>{};
  };
  EXPECT_EQ(row_of("concurrency 16", "peer"), (std::vector<std::string>{"20.00", "0.25x", "4000.0", "0.0", "8/0"})) << out;
  EXPECT_EQ(row_of("concurrency 1", "ours"), (std::vector<std::string>{"10.00", "1.00x", "100.0", "0.0", "8/0"})) << out;
  std::string why, svg = test::read_file(dir + "/c.svg");
  EXPECT_TRUE(well_formed(svg, &why)) << why;
  EXPECT_NE(svg.find("peer"), std::string::npos);
  // A malformed result names the file and the level.
  out = test::run_command(test::fastpath_bin() + " bench-serve -q --compare " + dir + "/bad.json 2>&1", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("bad.json: levels[0]"), std::string::npos) << out;
  out = test::run_command(test::fastpath_bin() + " bench-serve -q --compare " + dir + "/a.json --labels x,y 2>&1", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("has 2 names for 1 files"), std::string::npos) << out;
}

// ---------------------------------------------------------------- against fastpath serve

TEST(BenchServeRun, AgainstFastpathServe) {
  const std::string model = test::testdata("models/stories260K/stories260K.gguf");
  FP_REQUIRE_FILE(model);
  int code = -1;
  test::run_command(test::fastpath_bin() + " serve --help >/dev/null 2>&1", &code);
  if (code != 0) GTEST_SKIP() << "`fastpath serve` is not in this build yet";
  std::string dir = test::temp_dir("bench_serve_vs_serve");
  // Port 0: the server picks a free loopback port and writes it to the port file.
  std::string start = test::fastpath_bin() + " serve -q -t 1 -m " + model + " --host 127.0.0.1 --port 0 --port-file " +
                      dir + "/port > " + dir + "/serve.log 2>&1 & echo $!";
  std::string pid = test::run_command(start, &code);
  ASSERT_EQ(code, 0);
  while (!pid.empty() && std::isspace(static_cast<unsigned char>(pid.back()))) pid.pop_back();
  std::string port;
  for (int i = 0; i < 300 && port.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (file_exists(dir + "/port")) port = test::read_file(dir + "/port");
  }
  while (!port.empty() && std::isspace(static_cast<unsigned char>(port.back()))) port.pop_back();
  if (port.empty()) {
    test::run_command("kill " + pid, &code);
    FAIL() << "fastpath serve wrote no port file; log:\n" << test::read_file(dir + "/serve.log");
  }
  std::string cmd = test::fastpath_bin() + " bench-serve -q --request-timeout 60 --port " + port + " -m " + model +
                    " --num-prompts 8 --random-input-len 24 --random-output-len 12 --ignore-eos --num-warmups 1"
                    " --max-concurrency 1,4 --json " + dir + "/r.json --svg " + dir + "/r.svg";
  std::string out = test::run_command(cmd, &code);
  std::string cmd_chat = test::fastpath_bin() + " bench-serve -q --request-timeout 60 --port " + port + " -m " + model +
                         " --endpoint /v1/chat/completions --num-prompts 3 --random-input-len 16 --random-output-len 8"
                         " --ignore-eos --max-concurrency 2 --json " + dir + "/chat.json";
  int chat_code = -1;
  std::string chat_out = test::run_command(cmd_chat, &chat_code);
  test::run_command("kill " + pid, &code);
  ASSERT_EQ(chat_code, 0) << chat_out;
  ASSERT_EQ(code == 0 ? 0 : code, 0) << out;
  json j = json::parse(test::read_file(dir + "/r.json"));
  auto tok = Tokenizer::from_path(model);
  const int bos = tok->spec().add_bos ? 1 : 0;
  for (const json& level : j["levels"]) {
    EXPECT_EQ(level["completed"], 8) << level["first_error"];
    EXPECT_EQ(level["failed"], 0);
    EXPECT_EQ(level["total_input_tokens"], 8 * 24);
    EXPECT_EQ(level["total_output_tokens"], 8 * 12);  // ignore_eos: every request runs to max_tokens
    EXPECT_EQ(level["output_tokens_source"], "usage");
    for (const json& q : level["requests"]) {
      // The server counts exactly the tokens the dataset built (plus its BOS).
      EXPECT_EQ(q["server_prompt_tokens"], q["input_tokens"].get<int>() + bos);
      EXPECT_EQ(q["output_tokens"], 12);
    }
  }
  json chat = json::parse(test::read_file(dir + "/chat.json"));
  EXPECT_EQ(chat["levels"][0]["completed"], 3) << chat["levels"][0]["first_error"];
  EXPECT_EQ(chat["levels"][0]["total_output_tokens"], 3 * 8);
  std::string why;
  EXPECT_TRUE(well_formed(test::read_file(dir + "/r.svg"), &why)) << why;
}

}  // namespace
}  // namespace fp::bench_serve
