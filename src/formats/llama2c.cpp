// formats/llama2c.cpp — header validation and the weight layout of both llama2.c versions.
#include "formats/llama2c.h"

#include <cstring>

#include "core/error.h"

namespace fp {

std::unique_ptr<Llama2cFile> Llama2cFile::open(const std::string& path) {
  auto mf = MappedFile::open(path);
  std::unique_ptr<Llama2cFile> f(new Llama2cFile());
  f->parse_all(mf->data(), mf->size(), path);
  f->file_ = std::move(mf);
  return f;
}

std::unique_ptr<Llama2cFile> Llama2cFile::parse(const uint8_t* data, size_t size, const std::string& name) {
  std::unique_ptr<Llama2cFile> f(new Llama2cFile());
  f->parse_all(data, size, name);
  return f;
}

void Llama2cFile::parse_all(const uint8_t* data, size_t size, const std::string& name) {
  FP_CHECK(size >= 28, name, ": truncated llama2.c checkpoint: ", size, " bytes, the header needs 28");
  int32_t h[9];
  size_t header_bytes;
  uint32_t magic;
  std::memcpy(&magic, data, 4);
  if (magic == 0x616b3432u) {  // "ak42"
    FP_CHECK(size >= 256, name, ": truncated llama2.c v1 checkpoint: ", size, " bytes, the header needs 256");
    std::memcpy(h, data + 4, 4 * 8);
    FP_CHECK(h[0] == 1, name, ": llama2.c checkpoint version ", h[0], " is not supported (expected 1; version 2 is Q8_0)");
    cfg_.version = 1;
    cfg_.dim = h[1], cfg_.hidden_dim = h[2], cfg_.n_layers = h[3], cfg_.n_heads = h[4], cfg_.n_kv_heads = h[5];
    cfg_.vocab_size = h[6], cfg_.seq_len = h[7];
    cfg_.shared_classifier = data[36] != 0;
    FP_CHECK(data[36] <= 1, name, ": shared_classifier byte is ", int(data[36]), " (expected 0 or 1)");
    header_bytes = 256;
  } else {
    std::memcpy(h, data, 28);
    cfg_.dim = h[0], cfg_.hidden_dim = h[1], cfg_.n_layers = h[2], cfg_.n_heads = h[3], cfg_.n_kv_heads = h[4];
    cfg_.vocab_size = h[5], cfg_.seq_len = h[6];
    cfg_.shared_classifier = cfg_.vocab_size > 0;
    if (cfg_.vocab_size < -(1 << 24))  // checked before negating: -INT32_MIN overflows
      fail(name, ": llama2.c header field vocab_size = ", cfg_.vocab_size, " (expected 1..2^24, negative when untied)");
    if (cfg_.vocab_size < 0) cfg_.vocab_size = -cfg_.vocab_size;
    header_bytes = 28;
  }
  auto bad = [&](const char* field, int64_t v, const char* expect) {
    fail(name, ": llama2.c header field ", field, " = ", v, " (", expect, ")");
  };
  const int32_t kMax = 1 << 20;
  if (cfg_.dim <= 0 || cfg_.dim > kMax) bad("dim", cfg_.dim, "expected 1..2^20");
  if (cfg_.hidden_dim <= 0 || cfg_.hidden_dim > kMax) bad("hidden_dim", cfg_.hidden_dim, "expected 1..2^20");
  if (cfg_.n_layers <= 0 || cfg_.n_layers > 4096) bad("n_layers", cfg_.n_layers, "expected 1..4096");
  if (cfg_.n_heads <= 0 || cfg_.dim % cfg_.n_heads != 0) bad("n_heads", cfg_.n_heads, "must divide dim");
  if (cfg_.n_kv_heads <= 0 || cfg_.n_heads % cfg_.n_kv_heads != 0) bad("n_kv_heads", cfg_.n_kv_heads, "must divide n_heads");
  if (cfg_.vocab_size <= 0 || cfg_.vocab_size > (1 << 24)) bad("vocab_size", cfg_.vocab_size, "expected 1..2^24");
  if (cfg_.seq_len <= 0 || cfg_.seq_len > (1 << 24)) bad("seq_len", cfg_.seq_len, "expected 1..2^24");
  int64_t dim = cfg_.dim, hid = cfg_.hidden_dim, L = cfg_.n_layers, V = cfg_.vocab_size;
  int64_t hs = dim / cfg_.n_heads, kv_dim = hs * cfg_.n_kv_heads;

  // The layout, as (name pattern, per-layer?, shape). Per-layer tensors are stored consecutively.
  struct Item {
    std::string name;  // "%d" replaced by the layer
    bool per_layer;
    std::vector<int64_t> shape;
  };
  std::vector<Item> items;
  if (cfg_.version == 0) {
    items = {{"token_embd.weight", false, {V, dim}},      {"blk.%d.attn_norm.weight", true, {dim}},
             {"blk.%d.attn_q.weight", true, {dim, dim}},   {"blk.%d.attn_k.weight", true, {kv_dim, dim}},
             {"blk.%d.attn_v.weight", true, {kv_dim, dim}}, {"blk.%d.attn_output.weight", true, {dim, dim}},
             {"blk.%d.ffn_norm.weight", true, {dim}},      {"blk.%d.ffn_gate.weight", true, {hid, dim}},
             {"blk.%d.ffn_down.weight", true, {dim, hid}}, {"blk.%d.ffn_up.weight", true, {hid, dim}},
             {"output_norm.weight", false, {dim}},         {"rope.freq_cis_real", false, {cfg_.seq_len, hs / 2}},
             {"rope.freq_cis_imag", false, {cfg_.seq_len, hs / 2}}};
  } else {
    items = {{"blk.%d.attn_norm.weight", true, {dim}},      {"blk.%d.ffn_norm.weight", true, {dim}},
             {"output_norm.weight", false, {dim}},         {"token_embd.weight", false, {V, dim}},
             {"blk.%d.attn_q.weight", true, {dim, dim}},   {"blk.%d.attn_k.weight", true, {kv_dim, dim}},
             {"blk.%d.attn_v.weight", true, {kv_dim, dim}}, {"blk.%d.attn_output.weight", true, {dim, dim}},
             {"blk.%d.ffn_gate.weight", true, {hid, dim}}, {"blk.%d.ffn_down.weight", true, {dim, hid}},
             {"blk.%d.ffn_up.weight", true, {hid, dim}}};
  }
  if (!cfg_.shared_classifier) items.push_back({"output.weight", false, {V, dim}});

  uint64_t off = header_bytes;
  for (auto& it : items) {
    int64_t numel = 1;
    for (auto d : it.shape) numel *= d;
    for (int64_t l = 0; l < (it.per_layer ? L : 1); ++l) {
      std::string n = it.name;
      if (it.per_layer) n.replace(n.find("%d"), 2, std::to_string(l));
      uint64_t bytes = static_cast<uint64_t>(numel) * 4;
      FP_CHECK(off + bytes <= size, name, ": truncated llama2.c checkpoint: tensor '", n, "' needs bytes [", off, ", ",
               off + bytes, ") but the file has ", size, " (header says dim ", dim, ", layers ", L, ", vocab ", V, ")");
      tensors_[n] = {reinterpret_cast<const float*>(data + off), it.shape};
      off += bytes;
    }
  }
  FP_CHECK(off == size, name, ": llama2.c checkpoint has ", size - off, " unexpected trailing bytes after the last tensor (",
           "expected ", off, " bytes in all): the header does not describe this file");
}

}  // namespace fp
