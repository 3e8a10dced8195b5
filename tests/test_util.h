// tests/test_util.h — helpers shared by the suites: test data paths, file reading,
// running the fastpath binary, random inputs.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/paths.h"

namespace fp::test {

inline std::string testdata(const std::string& rel) { return testdata_dir() + "/" + rel; }

// Skips the current test (with the reason printed) when a test-data file is missing.
#define FP_REQUIRE_FILE(path)                                                 \
  do {                                                                        \
    if (!::fp::file_exists(path)) GTEST_SKIP() << "test data missing: " << (path); \
  } while (0)

std::string read_file(const std::string& path);
std::vector<float> read_f32_file(const std::string& path);
// Runs a shell command, returns its stdout; *exit_code gets the exit status.
std::string run_command(const std::string& cmd, int* exit_code);
inline std::string fastpath_bin() { return FASTPATH_BINARY; }
// Loads a model and returns the logits of every position of `ids` fed as one batch ([n, vocab]).
std::vector<float> all_position_logits(const std::string& model_path, const std::vector<int32_t>& ids);
// A fresh empty directory under the build's temp area.
std::string temp_dir(const std::string& name);

}  // namespace fp::test
