// tokenizer/vocab_trie.cpp — building the byte trie from the sorted token spellings.
#include "tokenizer/vocab_trie.h"

#include <algorithm>
#include <functional>
#include <string>
#include <utility>

#include "tokenizer/tokenizer.h"

namespace fp {

VocabTrie::VocabTrie(const Tokenizer& tok) {
  std::vector<std::pair<std::string, int32_t>> items;
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    std::string b = tok.token_to_bytes(id);
    if (!b.empty()) items.emplace_back(std::move(b), id);
  }
  std::sort(items.begin(), items.end());
  for (const auto& it : items) depth_ = std::max(depth_, it.first.size());
  nodes_.emplace_back();
  // Items [lo, hi) share their first `depth` bytes and lead to node `at`; those that end there
  // sort first. Children are allocated together so that a node's children are contiguous.
  std::function<void(uint32_t, size_t, size_t, size_t)> build = [&](uint32_t at, size_t lo, size_t hi, size_t depth) {
    size_t i = lo;
    nodes_[at].first_token = static_cast<uint32_t>(ids_.size());
    for (; i < hi && items[i].first.size() == depth; ++i) ids_.push_back(items[i].second);
    nodes_[at].n_tokens = static_cast<uint32_t>(ids_.size()) - nodes_[at].first_token;
    std::vector<std::pair<size_t, size_t>> groups;
    for (size_t j = i; j < hi;) {
      size_t k = j;
      while (k < hi && items[k].first[depth] == items[j].first[depth]) ++k;
      groups.emplace_back(j, k);
      j = k;
    }
    const uint32_t first = static_cast<uint32_t>(nodes_.size());
    nodes_[at].first_child = first;
    nodes_[at].n_children = static_cast<uint32_t>(groups.size());
    for (const auto& g : groups) {
      Node n;
      n.byte = static_cast<uint8_t>(items[g.first].first[depth]);
      nodes_.push_back(n);
    }
    for (size_t c = 0; c < groups.size(); ++c) build(first + static_cast<uint32_t>(c), groups[c].first, groups[c].second, depth + 1);
  };
  build(kRoot, 0, items.size(), 0);
}

}  // namespace fp
