// tokenizer/unicode.cpp — lookups over the generated tables, UTF-8 coding and NFC.
#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <unordered_map>

#include "tokenizer/unicode_tables.h"

namespace fp::uni {

namespace {
// Index of the range holding cp in a (start << 8 | value) table.
uint32_t range_value(const uint32_t* table, size_t n, uint32_t cp) {
  const uint32_t key = (cp << 8) | 0xFF;
  const uint32_t* it = std::upper_bound(table, table + n, key);
  return it == table ? 0 : (*(it - 1) & 0xFF);
}
}  // namespace

Gc category(uint32_t cp) {
  if (cp < 0x80) {
    // ASCII is the hot path of every pre-tokenizer: a small cached table.
    static const auto ascii = [] {
      std::array<uint8_t, 128> a{};
      for (uint32_t c = 0; c < 128; ++c) a[c] = static_cast<uint8_t>(range_value(tables::kCategory, tables::kCategoryCount, c));
      return a;
    }();
    return static_cast<Gc>(ascii[cp]);
  }
  if (cp >= 0x110000) return Cn;
  return static_cast<Gc>(range_value(tables::kCategory, tables::kCategoryCount, cp));
}

bool is_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

GcMask mask_for_name(std::string_view n) {
  struct Named { const char* name; GcMask mask; };
  static const Named names[] = {
      {"L", kLetter}, {"Letter", kLetter}, {"M", kMark}, {"Mark", kMark}, {"N", kNumber}, {"Number", kNumber},
      {"P", kPunct}, {"Punctuation", kPunct}, {"S", kSymbol}, {"Symbol", kSymbol}, {"Z", kSeparator},
      {"Separator", kSeparator}, {"C", kOther}, {"Other", kOther},
      {"Lu", gc_bit(Lu)}, {"Ll", gc_bit(Ll)}, {"Lt", gc_bit(Lt)}, {"Lm", gc_bit(Lm)}, {"Lo", gc_bit(Lo)},
      {"Mn", gc_bit(Mn)}, {"Mc", gc_bit(Mc)}, {"Me", gc_bit(Me)}, {"Nd", gc_bit(Nd)}, {"Nl", gc_bit(Nl)},
      {"No", gc_bit(No)}, {"Pc", gc_bit(Pc)}, {"Pd", gc_bit(Pd)}, {"Ps", gc_bit(Ps)}, {"Pe", gc_bit(Pe)},
      {"Pi", gc_bit(Pi)}, {"Pf", gc_bit(Pf)}, {"Po", gc_bit(Po)}, {"Sm", gc_bit(Sm)}, {"Sc", gc_bit(Sc)},
      {"Sk", gc_bit(Sk)}, {"So", gc_bit(So)}, {"Zs", gc_bit(Zs)}, {"Zl", gc_bit(Zl)}, {"Zp", gc_bit(Zp)},
      {"Cc", gc_bit(Cc)}, {"Cf", gc_bit(Cf)}, {"Cs", gc_bit(Cs)}, {"Co", gc_bit(Co)}, {"Cn", gc_bit(Cn)},
  };
  for (const auto& e : names)
    if (n == e.name) return e.mask;
  return 0;
}

uint32_t decode_one(std::string_view s, size_t i, size_t* len) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  *len = 1;
  if (b0 < 0x80) return b0;
  size_t n = utf8_len(b0);
  if (n == 1 || i + n > s.size()) return kReplacement;
  uint32_t cp = n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) return kReplacement;
    cp = (cp << 6) | (b & 0x3F);
  }
  // Reject overlong forms, surrogates and values past U+10FFFF.
  static const uint32_t min_for_len[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_for_len[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return kReplacement;
  *len = n;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t len;
    if (decode_one(s, i, &len) == kReplacement && !(len == 3 && s.substr(i, 3) == "\xEF\xBF\xBD")) return false;
    i += len;
  }
  return true;
}

CodePoints to_code_points(std::string_view s) {
  CodePoints r;
  r.cps.reserve(s.size());
  r.offsets.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    size_t len;
    r.cps.push_back(decode_one(s, i, &len));
    r.offsets.push_back(static_cast<uint32_t>(i));
    i += len;
  }
  r.offsets.push_back(static_cast<uint32_t>(s.size()));
  return r;
}

// ---- NFC ----------------------------------------------------------------------------------
namespace {
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

struct NfcData {
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> decomp;  // cp -> (first, second or 0)
  std::unordered_map<uint64_t, uint32_t> compose;                      // (first << 32 | second) -> composite
};
const NfcData& nfc_data() {
  static const NfcData d = [] {
    NfcData r;
    for (size_t i = 0; i + 2 < tables::kDecompositionCount; i += 3) {
      const uint32_t cp = tables::kDecomposition[i] & 0x7FFFFFFF;
      const uint32_t a = tables::kDecomposition[i + 1], b = tables::kDecomposition[i + 2];
      r.decomp[cp] = {a, b};
      if (tables::kDecomposition[i] & 0x80000000) r.compose[(uint64_t(a) << 32) | b] = cp;
    }
    return r;
  }();
  return d;
}

uint8_t ccc(uint32_t cp) { return cp < 0x300 ? 0 : static_cast<uint8_t>(range_value(tables::kCombining, tables::kCombiningCount, cp)); }

void decompose(uint32_t cp, std::vector<uint32_t>& out, const NfcData& d) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  auto it = d.decomp.find(cp);
  if (it == d.decomp.end()) {
    out.push_back(cp);
    return;
  }
  decompose(it->second.first, out, d);
  if (it->second.second) decompose(it->second.second, out, d);
}

uint32_t compose_pair(uint32_t a, uint32_t b, const NfcData& d) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  auto it = d.compose.find((uint64_t(a) << 32) | b);
  return it == d.compose.end() ? 0 : it->second;
}
}  // namespace

std::string nfc(std::string_view s) {
  // Text below U+0300 is always in NFC: the common case costs one scan.
  bool simple = true;
  for (char c : s)
    if (static_cast<uint8_t>(c) >= 0xCC) { simple = false; break; }
  if (simple || !is_valid_utf8(s)) return std::string(s);

  const NfcData& d = nfc_data();
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    decompose(decode_one(s, i, &len), cps, d);
    i += len;
  }
  // Canonical ordering: stable sort each run of non-starters by combining class.
  for (size_t i = 0; i < cps.size();) {
    if (ccc(cps[i]) == 0) { ++i; continue; }
    size_t j = i;
    while (j < cps.size() && ccc(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j, [](uint32_t a, uint32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }
  // Canonical composition: each character joins the last starter unless blocked.
  std::vector<uint32_t> out;
  out.reserve(cps.size());
  size_t starter = SIZE_MAX;
  int last_ccc = -1;
  for (uint32_t cp : cps) {
    const int c = ccc(cp);
    if (starter != SIZE_MAX && (last_ccc < c || (last_ccc == 0 && out.size() == starter + 1))) {
      // Not blocked: no character between the starter and cp has a class >= cp's (or cp follows it directly).
      if (uint32_t comp = compose_pair(out[starter], cp, d)) {
        out[starter] = comp;
        continue;
      }
    }
    if (c == 0) {
      starter = out.size();
      last_ccc = 0;
    } else {
      last_ccc = c;
    }
    out.push_back(cp);
  }
  std::string r;
  r.reserve(s.size());
  for (uint32_t cp : out) append_utf8(r, cp);
  return r;
}

}  // namespace fp::uni
