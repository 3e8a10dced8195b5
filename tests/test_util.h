// tests/test_util.h — helpers shared by the suites: test data paths, file reading,
// running the fastpath binary, random inputs.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/error.h"
#include "core/paths.h"

namespace fp::test {

inline std::string testdata(const std::string& rel) { return testdata_dir() + "/" + rel; }
// True in the sanitizer build (CI's second phase), where the broadest shape sweeps run fewer or
// smaller cases: every kernel and every tail still runs under ASan, the Release run keeps them all.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// The small real model most suites run (relative to the test-data directory).
inline constexpr const char* kStoriesGguf = "models/stories260K/stories260K.gguf";
inline std::string stories_path() { return testdata(kStoriesGguf); }

// Skips the current test (with the reason printed) when a test-data file is missing.
#define FP_REQUIRE_FILE(path)                                                 \
  do {                                                                        \
    if (!::fp::file_exists(path)) GTEST_SKIP() << "test data missing: " << (path); \
  } while (0)

std::string read_file(const std::string& path);
std::vector<float> read_f32_file(const std::string& path);
// Runs a shell command, returns its stdout; *exit_code gets the exit status.
std::string run_command(const std::string& cmd, int* exit_code);
// The fastpath binary the CLI tests run: $FASTPATH_BIN where set (the device check runs the
// tests away from their build tree), else the one built beside them.
inline std::string fastpath_bin() {
  const char* env = std::getenv("FASTPATH_BIN");
  return env && *env ? std::string(env) : std::string(FASTPATH_BINARY);
}
// Loads a model and returns the logits of every position of `ids` fed as one batch ([n, vocab]).
std::vector<float> all_position_logits(const std::string& model_path, const std::vector<int32_t>& ids);
// A golden case's model (tests/golden/hf_cases.json: arch, config, seed, optional type) written by
// synth to `out`: a safetensors directory, or GGUF for *.gguf. Returns out.
std::string write_synth_case(const nlohmann::json& c, const std::string& out);
// A fresh empty directory under the system temp area (/tmp), removed when this process exits.
std::string temp_dir(const std::string& name);
void write_file(const std::string& path, const std::string& bytes);
// max |got - ref| / max |ref|: one figure for how far a result is from its reference.
double rel_err(const std::vector<float>& got, const std::vector<float>& ref);
// Whether this CPU runs the AVX2 kernels (AVX2, FMA and F16C).
bool cpu_has_avx2();

// Runs f and expects an fp::Error whose message contains every needle.
template <class F>
void expect_error(F f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no fp::Error thrown";
  } catch (const Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
  }
}

}  // namespace fp::test
