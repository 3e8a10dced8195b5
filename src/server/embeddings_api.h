// server/embeddings_api.h — POST /v1/embeddings (OpenAI's embeddings API): the request's inputs
// as token ids (a string, a list of strings, a list of ids, or a list of id lists), its output
// options, and the response body.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai_api.h"
#include "tokenizer/tokenizer.h"

namespace fp {

struct EmbeddingRequest {
  std::string model;
  std::vector<std::vector<int32_t>> inputs;
  bool base64 = false;     // encoding_format "base64": little-endian float32 bytes, base64-encoded
  int64_t dimensions = 0;  // > 0: the first `dimensions` values, normalised again (Matryoshka models)
};

// Parses and validates the body: at most `max_inputs` inputs, each of 1 to max_len tokens (ids
// inside the vocabulary); `dim` is the model's width (dimensions must not exceed it). Errors
// name the field, as OpenAI's do.
std::optional<ApiError> parse_embedding_request(const nlohmann::json& body, const Tokenizer& tok, int64_t vocab,
                                                int64_t max_len, int64_t dim, size_t max_inputs, EmbeddingRequest& out);

// The response: {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
// "usage"}; each vector cut to req.dimensions (and normalised again when `normalize`).
nlohmann::json embedding_response(const EmbeddingRequest& req, std::vector<std::vector<float>> vectors,
                                  const std::string& model_name, bool normalize);

// RFC 4648 base64 of bytes (what encoding_format "base64" sends).
std::string base64_encode(const void* data, size_t bytes);

}  // namespace fp
