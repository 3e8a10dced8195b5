// tools/cmd_logits.cpp — `fastpath logits`: one float32 row of vocabulary logits per input
// position, little-endian, row p after feeding token p at position p.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "kernels/ledger.h"
#include "tools/common.h"

namespace fp::tools {

void add_logits(CLI::App& app) {
  struct Opts {
    CommonOptions common;
    std::string tokens, out;
    bool incremental = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("logits", "write the logits of every position of a token sequence");
  add_common(cmd, o->common, true);
  add_lora_option(cmd, o->common, false);
  cmd->add_option("--tokens", o->tokens, "token ids, space-separated")->required();
  cmd->add_option("--out", o->out, "output file: n_tokens x n_vocab float32")->required();
  cmd->add_flag("--incremental", o->incremental, "feed one token per forward pass (decode path) instead of one batch");
  cmd->callback([o] {
    std::vector<int32_t> ids;
    std::istringstream in(o->tokens);
    std::string word;
    while (in >> word) {
      size_t used = 0;
      long v = 0;
      try {
        v = std::stol(word, &used);
      } catch (...) {
        used = 0;
      }
      FP_CHECK(used == word.size() && v >= 0 && v <= INT32_MAX, "--tokens: '", word, "' is not a token id");
      ids.push_back(static_cast<int32_t>(v));
    }
    FP_CHECK(!ids.empty(), "--tokens: no token ids given");
    auto model = load_with(o->common);
    const ModelConfig& c = model->config();
    int64_t n = static_cast<int64_t>(ids.size());
    FP_CHECK(n <= c.max_context, "--tokens: ", n, " tokens exceed the model's context of ", c.max_context);
    for (int32_t id : ids) FP_CHECK(id < c.n_vocab, "--tokens: id ", id, " is outside the vocabulary [0, ", c.n_vocab, ")");
    auto cache = model->new_cache(n);
    std::vector<float> logits(static_cast<size_t>(n * c.n_vocab));
    std::vector<int32_t> pos(ids.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
    if (o->incremental) {
      for (int64_t i = 0; i < n; ++i) model->forward(&ids[i], &pos[i], 1, *cache, logits.data() + i * c.n_vocab, false);
    } else {
      model->forward(ids.data(), pos.data(), n, *cache, logits.data(), true);
    }
    if (!is_output_rank()) return;  // tensor parallel: every rank has the same logits; rank 0 writes
    std::ofstream out(o->out, std::ios::binary);
    FP_CHECK(out, o->out, ": cannot open for writing");
    out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
    out.flush();  // a full disk shows here, not in a destructor that cannot report it
    FP_CHECK(out, o->out, ": write failed: ", std::strerror(errno));
    log_info("wrote ", n, " x ", c.n_vocab, " logits to ", o->out);
    log_info(Ledger::global().summary_line());
  });
}

}  // namespace fp::tools
