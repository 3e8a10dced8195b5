// fuzz/fuzz_tokenizer_json.cpp — libFuzzer target for the Hugging Face tokenizer.json loader: the
// input goes to a private temp directory (no tokenizer_config.json beside it), then, when it loads,
// a short string is encoded and decoded. fp::Error is the expected outcome of bad input.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace {
const std::string& input_path() {
  static const std::string path = [] {
    static char tmpl[] = "/tmp/fuzz_tokenizer_json.XXXXXX";
    if (!mkdtemp(tmpl)) abort();
    atexit([] {
      unlink((std::string(tmpl) + "/tokenizer.json").c_str());
      rmdir(tmpl);
    });
    return std::string(tmpl) + "/tokenizer.json";
  }();
  return path;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = input_path();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out) abort();
  }
  try {
    auto tok = fp::Tokenizer::from_hf_json(path);
    for (bool special : {false, true}) {
      auto ids = tok->encode("Hello wörld <|endoftext|> 1234\n\t!!", special, special);
      (void)tok->decode(ids, special);
      fp::StreamDecoder sd(*tok);
      for (auto id : ids) (void)sd.push(id);
      (void)sd.flush();
    }
  } catch (const fp::Error&) {
  }
  return 0;
}
