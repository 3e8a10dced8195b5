// tokenizer/unicode.h — UTF-8 coding, general categories, White_Space and NFC, over code points.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fp::uni {

// General categories, in the order of scripts/gen_unicode_tables.py.
enum Gc : uint8_t { Cn, Lu, Ll, Lt, Lm, Lo, Mn, Mc, Me, Nd, Nl, No, Pc, Pd, Ps, Pe,
                    Pi, Pf, Po, Sm, Sc, Sk, So, Zs, Zl, Zp, Cc, Cf, Cs, Co, kGcCount };
using GcMask = uint32_t;  // bit (1 << Gc)
constexpr GcMask gc_bit(Gc g) { return GcMask(1) << g; }
constexpr GcMask kLetter = gc_bit(Lu) | gc_bit(Ll) | gc_bit(Lt) | gc_bit(Lm) | gc_bit(Lo);
constexpr GcMask kMark = gc_bit(Mn) | gc_bit(Mc) | gc_bit(Me);
constexpr GcMask kNumber = gc_bit(Nd) | gc_bit(Nl) | gc_bit(No);
constexpr GcMask kPunct = gc_bit(Pc) | gc_bit(Pd) | gc_bit(Ps) | gc_bit(Pe) | gc_bit(Pi) | gc_bit(Pf) | gc_bit(Po);
constexpr GcMask kSymbol = gc_bit(Sm) | gc_bit(Sc) | gc_bit(Sk) | gc_bit(So);
constexpr GcMask kSeparator = gc_bit(Zs) | gc_bit(Zl) | gc_bit(Zp);
constexpr GcMask kOther = gc_bit(Cn) | gc_bit(Cc) | gc_bit(Cf) | gc_bit(Cs) | gc_bit(Co);

Gc category(uint32_t cp);
inline bool in(uint32_t cp, GcMask m) { return (gc_bit(category(cp)) & m) != 0; }
// The White_Space property (what \s means in Oniguruma and Rust regex).
bool is_space(uint32_t cp);
// Mask for a property name as written in \p{...}: "L", "Lu", "Letter", "N", "P", "S", "M", "Z", "C", ...
// Returns 0 for an unknown name.
GcMask mask_for_name(std::string_view name);

constexpr uint32_t kReplacement = 0xFFFD;
// Decodes one code point at s[i]; *len gets its byte length. An invalid or truncated sequence
// decodes as kReplacement with *len = 1, so every byte of the input belongs to exactly one unit.
uint32_t decode_one(std::string_view s, size_t i, size_t* len);
void append_utf8(std::string& out, uint32_t cp);
// Byte length of a UTF-8 sequence from its first byte (1 for invalid lead bytes).
inline size_t utf8_len(uint8_t lead) {
  return lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 1;
}
bool is_valid_utf8(std::string_view s);

// Text as code points with the byte offset of each (offsets has one extra entry: the end).
struct CodePoints {
  std::vector<uint32_t> cps;
  std::vector<uint32_t> offsets;
};
CodePoints to_code_points(std::string_view s);

// Canonical composition (NFC). Invalid UTF-8 is returned unchanged.
std::string nfc(std::string_view s);

}  // namespace fp::uni
