// tools/bench_serve/dataset.cpp — random and shared-prefix prompts of exact token counts.
#include "tools/bench_serve/dataset.h"

#include <cmath>
#include <cstdlib>
#include <random>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace fp::bench_serve {

std::pair<int64_t, int64_t> length_bounds(int64_t len, double range_ratio, int64_t min_len) {
  auto lo = static_cast<int64_t>(std::floor(static_cast<double>(len) * (1.0 - range_ratio)));
  auto hi = static_cast<int64_t>(std::ceil(static_cast<double>(len) * (1.0 + range_ratio)));
  lo = std::max(lo, min_len);
  hi = std::max(hi, lo);
  return {lo, hi};
}

namespace {

bool valid_utf8_text(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 && c != '\n' && c != '\t') return false;  // no control bytes in prompts
    int extra = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : -1;
    if (extra < 0) return false;
    size_t len = static_cast<size_t>(extra) + 1;
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    i += len;
  }
  return true;
}

// Ids that make plain text on their own: normal tokens whose bytes are complete, valid UTF-8
// (a byte-level BPE token may hold half a character), never BOS/EOS/control/byte tokens.
std::vector<int32_t> text_token_pool(const Tokenizer& tok) {
  std::vector<int32_t> pool;
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    TokenType t = tok.token_type(id);
    if (t != TokenType::Normal && t != TokenType::Undefined) continue;
    if (id == tok.bos_id() || id == tok.eos_id() || id == tok.spec().unk_id || tok.is_eog(id)) continue;
    std::string bytes = tok.token_to_bytes(id);
    if (bytes.empty() || !valid_utf8_text(bytes)) continue;
    pool.push_back(id);
  }
  FP_CHECK(!pool.empty(), "tokenizer ", tok.spec().source, ": no plain-text tokens to build prompts from");
  return pool;
}

struct Fitted {
  std::string text;
  int64_t count = 0;  // tokens text adds after the context
};

// Text that adds exactly n tokens when encoded after `context` (which alone encodes to
// ctx_count tokens): random ids, rendered, re-encoded; ids dropped from the end while too
// long, random ids appended while too short. Returns the closest found when 32 rounds
// do not reach n.
Fitted fit_tokens(const Tokenizer& tok, const std::vector<int32_t>& pool, std::mt19937_64& rng, int64_t n,
                  const std::string& context, int64_t ctx_count) {
  std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
  std::vector<int32_t> ids;
  auto append = [&](int64_t k) {
    for (int64_t i = 0; i < k; ++i) ids.push_back(pool[pick(rng)]);
  };
  auto render = [&] {
    if (context.empty()) return tok.decode(ids);  // drops the space the SPM encoder puts back
    std::string s;
    for (int32_t id : ids) s += tok.token_to_bytes(id);
    return s;
  };
  append(n);
  Fitted best;
  int64_t best_err = -1;
  for (int round = 0; round < 32; ++round) {
    std::string text = render();
    auto got = static_cast<int64_t>(tok.encode(context + text, false, false).size()) - ctx_count;
    int64_t err = std::llabs(got - n);
    if (best_err < 0 || err < best_err) {
      best = {text, got};
      best_err = err;
    }
    if (err == 0) break;
    if (got > n) {
      ids.resize(ids.size() - static_cast<size_t>(std::min<int64_t>(got - n, static_cast<int64_t>(ids.size()))));
    } else {
      append(n - got);
    }
  }
  return best;
}

const char* const kWords[] = {
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "with", "as", "by", "at", "from", "his",
    "her", "they", "we", "one", "all", "there", "when", "up", "out", "about", "time", "day", "water",
    "people", "long", "little", "very", "after", "word", "called", "just", "where", "most", "know",
    "good", "through", "back", "much", "before", "go", "man", "over", "think", "say", "great", "help",
    "low", "line", "turn", "cause", "same", "mean", "move", "right", "boy", "old", "too", "does", "tell",
    "sentence", "set", "three", "want", "air", "well", "also", "play", "small", "end", "put", "home",
    "read", "hand", "port", "large", "spell", "add", "even", "land", "here", "must", "big", "high",
    "such", "follow", "act", "why", "ask", "men", "change", "went", "light", "kind", "off", "need",
    "house", "picture", "try", "us", "again", "animal", "point", "mother", "world", "near", "build"};

std::string random_words(std::mt19937_64& rng, int64_t n) {
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  std::string s;
  for (int64_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += kWords[pick(rng)];
  }
  return s;
}

}  // namespace

Dataset make_dataset(const DatasetOptions& o, const Tokenizer* tok) {
  FP_CHECK(o.name == "random" || o.name == "shared-prefix", "--dataset-name '", o.name,
           "': expected random or shared-prefix");
  FP_CHECK(o.range_ratio >= 0 && o.range_ratio < 1, "--random-range-ratio ", o.range_ratio,
           ": expected 0 <= r < 1");
  FP_CHECK(o.num_prompts >= 0, "--num-prompts ", o.num_prompts, ": expected >= 0");
  FP_CHECK(o.input_len >= 1 && o.output_len >= 1, "input and output lengths must be >= 1 (got ", o.input_len,
           " and ", o.output_len, ")");
  FP_CHECK(o.prefix_len >= 0, "--prefix-len ", o.prefix_len, ": expected >= 0");
  const bool shared = o.name == "shared-prefix";
  std::mt19937_64 rng(o.seed);
  auto [in_lo, in_hi] = length_bounds(o.input_len, o.range_ratio);
  auto [out_lo, out_hi] = length_bounds(o.output_len, o.range_ratio);
  std::uniform_int_distribution<int64_t> in_len(in_lo, in_hi), out_len(out_lo, out_hi);

  Dataset d;
  d.exact_tokens = tok != nullptr;
  std::vector<int32_t> pool;
  if (tok) pool = text_token_pool(*tok);
  std::string prefix;
  int64_t prefix_count = 0;
  if (shared && o.prefix_len > 0) {
    if (tok) {
      Fitted f = fit_tokens(*tok, pool, rng, o.prefix_len, "", 0);
      prefix = f.text;
      prefix_count = static_cast<int64_t>(tok->encode(prefix, false, false).size());
      if (prefix_count != o.prefix_len) ++d.inexact;
    } else {
      prefix = random_words(rng, o.prefix_len) + " ";
      prefix_count = o.prefix_len;
    }
  }
  for (int i = 0; i < o.num_prompts; ++i) {
    Prompt p;
    int64_t n = in_len(rng);
    p.output_len = out_len(rng);
    if (tok) {
      Fitted f = fit_tokens(*tok, pool, rng, n, prefix, prefix_count);
      if (f.count != n) ++d.inexact;
      p.text = prefix + f.text;
      p.input_len = prefix_count + f.count;
    } else {
      p.text = prefix + random_words(rng, n);
      p.input_len = prefix_count + n;
    }
    d.prompts.push_back(std::move(p));
  }
  std::string lens = "input " + std::to_string(in_lo) + ".." + std::to_string(in_hi) + ", output " +
                     std::to_string(out_lo) + ".." + std::to_string(out_hi);
  if (shared) lens = "prefix " + std::to_string(prefix_count) + " shared + " + lens;
  if (tok) {
    d.note = o.name + " prompts from random token ids of " + tok->spec().source + " (" + lens +
             " tokens, counts verified by re-encoding; BOS not counted)";
    if (d.inexact) d.note += "; " + std::to_string(d.inexact) + " not exact (closest kept, its true count used)";
  } else {
    d.note = o.name + " prompts of random English words, no tokenizer given (" + lens +
             " words; token counts are approximate: pass -m MODEL or --tokenizer PATH for exact ones)";
  }
  return d;
}

}  // namespace fp::bench_serve
