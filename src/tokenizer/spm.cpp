// tokenizer/spm.cpp — SentencePiece-style BPE with byte fallback (GGUF "llama", llama2.c, and
// the tokenizer.json files of Gemma, Llama 2 and Mistral): spaces become "▁", then adjacent
// pieces merge by highest vocabulary score (or, from a tokenizer.json, by lowest merge rank: a
// pair merges only when the file lists it), leftmost first, and what is left outside the
// vocabulary falls back to <0xNN> byte tokens.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <cstdio>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/models.h"
#include "tokenizer/unicode.h"

namespace fp {

namespace {

const std::string kSpace = "\xE2\x96\x81";  // U+2581 "▁"

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(TokenizerSpec spec) : Tokenizer(std::move(spec)) {
    byte_ids_.fill(-1);
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      byte_ids_[b] = find_token(name);
    }
    // A NaN score would break the heap's ordering.
    for (float& f : spec_.scores)
      if (std::isnan(f)) f = -std::numeric_limits<float>::infinity();
    // Only normal and user-defined pieces are reachable by merging text.
    mergeable_.assign(spec_.tokens.size(), 1);
    for (size_t i = 0; i < spec_.types.size(); ++i) {
      const auto t = static_cast<TokenType>(spec_.types[i]);
      mergeable_[i] = t == TokenType::Normal || t == TokenType::UserDefined || t == TokenType::Undefined;
    }
    // Ranked merges (tokenizer.json): (left id, right id) -> rank; pieces outside the vocabulary
    // cannot merge.
    std::string joined;
    for (size_t rank = 0; rank < spec_.merges.size(); ++rank) {
      const std::string& m = spec_.merges[rank];
      const size_t sp = m.find(' ', 1);
      FP_CHECK(sp != std::string::npos, spec_.source, ": merge ", rank, " '", m, "' is not 'left right'");
      const int32_t a = find_token(std::string_view(m).substr(0, sp)), b = find_token(std::string_view(m).substr(sp + 1));
      joined.assign(m, 0, sp);
      joined.append(m, sp + 1);
      const int32_t c = lookup(joined);
      if (a < 0 || b < 0 || c < 0) continue;
      merge_rank_.emplace((uint64_t(uint32_t(a)) << 32) | uint32_t(b), Merge{static_cast<uint32_t>(rank), c});  // the first listing wins
    }
  }

 protected:
  void encode_text(std::string_view text, bool after_special, std::vector<int32_t>& out) const override {
    std::string s;
    s.reserve(text.size() + 8);
    // Metaspace (unless_space) prepends nothing to a run that already starts with "▁" or a space.
    const bool marked = !text.empty() && (text[0] == ' ' || text.substr(0, kSpace.size()) == kSpace);
    if (spec_.add_space_prefix && after_special && !(spec_.space_prefix_unless_space && marked)) s += kSpace;
    for (char c : text) {
      if (c == ' ') s += kSpace;
      else s += c;
    }
    if (spec_.ignore_merges && !s.empty()) {  // a run that is itself a piece stays whole
      const int32_t whole = lookup(s);
      if (whole >= 0) {
        out.push_back(whole);
        return;
      }
    }
    tokenize(s, out);
  }

  std::string piece_bytes(int32_t id) const override {
    const std::string& p = spec_.tokens[id];
    if (token_type(id) == TokenType::Byte) {
      // "<0xNN>"
      const int hi = hex_digit(p.size() == 6 ? p[3] : 'x'), lo = hex_digit(p.size() == 6 ? p[4] : 'x');
      if (p.compare(0, 3, "<0x") == 0 && hi >= 0 && lo >= 0) return std::string(1, static_cast<char>(hi * 16 + lo));
      return p;
    }
    std::string r;
    r.reserve(p.size());
    for (size_t i = 0; i < p.size();) {
      if (p.compare(i, 3, kSpace) == 0) { r += ' '; i += 3; }
      else r += p[i++];
    }
    return r;
  }

 private:
  int32_t lookup(std::string_view piece) const {
    auto it = piece_to_id_.find(piece);
    if (it == piece_to_id_.end() || !mergeable_[it->second]) return -1;
    return it->second;
  }

  // Symbols are byte ranges of `s` in a doubly linked list, each with its piece's id (-1: not a
  // mergeable piece); a max-heap of candidate pairs (score, then leftmost) drives merges. Stale
  // heap entries are detected by length.
  void tokenize(const std::string& s, std::vector<int32_t>& out) const {
    struct Sym { uint32_t start, len; int32_t prev, next, id; };
    std::vector<Sym> sym;
    for (size_t i = 0; i < s.size();) {
      size_t len = std::min(uni::utf8_len(static_cast<uint8_t>(s[i])), s.size() - i);
      sym.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(len), static_cast<int32_t>(sym.size()) - 1,
                     static_cast<int32_t>(sym.size()) + 1, lookup(std::string_view(s).substr(i, len))});
      i += len;
    }
    if (sym.empty()) return;
    sym.back().next = -1;

    struct Pair { float score; int32_t left, right; uint32_t len; int32_t id; };
    auto cmp = [](const Pair& a, const Pair& b) { return a.score < b.score || (a.score == b.score && a.left > b.left); };
    std::priority_queue<Pair, std::vector<Pair>, decltype(cmp)> heap(cmp);
    auto try_pair = [&](int32_t l, int32_t r) {
      if (l < 0 || r < 0) return;
      const uint32_t len = sym[l].len + sym[r].len;
      if (!merge_rank_.empty()) {  // ranked merges: only the listed pairs, the lowest rank first
        if (sym[l].id < 0 || sym[r].id < 0) return;
        auto it = merge_rank_.find((uint64_t(uint32_t(sym[l].id)) << 32) | uint32_t(sym[r].id));
        if (it != merge_rank_.end()) heap.push({-static_cast<float>(it->second.rank), l, r, len, it->second.id});
        return;
      }
      const int32_t id = lookup(std::string_view(s).substr(sym[l].start, len));
      if (id >= 0) heap.push({spec_.scores.empty() ? 0.0f : spec_.scores[id], l, r, len, id});
    };
    for (size_t i = 1; i < sym.size(); ++i) try_pair(static_cast<int32_t>(i) - 1, static_cast<int32_t>(i));

    while (!heap.empty()) {
      const Pair p = heap.top();
      heap.pop();
      Sym& l = sym[p.left];
      if (l.len == 0 || l.next != p.right || l.len + sym[p.right].len != p.len) continue;  // stale
      Sym& r = sym[p.right];
      l.len += r.len;
      l.id = p.id;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = p.left;
      try_pair(l.prev, p.left);
      try_pair(p.left, l.next);
    }

    for (int32_t i = 0; i >= 0; i = sym[i].next) {
      const std::string_view piece = std::string_view(s).substr(sym[i].start, sym[i].len);
      const int32_t id = sym[i].id;
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      // Byte fallback; a vocabulary without the byte tokens gives one <unk> for the character.
      bool all_bytes = true;
      for (char c : piece) all_bytes = all_bytes && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all_bytes) {
        for (char c : piece) out.push_back(byte_ids_[static_cast<uint8_t>(c)]);
      } else if (spec_.unk_id >= 0) {
        out.push_back(spec_.unk_id);
      }
    }
  }

  std::array<int32_t, 256> byte_ids_{};
  std::vector<uint8_t> mergeable_;
  struct Merge { uint32_t rank; int32_t id; };  // a ranked merge's rank and the piece it makes
  std::unordered_map<uint64_t, Merge> merge_rank_;  // tokenizer.json's ranked merges
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(TokenizerSpec spec) { return std::make_unique<SpmTokenizer>(std::move(spec)); }

}  // namespace fp
