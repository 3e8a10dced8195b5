// fuzz/fuzz_gguf.cpp — libFuzzer target for the GGUF parser: parse, walk the metadata and tensor
// infos, dequantize the first row of each tensor within its bounds, and build the tokenizer when the
// file carries one. fp::Error is the expected outcome of bad input; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto g = fp::GgufFile::parse(data, size, "fuzz.gguf");
    for (auto& [key, v] : g->metadata()) {
      (void)v.to_string();
      if (v.is_integer()) (void)g->get_uint(key, 0);
      if (v.is_number()) (void)g->get_float(key, 0.0);
    }
    (void)g->get_string("general.architecture", "");
    std::vector<float> row;
    for (auto& t : g->tensors()) {
      (void)t.n_elements();
      if (g->find_tensor(t.name) != &t) __builtin_trap();
      if (t.data < data || t.data + t.nbytes > data + size) __builtin_trap();  // the parser promised bounds
      const int64_t n = t.ne[0];
      if (n <= 0 || n > (1 << 16)) continue;
      if (static_cast<uint64_t>(fp::row_bytes(t.type, n)) > t.nbytes) continue;  // a 0 dim elsewhere: no rows
      row.resize(static_cast<size_t>(n));
      fp::dequantize_row(t.type, t.data, row.data(), n);
    }
    if (g->has("tokenizer.ggml.model")) {
      auto tok = fp::Tokenizer::from_gguf(*g);
      auto ids = tok->encode("Hello world, 12 ünïcode!", true, true);
      (void)tok->decode(ids);
    }
  } catch (const fp::Error&) {
  }
  return 0;
}
