// core/dtype.h — element types and GGUF block-quantized formats: sizes, names, scalar
// conversions (F16, BF16, FP8-E4M3) and row dequantization/quantization for every format.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>
#include <cstring>
#include <string>

namespace fp {

// Values match GGUF's ggml_type ids where GGUF defines the type, so a GGUF tensor's type
// converts with a range check. F8_E4M3 has no GGUF id; it lives in safetensors checkpoints.
enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ4_NL = 20,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
  MXFP4 = 39,
  F8_E4M3 = 1000,
  // Q8_0 repacked at load for the CPU matmul kernels (BlockQ8_0x8 below); never in a file.
  Q8_0_X8 = 1001,
  // Q4_K repacked at load for the CPU matmul kernels (BlockQ4_Kx8 below); never in a file.
  Q4_K_X8 = 1002,
  // Q6_K repacked at load for the CPU matmul kernels (BlockQ6_Kx8 below); never in a file.
  Q6_K_X8 = 1003,
  // Q4_0 / Q4_1 / Q5_0 / Q5_1 repacked at load, 8 blocks interleaved (BlockQ4_0x8 ... below); never in a file.
  Q4_0_X8 = 1004,
  Q4_1_X8 = 1005,
  Q5_0_X8 = 1006,
  Q5_1_X8 = 1007,
  // Q3_K repacked at load for the CPU matmul kernels (BlockQ3_Kx8 below); never in a file.
  Q3_K_X8 = 1008,
  // Q2_K repacked at load for the CPU matmul kernels (BlockQ2_Kx8 below); never in a file.
  Q2_K_X8 = 1009,
  // IQ4_NL / IQ4_XS repacked at load for the CPU matmul kernels (BlockIQ4_NLx8 / BlockIQ4_XSx8 below); never in a file.
  IQ4_NL_X8 = 1010,
  IQ4_XS_X8 = 1011,
  // Unsigned bytes (safetensors "U8": the blocks and scales of gpt-oss's MXFP4 checkpoints).
  U8 = 1012,
  // MXFP4 repacked at load for the CPU matmul kernels (BlockMXFP4x8 below); never in a file.
  MXFP4_X8 = 1013,
};

struct DTypeInfo {
  const char* name;
  int64_t block_elems;  // elements per block (1 for plain types)
  int64_t block_bytes;  // bytes per block
  bool quantized;       // a GGUF block format
};

const DTypeInfo& dtype_info(DType t);
inline const char* dtype_name(DType t) { return dtype_info(t).name; }
bool dtype_from_gguf(uint32_t gguf_type, DType* out);  // false when unsupported
bool dtype_from_name(const std::string& name, DType* out);  // "f32", "q8_0", "Q4_K", "bf16", ...

// Bytes of a row of n elements; throws when n is not a multiple of the block size.
int64_t row_bytes(DType t, int64_t n);

// ---- scalar conversions -------------------------------------------------------------
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // round to nearest even, overflow to inf
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_bf16(float f);  // round to nearest even, NaN kept quiet
// The same with inputs below the smallest normal float taken as (signed) zero, as x86's
// AVX512-BF16 conversions (vcvtne2ps2bf16) round.
uint16_t f32_to_bf16_daz(float f);
float fp8e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8e4m3(float f);  // round to nearest even, saturating at +-448

// ---- block formats (layouts identical to ggml) -------------------------------------
constexpr int QK8_0 = 32;
constexpr int QK4_0 = 32;
constexpr int QK5_0 = 32;  // also Q4_1 and Q5_1
constexpr int QK_K = 256;

struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[QK8_0];
};
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[QK4_0 / 2];  // low nibbles: elements 0..15, high nibbles: 16..31
};
// Q4_1: value j = d * q + m, q the nibble (low nibbles: elements 0..15, high: 16..31).
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[QK5_0 / 2];
};
// Q5_0: value j = d * (q - 16), q = nibble as Q4_0's | bit j of qh (little-endian u32) << 4.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[QK5_0 / 2];
};
// Q5_1: value j = d * q + m, q as Q5_0's.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[QK5_0 / 2];
};
// Q2_K: 16 groups of 16 values, value = d * (scales[g] & 15) * q - dmin * (scales[g] >> 4), q
// 2 bits: value 128h + 32s + l is bits 2s..2s+1 of qs[32h + l].
struct BlockQ2_K {
  uint8_t scales[QK_K / 16];
  uint8_t qs[QK_K / 4];
  uint16_t d;
  uint16_t dmin;
};
// Q3_K: 16 groups of 16 values, value = d * (scale_g - 32) * (q - (hmask bit clear ? 4 : 0)), q's
// 2 low bits placed as Q2_K's, its high bit = bit (v / 32) of hmask[v % 32]; the 16 six-bit
// scales: low nibbles in bytes 0..7 (groups 0..7 low, 8..15 high nibble), high 2 bits in bytes
// 8..11 (group g: bits 2 (g / 4) of byte 8 + g % 4).
struct BlockQ3_K {
  uint8_t hmask[QK_K / 8];
  uint8_t qs[QK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d;      // super-block scale for the 6-bit scales
  uint16_t dmin;   // super-block scale for the 6-bit mins
  uint8_t scales[12];  // 8 scales and 8 mins, 6 bits each
  uint8_t qs[QK_K / 2];
};
// Q5_K: Q4_K's scales and nibbles, plus a fifth bit per value: sub-block s's value l has bit s
// of qh[l].
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[QK_K / 8];
  uint8_t qs[QK_K / 2];
};
// IQ4_NL: value j = d * kIq4nlValues[q], q the nibble (low nibbles: elements 0..15, high: 16..31):
// Q4_0's layout with 16 non-linear signed levels in place of q - 8.
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[16];
};
// IQ4_XS: 8 blocks of 32 values, value = d * (ls_j - 32) * kIq4nlValues[q]. Block j's six-bit scale
// ls_j: low 4 bits = nibble j % 2 of scales_l[j / 2], high 2 bits = bits 2j..2j+1 of scales_h; its
// nibbles are qs[16j .. 16j + 15], laid out as IQ4_NL's.
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[QK_K / 64];
  uint8_t qs[QK_K / 2];
};
// Block j's signed scale ls_j - 32 (-32..31) of an IQ4_XS super-block.
inline int iq4_xs_scale(const BlockIQ4_XS& b, int j) {
  return (((b.scales_l[j / 2] >> (4 * (j % 2))) & 15) | (((b.scales_h >> (2 * j)) & 3) << 4)) - 32;
}
// MXFP4 (OCP microscaling, gpt-oss's expert weights; GGUF type 39): 32 FP4 E2M1 values sharing a
// power-of-two scale byte e (E8M0). Value j = kMxfp4Values[q] * 2^(e - 128), q the nibble (low
// nibbles: elements 0..15, high: 16..31, as Q4_0). The levels are E2M1's (0, 0.5, 1, 1.5, 2, 3, 4,
// 6 and their negatives) doubled to integers, so the scale is half the E8M0 value 2^(e - 127).
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
struct BlockMXFP4 {
  uint8_t e;
  uint8_t qs[16];
};
// 2^(e - 128) as a float (e = 0 and 1 are subnormal: 2^-128, 2^-127).
inline float mxfp4_half_scale(uint8_t e) {
  uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
struct BlockQ6_K {
  uint8_t ql[QK_K / 2];      // low 4 bits
  uint8_t qh[QK_K / 4];      // high 2 bits
  int8_t scales[QK_K / 16];  // 8-bit scales of 16-element groups
  uint16_t d;
};
// Eight consecutive Q8_0 blocks of one row (256 values), interleaved for 8-lane integer dot
// products: qs[32c + 4j + k] = block j's value 4c + k, plus 128 (so unsigned, 0..255), and d[j]
// = block j's f16 scale. One 32-byte load (chunk c) holds 4 values of each of the 8 blocks, so
// a multiply-accumulate per chunk leaves block j's dot product in int32 lane j. Same bytes as
// the 8 Q8_0 blocks it replaces (8 x 34 = 272), so a row keeps its size; see docs/design.md.
constexpr int QK8_0X8 = 256;
struct BlockQ8_0x8 {
  uint16_t d[8];
  uint8_t qs[QK8_0X8];
};
// One Q4_K super-block (256 values, 8 sub-blocks of 32) rearranged for the same 8-lane integer
// dot products: qs[32t + 4j + k] holds sub-block j's value 4t + k in its low nibble and value
// 16 + 4t + k in its high nibble, so the low (high) nibbles of chunk t line up with chunk t
// (t + 4) of the interleaved activations (kernels/cpu/matmul_interleave.h) and one multiply-
// accumulate per chunk leaves sub-block j's dot product in int32 lane j. The 6-bit scales and
// mins are laid out to unpack with a few vector ops: byte j (0..7) = scale j | (min j >> 4) << 6,
// bytes 8..11 (a little-endian u32) = min j & 15 in bits 4j..4j+3. Same 144 bytes as Q4_K.
struct BlockQ4_Kx8 {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[QK_K / 2];
};
// One Q6_K super-block rearranged the same way. Value v of block j (32 values, 6 bits, q - 32) is
// split into its low 4 and high 2 bits: ql[32t + 4j + k] holds the low bits of values 4t + k (low
// nibble) and 16 + 4t + k (high nibble); qh[32u + 4j + k] holds the high bits of values 8u + k,
// 16 + 8u + k, 8u + 4 + k and 16 + 8u + 4 + k at bits 0, 2, 4, 6 — those of chunks t = 2u and
// 2u + 1, each chunk's low-nibble value first. scales[j] / scales[8 + j] = the scale of block j's
// values 0..15 / 16..31 (Q6_K's scales 2j and 2j + 1). Same 210 bytes as Q6_K.
struct BlockQ6_Kx8 {
  uint8_t ql[QK_K / 2];
  uint8_t qh[QK_K / 4];
  int8_t scales[QK_K / 16];
  uint16_t d;
};
// Eight consecutive blocks of a 32-value format (Q4_0, Q4_1, Q5_0, Q5_1) of one row, interleaved
// as Q4_K_X8's sub-blocks are: qs[32t + 4j + k] = block j's byte 4t + k, whose low nibble is its
// value 4t + k and high nibble its value 16 + 4t + k, so chunk t's low (high) nibbles line up with
// chunk t (t + 4) of the interleaved Q8_0 activations. d[j] / m[j]: block j's scale / minimum.
// Q5: bit c of qh[4j + k] = block j's fifth bit of value 4c + k, so one shift of the 32 bytes and
// a mask put chunk c's fifth bits in place (bit 4 of byte 4j + k). Same bytes as the 8 blocks
// they replace.
struct BlockQ4_0x8 {
  uint16_t d[8];
  uint8_t qs[128];
};
struct BlockQ4_1x8 {
  uint16_t d[8];
  uint16_t m[8];
  uint8_t qs[128];
};
struct BlockQ5_0x8 {
  uint16_t d[8];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ5_1x8 {
  uint16_t d[8];
  uint16_t m[8];
  uint8_t qh[32];
  uint8_t qs[128];
};
// Eight IQ4_NL blocks interleaved as Q4_0's (its nibbles index kIq4nlValues instead of q - 8).
using BlockIQ4_NLx8 = BlockQ4_0x8;
// Eight MXFP4 blocks interleaved as IQ4_NL_X8's (qs[32t + 4j + k] = block j's byte 4t + k, the
// nibbles index kMxfp4Values), their E8M0 scale bytes apart: the same 136 bytes as the 8 blocks.
// An MXFP4_X8 row may end inside a group (gpt-oss's rows are 2880 values: 11 groups and 2 blocks):
// its whole groups are BlockMXFP4x8, its last K % 256 / 32 blocks stay plain BlockMXFP4, so a row
// keeps MXFP4's 17 bytes per 32 values and the dtype's block is MXFP4's (dtype_info).
struct BlockMXFP4x8 {
  uint8_t e[8];
  uint8_t qs[128];
};

// One IQ4_XS super-block with its 8 blocks' nibbles interleaved as BlockQ4_0x8's (qs[32t + 4j + k]
// = block j's byte 4t + k); d and the scales as the file's. Same 136 bytes as IQ4_XS.
struct BlockIQ4_XSx8 {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[QK_K / 64];
  uint8_t qs[QK_K / 2];
};
// One Q3_K super-block rearranged as Q6_K_X8 is (value v of block j: 3 bits q, the weight
// d * scale * (q - 4)): qs[32u + 4j + k] holds the low 2 bits of values 8u + k, 16 + 8u + k,
// 8u + 4 + k and 16 + 8u + 4 + k at bits 0, 2, 4, 6 (chunks 2u and 2u + 1, as Q6_K_X8's qh);
// bit c of hmask[4j + k] = the third bit of value 4c + k. The 16 six-bit scales (stored + 32):
// byte j (0..7) = low 4 bits of block j's scale of values 0..15 | those of its values 16..31 << 4;
// the u32 at scales + 8: their top 2 bits at bits 2j and 16 + 2j. Same 110 bytes as Q3_K.
struct BlockQ3_Kx8 {
  uint8_t qs[QK_K / 4];
  uint8_t hmask[QK_K / 8];
  uint8_t scales[12];
  uint16_t d;
};
// One Q2_K super-block rearranged the same way: qs as Q3_K_X8's plane (the 2-bit values), scales[j]
// / scales[8 + j] = Q2_K's scale byte (scale | min << 4) of block j's values 0..15 / 16..31 (Q2_K's
// groups 2j and 2j + 1). Same 84 bytes as Q2_K.
struct BlockQ2_Kx8 {
  uint8_t qs[QK_K / 4];
  uint8_t scales[QK_K / 16];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_0x8) == 8 * sizeof(BlockQ8_0));
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ4_Kx8) == sizeof(BlockQ4_K));
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ6_Kx8) == sizeof(BlockQ6_K));
static_assert(sizeof(BlockQ4_0x8) == 8 * sizeof(BlockQ4_0) && sizeof(BlockQ4_1x8) == 8 * sizeof(BlockQ4_1));
static_assert(sizeof(BlockQ5_0x8) == 8 * sizeof(BlockQ5_0) && sizeof(BlockQ5_1x8) == 8 * sizeof(BlockQ5_1));
static_assert(sizeof(BlockQ3_Kx8) == sizeof(BlockQ3_K));
static_assert(sizeof(BlockQ2_Kx8) == sizeof(BlockQ2_K));
static_assert(sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136 && sizeof(BlockIQ4_XSx8) == sizeof(BlockIQ4_XS));

// The unsigned values of one block, in order: Q5_0 / Q5_1 (0..31; the weight d * (q - 16) or
// d * q + m), Q5_K (0..31), Q3_K (0..7, the weight d * scale * (q - 4)); Q3_K's 16 scales (-32..31).
void q5_values(const uint8_t* qs, const uint8_t* qh, uint8_t q[32]);
void q5_k_values(const BlockQ5_K& b, uint8_t q[QK_K]);
void q3_k_values(const BlockQ3_K& b, uint8_t q[QK_K]);
void q3_k_scales(const uint8_t* scales, int8_t out[16]);
// Q4_K / Q5_K sub-block j's six-bit scale and min from the 12 scale bytes.
void q4k_scale_min(int j, const uint8_t* scales, uint8_t* sc, uint8_t* m);

// Dequantize n elements of type t starting at src into dst (f32). Plain types convert.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
// Quantize/convert n f32 values into type t at dst (row_bytes(t, n) bytes).
void quantize_row(DType t, const float* src, void* dst, int64_t n);
// The same into a new buffer of row_bytes(t, n) bytes.
std::vector<uint8_t> quantize_to_bytes(DType t, const float* src, int64_t n);

// Q8_0 <-> Q8_0_X8, `groups` groups of 8 blocks; exact both ways. dst may equal src (each
// group is rewritten over the bytes of the blocks it came from).
void pack_q8_0_x8(const BlockQ8_0* src, BlockQ8_0x8* dst, int64_t groups);
void unpack_q8_0_x8(const BlockQ8_0x8* src, BlockQ8_0* dst, int64_t groups);
// Q4_K <-> Q4_K_X8, `blocks` super-blocks; exact both ways; dst may equal src.
void pack_q4_k_x8(const BlockQ4_K* src, BlockQ4_Kx8* dst, int64_t blocks);
void unpack_q4_k_x8(const BlockQ4_Kx8* src, BlockQ4_K* dst, int64_t blocks);
// Q6_K <-> Q6_K_X8, likewise.
void pack_q6_k_x8(const BlockQ6_K* src, BlockQ6_Kx8* dst, int64_t blocks);
void unpack_q6_k_x8(const BlockQ6_Kx8* src, BlockQ6_K* dst, int64_t blocks);

// Q3_K <-> Q3_K_X8, `blocks` super-blocks; exact both ways; dst may equal src.
void pack_q3_k_x8(const BlockQ3_K* src, BlockQ3_Kx8* dst, int64_t blocks);
void unpack_q3_k_x8(const BlockQ3_Kx8* src, BlockQ3_K* dst, int64_t blocks);
// Q2_K <-> Q2_K_X8, likewise.
void pack_q2_k_x8(const BlockQ2_K* src, BlockQ2_Kx8* dst, int64_t blocks);
void unpack_q2_k_x8(const BlockQ2_Kx8* src, BlockQ2_K* dst, int64_t blocks);
// IQ4_XS <-> IQ4_XS_X8, likewise.
void pack_iq4_xs_x8(const BlockIQ4_XS* src, BlockIQ4_XSx8* dst, int64_t blocks);
void unpack_iq4_xs_x8(const BlockIQ4_XSx8* src, BlockIQ4_XS* dst, int64_t blocks);
// Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / MXFP4 <-> their _X8 forms. block32_x8(t): the _X8 form of t (t itself when
// t has none); block32_base(t): the file format of an _X8 form (t itself otherwise).
DType block32_x8(DType t);
DType block32_base(DType t);
inline bool is_block32_x8(DType t) { return block32_base(t) != t; }
// `groups` groups of 8 blocks of type base = block32_base(packed); exact both ways; dst may equal src.
void pack_block32_x8(DType base, const void* src, void* dst, int64_t groups);
void unpack_block32_x8(DType packed, const void* src, void* dst, int64_t groups);
// The formats whose _X8 rows may end inside a group of 256: Q4_0, IQ4_NL, MXFP4 (rows of 1152
// or 2880 values: Gemma 3 1B's, gpt-oss's). Their n < 8 blocks after the last whole group form a
// partial group of the same bytes: the n scales (f16 d, or MXFP4's E8M0 byte), then chunk t < 4 =
// every block's nibble bytes 4t..4t+3 (4n bytes; lane j = block j, as a whole group's chunk),
// which a kernel reads with masked loads. A row keeps its bytes and the dtype's block is the
// base's (32 values).
inline bool block32_x8_takes_tail(DType t) {
  return t == DType::Q4_0 || t == DType::IQ4_NL || t == DType::MXFP4 || t == DType::Q4_0_X8 || t == DType::IQ4_NL_X8 ||
         t == DType::MXFP4_X8;
}
// A row of n values: its whole groups as above, and (block32_x8_takes_tail) the blocks after the
// last whole group as the partial group above; dst may equal src.
void pack_block32_x8_row(DType base, const void* src, void* dst, int64_t n);
void unpack_block32_x8_row(DType packed, const void* src, void* dst, int64_t n);
// A partial group of n < 8 blocks (the tail of a packed row) back as n plain blocks; dst may equal src.
void unpack_block32_x8_tail(DType packed, const void* src, void* dst, int64_t n);

// ggml's Q8_0 quantizer (round half away from zero), used for activations too.
void quantize_row_q8_0(const float* src, BlockQ8_0* dst, int64_t n);

}  // namespace fp
