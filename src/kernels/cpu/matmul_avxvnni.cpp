// kernels/cpu/matmul_avxvnni.cpp — the VNNI matmul kernels (matmul_vnni.cpp) for CPUs with AVX-VNNI
// but no AVX-512 (Intel Alder Lake / Raptor Lake / Meteor Lake / Arrow Lake client cores, Sierra
// Forest; AMD Zen 5 has both): vpdpbusd VEX-encoded on 256-bit registers. Registered as "avxvnni"
// below the AVX-512 one, so where both run the AVX-512 build is chosen and this one is checked
// against the reference beside it (tests) and can be forced (--kernel matmul=avxvnni).
#include <immintrin.h>

#define FP_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#define FP_DPBUSD _mm256_dpbusd_avx_epi32
#define FP_VNNI_NAME "avxvnni"
#define FP_VNNI_FEATURES {"avx2", "fma", "f16c", "avx_vnni"}
#define FP_VNNI_PRIORITY 190
// 3 x 4 prefill tiles, not AVX-512's 4 x 4: with 16 registers the 4 x 4 tile kept its sums on
// the stack (82 ymm stack accesses per group, llvm-mca alderlake 0.84 cycles per vpdpbusd);
// 3 x 4 reads each weight vector for as many tokens and sits at the 0.69 floor (bench/mca_loops.py;
// static counts only: no AVX-VNNI machine has timed it yet).
#define FP_VNNI_TILE_ROWS 3

#include "kernels/cpu/matmul_vnni.cpp"  // NOLINT(bugprone-suspicious-include): the kernels themselves, built for AVX-VNNI
