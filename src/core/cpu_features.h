// core/cpu_features.h — run-time CPU feature detection (cpuid + xgetbv), the facts kernels
// check in their `refuse` answers. FASTPATH_CPU_DISABLE=avx2,fma,... masks features off
// (to test the fallbacks on a machine that has them).
#pragma once
#include <string>

namespace fp {

struct CpuFeatures {
  bool sse42 = false, avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512_vnni = false, avx512_bf16 = false;
  bool avx_vnni = false, amx_int8 = false, amx_bf16 = false;
  std::string vendor, brand;
  int logical_cpus = 1;

  std::string describe() const;  // "AVX2 FMA F16C ..." in one line
  // "" when every named feature is present, else "needs X (CPU lacks x)".
  std::string missing(std::initializer_list<const char*> names) const;
  bool has(const std::string& name) const;
};

// Linux hands a process the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA), once, for all its threads. Asks on the first call; "" when granted, else
// why not (the AMX kernels refuse with it).
const std::string& amx_tile_permission();

const CpuFeatures& cpu_features();

}  // namespace fp
