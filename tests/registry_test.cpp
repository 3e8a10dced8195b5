// tests/registry_test.cpp — dispatch order, refusal reasons, forcing, and the ledger.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "kernels/ledger.h"
#include "kernels/registry.h"
#include "kernels/timed_choice.h"

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

// An op whose shape class misses what its fast kernel refuses on (the row width's tail): the
// first call decides for the whole class, a later call of the same class that the kernel
// refuses must not run on it. It is decided apart, under a class naming the gap.
struct GapArgs {
  static constexpr const char* kName = "toy_gap";
  int width = 0;
  int* ran = nullptr;  // 0 ref, 1 chunked
  std::string shape_class() const { return "one class"; }
};

const bool gap_registered = [] {
  register_kernel(Kernel<GapArgs>{"ref", Backend::CPU, 0, true, nullptr, [](const GapArgs& a) { *a.ran = 0; }});
  register_kernel(Kernel<GapArgs>{"chunked", Backend::CPU, 10, false,
                                  [](const GapArgs& a) { return a.width % 8 ? "width " + std::to_string(a.width) + " not a multiple of 8" : std::string(); },
                                  [](const GapArgs& a) { *a.ran = 1; }});
  return true;
}();

TEST(Registry, ACachedDecisionNeverRunsOnACallItsKernelRefuses) {
  Ledger::global().reset();
  int ran = -1;
  for (int width : {64, 172, 64, 172, 20}) {
    dispatch(GapArgs{width, &ran});
    EXPECT_EQ(ran, width % 8 ? 0 : 1) << "width " << width;
  }
  std::map<std::string, const LedgerEntry*> by_class;
  const auto es = Ledger::global().snapshot();
  for (const auto& e : es)
    if (e.op == "toy_gap") by_class[e.shape_class] = &e;
  ASSERT_EQ(by_class.size(), 3u);  // the class, and one apart per refusal reason (172, 20)
  ASSERT_TRUE(by_class.count("one class"));
  EXPECT_EQ(by_class["one class"]->kernel, "chunked");
  EXPECT_EQ(by_class["one class"]->calls, 2u);
  const std::string apart = "one class | chunked refuses: width 172 not a multiple of 8";
  ASSERT_TRUE(by_class.count(apart));
  EXPECT_EQ(by_class[apart]->kernel, "ref");
  EXPECT_EQ(by_class[apart]->calls, 2u);
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


// A second private op for timed choices: "panels" (timed, ranked first) sleeps when `slow_panels`,
// "tiles" when not, so which one is faster is set by the call; "picky" ranks between them and
// refuses every call; runs[] counts each kernel's runs.
struct TimedToyArgs {
  static constexpr const char* kName = "toy_timed";
  bool slow_panels = true;
  int* ran = nullptr;   // 1 panels, 2 tiles
  int* runs = nullptr;  // [3]: ref, panels, tiles
  bool raced = true;    // panels' timed_for: false, as for calls whose rivals compute other numerics
  std::string shape_class() const { return std::string(slow_panels ? "slow panels" : "fast panels") + (raced ? "" : " unraced"); }
};

void nap(const TimedToyArgs& a, bool slow) {
  if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

const bool timed_toy_registered = [] {
  register_kernel(Kernel<TimedToyArgs>{"ref", Backend::CPU, 0, true, nullptr, [](const TimedToyArgs& a) {
                                         *a.ran = 0, ++a.runs[0];
                                       }});
  register_kernel(Kernel<TimedToyArgs>{"tiles", Backend::CPU, 10, false, nullptr, [](const TimedToyArgs& a) {
                                         nap(a, !a.slow_panels), *a.ran = 2, ++a.runs[2];
                                       }});
  register_kernel(Kernel<TimedToyArgs>{"picky", Backend::CPU, 15, false,
                                       [](const TimedToyArgs&) { return std::string("never runs"); }, nullptr});
  Kernel<TimedToyArgs> panels{"panels", Backend::CPU, 20, false, nullptr, [](const TimedToyArgs& a) {
                                nap(a, a.slow_panels), *a.ran = 1, ++a.runs[1];
                              }};
  panels.timed = true;
  panels.timed_for = [](const TimedToyArgs& a) { return a.raced; };
  register_kernel(panels);
  return true;
}();

// The timed choices go to a file of this test's own, away from other test processes, removed
// (and XDG_CACHE_HOME restored) at the end.
class PrivateChoiceFile {
 public:
  PrivateChoiceFile() {
    if (const char* old = std::getenv("XDG_CACHE_HOME")) old_ = old, had_ = true;
    std::filesystem::create_directories(dir_);
    ::setenv("XDG_CACHE_HOME", dir_.c_str(), 1);
  }
  std::string path() const { return dir_ + "/fastpath/kernel_choices.json"; }
  ~PrivateChoiceFile() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    if (had_) ::setenv("XDG_CACHE_HOME", old_.c_str(), 1);
    else ::unsetenv("XDG_CACHE_HOME");
  }
 private:
  std::string dir_ = (std::filesystem::temp_directory_path() / ("fp-registry-test-" + std::to_string(::getpid()))).string();
  std::string old_;
  bool had_ = false;
};

const LedgerEntry* find_timed(const std::string& cls) {
  static std::vector<LedgerEntry> es;
  es = Ledger::global().snapshot();
  for (auto& e : es)
    if (e.op == "toy_timed" && e.shape_class == cls) return &e;
  return nullptr;
}

TEST(Registry, TimedKernelRacesItsRivalOnceAndTheFasterOneStays) {
  PrivateChoiceFile file;
  Ledger::global().reset();
  int ran = -1, runs[3] = {0, 0, 0};
  dispatch(TimedToyArgs{true, &ran, runs});
  EXPECT_EQ(ran, 2) << "the slow timed kernel lost: the rival's output is the call's";
  EXPECT_EQ(runs[1], 2) << "the timed kernel ran twice";
  EXPECT_EQ(runs[2], 2) << "the rival ran twice, the second time last (its output stays)";
  dispatch(TimedToyArgs{true, &ran, runs});
  EXPECT_EQ(runs[1], 2) << "decided: no more timing";
  EXPECT_EQ(runs[2], 3);
  const LedgerEntry* e = find_timed("slow panels");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kernel, "tiles");
  EXPECT_EQ(e->calls, 2u);
  EXPECT_NE(e->timing.find("tiles"), std::string::npos) << e->timing;
  EXPECT_NE(e->timing.find("timed in this run"), std::string::npos) << e->timing;
  ASSERT_EQ(e->refused.size(), 2u) << "panels lost, and picky ranks above the winner now (best ranked first)";
  EXPECT_EQ(e->refused[0].first, "panels");
  EXPECT_NE(e->refused[0].second.find("slower"), std::string::npos);
  EXPECT_EQ(e->refused[1].first, "picky");
  EXPECT_FALSE(e->fallback());
  EXPECT_NE(Ledger::global().table().find("chosen by timing"), std::string::npos);

  // Where the timed kernel is faster it keeps its rank; picky, ranked below it, is not listed.
  dispatch(TimedToyArgs{false, &ran, runs});
  EXPECT_EQ(ran, 1) << "the winner ran once more after the rival, for the output";
  EXPECT_EQ(runs[1], 2 + 3);
  e = find_timed("fast panels");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kernel, "panels");
  ASSERT_EQ(e->refused.size(), 1u);
  EXPECT_EQ(e->refused[0].first, "tiles");

  // A later process (here: forgotten decisions) takes the stored choice without timing.
  Ledger::global().reset();
  const int panels_runs = runs[1];
  dispatch(TimedToyArgs{true, &ran, runs});
  EXPECT_EQ(ran, 2);
  EXPECT_EQ(runs[1], panels_runs) << "the stored choice needs no timing";
  e = find_timed("slow panels");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kernel, "tiles");
  EXPECT_NE(e->timing.find("stored in"), std::string::npos) << e->timing;

  // --kernel decides outright: no timing, no rival.
  KernelOverrides::global().force("toy_timed", "panels");
  dispatch(TimedToyArgs{true, &ran, runs});
  EXPECT_EQ(ran, 1);
  EXPECT_TRUE(find_timed("slow panels")->forced);
  EXPECT_TRUE(find_timed("slow panels")->timing.empty());
  KernelOverrides::global().clear();

  // Forgotten on disk too: timed again.
  forget_timed_choices();
  Ledger::global().reset();
  dispatch(TimedToyArgs{true, &ran, runs});
  EXPECT_EQ(runs[1], panels_runs + 1 + 2);
  EXPECT_NE(find_timed("slow panels")->timing.find("timed in this run"), std::string::npos);

  // A damaged file is no error: the choice is timed again and the file rewritten whole.
  for (const char* damaged : {"{\"truncated", "[1, 2]", "{\"Intel | 2 threads\": 7}"}) {
    std::ofstream(file.path()) << damaged;
    Ledger::global().reset();
    EXPECT_NO_THROW(dispatch(TimedToyArgs{true, &ran, runs})) << damaged;
    EXPECT_EQ(ran, 2) << damaged;
  }
  Ledger::global().reset();
  const int before = runs[1];
  dispatch(TimedToyArgs{true, &ran, runs});
  EXPECT_EQ(runs[1], before) << "the rewritten file holds the choice";

  // A call its timed_for turns down is not raced: the kernel keeps its rank, slow or not.
  Ledger::global().reset();
  const int panels_before = runs[1], tiles_before = runs[2];
  dispatch(TimedToyArgs{true, &ran, runs, false});
  dispatch(TimedToyArgs{true, &ran, runs, false});
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(runs[1], panels_before + 2);
  EXPECT_EQ(runs[2], tiles_before) << "the rival never ran";
  e = find_timed("slow panels unraced");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kernel, "panels");
  EXPECT_TRUE(e->timing.empty()) << e->timing;
}

}  // namespace
}  // namespace fp
