// core/cpu_affinity.cpp — reading and setting the affinity mask (sched_getaffinity /
// sched_setaffinity on the calling thread).
#include "core/cpu_affinity.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <string>
#include <vector>

namespace fp {

int CpuSet::count() const {
  int n = 0;
  for (uint64_t w : words) n += std::popcount(w);
  return n;
}

void CpuSet::add(int cpu) {
  if (cpu >= 0 && cpu < 64 * kWords) words[cpu / 64] |= uint64_t{1} << (cpu % 64);
}

CpuSet& CpuSet::operator|=(const CpuSet& o) {
  for (int i = 0; i < kWords; ++i) words[i] |= o.words[i];
  return *this;
}

bool CpuSet::operator==(const CpuSet& o) const { return std::equal(words, words + kWords, o.words); }

std::string CpuSet::text() const {
  std::string s;
  for (int c = 0; c < 64 * kWords; ++c) {
    if (!has(c)) continue;
    int e = c;
    while (has(e + 1)) ++e;
    if (!s.empty()) s += ',';
    s += std::to_string(c);
    if (e > c) {
      s += '-';
      s += std::to_string(e);
    }
    c = e;
  }
  return s.empty() ? "none" : s;
}

int online_cpus() { return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN))); }

CpuSet thread_cpus() {
  CpuSet out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < 64 * CpuSet::kWords && c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out.add(c);
  }
  if (out.count() == 0)
    for (int c = 0; c < online_cpus(); ++c) out.add(c);
  return out;
}

bool set_thread_cpus(const CpuSet& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c = 0; c < 64 * CpuSet::kWords && c < CPU_SETSIZE; ++c)
    if (cpus.has(c)) CPU_SET(c, &set);
  return sched_setaffinity(0, sizeof set, &set) == 0;
}

int threads_for_rank(int requested, int local_ranks, int sharing, const CpuSet& cpus, int online,
                     std::vector<std::string>* warnings) {
  const int mine = std::max(1, cpus.count()), ranks = std::max(1, local_ranks);
  const int sharers = std::clamp(sharing, 1, ranks), per_rank = std::max(1, mine / sharers);
  const int threads = requested > 0 ? requested : per_rank;
  if (!warnings) return threads;
  const std::string where = std::to_string(mine) + " CPU(s) (" + cpus.text() + ")";
  const int share = std::max(1, online / ranks);
  if (ranks > 1 && sharers == 1 && mine < share)
    warnings->push_back("this rank may run on " + where + " of this machine's " + std::to_string(online) + ", shared by " +
                        std::to_string(ranks) + " ranks: its launcher bound it (mpirun binds each rank to one core when it "
                        "starts two or fewer). For each rank's share of " + std::to_string(share) +
                        ": mpirun --bind-to none, or --map-by slot:PE=" + std::to_string(share));
  if (threads > per_rank)
    warnings->push_back(std::to_string(threads) + " threads on " + where + ", this process's affinity" +
                        (sharers > 1 ? ", shared with " + std::to_string(sharers - 1) + " other rank(s)" : std::string()) +
                        ": they take turns. Fewer threads (-t " + std::to_string(per_rank) +
                        "), or a wider binding (mpirun --bind-to none / --map-by slot:PE=" + std::to_string(threads) +
                        "; taskset)");
  return threads;
}

}  // namespace fp
