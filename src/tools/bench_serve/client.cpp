// tools/bench_serve/client.cpp — one timed streaming request; /v1/models.
#include "tools/bench_serve/client.h"

#include <httplib.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fp::bench_serve {

using nlohmann::json;

void parse_base_url(const std::string& url, std::string& origin, std::string& prefix) {
  std::string rest = url, scheme = "http";
  if (auto p = rest.find("://"); p != std::string::npos) {
    scheme = rest.substr(0, p);
    rest = rest.substr(p + 3);
  }
  FP_CHECK(scheme == "http" || scheme == "https", "--base-url '", url, "': scheme '", scheme,
           "' (expected http or https)");
  size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  prefix = slash == std::string::npos ? "" : rest.substr(slash);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  // A base URL ending in /v1 (as OpenAI clients take it) would double the /v1 of the endpoint.
  if (prefix.size() >= 3 && prefix.compare(prefix.size() - 3, 3, "/v1") == 0) prefix.resize(prefix.size() - 3);
  FP_CHECK(!hostport.empty() && hostport[0] != ':', "--base-url '", url, "': no host");
  origin = scheme + "://" + hostport;
}

std::string request_body(const Target& t, const Prompt& p, const SamplingOptions& s) {
  json j;
  j["model"] = t.model;
  if (t.chat())
    j["messages"] = json::array({{{"role", "user"}, {"content", p.text}}});
  else
    j["prompt"] = p.text;
  j["max_tokens"] = p.output_len;
  j["temperature"] = s.temperature;
  j["stream"] = true;
  j["stream_options"] = {{"include_usage", true}};
  if (s.ignore_eos) {
    j["ignore_eos"] = true;
    j["min_tokens"] = p.output_len;
  }
  // Invalid UTF-8 in a prompt would make dump() throw; replace it instead (the server would
  // reject it anyway, and the dataset never builds it).
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool StreamTrace::on_bytes(std::string_view bytes, double t) {
  if (!error_.empty()) return false;
  events_.clear();
  if (!sse_.feed(bytes, events_)) {
    error_ = "malformed SSE: a line longer than " + std::to_string(sse_.max_line_bytes) + " bytes";
    return false;
  }
  for (const std::string& ev : events_) {
    StreamChunk c;
    std::string why;
    if (done_) {
      error_ = "malformed SSE: an event after data: [DONE]";
      return false;
    }
    if (!parse_chunk(ev, chat_, c, &why)) {
      error_ = "malformed SSE: " + why;
      return false;
    }
    if (!c.error.empty()) {
      error_ = "error event in stream: " + c.error;
      return false;
    }
    if (c.done) done_ = true;
    if (c.has_usage) {
      if (c.completion_tokens >= 0) {
        rec_.output_tokens = c.completion_tokens;
        rec_.output_from_usage = true;
      }
      if (c.prompt_tokens >= 0) rec_.server_prompt_tokens = c.prompt_tokens;
    }
    if (!c.content.empty()) {
      ++rec_.chunks;
      rec_.output_bytes += static_cast<int64_t>(c.content.size());
      if (rec_.ttft_s < 0)
        rec_.ttft_s = t;
      else
        rec_.itl_s.push_back(t - last_content_t_);
      last_content_t_ = t;
    }
  }
  return true;
}

void StreamTrace::finish(int http_status, const std::string& error_body, const std::string& transport_error,
                         double t_end) {
  rec_.e2e_s = t_end;
  std::string err;
  if (http_status > 0 && (http_status < 200 || http_status >= 300)) {
    err = "HTTP " + std::to_string(http_status) + ": " + error_message_of(error_body);
  } else if (!error_.empty()) {
    err = error_;
  } else if (!transport_error.empty() && !done_) {
    err = transport_error;
    if (http_status > 0) err += " (after " + std::to_string(rec_.chunks) + " content chunks)";
  } else if (!done_) {
    events_.clear();
    sse_.finish(events_);
    err = events_.empty() && rec_.chunks == 0 ? "no SSE events in a 2xx response (not a streaming server?)"
                                              : "stream ended without data: [DONE]";
  }
  if (!rec_.output_from_usage) rec_.output_tokens = rec_.chunks;
  rec_.ok = err.empty();
  rec_.error = err;
  if (rec_.ok && rec_.output_tokens > 1 && rec_.ttft_s >= 0)
    rec_.tpot_s = (rec_.e2e_s - rec_.ttft_s) / static_cast<double>(rec_.output_tokens - 1);
}

namespace {

void split_seconds(double s, time_t& sec, time_t& usec) {
  s = std::max(s, 0.001);
  sec = static_cast<time_t>(s);
  usec = static_cast<time_t>((s - static_cast<double>(sec)) * 1e6);
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

httplib::Headers headers_for(const Target& t) {
  httplib::Headers h{{"Accept", "text/event-stream"}};
  if (!t.api_key.empty()) h.emplace("Authorization", "Bearer " + t.api_key);
  return h;
}

std::string describe(httplib::Error e, const Target& t) {
  switch (e) {
    case httplib::Error::Connection:
      return "could not connect to " + t.origin + " (refused or unreachable)";
    case httplib::Error::ConnectionTimeout:
      return "connecting to " + t.origin + " timed out";
    case httplib::Error::Read:
      return "read failed: the connection dropped, or no data for " + seconds(t.request_timeout_s);
    case httplib::Error::Write:
      return "sending the request failed (connection dropped)";
    default:
      return "HTTP client error: " + httplib::to_string(e);
  }
}

}  // namespace

std::unique_ptr<httplib::Client> make_client(const Target& t) {
  auto cli = std::make_unique<httplib::Client>(t.origin);
  time_t sec, usec;
  split_seconds(t.connect_timeout_s, sec, usec);
  cli->set_connection_timeout(sec, usec);
  split_seconds(t.request_timeout_s, sec, usec);
  cli->set_read_timeout(sec, usec);
  cli->set_write_timeout(sec, usec);
  cli->set_keep_alive(true);
  cli->set_tcp_nodelay(true);  // as aiohttp does: no Nagle wait between the headers and the body
  return cli;
}

RequestRecord send_request(httplib::Client& cli, const Target& t, const Prompt& p, const SamplingOptions& s) {
  RequestRecord rec;
  rec.input_tokens = p.input_len;
  rec.requested_output = p.output_len;
  StreamTrace trace(t.chat(), rec);
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  try {
    httplib::Request req;
    req.method = "POST";
    req.path = t.path_prefix + t.endpoint;
    req.headers = headers_for(t);
    req.headers.emplace("Content-Type", "application/json");
    req.body = request_body(t, p, s);
    int status = 0;
    bool timed_out = false;
    std::string error_body;
    req.response_handler = [&](const httplib::Response& r) {
      status = r.status;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      double now = since();
      if (status < 200 || status >= 300) {  // keep the start of an error body for the message
        error_body.append(data, std::min(n, size_t{4096} - std::min(error_body.size(), size_t{4096})));
        return true;
      }
      if (now > t.request_timeout_s) {
        timed_out = true;
        return false;
      }
      return trace.on_bytes(std::string_view(data, n), now);
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    bool sent = cli.send(req, res, err);
    double t_end = since();
    std::string transport;
    if (timed_out)
      transport = "request timeout: still streaming after " + seconds(t.request_timeout_s);
    else if (!sent)
      transport = describe(err, t);
    if (status == 0 && sent) status = res.status;
    trace.finish(status, error_body, transport, t_end);
  } catch (const std::exception& e) {
    trace.finish(0, "", std::string("client exception: ") + e.what(), since());
  }
  return rec;
}

std::vector<std::string> list_models(const Target& t) {
  auto cli = make_client(t);
  std::string url = t.origin + t.path_prefix + "/v1/models";
  auto res = cli->Get(t.path_prefix + "/v1/models", headers_for(t));
  FP_CHECK(res, "GET ", url, ": ", describe(res.error(), t));
  FP_CHECK(res->status == 200, "GET ", url, ": HTTP ", res->status, ": ", error_message_of(res->body));
  json j = json::parse(res->body, nullptr, false);
  FP_CHECK(j.is_object() && j.contains("data") && j["data"].is_array(), "GET ", url,
           ": expected {\"data\": [...]}, got ", res->body.substr(0, 200));
  std::vector<std::string> ids;
  for (const json& m : j["data"])
    if (m.is_object() && m.contains("id") && m["id"].is_string()) ids.push_back(m["id"].get<std::string>());
  return ids;
}

}  // namespace fp::bench_serve
