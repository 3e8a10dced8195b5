// core/cpu_affinity.h — the CPUs this process may run on: its affinity mask, as a launcher set it
// (`mpirun` binds each rank to one core by default when it starts two ranks or fewer; `taskset`,
// cgroups' cpusets). Thread counts follow the mask, not the machine's CPU count: eight threads on
// a rank that may use one CPU take turns on it, a slow path nothing else would show.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fp {

// A set of CPU ids 0..1023 (Linux's default cpu_set_t), plain bits so ranks can exchange it.
struct CpuSet {
  static constexpr int kWords = 16;
  uint64_t words[kWords] = {};
  int count() const;
  bool has(int cpu) const { return cpu >= 0 && cpu < 64 * kWords && (words[cpu / 64] >> (cpu % 64) & 1); }
  void add(int cpu);
  CpuSet& operator|=(const CpuSet& o);
  bool operator==(const CpuSet& o) const;
  std::string text() const;  // "0-3,8,10-11"
};

// The calling thread's affinity mask (threads started from it inherit it). Where it cannot be
// read, every online CPU.
CpuSet thread_cpus();
// Sets the calling thread's mask; false (errno kept) when the kernel refuses it.
bool set_thread_cpus(const CpuSet& cpus);
// CPUs online on this machine, whatever the mask.
int online_cpus();

// The kernels' thread count for a process allowed `cpus` of this machine's `online` CPUs, one of
// `local_ranks` ranks here, `sharing` of which (itself included) may run on CPUs of its mask: 1
// when each rank has CPUs of its own (mpirun's per-core binding), all of them when none is bound.
// `requested` when > 0, else the mask's CPUs divided among the ranks sharing them. `warnings`
// (when given) receives what a user should know: ranks bound to fewer CPUs than their share of
// the machine, or more threads than the CPUs they have (threads taking turns on a core, a slow
// path nothing else would show).
int threads_for_rank(int requested, int local_ranks, int sharing, const CpuSet& cpus, int online,
                     std::vector<std::string>* warnings);

}  // namespace fp
