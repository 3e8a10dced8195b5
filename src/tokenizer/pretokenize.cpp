// tokenizer/pretokenize.cpp — the pre-tokenizer presets by GGUF `pre` name and the split loop.
#include "tokenizer/pretokenize.h"

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace fp {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {
// Llama-3 and Qwen2 differ only in how many digits make one number piece.
std::string llama3_like(const char* digits) {
  return std::string(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})") + digits +
         R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
}
const char* const kCjk = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+";
}  // namespace

std::vector<std::string> pre_regexes_for(const std::string& pre, const std::string& source) {
  if (pre == "default" || pre == "gpt-2" || pre == "gpt2" || pre.empty()) return {kGpt2Pattern};
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "smaug-bpe" || pre == "falcon3")
    return {llama3_like("{1,3}")};
  if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "qwen35") return {llama3_like("")};
  if (pre == "deepseek-coder")
    return {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjk, R"(\p{N})"};
  if (pre == "deepseek-llm")
    return {R"([\r\n])",
            "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
            "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
            "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
            "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
            "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
            "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
            "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
            "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
            "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
            "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
            "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
            "\U0001e900-\U0001e943]+",
            "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", R"(\s+$)", kCjk, R"(\p{N}+)"};
  if (pre == "deepseek-v3")
    return {R"(\p{N}{1,3})", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
            R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
  if (pre == "gpt-4o" || pre == "o200k")
    return {R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
            R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
            R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
  fail(source, ": unsupported pre-tokenizer tokenizer.ggml.pre '", pre,
       "' (known: default, gpt-2, llama-bpe, qwen2, deepseek-llm, deepseek-coder, deepseek-v3, gpt-4o)");
}

PreTokenizer::PreTokenizer(const std::vector<std::string>& patterns) {
  regexes_.reserve(patterns.size());
  for (const auto& p : patterns) regexes_.emplace_back(p);
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  std::vector<std::string_view> cur{text}, next;
  for (const Regex& re : regexes_) {
    next.clear();
    for (std::string_view piece : cur) split_one(re, piece, next);
    cur.swap(next);
  }
  out.insert(out.end(), cur.begin(), cur.end());
}

void PreTokenizer::split_one(const Regex& re, std::string_view piece, std::vector<std::string_view>& out) const {
  const uni::CodePoints cp = uni::to_code_points(piece);
  const size_t n = cp.cps.size();
  size_t gap = 0;  // start (in code points) of text not yet emitted
  for (size_t pos = 0; pos < n;) {
    const int64_t len = re.match_at(cp.cps.data(), 0, n, pos);
    if (len <= 0) {  // no match here (empty matches split nothing)
      ++pos;
      continue;
    }
    if (gap < pos) out.push_back(piece.substr(cp.offsets[gap], cp.offsets[pos] - cp.offsets[gap]));
    const size_t end = pos + static_cast<size_t>(len);
    out.push_back(piece.substr(cp.offsets[pos], cp.offsets[end] - cp.offsets[pos]));
    pos = gap = end;
  }
  if (gap < n) out.push_back(piece.substr(cp.offsets[gap]));
}

}  // namespace fp
