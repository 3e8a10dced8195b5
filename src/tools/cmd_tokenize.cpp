// tools/cmd_tokenize.cpp — `fastpath tokenize`: UTF-8 text on stdin, token ids on stdout.
#include <iostream>
#include <iterator>

#include "core/error.h"
#include "core/paths.h"
#include "formats/gguf.h"
#include "model/model_file.h"
#include "tools/common.h"

namespace fp::tools {

void add_tokenize(CLI::App& app) {
  struct Opts {
    std::string model;
    std::string tokenizer;
    bool no_special = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("tokenize", "read UTF-8 text on stdin, print its token ids space-separated");
  cmd->add_option("-m,--model", o->model, "a GGUF file, a tokenizer.json, a model directory, or a llama2.c .bin")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.bin for a llama2.c checkpoint");
  cmd->add_flag("--no-special", o->no_special, "no BOS/EOS and no special-token parsing in the text");
  cmd->callback([o] {
    std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    std::unique_ptr<Tokenizer> owned;
    std::unique_ptr<ModelFile> mf;
    const Tokenizer* tok = nullptr;
    const std::string& p = o->model;
    if (p.size() > 4 && p.compare(p.size() - 4, 4, ".bin") == 0) {
      LoadOptions lo;
      lo.tokenizer_path = o->tokenizer;
      lo.prefault = false;
      mf = load_model_file(p, lo);
      tok = mf->tokenizer.get();
      FP_CHECK(tok, p, ": no tokenizer found (pass --tokenizer)");
    } else {
      owned = Tokenizer::from_path(p);
      tok = owned.get();
    }
    auto ids = tok->encode(text, !o->no_special, !o->no_special);
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
    std::cout << out << "\n";
  });
}

}  // namespace fp::tools
