// tokenizer/vocab_trie.h — the vocabulary as a trie of the tokens' bytes (token_to_bytes), so
// that every token that can follow a place in a grammar is found in one walk that shares the
// work of common prefixes (constrained decoding, engine/token_constraint.h). Tokens without bytes
// (control, unused) are not in it.
#pragma once
#include <cstdint>
#include <vector>

namespace fp {

class Tokenizer;

class VocabTrie {
 public:
  explicit VocabTrie(const Tokenizer& tok);

  struct Node {
    uint32_t first_child = 0, n_children = 0;  // children are nodes [first_child, first_child + n_children), by byte
    uint32_t first_token = 0, n_tokens = 0;    // tokens spelled by the path to here: token_ids()[first_token ...]
    uint8_t byte = 0;                          // the byte that leads here from the parent
  };
  static constexpr uint32_t kRoot = 0;
  const Node& node(uint32_t i) const { return nodes_[i]; }
  const std::vector<int32_t>& token_ids() const { return ids_; }
  size_t n_nodes() const { return nodes_.size(); }
  size_t depth() const { return depth_; }  // the longest token's bytes

 private:
  std::vector<Node> nodes_;
  std::vector<int32_t> ids_;
  size_t depth_ = 0;
};

}  // namespace fp
