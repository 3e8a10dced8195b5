// engine/embedder.cpp — see embedder.h.
#include "engine/embedder.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fp {

Pooling pooling_from_name(const std::string& name) {
  if (name == "last") return Pooling::Last;
  if (name == "mean") return Pooling::Mean;
  fail("pooling '", name, "' is not one of last, mean");
}

const char* pooling_name(Pooling p) { return p == Pooling::Mean ? "mean" : "last"; }

Pooling default_pooling(const std::string& model_path) {
  const std::filesystem::path cfg = std::filesystem::path(model_path) / "1_Pooling" / "config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(cfg, ec)) return Pooling::Last;
  std::ifstream in(cfg);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  FP_CHECK(!j.is_discarded() && j.is_object(), cfg.string(), ": not a valid JSON object");
  if (j.value("pooling_mode_mean_tokens", false)) return Pooling::Mean;
  if (j.value("pooling_mode_lasttoken", false)) return Pooling::Last;
  for (const char* k : {"pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_weightedmean_tokens"})
    FP_CHECK(!j.value(k, false), cfg.string(), ": ", k, " is not supported (last-token and mean pooling are)");
  return Pooling::Last;
}

Embedder::Embedder(Model& model) : model_(model) { model_.set_hidden_output(true); }

Embedder::~Embedder() { model_.set_hidden_output(false); }

void Embedder::check_input(const std::vector<int32_t>& ids) const {
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t ctx = model_.config().max_context;
  FP_CHECK(n > 0, "embedding: the input has no tokens");
  FP_CHECK(n <= ctx, "embedding: the input has ", n, " tokens, more than the model's context of ", ctx);
}

void Embedder::finish(std::vector<float>& v, const EmbeddingOptions& o) {
  if (!o.normalize) return;
  double ss = 0;
  for (float x : v) ss += static_cast<double>(x) * x;
  const double norm = std::sqrt(ss);
  FP_CHECK(norm > 0 && std::isfinite(norm), "embedding: the pooled hidden state has norm ", norm);
  for (float& x : v) x = static_cast<float>(x / norm);
}

// Adds rows [row, row + n) of rows_ ([.., d]) to sum.
void Embedder::add_rows(int64_t row, int64_t n, std::vector<double>& sum) const {
  const int64_t d = dim();
  for (int64_t r = row; r < row + n; ++r)
    for (int64_t c = 0; c < d; ++c) sum[static_cast<size_t>(c)] += rows_[static_cast<size_t>(r * d + c)];
}

std::vector<float> Embedder::pooled(const std::vector<double>& sum, int64_t n, const EmbeddingOptions& o) {
  std::vector<float> v(sum.size());
  for (size_t c = 0; c < sum.size(); ++c) v[c] = static_cast<float>(sum[c] / static_cast<double>(n));
  finish(v, o);
  return v;
}

std::vector<std::vector<float>> Embedder::embed_batch(const std::vector<std::vector<int32_t>>& inputs, const EmbeddingOptions& o) {
  FP_CHECK(o.chunk > 0, "embedding: chunk ", o.chunk, " must be positive");
  for (const auto& ids : inputs) check_input(ids);
  const int64_t d = dim(), page = 16;
  const bool mean = o.pooling == Pooling::Mean;
  auto len = [&](size_t i) { return static_cast<int64_t>(inputs[i].size()); };
  std::vector<std::vector<float>> out(inputs.size());
  for (size_t i = 0; i < inputs.size();) {
    if (len(i) > o.chunk) {  // alone, in chunks
      out[i] = embed_chunked(inputs[i], o);
      ++i;
      continue;
    }
    size_t j = i;
    int64_t tokens = 0, pages = 0;
    for (; j < inputs.size() && len(j) <= o.chunk && tokens + len(j) <= o.chunk; ++j) {
      tokens += len(j);
      pages += (len(j) + page - 1) / page;
    }
    auto cache = model_.new_cache(pages * page, page);
    ForwardBatch b;
    int64_t at = 0;
    for (size_t k = i; k < j; ++k) {
      const int64_t n_pages = (len(k) + page - 1) / page;
      b.add_sequence(inputs[k].data(), len(k), 0, cache->pages.data() + at, n_pages, !mean, mean);
      at += n_pages;
    }
    rows_.resize(b.logit_rows.size() * static_cast<size_t>(d));
    model_.forward(b, *cache->pool, rows_.data());
    for (int64_t row = 0; i < j; ++i) {
      const int64_t rows = mean ? len(i) : 1;
      std::vector<double> sum(static_cast<size_t>(d), 0.0);
      add_rows(row, rows, sum);
      row += rows;
      out[i] = pooled(sum, rows, o);
    }
  }
  return out;
}

std::vector<float> Embedder::embed(const std::vector<int32_t>& ids, const EmbeddingOptions& o) { return embed_batch({ids}, o)[0]; }

std::vector<float> Embedder::embed_chunked(const std::vector<int32_t>& ids, const EmbeddingOptions& o) {
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t d = dim();
  const bool mean = o.pooling == Pooling::Mean;
  auto cache = model_.new_cache(n);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::vector<double> sum(static_cast<size_t>(d), 0.0);
  for (int64_t at = 0; at < n; at += o.chunk) {
    const int64_t len = std::min(o.chunk, n - at);
    // Last-token pooling reads the last chunk's last row only; the chunks before it fill the cache.
    rows_.resize(static_cast<size_t>((mean ? len : 1) * d));
    model_.forward(ids.data() + at, pos.data() + at, len, *cache, rows_.data(), mean);
    if (mean) add_rows(0, len, sum);
    else if (at + len == n) add_rows(0, 1, sum);
  }
  return pooled(sum, mean ? n : 1, o);
}

}  // namespace fp
