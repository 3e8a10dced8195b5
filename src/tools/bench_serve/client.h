// tools/bench_serve/client.h — one streaming request to an OpenAI-compatible server, timed:
// the JSON body, the SSE stream read as it arrives, TTFT / ITL / TPOT / end-to-end latency,
// and every way it can fail (refused connection, HTTP 4xx/5xx, malformed events, a dropped
// stream, a timeout) turned into a failed record, never an exception.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tools/bench_serve/dataset.h"
#include "tools/bench_serve/sse.h"
#include "tools/bench_serve/stats.h"

namespace httplib {
class Client;
}

namespace fp::bench_serve {

struct Target {
  std::string origin;            // "http://127.0.0.1:8080" (scheme, host, port)
  std::string path_prefix;       // from a base URL like http://host/api ("" usually)
  std::string endpoint = "/v1/completions";
  std::string model;             // the "model" field sent
  std::string api_key;           // Bearer token ("" = none)
  double request_timeout_s = 600;   // whole request, and the longest silence while reading
  double connect_timeout_s = 10;
  bool chat() const { return endpoint.find("chat") != std::string::npos; }
};

// Splits "http://host:port/prefix" (scheme optional, default http) into origin and prefix.
// Throws fp::Error on an unsupported scheme or an empty host.
void parse_base_url(const std::string& url, std::string& origin, std::string& prefix);

struct SamplingOptions {
  double temperature = 0;
  bool ignore_eos = false;  // also sends min_tokens = max_tokens
};

// The request body for one prompt (streaming, with usage in the final chunk).
std::string request_body(const Target& t, const Prompt& p, const SamplingOptions& s);

// Turns a response stream into a RequestRecord: feed bytes as they arrive with their arrival
// time, then finish(). Times are seconds since the request was sent.
class StreamTrace {
 public:
  StreamTrace(bool chat, RequestRecord& rec) : chat_(chat), rec_(rec) {}
  // False when the stream is broken (malformed event, an error event): stop reading.
  bool on_bytes(std::string_view bytes, double t);
  // Completes the record: success needs HTTP 2xx, well-formed events and the [DONE] sentinel.
  // `transport_error` is the client's error when the exchange broke off ("" if none).
  void finish(int http_status, const std::string& error_body, const std::string& transport_error, double t_end);
  bool saw_done() const { return done_; }

 private:
  bool chat_;
  RequestRecord& rec_;
  SseParser sse_;
  std::vector<std::string> events_;
  std::string error_;
  bool done_ = false;
  double last_content_t_ = -1;
};

// Sends one streaming request on `cli` and times it. `rec.index`, `input_tokens` and
// `requested_output` come from the caller.
RequestRecord send_request(httplib::Client& cli, const Target& t, const Prompt& p, const SamplingOptions& s);

// A client for target's origin with its timeouts and keep-alive set.
std::unique_ptr<httplib::Client> make_client(const Target& t);

// GET {prefix}/v1/models: the model ids the server lists. Throws fp::Error naming the URL and
// the reason when the server cannot be reached or answers with something else.
std::vector<std::string> list_models(const Target& t);

}  // namespace fp::bench_serve
