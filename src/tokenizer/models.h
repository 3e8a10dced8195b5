// tokenizer/models.h — internal: the two tokenizer models and the spec readers behind the
// Tokenizer factories (not part of the public interface).
#pragma once
#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace fp {

std::unique_ptr<Tokenizer> make_spm_tokenizer(TokenizerSpec spec);  // spm.cpp
std::unique_ptr<Tokenizer> make_bpe_tokenizer(TokenizerSpec spec);  // bpe.cpp
TokenizerSpec spec_from_gguf(const GgufFile& gguf);                 // gguf_vocab.cpp

// GPT-2's reversible byte <-> printable code point map used by byte-level BPE.
uint32_t byte_to_unicode(uint8_t b);
int byte_from_unicode(uint32_t cp);  // -1 when cp is not one of the 256

}  // namespace fp
