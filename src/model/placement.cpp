// model/placement.cpp — weight uploads, activation buffers and batch staging on a device.
#include "model/placement.h"

#include <cstring>

#include "core/error.h"
#include "kernels/ledger.h"
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "model/model.h"

namespace fp {

const void* DeviceWeights::upload(const void* host, size_t bytes) {
  auto it = copies_.find({host, bytes});
  if (it != copies_.end()) return it->second;
  DeviceBuffer& buf = buffers_.emplace_back(device_, bytes);
  copy_bytes(device_, buf.data(), Device::CPU, host, bytes);
  bytes_ += bytes;
  copies_[{host, bytes}] = buf.data();
  return buf.data();
}

const Tensor* DeviceWeights::tensor(const Tensor* t) {
  if (!t || device_ == Device::CPU || t->device == device_) return t;  // (a view stack_rows made)
  const TensorKey key{t->data, t->rows(), t->cols(), static_cast<int>(t->dtype)};
  auto it = tensors_.find(key);
  if (it != tensors_.end()) return it->second;
  FP_CHECK(t->is_contiguous(), "cannot place a non-contiguous tensor ", t->shape_str(), " on ", device_name(device_));
  Tensor d = *t;
  d.data = const_cast<void*>(upload(t->data, static_cast<size_t>(t->nbytes())));
  d.device = device_;
  if (t->block_scale) {
    const int64_t sb = t->scale_block, scales = ((t->rows() + sb - 1) / sb) * ((t->cols() + sb - 1) / sb);
    d.block_scale = static_cast<const float*>(upload(t->block_scale, static_cast<size_t>(scales) * sizeof(float)));
  }
  const Tensor* out = &views_.emplace_back(d);
  tensors_[key] = out;
  return out;
}

const float* DeviceWeights::floats(const float* p, int64_t n) {
  if (!p || device_ == Device::CPU) return p;
  return static_cast<const float*>(upload(p, static_cast<size_t>(n) * sizeof(float)));
}

std::vector<Tensor> DeviceWeights::stack(const std::vector<Tensor>& experts, int64_t begin, int64_t end) {
  if (device_ == Device::CPU || begin >= end) return experts;
  const Tensor& first = experts[static_cast<size_t>(begin)];
  const auto mat = static_cast<size_t>(first.nbytes());
  const int64_t sb = first.scale_block;
  const auto scales = first.block_scale ? static_cast<size_t>(((first.rows() + sb - 1) / sb) * ((first.cols() + sb - 1) / sb)) : 0;
  const auto count = static_cast<size_t>(end - begin);
  DeviceBuffer& buf = buffers_.emplace_back(device_, mat * count);
  DeviceBuffer* sbuf = scales ? &buffers_.emplace_back(device_, scales * count * sizeof(float)) : nullptr;
  std::vector<Tensor> out(experts.size());
  for (int64_t e = begin; e < end; ++e) {
    const Tensor& t = experts[static_cast<size_t>(e)];
    FP_CHECK(t.dtype == first.dtype && t.shape == first.shape && t.is_contiguous() && (t.block_scale != nullptr) == (scales > 0),
             "cannot place expert ", e, " ", t.shape_str(), " on ", device_name(device_), ": the experts differ from expert ",
             begin, " ", first.shape_str());
    const auto i = static_cast<size_t>(e - begin);
    Tensor& d = out[static_cast<size_t>(e)];
    d = t;
    d.data = buf.as<uint8_t>() + i * mat;
    d.device = device_;
    copy_bytes(device_, d.data, Device::CPU, t.data, mat);
    if (sbuf) {
      d.block_scale = sbuf->as<float>() + i * scales;
      copy_bytes(device_, const_cast<float*>(d.block_scale), Device::CPU, t.block_scale, scales * sizeof(float));
    }
  }
  bytes_ += mat * count + scales * count * sizeof(float);
  return out;
}

const Tensor* DeviceWeights::stack_rows(const std::vector<const Tensor**>& parts) {
  if (device_ == Device::CPU || parts.empty()) return nullptr;
  const Tensor& first = **parts[0];
  int64_t rows = 0;
  for (const Tensor** p : parts) {
    const Tensor& t = **p;
    if (t.device != Device::CPU || t.ndim != 2 || !t.is_contiguous() || t.dtype != first.dtype || t.cols() != first.cols() ||
        (t.block_scale != nullptr) != (first.block_scale != nullptr) || t.scale_block != first.scale_block ||
        (t.block_scale && t.rows() % t.scale_block != 0) || tensors_.count({t.data, t.rows(), t.cols(), static_cast<int>(t.dtype)}))
      return nullptr;  // another layout, already placed alone, or scale blocks that would straddle two parts
    rows += t.rows();
  }
  const auto row_bytes = static_cast<size_t>(fp::row_bytes(first.dtype, first.cols()));
  const int64_t sb = first.scale_block, scale_cols = first.block_scale ? (first.cols() + sb - 1) / sb : 0;
  DeviceBuffer& buf = buffers_.emplace_back(device_, row_bytes * static_cast<size_t>(rows));
  DeviceBuffer* sbuf = scale_cols ? &buffers_.emplace_back(device_, static_cast<size_t>(rows / sb * scale_cols) * sizeof(float)) : nullptr;
  Tensor whole = Tensor::view(buf.data(), first.dtype, {rows, first.cols()});
  whole.block_scale = sbuf ? sbuf->as<float>() : nullptr;
  whole.scale_block = first.scale_block;
  whole.device = device_;
  int64_t row0 = 0;
  for (const Tensor** p : parts) {
    const Tensor& t = **p;
    Tensor d = t;
    d.data = buf.as<uint8_t>() + static_cast<size_t>(row0) * row_bytes;
    d.device = device_;
    copy_bytes(device_, d.data, Device::CPU, t.data, static_cast<size_t>(t.nbytes()));
    if (sbuf) {
      d.block_scale = sbuf->as<float>() + row0 / sb * scale_cols;
      copy_bytes(device_, const_cast<float*>(d.block_scale), Device::CPU, t.block_scale,
                 static_cast<size_t>(t.rows() / sb * scale_cols) * sizeof(float));
    }
    const Tensor* view = &views_.emplace_back(d);
    tensors_[{t.data, t.rows(), t.cols(), static_cast<int>(t.dtype)}] = view;
    *p = view;
    row0 += t.rows();
  }
  bytes_ += buf.bytes() + (sbuf ? sbuf->bytes() : 0);
  return &views_.emplace_back(whole);
}

void LogitRowGather::run(const float* x, int64_t n, int64_t dim, const int32_t* ids, int64_t rows, const float* norm,
                         float eps, float* out) {
  rows_.run(x, n, dim, ids, rows, out);
  dispatch(RmsNormArgs{out, norm, rows, dim, eps, out});
}

void RowGather::run(const float* table, int64_t n, int64_t dim, const int32_t* ids, int64_t count, float* out) {
  Tensor& view = views_[{table, n, dim}];
  view = Tensor::view(table, DType::F32, {n, dim});
  view.device = device_;
  dispatch(EmbeddingArgs{&view, ids, count, out});
}

float* Activations::f32(size_t slot, int64_t n) {
  while (buffers_.size() <= slot) buffers_.emplace_back(device_);
  DeviceBuffer& b = buffers_[slot];
  b.reserve(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float));
  return b.as<float>();
}

StagedBatch host_view(const ForwardBatch& b) {
  StagedBatch s;
  s.n = b.n_tokens();
  s.n_seqs = b.n_seqs();
  s.n_logits = static_cast<int64_t>(b.logit_rows.size());
  s.tokens = b.tokens.data();
  s.positions = b.positions.data();
  s.seq_indptr = b.seq_indptr.data();
  s.page_indptr = b.page_indptr.data();
  s.page_ids = b.page_ids.data();
  s.kv_len = b.kv_len.data();
  s.logit_rows = b.logit_rows.data();
  s.window_page_ids = b.window_page_ids.empty() ? nullptr : b.window_page_ids.data();
  return s;
}

void UploadRing::upload(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (device_ == Device::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
  PinnedBuffer& image = images_[next_];
  wait_device_fence(device_, fences_[next_]);  // the copy that last read this image has run
  image.reserve(bytes);
  std::memcpy(image.data(), src, bytes);
  copy_bytes_async(device_, dst, Device::CPU, image.data(), bytes);
  fences_[next_] = device_fence(device_);
  next_ = 1 - next_;
}

StagedBatch BatchStager::stage(const ForwardBatch& b, int64_t page_size, const int32_t* fed_ids) {
  FP_CHECK(b.feed_rows.empty() || b.feed_rows.size() == b.tokens.size(), "a batch of ", b.tokens.size(), " tokens has ",
           b.feed_rows.size(), " feed rows");
  FP_CHECK(b.feed_rows.empty() || device_ != Device::CPU, "fed tokens are resolved before a CPU forward");
  FP_CHECK(b.feed_rows.empty() || fed_ids, "a batch with fed tokens but no ids to feed them from");
  b.slots(page_size, slots_);
  StagedBatch s = host_view(b);
  if (device_ == Device::CPU) {
    s.slots = slots_.data();
    if (!b.window_page_ids.empty()) {
      b.window_slots(page_size, window_slots_);
      s.window_slots = window_slots_.data();
    }
    return s;
  }
  FP_CHECK(b.window_page_ids.empty(), "window block tables on ", device_name(device_),
           " (window trimming runs on the CPU only)");
  // One host image of every array (8-byte aligned pieces), one copy to the device. The pieces
  // whose sizes follow from (tokens, sequences, logit rows) come first and the block tables,
  // whose length grows as sequences do, last: a step graph recorded for one shape then finds
  // every array where it was recorded (the feed rows keep their place, n entries, when a batch
  // has none).
  struct Piece {
    const void* src;
    size_t bytes;
    size_t at;
  };
  auto pieces = std::vector<Piece>{
      {slots_.data(), slots_.size() * 8, 0},           {b.tokens.data(), b.tokens.size() * 4, 0},
      {b.positions.data(), b.positions.size() * 4, 0}, {b.seq_indptr.data(), b.seq_indptr.size() * 4, 0},
      {b.page_indptr.data(), b.page_indptr.size() * 4, 0}, {b.kv_len.data(), b.kv_len.size() * 4, 0},
      {b.logit_rows.data(), b.logit_rows.size() * 4, 0}, {b.feed_rows.data(), b.tokens.size() * 4, 0},
      {b.page_ids.data(), b.page_ids.size() * 4, 0}};
  size_t total = 0;
  for (Piece& p : pieces) {
    p.at = total;
    total += (p.bytes + 7) / 8 * 8;
  }
  host_.resize(std::max<size_t>(total, 8));
  const bool fed = !b.feed_rows.empty();
  for (size_t i = 0; i < pieces.size(); ++i)  // piece 7, the feed rows, holds nothing when none are fed
    if (pieces[i].bytes && (i != 7 || fed)) std::memcpy(host_.data() + pieces[i].at, pieces[i].src, pieces[i].bytes);
  staging_.reserve(host_.size());
  uploads_.upload(staging_.data(), host_.data(), total);
  auto* base = staging_.as<uint8_t>();
  s.slots = reinterpret_cast<const int64_t*>(base + pieces[0].at);
  s.tokens = reinterpret_cast<const int32_t*>(base + pieces[1].at);
  s.positions = reinterpret_cast<const int32_t*>(base + pieces[2].at);
  s.seq_indptr = reinterpret_cast<const int32_t*>(base + pieces[3].at);
  s.page_indptr = reinterpret_cast<const int32_t*>(base + pieces[4].at);
  s.kv_len = reinterpret_cast<const int32_t*>(base + pieces[5].at);
  s.logit_rows = reinterpret_cast<const int32_t*>(base + pieces[6].at);
  s.page_ids = reinterpret_cast<const int32_t*>(base + pieces[8].at);
  if (fed) {  // the tokens the step before sampled, on the device (ordered after its sample op)
    DeviceScope scope(device_);
    dispatch(TokenFeedArgs{reinterpret_cast<int32_t*>(base + pieces[1].at),
                           reinterpret_cast<const int32_t*>(base + pieces[7].at), fed_ids, s.n});
  }
  return s;
}

StepGraphs::~StepGraphs() {
  const DeviceGraphOps* g = device_graphs(device_);
  for (auto& [k, e] : graphs_)
    if (e.graph && g) g->destroy(e.graph);
}

void StepGraphs::run(int64_t n, int64_t n_seqs, int64_t n_logits, const void* pool_key, const std::function<void()>& body,
                     int64_t variant) {
  if (device_ == Device::CPU) return body();
  Ledger& ledger = Ledger::global();
  const DeviceGraphOps* g = device_graphs(device_);
  std::string why;
  if (!enabled_) why = "graphs off (--no-cuda-graphs)";
  else if (!g) why = "the device records no graphs";
  else if (n != n_seqs) why = "prefill or mixed step";
  else if (ledger.profiling()) why = "profiling (each kernel is timed alone)";
  else if (graphs_.size() >= 256 && !graphs_.count(Key{n, n_seqs, n_logits, pool_key, variant})) why = "256 step shapes recorded already";
  if (!why.empty()) {
    ledger.note_step("eager: " + why);
    return body();
  }
  Entry& e = graphs_[Key{n, n_seqs, n_logits, pool_key, variant}];
  if (e.failed) {
    ledger.note_step("eager: recording this shape failed before");
    return body();
  }
  if (e.graph && e.epoch == device_memory_epoch()) {
    g->launch(e.graph);
    ledger.note_step("replayed");
    return;
  }
  if (e.graph) {  // device memory moved since: the graph may point at freed buffers
    g->destroy(e.graph);
    e.graph = nullptr;
  }
  if (++e.seen == 1) {
    ledger.note_step("eager: first step of its shape (buffers are allocated)");
    return body();
  }
  const uint64_t epoch = device_memory_epoch();
  g->begin_capture();
  try {
    body();
    e.graph = g->end_capture();
  } catch (const std::exception& err) {
    g->abort_capture();
    e.failed = true;
    ledger.note_step(std::string("eager: recording failed: ") + err.what());
    return body();  // nothing of the step ran while it was being recorded
  }
  if (device_memory_epoch() != epoch) {  // something allocated while recording: do not trust it
    g->destroy(e.graph);
    e.graph = nullptr;
    e.failed = true;
    ledger.note_step("eager: memory was allocated while recording");
    return body();
  }
  e.epoch = epoch;
  g->launch(e.graph);
  ledger.note_step("recorded");
}

}  // namespace fp
