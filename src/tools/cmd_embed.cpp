// tools/cmd_embed.cpp — `fastpath embed`: text embeddings (engine/embedder.h), one JSON line per
// input on stdout: {"index", "tokens", "embedding": [...]}.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "engine/embedder.h"
#include "parallel/communicator.h"
#include "tools/common.h"

namespace fp::tools {

void add_embed(CLI::App& app) {
  struct Opts {
    CommonOptions common;
    std::vector<std::string> prompts;
    std::string file, pooling;
    bool no_normalize = false;
    int64_t batch_tokens = 512;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("embed", "print the embeddings of texts (the final hidden state, pooled and L2-normalised) as JSON lines");
  add_common(cmd, o->common, true);
  cmd->add_option("-p,--prompt", o->prompts, "a text to embed (repeatable)");
  cmd->add_option("--file", o->file, "texts to embed, one per line");
  cmd->add_option("--pooling", o->pooling,
                  "last (the last token's hidden state) or mean (over the tokens); default: the model directory's "
                  "1_Pooling/config.json, else last")
      ->check(CLI::IsMember({"last", "mean"}));
  cmd->add_flag("--no-normalize", o->no_normalize, "keep the pooled hidden state's length (default: divided by its L2 norm)");
  cmd->add_option("--batch-tokens", o->batch_tokens,
                  "texts of up to this many tokens together go through one forward (a longer text runs alone, in chunks of it)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->callback([o] {
    std::vector<std::string> texts = o->prompts;
    if (!o->file.empty()) {
      std::ifstream in(o->file);
      FP_CHECK(in, o->file, ": cannot open");
      for (std::string line; std::getline(in, line);) texts.push_back(line);
    }
    FP_CHECK(!texts.empty(), "embed: no texts (give -p TEXT or --file FILE)");
    FP_CHECK(launched_world_size() <= 1, "embed: runs on one rank (not under mpirun)");
    auto model = load_with(o->common);
    const Tokenizer* tok = model->tokenizer();
    FP_CHECK(tok, o->common.model, ": the model has no tokenizer (for llama2.c pass --tokenizer)");
    EmbeddingOptions eo;
    eo.pooling = o->pooling.empty() ? default_pooling(o->common.model) : pooling_from_name(o->pooling);
    eo.normalize = !o->no_normalize;
    eo.chunk = o->batch_tokens;
    log_info("embedding ", texts.size(), " texts: ", pooling_name(eo.pooling), " pooling", eo.normalize ? ", L2-normalised" : "");
    std::vector<std::vector<int32_t>> ids;
    for (size_t i = 0; i < texts.size(); ++i) {
      ids.push_back(tok->encode(texts[i], /*add_special=*/true, /*parse_special=*/true));
      FP_CHECK(!ids.back().empty(), "embed: text ", i, " has no tokens");
    }
    Embedder embedder(*model);
    int64_t tokens = 0;
    for (const auto& t : ids) tokens += static_cast<int64_t>(t.size());
    const auto t0 = std::chrono::steady_clock::now();
    const auto vectors = embedder.embed_batch(ids, eo);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log_info("embedded ", texts.size(), " texts, ", tokens, " tokens in ", s, " s: ", static_cast<double>(tokens) / s, " tokens/s");
    for (size_t i = 0; i < texts.size(); ++i) {
      const nlohmann::json line{{"index", i}, {"tokens", ids[i].size()}, {"embedding", vectors[i]}};
      std::printf("%s\n", line.dump().c_str());
    }
    std::fflush(stdout);
  });
}

}  // namespace fp::tools
