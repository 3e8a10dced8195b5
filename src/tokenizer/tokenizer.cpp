// tokenizer/tokenizer.cpp — what every tokenizer shares: spec validation, added-token
// matching, BOS/EOS, decoding, end-of-generation ids, and from_path dispatch.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/paths.h"
#include "formats/gguf.h"
#include "tokenizer/models.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab_trie.h"

namespace fp {

namespace {
// Control tokens that end a turn in the chat formats we know, besides EOS itself.
const char* const kEogPieces[] = {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>",
                                  "<end_of_turn>", "<|end_of_text|>", "<｜end▁of▁sentence｜>", "</s>"};
}  // namespace

Tokenizer::Tokenizer(TokenizerSpec spec) : spec_(std::move(spec)) {
  const size_t n = spec_.tokens.size();
  piece_to_id_.reserve(n);
  // Later duplicates do not replace earlier ids: the first spelling wins, as in llama.cpp.
  for (size_t i = 0; i < n; ++i)
    if (!spec_.tokens[i].empty()) piece_to_id_.emplace(spec_.tokens[i], static_cast<int32_t>(i));

  added_by_byte_.resize(256);
  for (size_t i = 0; i < spec_.types.size() && i < n; ++i) {
    const auto t = static_cast<TokenType>(spec_.types[i]);
    if (spec_.tokens[i].empty()) continue;
    if (t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown)
      added_.push_back({spec_.tokens[i], static_cast<int32_t>(i), t != TokenType::UserDefined});
  }
  std::stable_sort(added_.begin(), added_.end(), [](const Added& a, const Added& b) { return a.text.size() > b.text.size(); });
  for (size_t i = 0; i < added_.size(); ++i)
    added_by_byte_[static_cast<uint8_t>(added_[i].text[0])].push_back(static_cast<uint32_t>(i));

  auto add_eog = [&](int32_t id) {
    if (id >= 0 && std::find(eog_ids_.begin(), eog_ids_.end(), id) == eog_ids_.end()) eog_ids_.push_back(id);
  };
  add_eog(spec_.eos_id);
  for (int32_t id : spec_.eog_ids) add_eog(id);
  // Harmony (gpt-oss): <|end|> closes one message of a reply (its thinking) and the reply goes
  // on; <|return|> ends it, <|call|> ends it at a tool call.
  const int32_t ret = find_token("<|return|>");
  const bool harmony = ret >= 0 && token_type(ret) == TokenType::Control && find_token("<|channel|>") >= 0;
  if (harmony) {
    eog_ids_.erase(std::remove(eog_ids_.begin(), eog_ids_.end(), find_token("<|end|>")), eog_ids_.end());
    add_eog(ret);
    const int32_t call = find_token("<|call|>");
    if (call >= 0 && token_type(call) == TokenType::Control) add_eog(call);
  }
  for (const char* p : kEogPieces) {
    int32_t id = find_token(p);
    if (id >= 0 && token_type(id) == TokenType::Control && !(harmony && std::string_view(p) == "<|end|>")) add_eog(id);
  }
}

std::unique_ptr<Tokenizer> Tokenizer::from_spec(TokenizerSpec spec) {
  const std::string src = spec.source.empty() ? std::string("tokenizer spec") : spec.source;
  const auto n = static_cast<int64_t>(spec.tokens.size());
  FP_CHECK(n > 0, src, ": empty vocabulary");
  FP_CHECK(spec.scores.empty() || static_cast<int64_t>(spec.scores.size()) == n, src, ": ", spec.scores.size(),
           " scores for ", n, " tokens");
  FP_CHECK(spec.types.empty() || static_cast<int64_t>(spec.types.size()) == n, src, ": ", spec.types.size(),
           " token types for ", n, " tokens");
  auto check_id = [&](int32_t& id, const char* what) {
    FP_CHECK(id >= -1 && id < n, src, ": ", what, " id ", id, " out of range [0, ", n, ")");
  };
  check_id(spec.bos_id, "bos");
  check_id(spec.eos_id, "eos");
  check_id(spec.unk_id, "unk");
  check_id(spec.pad_id, "pad");
  check_id(spec.suffix_id, "appended");
  for (int32_t& id : spec.eog_ids) check_id(id, "end-of-generation");
  if (spec.model == "llama") return make_spm_tokenizer(std::move(spec));
  if (spec.model == "gpt2") return make_bpe_tokenizer(std::move(spec));
  fail(src, ": unsupported tokenizer model '", spec.model, "' (supported: llama, gpt2)");
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& gguf) { return from_spec(spec_from_gguf(gguf)); }

std::unique_ptr<Tokenizer> Tokenizer::from_path(const std::string& path) {
  namespace fs = std::filesystem;
  FP_CHECK(file_exists(path), path, ": no such file or directory");
  if (is_directory(path)) {
    const fs::path dir(path);
    if (fs::exists(dir / "tokenizer.json")) return from_hf_json((dir / "tokenizer.json").string());
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".gguf") return from_gguf(*GgufFile::open(e.path().string()));
    if (fs::exists(dir / "tokenizer.bin")) fail(path, ": tokenizer.bin needs the vocabulary size (use from_llama2c)");
    fail(path, ": directory holds no tokenizer.json or .gguf file");
  }
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".gguf") return from_gguf(*GgufFile::open(path));
  if (ext == ".json") return from_hf_json(path);
  fail(path, ": cannot tell the tokenizer format (expected a .gguf, a tokenizer.json or a directory)");
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  if (add_special && spec_.add_bos && spec_.bos_id >= 0) out.push_back(spec_.bos_id);
  // Added tokens are found first (leftmost, then longest); the text between them goes to the model.
  // Every run may take SPM's space prefix, or (Metaspace "first") only the run at the text's start.
  auto prefix_allowed = [&](size_t start) { return start == 0 || !spec_.space_prefix_first_only; };
  size_t plain = 0;  // start of text not yet tokenized
  for (size_t i = 0; i < text.size();) {
    const Added* hit = nullptr;
    for (uint32_t k : added_by_byte_[static_cast<uint8_t>(text[i])]) {
      const Added& a = added_[k];
      if (a.special && !parse_special) continue;
      if (text.compare(i, a.text.size(), a.text) == 0) { hit = &a; break; }  // longest first
    }
    if (!hit) { ++i; continue; }
    if (plain < i) encode_text(text.substr(plain, i - plain), prefix_allowed(plain), out);
    out.push_back(hit->id);
    i += hit->text.size();
    plain = i;
  }
  if (plain < text.size()) encode_text(text.substr(plain), prefix_allowed(plain), out);
  if (add_special && spec_.add_eos && spec_.eos_id >= 0) out.push_back(spec_.eos_id);
  if (add_special && spec_.suffix_id >= 0 && !(spec_.add_eos && spec_.suffix_id == spec_.eos_id)) out.push_back(spec_.suffix_id);
  return out;
}

TokenType Tokenizer::token_type(int32_t id) const {
  FP_CHECK(id >= 0 && id < n_vocab(), spec_.source, ": token id ", id, " out of range [0, ", n_vocab(), ")");
  return spec_.types.empty() ? TokenType::Normal : static_cast<TokenType>(spec_.types[id]);
}

std::string Tokenizer::token_to_bytes(int32_t id, bool render_special) const {
  switch (token_type(id)) {
    case TokenType::Control:
    case TokenType::Unknown: return render_special ? spec_.tokens[id] : std::string();
    case TokenType::UserDefined: return spec_.tokens[id];
    case TokenType::Unused: return std::string();
    default: return piece_bytes(id);
  }
}

const VocabTrie& Tokenizer::vocab_trie() const {
  std::call_once(trie_once_, [this] { trie_ = std::make_shared<const VocabTrie>(*this); });
  return *trie_;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool render_special) const {
  std::string out;
  bool at_start = true;  // nothing but control tokens so far
  for (int32_t id : ids) {
    std::string piece = token_to_bytes(id, render_special);
    if (token_type(id) == TokenType::Control) {  // BOS before the text keeps the space strip pending
      out += piece;
      continue;
    }
    if (at_start && strips_leading_space() && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    at_start = false;
    out += piece;
  }
  return out;
}

bool Tokenizer::is_eog(int32_t id) const { return std::find(eog_ids_.begin(), eog_ids_.end(), id) != eog_ids_.end(); }

int32_t Tokenizer::find_token(std::string_view piece) const {
  auto it = piece_to_id_.find(piece);
  return it == piece_to_id_.end() ? -1 : it->second;
}

std::string Tokenizer::describe() const {
  std::ostringstream os;
  auto name = [&](int32_t id) { return id >= 0 ? " '" + spec_.tokens[id] + "'" : std::string(); };
  os << "tokenizer " << spec_.model << " pre=" << (spec_.pre_regexes.empty() ? spec_.pre : "custom(" + std::to_string(spec_.pre_regexes.size()) + " splits)")
     << " vocab=" << n_vocab() << " merges=" << spec_.merges.size() << " added=" << added_.size()
     << " bos=" << spec_.bos_id << name(spec_.bos_id) << (spec_.add_bos ? " (added)" : "")
     << " eos=" << spec_.eos_id << name(spec_.eos_id) << (spec_.add_eos ? " (added)" : "") << " eog=" << eog_ids_.size();
  if (spec_.suffix_id >= 0) os << " appends=" << spec_.suffix_id << name(spec_.suffix_id);
  if (!spec_.normalizer.empty()) os << " normalizer=" << spec_.normalizer;
  return os.str();
}

}  // namespace fp
