// tests/tokenizer_unicode_test.cpp — the pieces under the tokenizers: category tables, UTF-8,
// NFC, the code-point regex engine and the pre-tokenizer presets.
#include "core/error.h"
#include "test_util.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace fp {
namespace {

std::vector<std::string> split(const std::vector<std::string>& patterns, const std::string& text) {
  PreTokenizer pre(patterns);
  std::vector<std::string_view> pieces;
  pre.split(text, pieces);
  return {pieces.begin(), pieces.end()};
}

TEST(TokenizerUnicode, Categories) {
  EXPECT_EQ(uni::category('A'), uni::Lu);
  EXPECT_EQ(uni::category('z'), uni::Ll);
  EXPECT_EQ(uni::category('7'), uni::Nd);
  EXPECT_EQ(uni::category(' '), uni::Zs);
  EXPECT_EQ(uni::category('!'), uni::Po);
  EXPECT_EQ(uni::category('+'), uni::Sm);
  EXPECT_EQ(uni::category(0x4E2D), uni::Lo);   // 中
  EXPECT_EQ(uni::category(0x0301), uni::Mn);   // combining acute
  EXPECT_EQ(uni::category(0x00BD), uni::No);   // ½
  EXPECT_EQ(uni::category(0x1F999), uni::So);  // 🦙
  EXPECT_EQ(uni::category(0x10FFFF), uni::Cn);
  EXPECT_TRUE(uni::is_space(0x3000));
  EXPECT_TRUE(uni::is_space('\n'));
  EXPECT_FALSE(uni::is_space(0x200B));  // zero width space is not White_Space
}

TEST(TokenizerUnicode, Utf8) {
  const std::string s = "a\xc3\xa9\xe4\xb8\xad\xf0\x9f\xa6\x99\xff";
  const auto cp = uni::to_code_points(s);
  EXPECT_EQ(cp.cps, (std::vector<uint32_t>{'a', 0xE9, 0x4E2D, 0x1F999, uni::kReplacement}));
  EXPECT_EQ(cp.offsets, (std::vector<uint32_t>{0, 1, 3, 6, 10, 11}));
  EXPECT_FALSE(uni::is_valid_utf8(s));
  EXPECT_TRUE(uni::is_valid_utf8(s.substr(0, 10)));
  EXPECT_FALSE(uni::is_valid_utf8("\xc0\x80"));      // overlong
  EXPECT_FALSE(uni::is_valid_utf8("\xed\xa0\x80"));  // surrogate
}

TEST(TokenizerUnicode, Nfc) {
  EXPECT_EQ(uni::nfc("cafe\xcc\x81"), "caf\xc3\xa9");                   // e + acute -> é
  EXPECT_EQ(uni::nfc("\xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab"), "\xed\x95\x9c");  // Hangul jamo -> 한
  EXPECT_EQ(uni::nfc("\xe2\x84\xab"), "\xc3\x85");                      // Angstrom sign -> Å (singleton)
  EXPECT_EQ(uni::nfc("a\xcc\xa3\xcc\x87"), "\xe1\xba\xa1\xcc\x87");     // reordered marks compose: ạ̇
  EXPECT_EQ(uni::nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(uni::nfc("\xff\xfe"), "\xff\xfe");  // invalid UTF-8 is left alone
}

TEST(TokenizerRegex, Basics) {
  auto m = [](const std::string& pat, const std::string& text, size_t pos = 0) {
    const auto cp = uni::to_code_points(text);
    return Regex(pat).match_at(cp.cps.data(), 0, cp.cps.size(), pos);
  };
  EXPECT_EQ(m(R"(\p{L}+)", "hello world"), 5);
  EXPECT_EQ(m(R"(\p{L}+)", " hello"), -1);
  EXPECT_EQ(m(R"( ?\p{L}+)", " h\xc3\xa9llo!"), 6);
  EXPECT_EQ(m(R"(\p{N}{1,3})", "12345"), 3);
  EXPECT_EQ(m(R"(\s+(?!\S))", "   x"), 2);
  EXPECT_EQ(m(R"(\s+(?!\S))", "   "), 3);
  EXPECT_EQ(m(R"((?i:'s|'ll))", "'LL"), 3);
  EXPECT_EQ(m(R"('s|'ll)", "'LL"), -1);
  EXPECT_EQ(m(R"((?i:'s))", "'\xc5\xbf"), 2);  // long s folds to s, as in Oniguruma
  EXPECT_EQ(m(R"((?i:[a-z]+))", "AbC"), 3);
  EXPECT_EQ(m(R"([^\r\n\p{L}\p{N}]?\p{L}+)", "$abc"), 4);
  EXPECT_EQ(m(R"(\s+$)", "  \n"), 3);
  EXPECT_EQ(m(R"(\s+$)", "  a"), -1);
  EXPECT_EQ(m("[\u4e00-\u9fa5]+", "\xe4\xb8\xad\xe6\x96\x87x"), 2);
  EXPECT_EQ(m(R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+)", "\\n"), 2);
  EXPECT_EQ(m(R"(a+?b)", "aaab"), 4);
  EXPECT_EQ(m(R"((?:ab)*c)", "ababc"), 5);
  EXPECT_EQ(m(R"(\x41\u00e9)", "A\xc3\xa9"), 2);
  EXPECT_THROW(Regex("(abc"), Error);
  EXPECT_THROW(Regex("[abc"), Error);
  EXPECT_THROW(Regex(R"(\p{Bogus})"), Error);
  EXPECT_THROW(Regex("a{3,1}"), Error);
  EXPECT_THROW(Regex(std::string(5000, '(') + std::string(5000, ')')), Error);
  EXPECT_THROW(Regex("((a{1000}){1000}){1000}"), Error);
  EXPECT_THROW(Regex("a" + std::string(100000, '?')), Error);
}

TEST(TokenizerPreTokenize, Gpt2) {
  EXPECT_EQ(split({kGpt2Pattern}, "Hello world's  3333 !!?\n\n"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " 3333", " !!?", "\n\n"}));
}

TEST(TokenizerPreTokenize, Llama3AndQwen2) {
  const auto llama3 = pre_regexes_for("llama-bpe", "test");
  EXPECT_EQ(split(llama3, "I'VE 12345 apples,\n\n  ok"),
            (std::vector<std::string>{"I", "'VE", " ", "123", "45", " apples", ",\n\n", " ", " ok"}));
  const auto qwen2 = pre_regexes_for("qwen2", "test");
  EXPECT_EQ(split(qwen2, "x 123"), (std::vector<std::string>{"x", " ", "1", "2", "3"}));
}

TEST(TokenizerPreTokenize, DeepSeekSequences) {
  const auto v3 = pre_regexes_for("deepseek-v3", "test");
  EXPECT_EQ(split(v3, "abc12345\xe4\xb8\xad\xe6\x96\x87.def"),
            (std::vector<std::string>{"abc", "123", "45", "\xe4\xb8\xad\xe6\x96\x87", ".def"}));
  const auto coder = pre_regexes_for("deepseek-coder", "test");
  EXPECT_EQ(split(coder, "a1\nb"), (std::vector<std::string>{"a", "1", "\n", "b"}));
  EXPECT_THROW(pre_regexes_for("nope", "test.gguf"), Error);
}

}  // namespace
}  // namespace fp
