// tests/registry_test.cpp — dispatch order, refusal reasons, forcing, and the ledger.
#include <gtest/gtest.h>

#include <string>

#include "kernels/ledger.h"
#include "kernels/registry.h"

namespace fp {
namespace {

// A private op so the test controls every kernel it has.
struct ToyArgs {
  static constexpr const char* kName = "toy";
  int width = 0;
  int* ran = nullptr;  // which kernel ran: 0 ref, 1 fast, 2 faster
  std::string shape_class() const { return "w=" + std::to_string(width); }
};

const bool toy_registered = [] {
  register_kernel(Kernel<ToyArgs>{"ref", Backend::CPU, 0, true, nullptr, [](const ToyArgs& a) { *a.ran = 0; }});
  register_kernel(Kernel<ToyArgs>{"fast", Backend::CPU, 10, false,
                                  [](const ToyArgs& a) { return a.width % 8 ? std::string("width not a multiple of 8") : std::string(); },
                                  [](const ToyArgs& a) { *a.ran = 1; }});
  register_kernel(Kernel<ToyArgs>{"faster", Backend::CPU, 20, false,
                                  [](const ToyArgs&) { return std::string("needs AVX-512 (CPU lacks avx512f)"); },
                                  [](const ToyArgs& a) { *a.ran = 2; }});
  return true;
}();

const LedgerEntry* find_entry(const std::vector<LedgerEntry>& es, const std::string& cls) {
  for (auto& e : es)
    if (e.op == "toy" && e.shape_class == cls) return &e;
  return nullptr;
}

TEST(Registry, PicksBestKernelThatAcceptsAndRecordsRefusals) {
  Ledger::global().reset();
  int ran = -1;
  dispatch(ToyArgs{16, &ran});
  EXPECT_EQ(ran, 1);
  dispatch(ToyArgs{16, &ran});
  dispatch(ToyArgs{12, &ran});
  EXPECT_EQ(ran, 0);
  auto es = Ledger::global().snapshot();
  const LedgerEntry* e16 = find_entry(es, "w=16");
  ASSERT_TRUE(e16);
  EXPECT_EQ(e16->kernel, "fast");
  EXPECT_EQ(e16->calls, 2u);
  ASSERT_EQ(e16->refused.size(), 1u);
  EXPECT_EQ(e16->refused[0].first, "faster");
  EXPECT_NE(e16->refused[0].second.find("AVX-512"), std::string::npos);
  EXPECT_FALSE(e16->fallback());
  const LedgerEntry* e12 = find_entry(es, "w=12");
  ASSERT_TRUE(e12);
  EXPECT_EQ(e12->kernel, "ref");
  EXPECT_TRUE(e12->fallback()) << "the reference ran although faster kernels exist";
  ASSERT_EQ(e12->refused.size(), 2u);
  EXPECT_NE(Ledger::global().table().find("FALLBACK"), std::string::npos);
  auto fb = Ledger::global().fallbacks();
  ASSERT_EQ(fb.size(), 1u);
  EXPECT_NE(fb[0].find("w=12"), std::string::npos);
  EXPECT_NE(Ledger::global().json().find("\"fallback\": true"), std::string::npos);
}

TEST(Registry, ForcedKernelRunsOrFailsWithReason) {
  Ledger::global().reset();
  int ran = -1;
  KernelOverrides::global().force("toy", "ref");
  dispatch(ToyArgs{16, &ran});
  EXPECT_EQ(ran, 0);
  auto es = Ledger::global().snapshot();
  ASSERT_TRUE(find_entry(es, "w=16"));
  EXPECT_TRUE(find_entry(es, "w=16")->forced);
  EXPECT_FALSE(find_entry(es, "w=16")->fallback());
  KernelOverrides::global().force("toy", "fast");
  try {
    dispatch(ToyArgs{12, &ran});
    FAIL() << "a forced kernel that cannot run must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("width not a multiple of 8"), std::string::npos) << e.what();
  }
  KernelOverrides::global().clear();
  EXPECT_THROW(KernelOverrides::global().force("toy", "nope"), Error);
  EXPECT_THROW(KernelOverrides::global().force("nope", "ref"), Error);
}

TEST(Registry, ProfilingAccumulatesTime) {
  Ledger::global().reset();
  Ledger::global().set_profiling(true);
  int ran = -1;
  for (int i = 0; i < 3; ++i) dispatch(ToyArgs{8, &ran});
  Ledger::global().set_profiling(false);
  auto es = Ledger::global().snapshot();
  ASSERT_TRUE(find_entry(es, "w=8"));
  EXPECT_EQ(find_entry(es, "w=8")->calls, 3u);
  EXPECT_NE(Ledger::global().summary_line().find("toy=fast"), std::string::npos);
}

}  // namespace
}  // namespace fp
