// model/placement.cpp — weight uploads, activation buffers and batch staging on a device.
#include "model/placement.h"

#include <cstring>

#include "core/error.h"
#include "model/model.h"

namespace fp {

const void* DeviceWeights::upload(const void* host, size_t bytes) {
  auto it = copies_.find(host);
  if (it != copies_.end()) return it->second;
  DeviceBuffer& buf = buffers_.emplace_back(device_, bytes);
  copy_bytes(device_, buf.data(), Device::CPU, host, bytes);
  bytes_ += bytes;
  copies_[host] = buf.data();
  return buf.data();
}

const Tensor* DeviceWeights::tensor(const Tensor* t) {
  if (!t || device_ == Device::CPU) return t;
  auto it = tensors_.find(t->data);
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
  tensors_[t->data] = out;
  return out;
}

const float* DeviceWeights::floats(const float* p, int64_t n) {
  if (!p || device_ == Device::CPU) return p;
  return static_cast<const float*>(upload(p, static_cast<size_t>(n) * sizeof(float)));
}

float* Activations::f32(size_t slot, int64_t n) {
  while (buffers_.size() <= slot) buffers_.emplace_back(device_);
  DeviceBuffer& b = buffers_[slot];
  b.reserve(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float));
  return b.as<float>();
}

StagedBatch BatchStager::stage(const ForwardBatch& b, int64_t page_size) {
  b.slots(page_size, slots_);
  StagedBatch s;
  s.n = b.n_tokens();
  s.n_seqs = b.n_seqs();
  s.n_logits = static_cast<int64_t>(b.logit_rows.size());
  if (device_ == Device::CPU) {
    s.tokens = b.tokens.data();
    s.positions = b.positions.data();
    s.seq_indptr = b.seq_indptr.data();
    s.page_indptr = b.page_indptr.data();
    s.page_ids = b.page_ids.data();
    s.kv_len = b.kv_len.data();
    s.logit_rows = b.logit_rows.data();
    s.slots = slots_.data();
    return s;
  }
  // One host image of every array (8-byte aligned pieces), one copy to the device.
  struct Piece {
    const void* src;
    size_t bytes;
    size_t at;
  };
  auto pieces = std::vector<Piece>{
      {slots_.data(), slots_.size() * 8, 0},           {b.tokens.data(), b.tokens.size() * 4, 0},
      {b.positions.data(), b.positions.size() * 4, 0}, {b.seq_indptr.data(), b.seq_indptr.size() * 4, 0},
      {b.page_indptr.data(), b.page_indptr.size() * 4, 0}, {b.page_ids.data(), b.page_ids.size() * 4, 0},
      {b.kv_len.data(), b.kv_len.size() * 4, 0},       {b.logit_rows.data(), b.logit_rows.size() * 4, 0}};
  size_t total = 0;
  for (Piece& p : pieces) {
    p.at = total;
    total += (p.bytes + 7) / 8 * 8;
  }
  host_.resize(std::max<size_t>(total, 8));
  for (const Piece& p : pieces)
    if (p.bytes) std::memcpy(host_.data() + p.at, p.src, p.bytes);
  staging_.reserve(host_.size());
  copy_bytes(device_, staging_.data(), Device::CPU, host_.data(), total);
  auto* base = staging_.as<uint8_t>();
  s.slots = reinterpret_cast<const int64_t*>(base + pieces[0].at);
  s.tokens = reinterpret_cast<const int32_t*>(base + pieces[1].at);
  s.positions = reinterpret_cast<const int32_t*>(base + pieces[2].at);
  s.seq_indptr = reinterpret_cast<const int32_t*>(base + pieces[3].at);
  s.page_indptr = reinterpret_cast<const int32_t*>(base + pieces[4].at);
  s.page_ids = reinterpret_cast<const int32_t*>(base + pieces[5].at);
  s.kv_len = reinterpret_cast<const int32_t*>(base + pieces[6].at);
  s.logit_rows = reinterpret_cast<const int32_t*>(base + pieces[7].at);
  return s;
}

}  // namespace fp
