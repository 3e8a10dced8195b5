// tokenizer/tokenizer.h — the tokenizer interface: SentencePiece-style BPE with byte fallback
// (Llama-2 / llama2.c vocabularies, GGUF model "llama") and byte-level BPE (GPT-2, Llama-3,
// Qwen2/3, DeepSeek pre-tokenizers; GGUF model "gpt2" and Hugging Face tokenizer.json),
// both with added/special tokens, plus a streaming decoder that never emits a broken
// multi-byte UTF-8 character.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fp {

class VocabTrie;

class GgufFile;

// GGUF token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t { Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

// Everything a tokenizer is built from, whatever the source file.
struct TokenizerSpec {
  std::string model = "llama";   // "llama" (SentencePiece BPE + byte fallback) or "gpt2" (byte-level BPE)
  std::string pre = "default";   // pre-tokenizer name as in GGUF tokenizer.ggml.pre: "default", "llama-bpe",
                                 // "qwen2", "deepseek-llm", "deepseek-coder", "deepseek-v3", "gpt-2", ...
  // Explicit pre-tokenizer: regexes applied in turn, each splitting every piece into matches and
  // the gaps between them (HF Split "Isolated"). When non-empty it replaces the preset named by `pre`.
  std::vector<std::string> pre_regexes;
  bool pre_add_prefix_space = false;  // HF ByteLevel add_prefix_space: a space before the text
  std::string normalizer;             // "" or "NFC" (applied to text outside added tokens)
  bool ignore_merges = false;         // BPE: a pre-token that is itself in the vocabulary is kept whole
  std::vector<std::string> tokens;  // id -> piece (GGUF/HF spelling: "▁" for space in SPM, byte-level chars in BPE)
  std::vector<float> scores;        // SPM merge priority (may be empty for BPE)
  std::vector<int32_t> types;       // TokenType per id (may be empty: all Normal). Control tokens are
                                    // matched in text only with parse_special; UserDefined always.
  std::vector<std::string> merges;  // BPE merges "left right", rank = index (SPM from tokenizer.json:
                                    // merges ranked instead of scores, HF's BPE with byte fallback)
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  std::vector<int32_t> eog_ids;     // extra end-of-generation ids (EOS is always one)
  bool add_bos = true;
  bool add_eos = false;
  // A token appended after every text encoded with its special tokens: the trailing special token
  // of a tokenizer.json's TemplateProcessing (Qwen3-Embedding's <|endoftext|>, the token its
  // last-token pooling reads), which need not be the EOS the chat template ends turns with.
  int32_t suffix_id = -1;
  bool add_space_prefix = true;  // SPM: prepend "▁" to the text
  // SPM from a tokenizer.json whose Metaspace says how (HF's prepend_scheme): only before the
  // text's first run, not after added tokens ("first"); and not before a run that already starts
  // with a space or "▁" (Metaspace checks after replacing spaces, the legacy Prepend normalizer does not).
  bool space_prefix_first_only = false;
  bool space_prefix_unless_space = false;
  std::string source;            // file it came from, for messages
};

class Tokenizer {
 public:
  // Validates the spec (ids in range, known model and pre-tokenizer) and builds the tokenizer.
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
  // (UserDefined / non-special added tokens are always matched, as in HF and llama.cpp.)
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
  // Raw bytes of one token (byte tokens like <0x0A> become the byte; "▁" becomes " ").
  // Control tokens (BOS, EOS, <|im_start|>...) give "" unless render_special. Throws on a bad id.
  std::string token_to_bytes(int32_t id, bool render_special = false) const;
  // Concatenated bytes; SPM strips the one leading space the encoder added when the first text
  // token comes first or right after BOS. The result may be invalid UTF-8 (exact bytes).
  std::string decode(const std::vector<int32_t>& ids, bool render_special = false) const;

  int32_t n_vocab() const { return static_cast<int32_t>(spec_.tokens.size()); }
  int32_t bos_id() const { return spec_.bos_id; }
  int32_t eos_id() const { return spec_.eos_id; }
  bool is_eog(int32_t id) const;  // end of generation (EOS, <|eot_id|>, <|im_end|>, ...)
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }
  const TokenizerSpec& spec() const { return spec_; }
  std::string describe() const;   // one line for inspect: model, pre, vocab, merges, bos/eos
  // The token spelled exactly `piece` (as stored: "▁the", "<|im_start|>"), or -1.
  int32_t find_token(std::string_view piece) const;
  TokenType token_type(int32_t id) const;
  // True when decoding drops the space the SPM encoder put before the text.
  bool strips_leading_space() const { return spec_.model == "llama" && spec_.add_space_prefix; }
  // The vocabulary as a byte trie (constrained decoding), built on first use; thread-safe.
  const VocabTrie& vocab_trie() const;

 protected:
  explicit Tokenizer(TokenizerSpec spec);
  // Tokenizes one run of plain text (no added tokens inside). `after_special` is true at the
  // start of the input and right after an added token (SPM adds its space prefix there).
  virtual void encode_text(std::string_view text, bool after_special, std::vector<int32_t>& out) const = 0;
  // Bytes of a Normal/Byte/Unknown token in this model's spelling.
  virtual std::string piece_bytes(int32_t id) const = 0;

  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using PieceMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  TokenizerSpec spec_;
  PieceMap piece_to_id_;
  std::vector<int32_t> eog_ids_;

 private:
  struct Added {
    std::string text;
    int32_t id;
    bool special;  // needs parse_special
  };
  std::vector<Added> added_;                 // sorted longest first
  std::vector<std::vector<uint32_t>> added_by_byte_;  // first byte -> indices into added_
  mutable std::once_flag trie_once_;
  mutable std::shared_ptr<const VocabTrie> trie_;
};

// Streams decoded text token by token, holding back bytes of an incomplete UTF-8
// character until the token that completes it arrives.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool render_special = false)
      : tok_(tok), render_special_(render_special) {}
  std::string push(int32_t id);  // text that is now complete (possibly empty); always valid UTF-8
  std::string flush();           // whatever is left (invalid bytes replaced with U+FFFD)
 private:
  const Tokenizer& tok_;
  bool render_special_;
  std::string pending_;
  int32_t prev_ = -1;  // previous token pushed; SPM drops the leading space right after BOS
};

}  // namespace fp
