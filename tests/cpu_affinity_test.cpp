// tests/cpu_affinity_test.cpp — the CPUs a process may run on (core/cpu_affinity.h): the set's
// text and arithmetic, the default thread count following the calling thread's mask (and the
// pool's new threads inheriting it), and the thread count of a rank with the warnings a user
// gets when a launcher's binding would leave threads taking turns on one core.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "core/cpu_affinity.h"
#include "core/thread_pool.h"

namespace fp {
namespace {

CpuSet cpus_of(std::initializer_list<int> ids) {
  CpuSet s;
  for (int c : ids) s.add(c);
  return s;
}

TEST(CpuAffinity, SetTextCountAndUnion) {
  EXPECT_EQ(CpuSet{}.text(), "none");
  EXPECT_EQ(cpus_of({0}).text(), "0");
  EXPECT_EQ(cpus_of({0, 1, 2, 3, 8, 10, 11, 1023}).text(), "0-3,8,10-11,1023");
  EXPECT_EQ(cpus_of({0, 1, 2, 3, 8, 10, 11, 1023}).count(), 8);
  CpuSet u = cpus_of({0, 5});
  u |= cpus_of({1, 5, 64});
  EXPECT_EQ(u.text(), "0-1,5,64");
  EXPECT_TRUE(u == cpus_of({64, 5, 1, 0}));
  EXPECT_FALSE(u == cpus_of({0, 1, 5}));
  EXPECT_FALSE(cpus_of({2000}).has(2000)) << "ids past the set are ignored";
}

TEST(CpuAffinity, DefaultThreadsFollowTheCallingThreadsMask) {
  const CpuSet all = thread_cpus();
  ASSERT_GE(all.count(), 1);
  EXPECT_LE(all.count(), online_cpus());
  EXPECT_EQ(default_num_threads(), all.count());
  if (all.count() < 2) GTEST_SKIP() << "this process may run on one CPU (" << all.text() << "): nothing to narrow";
  int first = 0;
  while (!all.has(first)) ++first;
  ASSERT_TRUE(set_thread_cpus(cpus_of({first})));
  EXPECT_EQ(thread_cpus().text(), std::to_string(first));
  EXPECT_EQ(default_num_threads(), 1);
  // A pool made now has workers bound like this thread: each sees the one CPU.
  set_num_threads(2);
  std::atomic<int> narrowed{0};
  thread_pool().parallel_for(2, 1, [&](int64_t, int64_t) { narrowed += thread_cpus().count() == 1; });
  EXPECT_EQ(narrowed.load(), 2);
  ASSERT_TRUE(set_thread_cpus(all));
  set_num_threads(default_num_threads());
  EXPECT_EQ(default_num_threads(), all.count());
}

TEST(CpuAffinity, ThreadsForARankAndWhatItIsTold) {
  std::vector<std::string> why;
  CpuSet machine;
  for (int c = 0; c < 16; ++c) machine.add(c);
  // One process: its mask.
  EXPECT_EQ(threads_for_rank(0, 1, 1, machine, 16, &why), 16);
  EXPECT_EQ(threads_for_rank(0, 1, 1, cpus_of({2, 3, 4, 5}), 16, &why), 4) << "taskset -c 2-5";
  EXPECT_TRUE(why.empty());
  // Two ranks not bound (mpirun --bind-to none): both may use every CPU, each takes half.
  EXPECT_EQ(threads_for_rank(0, 2, 2, machine, 16, &why), 8);
  // ... inside taskset -c 0-3 (or a container's cpuset): half of those 4, not half of the machine.
  EXPECT_EQ(threads_for_rank(0, 2, 2, cpus_of({0, 1, 2, 3}), 16, &why), 2);
  EXPECT_TRUE(why.empty());
  // Two ranks bound to a core each (mpirun's default for -np 2): one thread, and why.
  EXPECT_EQ(threads_for_rank(0, 2, 1, cpus_of({1}), 16, &why), 1);
  ASSERT_EQ(why.size(), 1u);
  EXPECT_NE(why[0].find("1 CPU(s) (1) of this machine's 16, shared by 2 ranks"), std::string::npos) << why[0];
  EXPECT_NE(why[0].find("--bind-to none, or --map-by slot:PE=8"), std::string::npos) << why[0];
  why.clear();
  // The same with -t 8: eight threads on one core, said too.
  EXPECT_EQ(threads_for_rank(8, 2, 1, cpus_of({1}), 16, &why), 8) << "an explicit count is kept";
  ASSERT_EQ(why.size(), 2u);
  EXPECT_NE(why[1].find("8 threads on 1 CPU(s) (1)"), std::string::npos) << why[1];
  why.clear();
  // -t 4 on each of two unbound ranks of a 4-CPU mask: 8 threads on 4 CPUs.
  EXPECT_EQ(threads_for_rank(4, 2, 2, cpus_of({0, 1, 2, 3}), 16, &why), 4);
  ASSERT_EQ(why.size(), 1u);
  EXPECT_NE(why[0].find("shared with 1 other rank(s): they take turns. Fewer threads (-t 2)"), std::string::npos) << why[0];
  why.clear();
  // Two ranks on a 2-CPU machine, one core each: exactly their share, nothing to say.
  EXPECT_EQ(threads_for_rank(0, 2, 1, cpus_of({0}), 2, &why), 1);
  EXPECT_TRUE(why.empty());
  EXPECT_EQ(threads_for_rank(0, 3, 3, cpus_of({0, 1}), 2, nullptr), 1) << "more ranks than CPUs: one thread each";
}

}  // namespace
}  // namespace fp
