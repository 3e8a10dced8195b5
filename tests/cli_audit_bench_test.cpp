// tests/cli_audit_bench_test.cpp — `audit` prints the ledger and --strict fails on a fallback
// (provoked by masking the CPU's AVX2); `bench --json` has the contract's keys.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/cpu_features.h"
#include "test_util.h"

namespace fp {
namespace {

std::string stories() { return test::testdata("models/stories260K/stories260K.gguf"); }

TEST(CliAudit, PrintsTheLedgerAndStrictPassesWithoutFallbacks) {
  FP_REQUIRE_FILE(stories());
  int rc = -1;
  std::string out = test::run_command(test::fastpath_bin() + " audit -q --strict -m " + stories(), &rc);
  EXPECT_EQ(rc, 0) << out;
  for (const char* op : {"matmul", "attention", "rmsnorm", "rope", "silu_mul", "embedding", "add"})
    EXPECT_NE(out.find(op), std::string::npos) << op << "\n" << out;
  EXPECT_NE(out.find("0 fallbacks"), std::string::npos) << out;
}

TEST(CliAudit, StrictFailsWhenAFastKernelIsRefused) {
  FP_REQUIRE_FILE(stories());
  if (!cpu_features().missing({"avx2"}).empty()) GTEST_SKIP() << "no AVX2 kernels to refuse on this CPU";
  int rc = -1;
  std::string out = test::run_command("FASTPATH_CPU_DISABLE=avx2 " + test::fastpath_bin() + " audit --strict -m " + stories() + " 2>&1", &rc);
  EXPECT_EQ(rc, 3) << out;
  EXPECT_NE(out.find("FALLBACK"), std::string::npos) << out;
  EXPECT_NE(out.find("needs avx2"), std::string::npos) << out;
  // The JSON ledger says the same.
  out = test::run_command("FASTPATH_CPU_DISABLE=avx2 " + test::fastpath_bin() + " audit -q --json -m " + stories(), &rc);
  EXPECT_EQ(rc, 0);
  auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_FALSE(j["fallbacks"].empty());
}

TEST(CliAudit, ForcedKernelThatCannotRunIsAnError) {
  FP_REQUIRE_FILE(stories());
  if (!cpu_features().missing({"avx2"}).empty()) GTEST_SKIP() << "needs AVX2";
  int rc = -1;
  std::string out = test::run_command("FASTPATH_CPU_DISABLE=avx2 " + test::fastpath_bin() + " audit --kernel matmul=avx2 -m " + stories() + " 2>&1", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("was forced but cannot run"), std::string::npos) << out;
}

TEST(CliBench, JsonHasTheContractKeys) {
  FP_REQUIRE_FILE(stories());
  int rc = -1;
  std::string out = test::run_command(test::fastpath_bin() + " bench -q --json -p 32 -n 8 -r 2 --warmup 0 -m " + stories(), &rc);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  for (const char* k : {"prefill_tps", "decode_tps", "prefill_ceiling_fraction", "decode_ceiling_fraction"}) {
    ASSERT_TRUE(j.contains(k)) << k;
    EXPECT_GT(j[k].get<double>(), 0.0) << k;
  }
  out = test::run_command(test::fastpath_bin() + " bench -q -b 4 -m " + stories() + " 2>&1", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("--batch 4"), std::string::npos) << out;
}

}  // namespace
}  // namespace fp
