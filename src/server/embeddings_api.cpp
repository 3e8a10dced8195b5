// server/embeddings_api.cpp — see embeddings_api.h.
#include "server/embeddings_api.h"

#include <cmath>

namespace fp {

namespace {
using nlohmann::json;

ApiError embedding_error(const std::string& message, const std::string& param) { return ApiError{400, message, "invalid_request_error", param}; }
}  // namespace

std::string base64_encode(const void* data, size_t bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve((bytes + 2) / 3 * 4);
  for (size_t i = 0; i < bytes; i += 3) {
    const uint32_t b0 = p[i], b1 = i + 1 < bytes ? p[i + 1] : 0, b2 = i + 2 < bytes ? p[i + 2] : 0;
    const uint32_t v = b0 << 16 | b1 << 8 | b2;
    out += kAlphabet[v >> 18 & 63];
    out += kAlphabet[v >> 12 & 63];
    out += i + 1 < bytes ? kAlphabet[v >> 6 & 63] : '=';
    out += i + 2 < bytes ? kAlphabet[v & 63] : '=';
  }
  return out;
}

std::optional<ApiError> parse_embedding_request(const json& body, const Tokenizer& tok, int64_t vocab, int64_t max_len, int64_t dim,
                                                size_t max_inputs, EmbeddingRequest& out) {
  if (!body.is_object()) return embedding_error("the body must be a JSON object", "");
  if (auto m = body.find("model"); m != body.end() && !m->is_null()) {
    if (!m->is_string()) return embedding_error("'model' must be a string", "model");
    out.model = m->get<std::string>();
  }
  auto in = body.find("input");
  if (in == body.end() || in->is_null()) return embedding_error("'input' is required: a string, a list of strings, or token ids", "input");
  auto ids_of = [&](const json& a, std::vector<int32_t>& ids) -> std::optional<ApiError> {
    for (const json& v : a) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab)
        return embedding_error("'input' holds " + v.dump() + ", not a token id in [0, " + std::to_string(vocab) + ")", "input");
      ids.push_back(v.get<int32_t>());
    }
    return std::nullopt;
  };
  if (in->is_string()) {
    out.inputs.push_back(tok.encode(in->get<std::string>(), true, true));
  } else if (in->is_array() && !in->empty() && (*in)[0].is_number()) {
    out.inputs.emplace_back();
    if (auto e = ids_of(*in, out.inputs.back())) return e;
  } else if (in->is_array()) {
    for (const json& item : *in) {
      if (item.is_string()) {
        out.inputs.push_back(tok.encode(item.get<std::string>(), true, true));
      } else if (item.is_array()) {
        out.inputs.emplace_back();
        if (auto e = ids_of(item, out.inputs.back())) return e;
      } else {
        return embedding_error("'input' items must be strings or lists of token ids, found " + item.dump(), "input");
      }
    }
  } else {
    return embedding_error("'input' must be a string, a list of strings, or token ids, found " + in->dump(), "input");
  }
  if (out.inputs.empty()) return embedding_error("'input' is an empty list", "input");
  if (out.inputs.size() > max_inputs)
    return embedding_error("'input' has " + std::to_string(out.inputs.size()) + " items, more than " + std::to_string(max_inputs), "input");
  for (size_t i = 0; i < out.inputs.size(); ++i) {
    const auto n = static_cast<int64_t>(out.inputs[i].size());
    if (n == 0) return embedding_error("input " + std::to_string(i) + " has no tokens", "input");
    if (n > max_len)
      return embedding_error("input " + std::to_string(i) + " has " + std::to_string(n) + " tokens, more than the maximum of " +
                     std::to_string(max_len),
                 "input");
  }
  if (auto f = body.find("encoding_format"); f != body.end() && !f->is_null()) {
    if (*f != "float" && *f != "base64") return embedding_error("'encoding_format' must be \"float\" or \"base64\", found " + f->dump(), "encoding_format");
    out.base64 = *f == "base64";
  }
  if (auto d = body.find("dimensions"); d != body.end() && !d->is_null()) {
    if (!d->is_number_integer() || d->get<int64_t>() < 1 || d->get<int64_t>() > dim)
      return embedding_error("'dimensions' must be an integer in [1, " + std::to_string(dim) + "], found " + d->dump(), "dimensions");
    out.dimensions = d->get<int64_t>();
  }
  return std::nullopt;
}

json embedding_response(const EmbeddingRequest& req, std::vector<std::vector<float>> vectors, const std::string& model_name,
                        bool normalize) {
  json data = json::array();
  int64_t tokens = 0;
  for (size_t i = 0; i < vectors.size(); ++i) {
    std::vector<float>& v = vectors[i];
    tokens += static_cast<int64_t>(req.inputs[i].size());
    if (req.dimensions > 0 && req.dimensions < static_cast<int64_t>(v.size())) {
      v.resize(static_cast<size_t>(req.dimensions));
      if (normalize) {
        double ss = 0;
        for (float x : v) ss += static_cast<double>(x) * x;
        if (ss > 0)
          for (float& x : v) x = static_cast<float>(x / std::sqrt(ss));
      }
    }
    json e{{"object", "embedding"}, {"index", i}};
    if (req.base64) e["embedding"] = base64_encode(v.data(), v.size() * sizeof(float));
    else e["embedding"] = v;
    data.push_back(std::move(e));
  }
  return {{"object", "list"}, {"data", std::move(data)}, {"model", model_name},
          {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
}

}  // namespace fp
