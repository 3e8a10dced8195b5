// kernels/cpu/amx_tiles.h — the AMX tile configuration the AMX kernels (amxbf16, amx_flash) and
// the ceiling probe share: eight tiles of 16 rows x 64 bytes (palette 1).
#pragma once
#include <cstdint>

// What the AMX kernels are compiled for (AVX-512 with BF16 around the tiles).
#define FP_AMX __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

namespace fp::cpu {

struct AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
// A constant in memory, loaded with _tile_loadconfig(&kAmxTiles): GCC 12 does not see LDTILECFG
// read its operand, and dropped the stores of a configuration built on the stack (the
// instruction then faulted on the garbage).
alignas(64) inline constexpr AmxTileConfig kAmxTiles{};

}  // namespace fp::cpu
