// tokenizer/llama2c_vocab.cpp — reads llama2.c's tokenizer.bin: int32 max_token_length, then per
// token a float score, an int32 byte length and the bytes. Spaces are stored as ' ' there; we
// respell them "▁" so the vocabulary is the same as its GGUF form and shares the SPM code.
#include <cstring>

#include "core/error.h"
#include "core/mapped_file.h"
#include "tokenizer/models.h"

namespace fp {

std::unique_ptr<Tokenizer> Tokenizer::from_llama2c(const std::string& path, int32_t vocab_size) {
  FP_CHECK(vocab_size > 0, path, ": vocabulary size must be positive, got ", vocab_size);
  auto file = MappedFile::open(path);
  const uint8_t* p = file->data();
  const size_t size = file->size();
  size_t off = 0;
  auto read = [&](void* dst, size_t n, const char* what, int32_t id) {
    if (size - off < n)
      fail(path, ": truncated llama2.c tokenizer: ", what, id >= 0 ? " of token " + std::to_string(id) : std::string(),
           " needs ", n, " bytes at offset ", off, ", file has ", size);
    std::memcpy(dst, p + off, n);
    off += n;
  };
  int32_t max_len = 0;
  read(&max_len, 4, "max_token_length", -1);
  FP_CHECK(max_len > 0 && max_len < (1 << 20), path, ": max_token_length ", max_len, " is not plausible");

  // Every token takes at least 8 bytes (score, length): bound the count before allocating.
  FP_CHECK(static_cast<uint64_t>(vocab_size) * 8 <= size - off, path, ": truncated llama2.c tokenizer: ", vocab_size,
           " tokens need at least ", static_cast<uint64_t>(vocab_size) * 8, " bytes after the header, file has ", size - off);
  TokenizerSpec s;
  s.source = path;
  s.model = "llama";
  s.tokens.resize(vocab_size);
  s.scores.resize(vocab_size);
  s.types.assign(vocab_size, static_cast<int32_t>(TokenType::Normal));
  for (int32_t i = 0; i < vocab_size; ++i) {
    int32_t len = 0;
    read(&s.scores[i], 4, "score", i);
    read(&len, 4, "length", i);
    FP_CHECK(len >= 0 && len <= max_len, path, ": token ", i, " has length ", len, " (max_token_length ", max_len, ")");
    std::string raw(static_cast<size_t>(len), '\0');
    read(raw.data(), raw.size(), "bytes", i);
    std::string piece;
    for (char c : raw) {
      if (c == ' ') piece += "\xE2\x96\x81";
      else piece += c;
    }
    s.tokens[i] = std::move(piece);
  }
  // llama2.c's export writes BOS/EOS as "\n<s>\n" and "\n</s>\n"; the ids are fixed by the format.
  s.unk_id = 0;
  s.bos_id = vocab_size > 1 ? 1 : -1;
  s.eos_id = vocab_size > 2 ? 2 : -1;
  s.types[0] = static_cast<int32_t>(TokenType::Unknown);
  for (int32_t id : {s.bos_id, s.eos_id}) {
    if (id < 0) continue;
    s.types[id] = static_cast<int32_t>(TokenType::Control);
    std::string& t = s.tokens[id];
    if (t.size() > 2 && t.front() == '\n' && t.back() == '\n') t = t.substr(1, t.size() - 2);
  }
  for (int32_t i = 0; i < vocab_size; ++i) {
    const std::string& t = s.tokens[i];
    if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') s.types[i] = static_cast<int32_t>(TokenType::Byte);
  }
  return from_spec(std::move(s));
}

}  // namespace fp
