// tokenizer/bpe.cpp — byte-level BPE (GPT-2 family: GGUF "gpt2", HF tokenizer.json BPE with
// ByteLevel): text -> (optional NFC) -> pre-tokens -> one symbol per byte -> merges by rank.
#include <queue>

#include "core/error.h"
#include "core/log.h"
#include "tokenizer/models.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"

namespace fp {

namespace {

// GPT-2 maps the 188 printable bytes to themselves and the other 68 to U+0100 upward.
struct ByteMap {
  uint32_t to_cp[256];
  std::unordered_map<uint32_t, uint8_t> from_cp;
  ByteMap() {
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? b : 256 + extra++;
      from_cp[to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(TokenizerSpec spec)
      : Tokenizer(std::move(spec)),
        pre_(spec_.pre_regexes.empty() ? pre_regexes_for(spec_.pre, spec_.source) : spec_.pre_regexes) {
    for (int b = 0; b < 256; ++b) {
      std::string s;
      uni::append_utf8(s, byte_map().to_cp[b]);
      byte_ids_[b] = find_token(s);
    }
    // Merge table: (left id, right id) -> (rank, merged id). Merges naming pieces outside the
    // vocabulary cannot fire and are skipped.
    merges_.reserve(spec_.merges.size() * 2);
    size_t skipped = 0;
    std::string joined;
    for (size_t rank = 0; rank < spec_.merges.size(); ++rank) {
      const std::string& m = spec_.merges[rank];
      const size_t sp = m.find(' ', 1);  // the left piece is never empty
      FP_CHECK(sp != std::string::npos, spec_.source, ": merge ", rank, " '", m, "' is not 'left right'");
      const std::string_view left = std::string_view(m).substr(0, sp), right = std::string_view(m).substr(sp + 1);
      joined.assign(left);
      joined += right;
      const int32_t a = find_token(left), b = find_token(right), c = find_token(joined);
      if (a < 0 || b < 0 || c < 0) { ++skipped; continue; }
      merges_.emplace(key(a, b), Merge{static_cast<uint32_t>(rank), c});
    }
    if (skipped) log_debug(spec_.source, ": ", skipped, " merges name pieces outside the vocabulary");
  }

 protected:
  void encode_text(std::string_view text, bool, std::vector<int32_t>& out) const override {
    std::string normalized;
    if (spec_.normalizer == "NFC") {
      normalized = uni::nfc(text);
      text = normalized;
    }
    std::string prefixed;
    if (spec_.pre_add_prefix_space && !text.empty() && text[0] != ' ') {
      prefixed = " ";
      prefixed += text;
      text = prefixed;
    }
    std::vector<std::string_view> pieces;
    pre_.split(text, pieces);
    for (std::string_view p : pieces) encode_piece(p, out);
  }

  std::string piece_bytes(int32_t id) const override {
    const std::string& p = spec_.tokens[id];
    std::string r;
    r.reserve(p.size());
    for (size_t i = 0; i < p.size();) {
      size_t len;
      const uint32_t cp = uni::decode_one(p, i, &len);
      auto it = byte_map().from_cp.find(cp);
      if (it != byte_map().from_cp.end()) r += static_cast<char>(it->second);
      else r.append(p, i, len);  // not byte-level spelling: keep as is
      i += len;
    }
    return r;
  }

 private:
  struct Merge { uint32_t rank; int32_t id; };
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    if (spec_.ignore_merges) {
      std::string spelled;
      for (char c : piece) uni::append_utf8(spelled, byte_map().to_cp[static_cast<uint8_t>(c)]);
      const int32_t whole = find_token(spelled);
      if (whole >= 0) {
        out.push_back(whole);
        return;
      }
    }
    // One symbol per byte in a linked list; a min-heap of (rank, position) picks merges.
    struct Sym { int32_t id, prev, next; };
    std::vector<Sym> sym(piece.size());
    for (size_t i = 0; i < piece.size(); ++i)
      sym[i] = {byte_ids_[static_cast<uint8_t>(piece[i])], static_cast<int32_t>(i) - 1, static_cast<int32_t>(i) + 1};
    if (sym.empty()) return;
    sym.back().next = -1;

    struct Cand { uint32_t rank; int32_t left, left_id, right_id; };
    auto cmp = [](const Cand& a, const Cand& b) { return a.rank > b.rank || (a.rank == b.rank && a.left > b.left); };
    std::priority_queue<Cand, std::vector<Cand>, decltype(cmp)> heap(cmp);
    auto try_pair = [&](int32_t l) {
      if (l < 0 || sym[l].next < 0) return;
      const Sym& a = sym[l];
      const Sym& b = sym[a.next];
      if (a.id < 0 || b.id < 0) return;
      auto it = merges_.find(key(a.id, b.id));
      if (it != merges_.end()) heap.push({it->second.rank, l, a.id, b.id});
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) try_pair(i);

    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      Sym& l = sym[c.left];
      if (l.id != c.left_id || l.next < 0 || sym[l.next].id != c.right_id) continue;  // stale
      Sym& r = sym[l.next];
      l.id = merges_.at(key(c.left_id, c.right_id)).id;
      r.id = -2;  // dead
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = c.left;
      try_pair(l.prev);
      try_pair(c.left);
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
      if (sym[i].id >= 0) out.push_back(sym[i].id);
      else if (spec_.unk_id >= 0) out.push_back(spec_.unk_id);  // a byte missing from the vocabulary
    }
  }

  PreTokenizer pre_;
  int32_t byte_ids_[256];
  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace

uint32_t byte_to_unicode(uint8_t b) { return byte_map().to_cp[b]; }
int byte_from_unicode(uint32_t cp) {
  auto it = byte_map().from_cp.find(cp);
  return it == byte_map().from_cp.end() ? -1 : it->second;
}

std::unique_ptr<Tokenizer> make_bpe_tokenizer(TokenizerSpec spec) { return std::make_unique<BpeTokenizer>(std::move(spec)); }

}  // namespace fp
