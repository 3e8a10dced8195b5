// tokenizer/stream_decoder.cpp — incremental decoding that only ever emits whole UTF-8 characters.
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace fp {

namespace {
// Moves every complete character of `pending` to the result (invalid bytes as U+FFFD) and keeps
// a trailing incomplete-but-valid prefix, unless `final`.
std::string drain(std::string& pending, bool final) {
  std::string out;
  size_t i = 0;
  while (i < pending.size()) {
    const auto lead = static_cast<uint8_t>(pending[i]);
    const size_t need = uni::utf8_len(lead);
    if (!final && need > 1 && i + need > pending.size()) {
      // Keep it only if what we have so far could still become a valid character.
      bool prefix_ok = true;
      for (size_t k = i + 1; k < pending.size(); ++k) prefix_ok = prefix_ok && (static_cast<uint8_t>(pending[k]) & 0xC0) == 0x80;
      if (prefix_ok) break;
    }
    size_t len;
    const uint32_t cp = uni::decode_one(pending, i, &len);
    uni::append_utf8(out, cp);
    i += len;
  }
  pending.erase(0, i);
  return out;
}
}  // namespace

std::string StreamDecoder::push(int32_t id) {
  std::string piece = tok_.token_to_bytes(id, render_special_);
  if (prev_ >= 0 && prev_ == tok_.bos_id() && tok_.strips_leading_space() && !piece.empty() && piece[0] == ' ')
    piece.erase(0, 1);
  prev_ = id;
  pending_ += piece;
  return drain(pending_, false);
}

std::string StreamDecoder::flush() { return drain(pending_, true); }

}  // namespace fp
