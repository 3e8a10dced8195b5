// tokenizer/tokenizer.h — the tokenizer interface: SentencePiece-style BPE with byte fallback
// (Llama-2 / llama2.c vocabularies, GGUF model "llama") and byte-level BPE (GPT-2, Llama-3,
// Qwen2/3, DeepSeek pre-tokenizers; GGUF model "gpt2" and Hugging Face tokenizer.json),
// both with added/special tokens, plus a streaming decoder that never emits a broken
// multi-byte UTF-8 character.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fp {

class GgufFile;

// GGUF token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t { Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

// Everything a tokenizer is built from, whatever the source file.
struct TokenizerSpec {
  std::string model = "llama";   // "llama" (SentencePiece BPE + byte fallback) or "gpt2" (byte-level BPE)
  std::string pre = "default";   // pre-tokenizer name as in GGUF tokenizer.ggml.pre: "default", "llama-bpe",
                                 // "qwen2", "deepseek-llm", "deepseek-coder", "deepseek-v3", "gpt-2", ...
  std::vector<std::string> tokens;  // id -> piece (GGUF/HF spelling: "▁" for space in SPM, byte-level chars in BPE)
  std::vector<float> scores;        // SPM merge priority (may be empty for BPE)
  std::vector<int32_t> types;       // TokenType per id (may be empty: all Normal)
  std::vector<std::string> merges;  // BPE merges "left right", rank = index
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  bool add_bos = true;
  bool add_eos = false;
  bool add_space_prefix = true;  // SPM: prepend "▁" to the text
};

class Tokenizer {
 public:
  static std::unique_ptr<Tokenizer> from_spec(TokenizerSpec spec);
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& gguf);
  // A Hugging Face tokenizer.json; a tokenizer_config.json beside it, when present,
  // supplies bos/eos tokens and add_bos_token.
  static std::unique_ptr<Tokenizer> from_hf_json(const std::string& path);
  // llama2.c tokenizer.bin (max_token_length, then per token: float score, int32 len, bytes).
  static std::unique_ptr<Tokenizer> from_llama2c(const std::string& path, int32_t vocab_size);
  // A directory holding tokenizer.json, a .gguf file, or a tokenizer.json path.
  static std::unique_ptr<Tokenizer> from_path(const std::string& path);

  virtual ~Tokenizer() = default;

  // add_special: prepend BOS (and append EOS) as the vocabulary asks.
  // parse_special: text like "<|im_start|>" becomes the special token rather than plain text.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const = 0;
  // Raw bytes of one token (byte tokens like <0x0A> become the byte; "▁" becomes " ").
  virtual std::string token_to_bytes(int32_t id) const = 0;
  // Concatenated bytes; SPM strips the one leading space the encoder added when the first token is BOS-adjacent.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;

  int32_t n_vocab() const { return static_cast<int32_t>(spec_.tokens.size()); }
  int32_t bos_id() const { return spec_.bos_id; }
  int32_t eos_id() const { return spec_.eos_id; }
  bool is_eog(int32_t id) const;  // end of generation (EOS, <|eot_id|>, <|im_end|>, ...)
  const TokenizerSpec& spec() const { return spec_; }
  std::string describe() const;   // one line for inspect: model, pre, vocab, merges, bos/eos

 protected:
  explicit Tokenizer(TokenizerSpec spec) : spec_(std::move(spec)) {}
  TokenizerSpec spec_;
  std::vector<int32_t> eog_ids_;
};

// Streams decoded text token by token, holding back bytes of an incomplete UTF-8
// character until the token that completes it arrives.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  std::string push(int32_t id);  // text that is now complete (possibly empty)
  std::string flush();           // whatever is left (invalid bytes replaced with U+FFFD)
 private:
  const Tokenizer& tok_;
  std::string pending_;
  bool first_ = true;
};

}  // namespace fp
