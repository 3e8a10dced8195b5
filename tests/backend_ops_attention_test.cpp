// tests/backend_ops_attention_test.cpp — every attention kernel against the reference over
// head dims 8/16/64/96/128 (and v_dim != head_dim), GQA ratios 1/2/4/8, decode (n = 1) from
// kv_len 1 to long contexts (with and without KV splits), prefill from position 0 and after a
// cached prefix (pos[0] > 0), block-boundary lengths (63/64/65), positions beyond kv_len,
// unordered positions, an empty cache and n = 0 — each with the KV pool in F32, F16 and BF16
// (the reference reads the same half-width pool, so only the arithmetic differs).
//
// Tolerance 2e-5 (normalised error): the fast kernel scales q before the dot products, sums
// in a different order, uses a polynomial exp (<= 2.3e-7 relative) and normalizes once at the
// end instead of per weight. amx_flash (BF16 products on AMX tiles for prefill-like sequences)
// is compared with its twin `ref_bf16` instead (kAmxTolerance below); amx_flash_x3 (an F16
// cache's prefill in two-part BF16 products) with the f32 reference at kX3Tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "backend_ops.h"
#include "core/cpu_features.h"
#include "kernels/ops.h"

namespace fp {
namespace {

struct AttnCase {
  int64_t n, heads, kv_heads, hd, vd, kv_len;
  int32_t pos0;          // pos[i] = pos0 + i, unless shuffled
  bool shuffled = false;  // positions in a scrambled order with gaps
  float scale = 0;        // 0: 1/sqrt(hd)
  int64_t page_size = 16;
  // Extra sequences in the same batch: (n, kv_len, pos0) each.
  std::vector<std::array<int64_t, 3>> more = {};
  DType kv = DType::F32;  // the pool's element type
  int64_t window = 0;     // gpt-oss: sliding window (0: none)
  int64_t chunk = 0;      // Llama 4: chunked attention (0: none)
  bool sinks = false;     // gpt-oss: a sink logit per head
  float softcap = 0;      // Gemma 2: scores capped to softcap * tanh(s / softcap) (0: none)
};

struct AttnData {
  std::vector<float> q, k, v;
  std::vector<uint16_t> k16, v16;  // k and v rounded to F16/BF16 when the case asks for it
  std::vector<int32_t> pos, seq_indptr{0}, page_indptr{0}, page_ids, kv_len;
  std::vector<float> sinks;
};

// Builds a paged pool whose blocks are handed to the sequences in a scrambled order.
AttentionArgs build(const AttnCase& c, AttnData& d, std::vector<float>& out) {
  std::vector<std::array<int64_t, 3>> seqs = {{c.n, c.kv_len, c.pos0}};
  seqs.insert(seqs.end(), c.more.begin(), c.more.end());
  const uint32_t seed = static_cast<uint32_t>(c.n * 131 + c.heads * 17 + c.kv_heads * 5 + c.hd + c.kv_len * 3);
  const int64_t ps = c.page_size;
  int64_t n = 0, blocks = 0;
  for (auto& sq : seqs) {
    n += sq[0];
    blocks += (std::max<int64_t>(sq[1], 1) + ps - 1) / ps;
  }
  std::vector<int32_t> order(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) order[static_cast<size_t>(b)] = static_cast<int32_t>((b * 7 + 3) % blocks);
  if (blocks % 7 == 0)  // 7 must be coprime with the block count for a permutation
    for (int64_t b = 0; b < blocks; ++b) order[static_cast<size_t>(b)] = static_cast<int32_t>(blocks - 1 - b);
  d = AttnData{};
  d.q = test::random_floats(static_cast<size_t>(n * c.heads * c.hd), seed);
  d.k = test::random_floats(static_cast<size_t>(blocks * ps * c.kv_heads * c.hd), seed + 1);
  d.v = test::random_floats(static_cast<size_t>(blocks * ps * c.kv_heads * c.vd), seed + 2);
  int64_t next_block = 0;
  for (auto& [sn, kv, pos0] : seqs) {
    for (int64_t i = 0; i < sn; ++i)
      d.pos.push_back(c.shuffled ? static_cast<int32_t>((i * 37 + 11) % (kv + 5)) : static_cast<int32_t>(pos0 + i));
    d.seq_indptr.push_back(static_cast<int32_t>(d.pos.size()));
    for (int64_t p = 0; p < (std::max<int64_t>(kv, 1) + ps - 1) / ps; ++p) d.page_ids.push_back(order[static_cast<size_t>(next_block++)]);
    d.page_indptr.push_back(static_cast<int32_t>(d.page_ids.size()));
    d.kv_len.push_back(static_cast<int32_t>(kv));
  }
  out.assign(static_cast<size_t>(n * c.heads * c.vd), NAN);
  AttentionArgs a{};
  a.q = d.q.data();
  a.pos = d.pos.data();
  a.n = n;
  a.n_seqs = static_cast<int64_t>(seqs.size());
  a.seq_indptr = d.seq_indptr.data();
  a.n_heads = c.heads;
  a.n_kv_heads = c.kv_heads;
  a.head_dim = c.hd;
  a.v_dim = c.vd;
  a.k_pool = d.k.data();
  a.v_pool = d.v.data();
  a.kv_dtype = c.kv;
  if (c.kv != DType::F32) {
    d.k16.resize(d.k.size());
    d.v16.resize(d.v.size());
    quantize_row(c.kv, d.k.data(), d.k16.data(), static_cast<int64_t>(d.k.size()));
    quantize_row(c.kv, d.v.data(), d.v16.data(), static_cast<int64_t>(d.v.size()));
    a.k_pool = d.k16.data();
    a.v_pool = d.v16.data();
  }
  a.k_stride = c.kv_heads * c.hd;
  a.v_stride = c.kv_heads * c.vd;
  a.page_size = ps;
  a.page_indptr = d.page_indptr.data();
  a.page_ids = d.page_ids.data();
  a.kv_len = d.kv_len.data();
  a.scale = c.scale != 0 ? c.scale : 1.0f / std::sqrt(static_cast<float>(c.hd));
  a.window = c.window;
  a.chunk = c.chunk;
  a.softcap = c.softcap;
  if (c.sinks) {  // logits of the scores' size and larger: from a negligible sink to a dominant one
    d.sinks = test::random_floats(static_cast<size_t>(c.heads), seed + 3);
    for (auto& x : d.sinks) x *= 4.0f;
    a.sinks = d.sinks.data();
  }
  a.out = out.data();
  return a;
}

std::string label(const AttnCase& c) {
  std::string more;
  for (auto& sq : c.more) more += " +seq(n=" + std::to_string(sq[0]) + " kv=" + std::to_string(sq[1]) + " pos0=" + std::to_string(sq[2]) + ")";
  return "n=" + std::to_string(c.n) + " heads=" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) +
         " hd=" + std::to_string(c.hd) + " vd=" + std::to_string(c.vd) + " kv_len=" + std::to_string(c.kv_len) +
         " pos0=" + std::to_string(c.pos0) + (c.shuffled ? " shuffled" : "") +
         (c.scale != 0 ? " scale=" + std::to_string(c.scale) : "") + " page=" + std::to_string(c.page_size) + more +
         " kv=" + dtype_name(c.kv) + (c.window ? " window=" + std::to_string(c.window) : "") +
         (c.chunk ? " chunk=" + std::to_string(c.chunk) : "") + (c.sinks ? " sinks" : "") + (c.softcap > 0 ? " softcap=" + std::to_string(c.softcap) : "");
}

// amx_flash against its twin `ref_bf16` (the same BF16-rounded q * scale, K and V): what is
// left is P rounded to BF16 (relative 2^-9 per weight; the output a convex mix of V rows with
// weights off by that much) and the order of the sums.
// Over this file's cases (990 runs) the error against the twin was 4e-4 .. 1.7e-3, against the
// f32 reference up to 2.3e-2 (the input rounding the twin shares).
constexpr double kAmxTolerance = 4e-3;

// amx_flash_x3 against the f32 reference: K and V exact (an F16 row is the sum of its two BF16
// parts), q * scale and P to 2^-17 relative, the kl ql product left out (2^-18). Over this
// file's cases the error was <= 2e-5 but for the sharp softmax (scale 1, head dim 128: scores
// of tens, whose 2^-17 becomes the weights' relative error): 4.0e-5. The F16 cache's own
// rounding of K and V is 2^-11 = 4.9e-4.
constexpr double kX3Tolerance = 1e-4;

bool amx_kernel(const Kernel<AttentionArgs>& k) { return k.name == "amx_flash"; }
bool x3_kernel(const Kernel<AttentionArgs>& k) { return k.name == "amx_flash_x3"; }
bool amx_cpu() { return cpu_features().missing({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_bf16"}).empty(); }

struct Checked {
  int f32 = 0, amx = 0, x3 = 0;  // kernel runs compared with `ref`, amx_flash's with `ref_bf16`, amx_flash_x3's
};

// Every case with the pool in each KV dtype.
Checked run_cases(const std::vector<AttnCase>& cases) {
  Checked checked;
  for (DType kv : {DType::F32, DType::F16, DType::BF16})
    for (AttnCase c : cases) {
      c.kv = kv;
      AttnData d;
      std::function<AttentionArgs(std::vector<float>&)> make = [&](std::vector<float>& out) { return build(c, d, out); };
      checked.f32 += test::check_kernels<AttentionArgs>(label(c), make, "ref", 2e-5,
                                                        [](auto& k) { return !amx_kernel(k) && !x3_kernel(k); });
      checked.amx += test::check_kernels<AttentionArgs>(label(c), make, "ref_bf16", kAmxTolerance, amx_kernel);
      checked.x3 += test::check_kernels<AttentionArgs>(label(c), make, "ref", kX3Tolerance, x3_kernel);
    }
  return checked;
}


// (heads, kv_heads) for GQA ratios 1, 2, 4, 8.
const std::vector<std::pair<int64_t, int64_t>> kHeadConfigs = {{4, 4}, {4, 2}, {8, 2}, {8, 1}};

TEST(BackendOps, AttentionDecodeEveryKernelAgainstItsReference) {
  std::vector<AttnCase> cs;
  for (int64_t hd : {8, 16, 64, 96, 128})
    for (auto [h, kvh] : kHeadConfigs)
      for (int64_t kv : {1, 2, 7, 63, 64, 65, 200, 1000}) cs.push_back({1, h, kvh, hd, hd, kv, static_cast<int32_t>(kv - 1)});
  // Long contexts: one KV head (split over KV positions), eight (split over heads).
  cs.push_back({1, 8, 1, 128, 128, 4000, 3999});
  cs.push_back({1, 32, 8, 128, 128, 3000, 2999});
  cs.push_back({1, 16, 2, 64, 64, 8192, 8191});
  // A query that sees only part of the cache; a cache shorter than pos + 1.
  cs.push_back({1, 8, 2, 64, 64, 900, 300});
  cs.push_back({1, 8, 2, 64, 64, 100, 500});
  // v_dim != head_dim, and a sharp softmax.
  cs.push_back({1, 8, 2, 64, 32, 333, 332});
  cs.push_back({1, 4, 1, 192, 128, 700, 699});
  cs.push_back({1, 8, 8, 64, 64, 600, 599, false, 1.0f});
  const Checked checked = run_cases(cs);
  if (test::cpu_has_avx2()) {
    EXPECT_GT(checked.f32, 0) << "no non-reference attention kernel ran on an AVX2 CPU";
  }
  EXPECT_EQ(checked.amx, 0) << "decode is not amx_flash's (it leaves it to the f32 items)";
  EXPECT_EQ(checked.x3, 0) << "decode is not amx_flash_x3's (it leaves it to the f32 items)";
}

TEST(BackendOps, AttentionPrefillEveryKernelAgainstItsReference) {
  std::vector<AttnCase> cs;
  for (int64_t hd : {8, 16, 64, 96, 128})
    for (auto [h, kvh] : kHeadConfigs)
      for (int64_t n : {2, 5, 17, 64, 65})
        for (int32_t pos0 : {0, 37}) cs.push_back({n, h, kvh, hd, hd, pos0 + n, pos0});
  // Long prefills, from zero and after a cached prefix (under the sanitizers with a quarter of
  // the heads: the same tiles and bounds, a quarter of the work).
  const int64_t long_heads = test::kSanitized ? 2 : 8;
  cs.push_back({300, 4, 4, 64, 64, 300, 0});
  cs.push_back({300, long_heads, 2, 128, 128, 800, 500});
  cs.push_back({257, long_heads, 1, 96, 96, 1000, 743});
  cs.push_back({130, 16, 2, 16, 16, 130, 0});
  // The last tokens of a chunk: kv_len beyond the batch (cache already holds later rows too).
  cs.push_back({20, 4, 2, 64, 64, 600, 100});
  // Scrambled positions with gaps; positions beyond kv_len; v_dim != head_dim; sharp softmax.
  cs.push_back({40, 8, 2, 64, 64, 200, 0, true});
  cs.push_back({33, 4, 1, 32, 32, 70, 0, true});
  cs.push_back({24, 8, 2, 64, 32, 300, 250});
  cs.push_back({70, 4, 4, 128, 128, 200, 130, false, 1.0f});
  // Head dims that are not multiples of the tiles' 32 (padded with zeros), value dims not
  // multiples of 64 (one column tile at a time); 3 tokens at GQA 8 (24 rows: not wide).
  cs.push_back({45, 8, 2, 40, 24, 45, 0});
  cs.push_back({66, 4, 1, 80, 80, 500, 434});
  cs.push_back({3, 8, 1, 64, 64, 90, 87});
  // 8 tokens after a long prefix: one query block (an item walks both KV heads), KV splits.
  cs.push_back({8, 8, 2, 64, 64, 2000, 1992});
  const Checked checked = run_cases(cs);
  if (test::cpu_has_avx2()) {
    EXPECT_GT(checked.f32, 0) << "no non-reference attention kernel ran on an AVX2 CPU";
  }
  if (amx_cpu()) {
    EXPECT_GT(checked.amx, 0) << "amx_flash ran no case on an AMX CPU";
    EXPECT_GT(checked.x3, 0) << "amx_flash_x3 ran no case on an AMX CPU";
  }
}

// Where rounding P to BF16 loses nothing, amx_flash matches its twin to f32 precision: with
// q = 0 every visible key weighs e^0 = 1, so the output is the mean of the visible V rows (the
// causal masks, the V tiles, KV splits and their merge, exactly). (A sharp softmax, scale 1000,
// was tried as the K tiles' exact check: near-ties between a row's two best keys left 1e-4 ..
// 1.6e-3, no tighter than the test above.)
TEST(BackendOps, AttentionAmxMatchesItsTwinWhereRoundingVanishes) {
  if (!amx_cpu()) GTEST_SKIP() << "no AMX on this CPU (amx_flash refuses every call)";
  const std::vector<AttnCase> cases = {{300, 8, 2, 64, 64, 300, 0},     {100, 8, 2, 128, 128, 900, 800},
                                       {66, 4, 1, 80, 40, 500, 434},    {20, 4, 2, 64, 64, 600, 100},
                                       {8, 8, 2, 64, 64, 2000, 1992}};
  int checked = 0, checked_x3 = 0;
  for (DType kv : {DType::F32, DType::F16, DType::BF16})
    for (AttnCase c : cases) {
      c.kv = kv;
      AttnData d;
      std::function<AttentionArgs(std::vector<float>&)> make = [&](std::vector<float>& out) {
        AttentionArgs a = build(c, d, out);
        std::fill(d.q.begin(), d.q.end(), 0.0f);
        return a;
      };
      checked += test::check_kernels<AttentionArgs>(label(c) + " q=0", make, "ref_bf16", 1e-5, amx_kernel);
      // amx_flash_x3 (F16 pools): the mean of exact V rows, against the f32 reference.
      checked_x3 += test::check_kernels<AttentionArgs>(label(c) + " q=0", make, "ref", 1e-6, x3_kernel);
    }
  EXPECT_GT(checked, 0);
  EXPECT_GT(checked_x3, 0);
}

TEST(BackendOps, AttentionEmptyCacheGivesZerosAndNoTokensWritesNothing) {
  // kv_len 0: no query sees a key; the reference writes zeros.
  std::vector<AttnCase> cs = {{3, 4, 2, 16, 16, 0, 0}, {1, 4, 4, 64, 64, 0, 0}, {8, 4, 2, 32, 32, 0, 0}};
  const Checked checked = run_cases(cs);
  if (test::cpu_has_avx2()) {
    EXPECT_GT(checked.f32, 0);
  }
  if (amx_cpu()) {
    EXPECT_GT(checked.amx, 0);
  }
  AttnCase c{0, 4, 2, 64, 64, 10, 0};
  AttnData d;
  std::vector<float> out;
  AttentionArgs a = build(c, d, out);
  for (auto& k : OpRegistry<AttentionArgs>::instance().kernels())
    if (k.backend == Backend::CPU && (!k.refuse || k.refuse(a).empty())) k.run(a);
  EXPECT_TRUE(out.empty());
}

TEST(BackendOps, AttentionEveryPageSizeAndVarlenBatches) {
  std::vector<AttnCase> cs;
  for (int64_t ps : {1, 8, 16, 32, 64, 128, 256}) {
    cs.push_back({1, 8, 2, 64, 64, 700, 699, false, 0, ps});                 // decode
    cs.push_back({37, 8, 2, 64, 64, 237, 200, false, 0, ps});                // prefill after a prefix
    AttnCase mixed{1, 8, 2, 64, 64, 300, 299, false, 0, ps};                 // decode + chunked prefill + decode
    mixed.more = {{50, 130, 80}, {1, 1, 0}, {1, 1000, 999}, {0, 20, 20}, {17, 17, 0}};
    cs.push_back(mixed);
  }
  // A batch of many decodes (the continuous-batching step), short and long contexts.
  AttnCase decodes{1, 32, 8, 64, 64, 5, 4, false, 0, 16};
  for (int64_t s = 1; s < 16; ++s) decodes.more.push_back({1, 40 * s + 3, 40 * s + 2});
  cs.push_back(decodes);
  const Checked checked = run_cases(cs);
  if (test::cpu_has_avx2()) {
    EXPECT_GT(checked.f32, 0);
  }
  if (amx_cpu()) {
    EXPECT_GT(checked.amx, 0) << "amx_flash ran no mixed batch on an AMX CPU";
    EXPECT_GT(checked.x3, 0) << "amx_flash_x3 ran no mixed batch on an AMX CPU";
  }
}

TEST(BackendOps, AttentionFastKernelDeclaresItsPageSizes) {
  AttnCase c{1, 4, 2, 64, 64, 50, 49, false, 0, 24};  // a page size that is not a power of two
  std::map<std::string, int> named;  // per kernel: the pools on which it named the page size
  for (DType kv : {DType::BF16, DType::F16}) {  // amx_flash reads BF16 only, amx_flash_x3 F16 only
    c.kv = kv;
    AttnData d;
    std::vector<float> out;
    AttentionArgs a = build(c, d, out);
    for (auto& k : OpRegistry<AttentionArgs>::instance().kernels()) {
      if (k.reference || k.backend != Backend::CPU) continue;
      ASSERT_TRUE(k.refuse);
      const std::string why = k.refuse(a);
      if (why.find("this CPU lacks") != std::string::npos) continue;  // refused earlier, on the CPU
      named[k.name] += 0;
      if (why.find("KV cache dtype") == 0) continue;  // a cache it does not read
      EXPECT_NE(why.find("page size 24"), std::string::npos) << k.name << ": " << why;
      ++named[k.name];
    }
    EXPECT_NE(a.shape_class().find("page=24"), std::string::npos);
  }
  for (auto& [name, n] : named) EXPECT_GT(n, 0) << name << " refused both pools by their dtype";
}

TEST(BackendOps, AttentionKernelsDeclareTheirKvDtypes) {
  AttnCase c{1, 4, 2, 64, 64, 50, 49};
  c.kv = DType::F16;
  AttnData d;
  std::vector<float> out;
  AttentionArgs a = build(c, d, out);
  EXPECT_NE(a.shape_class().find("kv=F16"), std::string::npos) << a.shape_class();
  // FP8 is not read by any kernel yet: every one refuses it, naming the dtype and what it reads.
  // amx_flash refuses F16 and F32 caches too (their precision stays on the f32 kernel).
  for (DType t : {DType::F16, DType::F32}) {
    a.kv_dtype = t;
    for (auto& k : OpRegistry<AttentionArgs>::instance().kernels()) {
      if (k.name == "amx_flash" && k.refuse(a).find("this CPU lacks") == std::string::npos) {
        EXPECT_NE(k.refuse(a).find("--kv-cache-dtype bf16"), std::string::npos) << k.refuse(a);
      }
    }
  }
  a.kv_dtype = DType::F8_E4M3;
  for (auto& k : OpRegistry<AttentionArgs>::instance().kernels()) {
    if (k.backend != Backend::CPU) continue;
    ASSERT_TRUE(k.refuse) << k.name;
    const std::string why = k.refuse(a);
    if (!k.reference && why.find("this CPU lacks") != std::string::npos) continue;  // refused earlier, on the CPU
    // amx_flash and amx_flash_x3: the cache they multiply as it is (x3: in two exact parts).
    const std::string reads = k.name == "amx_flash" ? "BF16" : k.name == "amx_flash_x3" ? "F16" : "F32, F16, BF16";
    EXPECT_NE(why.find("KV cache dtype F8_E4M3: this kernel reads " + reads), std::string::npos) << k.name << ": " << why;
  }
}

// gpt-oss's options against the reference: sliding windows (1, shorter than a key block, one
// block, just past it, longer than the context) and sinks, in decode (short and long contexts,
// the latter split over the threads), prefill from 0 and after a cached prefix, and a varlen
// batch, in every KV dtype. The fast kernel must take them (avx2_flash) or refuse with the reason.
TEST(BackendOps, AttentionSlidingWindowAndSinksAgainstTheReference) {
  std::vector<AttnCase> cs;
  for (int64_t window : {0, 1, 3, 64, 65, 200})
    for (bool sinks : {false, true}) {
      if (!window && !sinks) continue;
      for (auto [h, kvh] : {std::pair<int64_t, int64_t>{4, 2}, {8, 1}}) {
        AttnCase dec{1, h, kvh, 64, 64, 700, 699};  // decode, long enough for KV splits
        AttnCase dec_short{1, h, kvh, 16, 16, 5, 4};
        AttnCase pre{37, h, kvh, 64, 64, 37, 0};     // prefill from 0
        AttnCase pre_cached{20, h, kvh, 16, 16, 150, 130};  // after a cached prefix
        AttnCase varlen{3, h, kvh, 16, 16, 90, 87, false, 0, 4, {{1, 300, 299}, {12, 12, 0}}};
        for (AttnCase c : {dec, dec_short, pre, pre_cached, varlen}) {
          c.window = window;
          c.sinks = sinks;
          cs.push_back(c);
        }
      }
    }
  const Checked checked = run_cases(cs);
  EXPECT_GE(checked.f32, static_cast<int>(cs.size()) * 3 * 2) << "avx2_flash took every case, at 1 and 2 threads";
}

// Llama 4's chunked attention against the reference: chunks of 1, shorter than a key block, one
// block, just past it and longer than the context, alone and with a window (the later start
// wins), in decode at a chunk's first position and inside one, prefill across chunk edges from
// 0 and after a cached prefix, and a varlen batch, in every KV dtype.
TEST(BackendOps, AttentionChunkedAgainstTheReference) {
  std::vector<AttnCase> cs;
  for (int64_t chunk : {1, 5, 64, 65, 1000})
    for (int64_t window : {0, 3, 100}) {
      AttnCase dec{1, 8, 2, 64, 64, 700, 699};
      AttnCase dec_edge{1, 4, 2, 16, 16, 641, 640};  // the first position of a chunk of 64 (or 5)
      AttnCase pre{37, 4, 2, 64, 64, 37, 0};
      AttnCase pre_cached{20, 8, 1, 16, 16, 150, 130};
      AttnCase varlen{3, 4, 2, 16, 16, 90, 87, false, 0, 4, {{1, 300, 299}, {12, 12, 0}}};
      for (AttnCase c : {dec, dec_edge, pre, pre_cached, varlen}) {
        c.chunk = chunk;
        c.window = window;
        cs.push_back(c);
      }
    }
  const Checked checked = run_cases(cs);
  EXPECT_GE(checked.f32, static_cast<int>(cs.size()) * 3 * 2) << "avx2_flash took every case, at 1 and 2 threads";
}

// Gemma 2's score soft-capping against the reference: caps that bend every score (0.5), some
// (5, with scale 1 for scores of several units) and few (50), alone and with a sliding window,
// in decode (short, and long enough for KV splits), prefill from 0 and after a cached prefix,
// and a varlen batch, in every KV dtype.
TEST(BackendOps, AttentionSoftcapAgainstTheReference) {
  std::vector<AttnCase> cs;
  for (float softcap : {0.5f, 5.0f, 50.0f})
    for (int64_t window : {0, 3, 65}) {
      AttnCase dec{1, 8, 2, 64, 64, 700, 699};
      AttnCase dec_short{1, 4, 2, 16, 16, 5, 4};
      AttnCase pre{37, 4, 2, 64, 64, 37, 0, false, 1.0f};
      AttnCase pre_cached{20, 8, 1, 16, 16, 150, 130};
      AttnCase varlen{3, 4, 2, 16, 16, 90, 87, false, 0, 4, {{1, 300, 299}, {12, 12, 0}}};
      for (AttnCase c : {dec, dec_short, pre, pre_cached, varlen}) {
        c.window = window;
        c.softcap = softcap;
        cs.push_back(c);
      }
    }
  const Checked checked = run_cases(cs);
  EXPECT_GE(checked.f32, static_cast<int>(cs.size()) * 3 * 2) << "avx2_flash took every case, at 1 and 2 threads";
}

// The reference's window, chunks, sinks and softcap against a plain softmax written here: the
// query at p sees keys max(0, p - window + 1, p - p % chunk) .. p, s = cap tanh(scale q.k / cap)
// (or scale q.k), and out = sum e^s v / (e^sink + sum e^s).
TEST(BackendOps, AttentionReferenceWindowSinksAndSoftcapAreTheDefinition) {
  for (int64_t window : {0, 1, 2, 5})
    for (int64_t chunk : {0, 2, 3})
    for (float softcap : {0.0f, 0.3f}) {
      AttnCase c{6, 4, 2, 8, 8, 6, 0};
      c.window = window;
      c.chunk = chunk;
      c.sinks = true;
      c.softcap = softcap;
      c.scale = 2.0f;  // scores of a few units, so that a cap of 0.3 bends them
      AttnData d;
      std::vector<float> got;
      AttentionArgs a = build(c, d, got);
      for (auto& k : OpRegistry<AttentionArgs>::instance().kernels())
        if (k.name == "ref" && k.backend == Backend::CPU) k.run(a);
      const int64_t group = c.heads / c.kv_heads;
      for (int64_t i = 0; i < c.n; ++i)
        for (int64_t h = 0; h < c.heads; ++h) {
          const int64_t p = a.pos[i], kvh = h / group;
          const int64_t first = std::max({int64_t{0}, window ? p - window + 1 : 0, chunk ? p - p % chunk : 0});
          std::vector<double> e;
          double mx = a.sinks[h];
          for (int64_t t = first; t <= p; ++t) {
            double dot = 0;
            for (int64_t j = 0; j < c.hd; ++j) dot += a.q[(i * c.heads + h) * c.hd + j] * d.k[static_cast<size_t>(a.slot(0, t) * a.k_stride + kvh * c.hd + j)];
            e.push_back(softcap > 0 ? softcap * std::tanh(dot * a.scale / softcap) : dot * a.scale);
            mx = std::max(mx, e.back());
          }
          double sum = std::exp(a.sinks[h] - mx);
          for (double& x : e) sum += (x = std::exp(x - mx));
          for (int64_t j = 0; j < c.vd; ++j) {
            double o = 0;
            for (int64_t t = first; t <= p; ++t)
              o += e[static_cast<size_t>(t - first)] * d.v[static_cast<size_t>(a.slot(0, t) * a.v_stride + kvh * c.vd + j)];
            EXPECT_NEAR(got[static_cast<size_t>((i * c.heads + h) * c.vd + j)], o / sum, 1e-5)
                << "window " << window << " chunk " << chunk << " softcap " << softcap << " token " << i << " head " << h;
          }
        }
    }
}

// Kernels without windows or sinks say so, and a batch that has them never reaches them.
TEST(BackendOps, AttentionKernelsWithoutSinksRefuseThem) {
  AttnCase c{37, 8, 2, 64, 64, 37, 0};
  c.kv = DType::BF16;
  c.window = 16;
  c.sinks = true;
  AttnData d;
  std::vector<float> out;
  const AttentionArgs a = build(c, d, out);
  for (auto& k : OpRegistry<AttentionArgs>::instance().kernels()) {
    if (k.backend != Backend::CPU || !k.refuse) continue;
    const std::string why = k.refuse(a);
    if (k.name == "amx_flash" || k.name == "amx_flash_x3") {
      EXPECT_FALSE(why.empty()) << k.name << " took a sliding window and sinks";
    }
    if (k.name == "avx2_flash" && cpu_features().missing({"avx2", "fma", "f16c"}).empty()) {
      EXPECT_EQ(why, "") << "avx2_flash takes windows and sinks";
    }
  }
  EXPECT_EQ(refuse_attention_options(a, {.sinks = true}), "sliding-window attention (window 16) is not implemented here");
  EXPECT_EQ(refuse_attention_options(a, {.window = true}), "attention sinks are not implemented here");
  EXPECT_EQ(refuse_attention_options(a, {.window = true, .sinks = true}), "");
  AttentionArgs capped = a;  // a softcap alone
  capped.window = 0;
  capped.sinks = nullptr;
  capped.softcap = 50;
  EXPECT_EQ(refuse_attention_options(capped, {}), "score soft-capping (softcap 50) is not implemented here");
  EXPECT_EQ(refuse_attention_options(capped, {.softcap = true}), "");
  AttentionArgs chunked = capped;  // chunks alone
  chunked.softcap = 0;
  chunked.chunk = 8192;
  EXPECT_EQ(refuse_attention_options(chunked, {.window = true}), "chunked attention (chunk 8192) is not implemented here");
  EXPECT_EQ(refuse_attention_options(chunked, {.chunk = true}), "");
  for (auto& k : OpRegistry<AttentionArgs>::instance().kernels())
    if (k.backend == Backend::CPU && k.refuse && (k.name == "amx_flash" || k.name == "amx_flash_x3")) {
      EXPECT_NE(k.refuse(capped), "") << k.name << " took a softcap";
    }
}

}  // namespace
}  // namespace fp
