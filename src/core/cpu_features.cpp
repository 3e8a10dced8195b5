// core/cpu_features.cpp — cpuid leaves 1, 7 (subleaf 0 and 1) and OS support via xgetbv.
#include "core/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>

namespace fp {
namespace {

uint64_t xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

// Built once: kernels' refusals ask has() on every dispatched call (registry.h re-asks a cached
// decision), so a map built per question would cost microseconds per op call.
const std::map<std::string, bool CpuFeatures::*>& feature_fields() {
  static const std::map<std::string, bool CpuFeatures::*> fields{{"sse4.2", &CpuFeatures::sse42},        {"avx", &CpuFeatures::avx},
          {"avx2", &CpuFeatures::avx2},           {"fma", &CpuFeatures::fma},
          {"f16c", &CpuFeatures::f16c},           {"avx512f", &CpuFeatures::avx512f},
          {"avx512bw", &CpuFeatures::avx512bw},   {"avx512vl", &CpuFeatures::avx512vl},
          {"avx512_vnni", &CpuFeatures::avx512_vnni}, {"avx512_bf16", &CpuFeatures::avx512_bf16},
          {"avx_vnni", &CpuFeatures::avx_vnni},   {"amx_int8", &CpuFeatures::amx_int8},
          {"amx_bf16", &CpuFeatures::amx_bf16}};
  return fields;
}

CpuFeatures detect() {
  CpuFeatures f;
  f.logical_cpus = static_cast<int>(std::thread::hardware_concurrency());
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  unsigned max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;
  __get_cpuid(1, &a, &b, &c, &d);
  f.sse42 = c & bit_SSE4_2;
  bool osxsave = c & bit_OSXSAVE;
  uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  bool ymm_os = (xcr0 & 0x6) == 0x6, zmm_os = (xcr0 & 0xe6) == 0xe6, amx_os = (xcr0 & 0x60000) == 0x60000;
  f.avx = (c & bit_AVX) && ymm_os;
  f.fma = (c & bit_FMA) && ymm_os;
  f.f16c = (c & bit_F16C) && ymm_os;
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = (b & bit_AVX2) && ymm_os;
    f.avx512f = (b & bit_AVX512F) && zmm_os;
    f.avx512bw = (b & bit_AVX512BW) && zmm_os;
    f.avx512vl = (b & bit_AVX512VL) && zmm_os;
    f.avx512_vnni = (c & (1u << 11)) && zmm_os;
    f.amx_bf16 = (d & (1u << 22)) && amx_os;
    f.amx_int8 = (d & (1u << 25)) && amx_os;
    __cpuid_count(7, 1, a, b, c, d);
    f.avx_vnni = (a & (1u << 4)) && ymm_os;
    f.avx512_bf16 = (a & (1u << 5)) && zmm_os;
  }
  unsigned ext = 0;
  __get_cpuid(0x80000000, &ext, &b, &c, &d);
  if (ext >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002 + i, &a, &b, &c, &d);
      std::memcpy(brand + 16 * i, &a, 4);
      std::memcpy(brand + 16 * i + 4, &b, 4);
      std::memcpy(brand + 16 * i + 8, &c, 4);
      std::memcpy(brand + 16 * i + 12, &d, 4);
    }
    f.brand = brand;
    while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
  }
  if (const char* off = std::getenv("FASTPATH_CPU_DISABLE")) {
    const auto& fields = feature_fields();
    std::stringstream ss(off);
    std::string name;
    while (std::getline(ss, name, ','))
      if (auto it = fields.find(name); it != fields.end()) f.*(it->second) = false;
  }
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

bool CpuFeatures::has(const std::string& name) const {
  const auto& fields = feature_fields();
  auto it = fields.find(name);
  return it != fields.end() && this->*(it->second);
}

std::string CpuFeatures::missing(std::initializer_list<const char*> names) const {
  std::string lacking;
  for (const char* n : names)
    if (!has(n)) lacking += (lacking.empty() ? "" : ", ") + std::string(n);
  return lacking.empty() ? std::string() : "needs " + lacking + " (this CPU lacks it)";
}

std::string CpuFeatures::describe() const {
  std::string s;
  for (auto& [name, field] : feature_fields())
    if (this->*field) s += (s.empty() ? "" : " ") + name;
  return s;
}

const std::string& amx_tile_permission() {
  static const std::string why = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0) return std::string();
    return std::string("the OS refused AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: ") + std::strerror(errno) + ")";
  }();
  return why;
}

}  // namespace fp
