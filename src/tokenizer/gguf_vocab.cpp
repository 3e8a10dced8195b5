// tokenizer/gguf_vocab.cpp — reads a TokenizerSpec from GGUF metadata (tokenizer.ggml.*).
#include <cmath>

#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/models.h"

namespace fp {

namespace {
// GGUF writes "no such token" as -1 stored unsigned (4294967295).
int32_t token_id(const GgufFile& g, const std::string& key, int64_t n_vocab) {
  const GgufValue* v = g.find(key);
  if (!v) return -1;
  FP_CHECK(v->is_integer(), g.path(), ": ", key, " is a ", gguf_type_name(v->type), ", expected an integer");
  const int64_t id = v->type == GgufType::I8 || v->type == GgufType::I16 || v->type == GgufType::I32 || v->type == GgufType::I64
                         ? v->i
                         : static_cast<int64_t>(v->u);
  if (id < 0 || id == 0xFFFFFFFFll || id == -1) return -1;
  FP_CHECK(id < n_vocab, g.path(), ": ", key, " = ", id, " is out of range for a vocabulary of ", n_vocab);
  return static_cast<int32_t>(id);
}
}  // namespace

TokenizerSpec spec_from_gguf(const GgufFile& g) {
  TokenizerSpec s;
  s.source = g.path();
  FP_CHECK(g.has("tokenizer.ggml.model"), g.path(), ": no tokenizer.ggml.model in the metadata (no tokenizer)");
  s.model = g.get_string("tokenizer.ggml.model");
  const auto* tokens = g.get_string_array("tokenizer.ggml.tokens");
  FP_CHECK(tokens && !tokens->empty(), g.path(), ": missing or empty tokenizer.ggml.tokens");
  s.tokens = *tokens;
  const auto n = static_cast<int64_t>(s.tokens.size());

  if (const auto* scores = g.get_number_array("tokenizer.ggml.scores")) {
    FP_CHECK(static_cast<int64_t>(scores->size()) == n, g.path(), ": tokenizer.ggml.scores has ", scores->size(),
             " entries for ", n, " tokens");
    s.scores.assign(scores->begin(), scores->end());
  }
  if (const auto* types = g.get_number_array("tokenizer.ggml.token_type")) {
    FP_CHECK(static_cast<int64_t>(types->size()) == n, g.path(), ": tokenizer.ggml.token_type has ", types->size(),
             " entries for ", n, " tokens");
    s.types.reserve(types->size());
    for (size_t i = 0; i < types->size(); ++i) {
      const double t = (*types)[i];
      FP_CHECK(t >= 0 && t <= 6 && t == std::floor(t), g.path(), ": tokenizer.ggml.token_type[", i, "] = ", t,
               " is not a token type (0..6)");
      s.types.push_back(static_cast<int32_t>(t));
    }
  }
  if (const auto* merges = g.get_string_array("tokenizer.ggml.merges")) s.merges = *merges;

  s.bos_id = token_id(g, "tokenizer.ggml.bos_token_id", n);
  s.eos_id = token_id(g, "tokenizer.ggml.eos_token_id", n);
  s.unk_id = token_id(g, "tokenizer.ggml.unknown_token_id", n);
  s.pad_id = token_id(g, "tokenizer.ggml.padding_token_id", n);
  for (const char* k : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    const int32_t id = token_id(g, k, n);
    if (id >= 0) s.eog_ids.push_back(id);
  }

  if (s.model == "llama") {
    s.pre = g.get_string("tokenizer.ggml.pre", "default");
    s.add_bos = g.get_bool("tokenizer.ggml.add_bos_token", true);
    s.add_space_prefix = g.get_bool("tokenizer.ggml.add_space_prefix", true);
  } else if (s.model == "gpt2") {
    s.pre = g.get_string("tokenizer.ggml.pre", "default");
    s.add_bos = g.get_bool("tokenizer.ggml.add_bos_token", false);
    s.add_space_prefix = g.get_bool("tokenizer.ggml.add_space_prefix", false);
    FP_CHECK(!s.merges.empty(), g.path(), ": byte-level BPE vocabulary without tokenizer.ggml.merges");
    // Llama-3's tokenizer keeps pre-tokens that are whole vocabulary entries (HF ignore_merges).
    s.ignore_merges = s.pre == "llama-bpe" || s.pre == "llama3" || s.pre == "llama-v3";
  } else {
    fail(g.path(), ": unsupported tokenizer.ggml.model '", s.model, "' (supported: llama, gpt2)");
  }
  s.add_eos = g.get_bool("tokenizer.ggml.add_eos_token", false);
  return s;
}

}  // namespace fp
