// engine/number_range_grammar.cpp — bounds to GBNF. A bounded number splits by sign into a
// magnitude range (x >= 0 as written; x < 0 as "-" and a magnitude > 0), and a magnitude range
// into its integer part strictly between the bounds' integer parts (any fraction), equal to the
// lower one (the fraction bounded below) or equal to the upper one (bounded above).
#include "engine/number_range_grammar.h"

#include <cctype>
#include <vector>

#include "core/error.h"

namespace fp {

namespace {

constexpr size_t kMaxIntDigits = 16;   // as the schema compiler's `integer` rule: [1-9] [0-9]{0,15}
constexpr size_t kMaxFracDigits = 16;

// A non-negative decimal: integer digits without leading zeros ("0" for none) and fraction
// digits without trailing zeros.
struct Magnitude {
  std::string int_digits = "0";
  std::string frac_digits;
};

struct Decimal {
  bool negative = false;  // never for zero
  Magnitude mag;
};

Decimal parse_decimal(const std::string& text) {
  size_t i = 0;
  Decimal d;
  auto bad = [&] { fail("json_schema: bound ", text, " is not a JSON number"); };
  if (i < text.size() && text[i] == '-') d.negative = true, ++i;
  std::string digits;
  long point = -1;
  for (; i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'); ++i) {
    if (text[i] == '.') {
      if (point >= 0) bad();
      point = static_cast<long>(digits.size());
    } else {
      digits += text[i];
    }
  }
  if (digits.empty()) bad();
  if (point < 0) point = static_cast<long>(digits.size());
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool neg_exp = false;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) neg_exp = text[i] == '-', ++i;
    if (i == text.size()) bad();
    long e = 0;
    for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
      e = e * 10 + (text[i] - '0');
      FP_CHECK(e <= 1000, "json_schema: bound ", text, " has an exponent beyond 1000");
    }
    point += neg_exp ? -e : e;
  }
  if (i != text.size()) bad();
  // Place the point: pad with zeros on either side as the exponent asks.
  if (point < 0) digits.insert(0, static_cast<size_t>(-point), '0'), point = 0;
  if (point > static_cast<long>(digits.size())) digits.append(static_cast<size_t>(point) - digits.size(), '0');
  std::string int_part = digits.substr(0, static_cast<size_t>(point));
  std::string frac_part = digits.substr(static_cast<size_t>(point));
  const size_t nz = int_part.find_first_not_of('0');
  d.mag.int_digits = nz == std::string::npos ? "0" : int_part.substr(nz);
  const size_t last = frac_part.find_last_not_of('0');
  d.mag.frac_digits = last == std::string::npos ? "" : frac_part.substr(0, last + 1);
  if (d.mag.int_digits == "0" && d.mag.frac_digits.empty()) d.negative = false;
  return d;
}

// Integer digit strings without leading zeros, compared by value.
int compare_int(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  return a.compare(b) < 0 ? -1 : (a == b ? 0 : 1);
}

std::string plus_one(std::string s) {
  size_t i = s.size();
  while (i > 0 && s[i - 1] == '9') s[--i] = '0';
  if (i == 0) return "1" + s;
  ++s[i - 1];
  return s;
}

// s > 0.
std::string minus_one(std::string s) {
  size_t i = s.size();
  while (s[i - 1] == '0') s[--i] = '9';
  --s[i - 1];
  if (s.size() > 1 && s[0] == '0') s.erase(0, 1);
  return s;
}

std::string digit_class(char a, char b) {
  if (a == b) return std::string("\"") + a + "\"";
  return std::string("[") + a + "-" + b + "]";
}

std::string any_digits(size_t n) { return n == 0 ? "" : n == 1 ? "[0-9]" : "[0-9]{" + std::to_string(n) + "}"; }

std::string join(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

std::string seq(const std::string& a, const std::string& b) { return a.empty() ? b : b.empty() ? a : a + " " + b; }

// Digit strings of one length between x and y (x <= y), leading zeros allowed.
std::string same_length_range(const std::string& x, const std::string& y) {
  size_t i = 0;
  while (i < x.size() && x[i] == y[i]) ++i;
  const std::string prefix = i ? "\"" + x.substr(0, i) + "\"" : "";
  if (i == x.size()) return prefix;
  const size_t m = x.size() - i - 1;
  const std::string xs = x.substr(i + 1), ys = y.substr(i + 1);
  const bool xs_low = xs.find_first_not_of('0') == std::string::npos;
  const bool ys_high = ys.find_first_not_of('9') == std::string::npos;
  const char a = x[i], b = y[i];
  if (xs_low && ys_high) return seq(prefix, seq(digit_class(a, b), any_digits(m)));
  std::vector<std::string> alts;
  alts.push_back(seq(digit_class(a, a), xs_low ? any_digits(m) : same_length_range(xs, std::string(m, '9'))));
  if (b - a >= 2) alts.push_back(seq(digit_class(static_cast<char>(a + 1), static_cast<char>(b - 1)), any_digits(m)));
  alts.push_back(seq(digit_class(b, b), ys_high ? any_digits(m) : same_length_range(std::string(m, '0'), ys)));
  return seq(prefix, join(alts));
}

// Integers without leading zeros in [lo, hi] (hi empty: up to kMaxIntDigits digits); lo <= hi
// and lo has at most kMaxIntDigits digits.
std::string integer_range(const std::string& lo, const std::string& hi) {
  std::vector<std::string> alts;
  const size_t top = hi.empty() ? kMaxIntDigits : hi.size();
  for (size_t len = lo.size(); len <= top; ++len) {
    std::string from = lo;
    if (len != lo.size()) from.assign(len, '0'), from[0] = '1';
    if (hi.empty() && len > lo.size()) {  // every longer length at once
      const size_t a = len - 1, b = kMaxIntDigits - 1;
      alts.push_back(a == b ? "[1-9] " + any_digits(a) : "[1-9] [0-9]{" + std::to_string(a) + "," + std::to_string(b) + "}");
      break;
    }
    const std::string to = (!hi.empty() && len == hi.size()) ? hi : std::string(len, '9');
    alts.push_back(same_length_range(from, to));
  }
  return join(alts);
}

// A bound on a fraction's digits (compared as if padded with zeros): `digits` has no trailing zeros.
struct FracBound {
  std::string digits;
  bool strict = false;
};
using OptFrac = std::optional<FracBound>;

// Whether a fraction of zeros only (or none) satisfies the bounds.
bool zeros_satisfy(const OptFrac& lo, const OptFrac& hi) {
  const bool lo_ok = !lo || (lo->digits.empty() && !lo->strict);
  const bool hi_ok = !hi || !hi->strict || !hi->digits.empty();
  return lo_ok && hi_ok;
}

// The bounds after one more digit d; false when d breaks one.
bool step(OptFrac& lo, OptFrac& hi, char d) {
  if (lo) {
    const char a = lo->digits.empty() ? '0' : lo->digits[0];
    if (d < a) return false;
    if (d > a) lo.reset();
    else if (!lo->digits.empty()) lo->digits.erase(0, 1);
    if (lo && lo->digits.empty() && !lo->strict) lo.reset();
  }
  if (hi) {
    const char b = hi->digits.empty() ? '0' : hi->digits[0];
    if (d > b) return false;
    if (d < b) hi.reset();
    else if (!hi->digits.empty()) hi->digits.erase(0, 1);
  }
  return true;
}

std::optional<std::string> fraction_digits(const OptFrac& lo, const OptFrac& hi, bool nonempty, size_t left);

// Digit strings of length >= 1 (up to `left` digits, loosely) within the bounds.
std::optional<std::string> fraction_nonempty(const OptFrac& lo, const OptFrac& hi, size_t left) {
  const std::string cap = std::to_string(left > 0 ? left - 1 : 0);
  if (!lo && !hi) return "[0-9]{1," + std::to_string(left) + "}";
  if (lo && lo->digits.empty() && lo->strict && !hi) return "[0]{0," + cap + "} [1-9] [0-9]{0," + cap + "}";
  if (hi && hi->digits.empty()) {
    if (hi->strict || lo) return std::nullopt;  // below zero, or above zero and at most zero
    return "[0]{1," + std::to_string(left) + "}";
  }
  // Digits that lead to the same bounds share a class.
  std::vector<std::string> alts;
  char first = 0;
  OptFrac group_lo, group_hi;
  bool group_ok = false;
  auto close = [&](char last) {
    if (!group_ok) return;
    const auto rest = fraction_digits(group_lo, group_hi, false, left > 1 ? left - 1 : 1);
    if (rest) alts.push_back(seq(digit_class(first, last), *rest));
  };
  for (char d = '0'; d <= '9'; ++d) {
    OptFrac l = lo, h = hi;
    const bool ok = step(l, h, d);
    const bool same = ok && group_ok && l.has_value() == group_lo.has_value() && h.has_value() == group_hi.has_value() &&
                      (!l || (l->digits == group_lo->digits && l->strict == group_lo->strict)) &&
                      (!h || (h->digits == group_hi->digits && h->strict == group_hi->strict));
    if (same) continue;
    close(static_cast<char>(d - 1));
    first = d, group_lo = l, group_hi = h, group_ok = ok;
  }
  close('9');
  if (alts.empty()) return std::nullopt;
  return join(alts);
}

// Digit strings within the bounds, the empty one included when `nonempty` is false and zeros satisfy.
std::optional<std::string> fraction_digits(const OptFrac& lo, const OptFrac& hi, bool nonempty, size_t left) {
  const auto body = fraction_nonempty(lo, hi, left);
  if (nonempty || !zeros_satisfy(lo, hi)) return body;
  if (!body) return std::string();
  return "(" + *body + ")?";
}

// The fraction part after an integer part: "." and digits, or nothing where zeros satisfy.
std::optional<std::string> fraction_tail(const OptFrac& lo, const OptFrac& hi) {
  const auto body = fraction_nonempty(lo, hi, kMaxFracDigits);
  const bool none_ok = zeros_satisfy(lo, hi);
  if (!body) return none_ok ? std::optional<std::string>("") : std::nullopt;
  const std::string dotted = "\".\" " + *body;
  return none_ok ? "(" + dotted + ")?" : dotted;
}

struct MagBound {
  Magnitude mag;
  bool strict = false;
};
using OptMag = std::optional<MagBound>;

// Magnitudes m (written without a sign) with lo <= m <= hi.
std::optional<std::string> magnitude_range(OptMag lo, OptMag hi, bool integer_only) {
  if (hi && hi->mag.int_digits.size() > kMaxIntDigits) hi.reset();  // every number we write is below it
  if (lo && lo->mag.int_digits.size() > kMaxIntDigits) return std::nullopt;
  if (integer_only) {
    std::string from = "0", to;
    if (lo) from = (lo->strict || !lo->mag.frac_digits.empty()) ? plus_one(lo->mag.int_digits) : lo->mag.int_digits;
    if (hi) {
      if (hi->strict && hi->mag.frac_digits.empty()) {
        if (hi->mag.int_digits == "0") return std::nullopt;
        to = minus_one(hi->mag.int_digits);
      } else {
        to = hi->mag.int_digits;
      }
    }
    if (from.size() > kMaxIntDigits || (!to.empty() && compare_int(from, to) > 0)) return std::nullopt;
    return integer_range(from, to);
  }
  std::vector<std::string> alts;
  const int order = lo && hi ? compare_int(lo->mag.int_digits, hi->mag.int_digits) : -1;
  if (order > 0) return std::nullopt;
  // Integer parts strictly between the bounds' integer parts: any fraction.
  const std::string from = lo ? plus_one(lo->mag.int_digits) : "0";
  if (from.size() <= kMaxIntDigits && (!hi || (hi->mag.int_digits != "0" && compare_int(from, minus_one(hi->mag.int_digits)) <= 0))) {
    const auto tail = fraction_tail(std::nullopt, std::nullopt);
    alts.push_back(seq(integer_range(from, hi ? minus_one(hi->mag.int_digits) : ""), *tail));
  }
  const OptFrac flo = lo ? OptFrac(FracBound{lo->mag.frac_digits, lo->strict}) : std::nullopt;
  const OptFrac fhi = hi ? OptFrac(FracBound{hi->mag.frac_digits, hi->strict}) : std::nullopt;
  OptFrac flo_n = flo;
  if (flo_n && flo_n->digits.empty() && !flo_n->strict) flo_n.reset();  // a fraction is never below zero
  if (order == 0) {  // one integer part: the fraction between both bounds
    if (const auto tail = fraction_tail(flo_n, fhi)) alts.push_back(seq("\"" + lo->mag.int_digits + "\"", *tail));
  } else {
    if (lo)
      if (const auto tail = fraction_tail(flo_n, std::nullopt)) alts.push_back(seq("\"" + lo->mag.int_digits + "\"", *tail));
    if (hi)
      if (const auto tail = fraction_tail(std::nullopt, fhi)) alts.push_back(seq("\"" + hi->mag.int_digits + "\"", *tail));
  }
  if (alts.empty()) return std::nullopt;
  return join(alts);
}

}  // namespace

std::optional<std::string> number_range_gbnf(const std::optional<NumberBound>& lower,
                                             const std::optional<NumberBound>& upper, bool integer_only) {
  std::optional<Decimal> lo, hi;
  if (lower) lo = parse_decimal(lower->value);
  if (upper) hi = parse_decimal(upper->value);
  std::vector<std::string> alts;
  // x >= 0, written without a sign.
  if (!hi || !hi->negative) {
    OptMag mlo, mhi;
    if (lo && !lo->negative) mlo = MagBound{lo->mag, lower->exclusive};
    if (hi) mhi = MagBound{hi->mag, upper->exclusive};
    if (const auto e = magnitude_range(mlo, mhi, integer_only)) alts.push_back(*e);
  }
  // x < 0: "-" and a magnitude above zero.
  if (!lo || lo->negative) {
    OptMag mlo = MagBound{Magnitude{}, true}, mhi;
    if (hi && hi->negative) mlo = MagBound{hi->mag, upper->exclusive};
    if (lo) mhi = MagBound{lo->mag, lower->exclusive};
    if (const auto e = magnitude_range(mlo, mhi, integer_only)) alts.push_back("\"-\" " + *e);
  }
  if (alts.empty()) return std::nullopt;
  return join(alts);
}

}  // namespace fp
