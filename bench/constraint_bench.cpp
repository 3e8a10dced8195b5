// bench/constraint_bench.cpp — constrained decoding's per-token cost on real vocabularies: the
// allowed-token mask for a grammar state computed by walking the vocabulary trie (cold: what a
// state costs the first time) and taken from the cache with the logits masked (warm: every later
// visit), at the start of a JSON object, inside a string and inside a number, and inside the
// keywords with their own compilers: a date-time format, a bounded number, a `.` pattern. Needs the test data
// (FASTPATH_TESTDATA or ../shared/testdata); skipped with the reason otherwise.
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/paths.h"
#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "engine/token_constraint.h"
#include "tokenizer/tokenizer.h"

namespace fp {
namespace {

void register_constraint_benchmarks() {
  const char* schema = R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                           "tags": {"type": "array", "items": {"type": "string"}},
                           "when": {"type": "string", "format": "date-time"}, "score": {"type": "number", "minimum": 0, "maximum": 1},
                           "note": {"type": "string", "pattern": "^.+$"}}, "required": ["name", "age", "tags"]})";
  struct Where {
    const char* name;
    const char* text;  // the text written so far
  };
  static const Where wheres[] = {{"start", ""},
                                 {"in_string", "{\"name\": \"Ann B"},
                                 {"in_number", "{\"name\": \"A\", \"age\": 4"},
                                 {"in_date_time", "{\"name\": \"A\", \"age\": 4, \"tags\": [], \"when\": \"2024-0"},
                                 {"in_bounded_number", "{\"name\": \"A\", \"age\": 4, \"tags\": [], \"score\": 0.2"},
                                 {"in_pattern_dot", "{\"name\": \"A\", \"age\": 4, \"tags\": [], \"note\": \"Ann B"}};
  for (const char* tok_name : {"llama3", "qwen3"}) {
    const std::string path = testdata_dir() + "/tokenizers/" + tok_name + "/tokenizer.json";
    for (const Where& w : wheres)
      for (bool cold : {true, false}) {
        const std::string name = std::string("constraint/mask/") + tok_name + "/" + w.name + (cold ? "/cold" : "/warm");
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
          if (!file_exists(path)) {
            st.SkipWithError(("test data missing: " + path).c_str());
            return;
          }
          static std::map<std::string, std::shared_ptr<Tokenizer>> loaded;  // once per tokenizer, not per run
          std::shared_ptr<Tokenizer>& tok = loaded[path];
          if (!tok) tok = Tokenizer::from_path(path);
          auto grammar = Grammar::parse(json_schema_to_gbnf(nlohmann::ordered_json::parse(schema)));
          GrammarState s = grammar_start(*grammar);
          grammar_accepts_prefix(*grammar, s, w.text);
          std::vector<float> logits(static_cast<size_t>(tok->n_vocab()), 0.5f);
          TokenConstraint c(grammar, *tok, "json_schema");
          c.mask_logits(s, logits.data(), tok->n_vocab());  // the trie is built on first use
          for (auto _ : st) {
            if (cold) c.clear_cache();
            c.mask_logits(s, logits.data(), tok->n_vocab());
            benchmark::DoNotOptimize(logits.data());
          }
          st.counters["vocab"] = static_cast<double>(tok->n_vocab());
        })->Unit(benchmark::kMicrosecond);
      }
  }
}

const bool registered = (register_constraint_benchmarks(), true);

}  // namespace
}  // namespace fp
