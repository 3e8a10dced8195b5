// tests/cuda_ops_attention_test.cpp — every CUDA attention kernel (split_kv, tiled, the plain
// "cuda") against the CPU reference (harness: cuda_ops.h): head dims 8..256 (and v_dim !=
// head_dim, as DeepSeek's 192/128), GQA ratios 1/2/4/7/8/16, page sizes 1..256, KV pools in
// F32/F16/BF16 (the reference reads the same rounded pool), decode from kv_len 1 to 16K,
// prefill from position 0 and after a cached prefix, scrambled positions, positions beyond
// kv_len, empty caches, and varlen batches that mix decode, chunked prefill and empty sequences.
// The options (a sliding window, sinks, soft-capped scores) against the reference too: the
// kernels that do not take them must refuse them. Tolerance 2e-5 (normalised L2): f32 arithmetic, another summation order and exp; 3e-3 for the
// tensor-core kernels "wmma" and "mma" (Q, K, P and V rounded to F16 once each) and
// "mma_pipelined" on F16 caches, 1e-2 for it on BF16 caches (Q and P rounded to BF16).
#include <gtest/gtest.h>

#include <array>
#include <cmath>

#include "cuda_ops.h"
#include "kernels/ops.h"

namespace fp {
namespace {

using test::Coverage;
using test::download;
using test::upload;
using test::upload_into;

struct GpuAttnCase {
  int64_t n, heads, kv_heads, hd, vd, kv_len;
  int32_t pos0;           // pos[i] = pos0 + i, unless shuffled
  bool shuffled = false;  // positions in a scrambled order with gaps
  int64_t page_size = 16;
  std::vector<std::array<int64_t, 3>> more = {};  // further sequences: (n, kv_len, pos0) each
  DType kv = DType::F32;
  int64_t window = 0;   // sliding window (gpt-oss, Gemma; 0: none)
  bool sinks = false;   // a sink logit per head (gpt-oss)
  float softcap = 0;    // soft-capped scores (Gemma 2; 0: none)
};

std::string label(const GpuAttnCase& c) {
  std::string more;
  for (auto& sq : c.more) more += " +seq(n=" + std::to_string(sq[0]) + " kv=" + std::to_string(sq[1]) + " pos0=" + std::to_string(sq[2]) + ")";
  return "n=" + std::to_string(c.n) + " heads=" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) +
         " hd=" + std::to_string(c.hd) + " vd=" + std::to_string(c.vd) + " kv_len=" + std::to_string(c.kv_len) +
         " pos0=" + std::to_string(c.pos0) + (c.shuffled ? " shuffled" : "") + " page=" + std::to_string(c.page_size) + more +
         " kv=" + dtype_name(c.kv) + (c.window ? " window=" + std::to_string(c.window) : "") + (c.sinks ? " sinks" : "") +
         (c.softcap > 0 ? " softcap=" + std::to_string(c.softcap) : "");
}

// Host inputs: a paged pool whose pages are handed to the sequences in a scrambled order, with
// spare slots between the used ones (k_stride/v_stride wider than a row would be in the model's
// pool: the kernels must use the strides).
struct AttnHost {
  std::vector<float> q, k, v;
  std::vector<uint16_t> k16, v16;
  std::vector<int32_t> pos, seq_indptr{0}, page_indptr{0}, page_ids, kv_len;
  int64_t n = 0, n_seqs = 0, k_stride = 0, v_stride = 0;
};

AttnHost make_host(const GpuAttnCase& c) {
  std::vector<std::array<int64_t, 3>> seqs = {{c.n, c.kv_len, c.pos0}};
  seqs.insert(seqs.end(), c.more.begin(), c.more.end());
  const uint32_t seed = static_cast<uint32_t>(c.n * 131 + c.heads * 17 + c.kv_heads * 5 + c.hd + c.kv_len * 3 + c.page_size);
  const int64_t ps = c.page_size;
  AttnHost h;
  int64_t blocks = 0;
  for (auto& sq : seqs) {
    h.n += sq[0];
    blocks += (std::max<int64_t>(sq[1], 1) + ps - 1) / ps;
  }
  blocks += 3;  // pages no sequence owns
  std::vector<int32_t> order(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) order[static_cast<size_t>(b)] = static_cast<int32_t>((b * 7 + 3) % blocks);
  if (blocks % 7 == 0)
    for (int64_t b = 0; b < blocks; ++b) order[static_cast<size_t>(b)] = static_cast<int32_t>(blocks - 1 - b);
  h.k_stride = c.kv_heads * c.hd + 8;
  h.v_stride = c.kv_heads * c.vd + 8;
  h.q = test::random_floats(static_cast<size_t>(h.n * c.heads * c.hd), seed);
  h.k = test::random_floats(static_cast<size_t>(blocks * ps * h.k_stride), seed + 1);
  h.v = test::random_floats(static_cast<size_t>(blocks * ps * h.v_stride), seed + 2);
  int64_t next = 0;
  for (auto& [sn, kv, pos0] : seqs) {
    for (int64_t i = 0; i < sn; ++i)
      h.pos.push_back(c.shuffled ? static_cast<int32_t>((i * 37 + 11) % (kv + 5)) : static_cast<int32_t>(pos0 + i));
    h.seq_indptr.push_back(static_cast<int32_t>(h.pos.size()));
    for (int64_t p = 0; p < (std::max<int64_t>(kv, 1) + ps - 1) / ps; ++p) h.page_ids.push_back(order[static_cast<size_t>(next++)]);
    h.page_indptr.push_back(static_cast<int32_t>(h.page_ids.size()));
    h.kv_len.push_back(static_cast<int32_t>(kv));
  }
  h.n_seqs = static_cast<int64_t>(seqs.size());
  if (c.kv != DType::F32) {
    h.k16.resize(h.k.size());
    h.v16.resize(h.v.size());
    quantize_row(c.kv, h.k.data(), h.k16.data(), static_cast<int64_t>(h.k.size()));
    quantize_row(c.kv, h.v.data(), h.v16.data(), static_cast<int64_t>(h.v.size()));
  }
  return h;
}

AttentionArgs args(const GpuAttnCase& c, const AttnHost& h, const float* q, const int32_t* pos, const int32_t* seq_indptr,
                   const void* k, const void* v, const int32_t* page_indptr, const int32_t* page_ids, const int32_t* kv_len,
                   float* out, const float* sinks = nullptr) {
  AttentionArgs a{};
  a.window = c.window;
  a.softcap = c.softcap;
  a.sinks = c.sinks ? sinks : nullptr;
  a.q = q;
  a.pos = pos;
  a.n = h.n;
  a.n_seqs = h.n_seqs;
  a.seq_indptr = seq_indptr;
  a.n_heads = c.heads;
  a.n_kv_heads = c.kv_heads;
  a.head_dim = c.hd;
  a.v_dim = c.vd;
  a.k_pool = k;
  a.v_pool = v;
  a.k_stride = h.k_stride;
  a.v_stride = h.v_stride;
  a.kv_dtype = c.kv;
  a.page_size = c.page_size;
  a.page_indptr = page_indptr;
  a.page_ids = page_ids;
  a.kv_len = kv_len;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  a.out = out;
  return a;
}

// Normalised L2 bound per kernel: f32 arithmetic 2e-5; the tensor-core kernels round Q and P
// (and K, V where the cache is F32) to F16 (11 significant bits): 3e-3; `mma_pipelined` on a
// BF16 cache rounds Q and P to BF16 (8 bits; 2.0e-3 in scripts/emulate_attention_mma.py): 1e-2.
double tolerance(const std::string& kernel, DType kv) {
  if (kernel == "mma_pipelined") return kv == DType::BF16 ? 1e-2 : 3e-3;
  return kernel == "wmma" || kernel == "mma" ? 3e-3 : 2e-5;
}

void check_attention(const GpuAttnCase& c, Coverage& cov) {
  SCOPED_TRACE(label(c));
  const AttnHost h = make_host(c);
  const bool half = c.kv != DType::F32;
  const void* hk = half ? static_cast<const void*>(h.k16.data()) : h.k.data();
  const void* hv = half ? static_cast<const void*>(h.v16.data()) : h.v.data();
  std::vector<float> want(static_cast<size_t>(h.n * c.heads * c.vd), NAN);
  const auto* ref = test::find_kernel<AttentionArgs>(Backend::CPU, "ref");
  ASSERT_TRUE(ref);
  std::vector<float> sinks(static_cast<size_t>(c.heads));
  for (int64_t i = 0; i < c.heads; ++i) sinks[static_cast<size_t>(i)] = 2.0f * std::sin(static_cast<float>(i) * 1.3f);
  ref->run(args(c, h, h.q.data(), h.pos.data(), h.seq_indptr.data(), hk, hv, h.page_indptr.data(), h.page_ids.data(),
                h.kv_len.data(), want.data(), sinks.data()));

  DeviceBuffer dq = upload(h.q), dpos = upload(h.pos), dsi = upload(h.seq_indptr), dpi = upload(h.page_indptr),
               dpid = upload(h.page_ids), dkl = upload(h.kv_len);
  DeviceBuffer dk = half ? upload(h.k16) : upload(h.k), dv = half ? upload(h.v16) : upload(h.v);
  const std::vector<float> poison(want.size(), NAN);
  DeviceBuffer dout = upload(poison), dsinks = upload(sinks);
  const AttentionArgs a = args(c, h, dq.as<float>(), dpos.as<int32_t>(), dsi.as<int32_t>(), dk.data(), dv.data(),
                               dpi.as<int32_t>(), dpid.as<int32_t>(), dkl.as<int32_t>(), dout.as<float>(), dsinks.as<float>());
  for (const auto* k : test::kernels_under_test<AttentionArgs>()) {
    if (!test::refusal(*k, a).empty()) continue;
    upload_into(dout, poison);
    const std::string err = test::run_kernel(*k, a);
    EXPECT_EQ(err, "") << "kernel " << k->name;
    if (!err.empty()) continue;
    const auto got = download<float>(dout, want.size());
    EXPECT_LE(test::l2_error(got, want), tolerance(k->name, c.kv))
        << "kernel " << k->name << ", first unwritten element " << test::first_unwritten(got, want);
    ++cov.ran[k->name];
  }
}

void run_all_kv_dtypes(const std::vector<GpuAttnCase>& cases, Coverage& cov) {
  for (DType kv : {DType::F32, DType::F16, DType::BF16})
    for (GpuAttnCase c : cases) {
      c.kv = kv;
      check_attention(c, cov);
    }
}

// (heads, kv_heads): GQA ratios 1, 2, 4, 7 (Qwen2-7B's 28/4), 8, 16.
const std::vector<std::pair<int64_t, int64_t>> kHeads = {{4, 4}, {4, 2}, {8, 2}, {28, 4}, {8, 1}, {32, 2}};
// (head_dim, v_dim): stories260K's 8, 16, 64, 96, 128, 256, DeepSeek's 192/128, v_dim != head_dim,
// and 18 (rows the 16-byte K/V loads cannot take: the element-wise path).
const std::vector<std::pair<int64_t, int64_t>> kDims = {{8, 8},     {16, 16},   {64, 64}, {96, 96}, {128, 128},
                                                        {256, 256}, {192, 128}, {80, 72}, {18, 18}};

TEST(CudaOpsAttention, DecodeAgainstTheReference) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  std::vector<GpuAttnCase> cs;
  for (auto [hd, vd] : kDims)
    for (auto [h, kvh] : kHeads)
      for (int64_t kv : {1, 2, 33, 65, 1000}) cs.push_back({1, h, kvh, hd, vd, kv, static_cast<int32_t>(kv - 1)});
  // Long contexts (the splits), one and several KV heads.
  cs.push_back({1, 8, 1, 128, 128, 4000, 3999});
  cs.push_back({1, 32, 8, 128, 128, 16384, 16383, false, 256});
  cs.push_back({1, 16, 2, 64, 64, 8192, 8191, false, 1});
  cs.push_back({1, 8, 2, 256, 256, 5000, 4999});
  // A query that sees part of the cache; a cache shorter than pos + 1; an empty cache.
  cs.push_back({1, 8, 2, 64, 64, 900, 300});
  cs.push_back({1, 8, 2, 64, 64, 100, 500});
  cs.push_back({1, 4, 4, 64, 64, 0, 0});
  run_all_kv_dtypes(cs, cov);
  cov.expect_ran({"split_kv", "tiled", "cuda"});
}

TEST(CudaOpsAttention, PrefillAgainstTheReference) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  std::vector<GpuAttnCase> cs;
  for (auto [hd, vd] : kDims)
    for (auto [h, kvh] : kHeads)
      for (int64_t n : {2, 17, 65})
        for (int32_t pos0 : {0, 37}) cs.push_back({n, h, kvh, hd, vd, pos0 + n, pos0});
  // Long prefills, from zero and after a cached prefix.
  cs.push_back({300, 4, 4, 64, 64, 300, 0});
  cs.push_back({300, 8, 2, 128, 128, 800, 500});
  cs.push_back({257, 8, 1, 96, 96, 1000, 743});
  cs.push_back({130, 32, 8, 128, 128, 130, 0, false, 256});
  cs.push_back({100, 16, 16, 256, 256, 150, 50, false, 1});
  // kv_len beyond the batch; scrambled positions with gaps; positions beyond kv_len; empty cache.
  cs.push_back({20, 4, 2, 64, 64, 600, 100});
  cs.push_back({40, 8, 2, 64, 64, 200, 0, true});
  cs.push_back({33, 4, 1, 32, 32, 70, 0, true});
  cs.push_back({24, 8, 2, 64, 32, 300, 250});
  cs.push_back({3, 4, 2, 16, 16, 0, 0});
  run_all_kv_dtypes(cs, cov);
  cov.expect_ran({"tiled", "cuda", "wmma", "mma", "mma_pipelined"});
}

TEST(CudaOpsAttention, EveryPageSizeAndVarlenBatches) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  std::vector<GpuAttnCase> cs;
  for (int64_t ps : {1, 8, 16, 32, 64, 128, 256}) {
    cs.push_back({1, 8, 2, 64, 64, 700, 699, false, ps});   // decode
    cs.push_back({37, 8, 2, 64, 64, 237, 200, false, ps});  // prefill after a prefix
    // decode + chunked prefill + a one-token cache + a long decode + an empty sequence + prefill
    GpuAttnCase mixed{1, 8, 2, 128, 128, 300, 299, false, ps};
    mixed.more = {{50, 130, 80}, {1, 1, 0}, {1, 1000, 999}, {0, 20, 20}, {17, 17, 0}};
    cs.push_back(mixed);
  }
  // The continuous-batching decode step: many sequences, one token each, short and long.
  GpuAttnCase decodes{1, 32, 8, 128, 128, 5, 4, false, 16};
  for (int64_t s = 1; s < 24; ++s) decodes.more.push_back({1, 173 * s + 3, 173 * s + 2});
  cs.push_back(decodes);
  // As many tokens as sequences (the "decode" class) but not one each: 2 + 0 tokens.
  GpuAttnCase lumpy{2, 8, 2, 64, 64, 50, 48, false, 16};
  lumpy.more = {{0, 30, 30}};
  cs.push_back(lumpy);
  // A prefill tile that straddles sequences: short sequences of odd lengths back to back.
  GpuAttnCase packed{3, 16, 16, 64, 64, 3, 0, false, 16};
  packed.more = {{5, 5, 0}, {7, 40, 33}, {1, 9, 8}, {11, 11, 0}};
  cs.push_back(packed);
  run_all_kv_dtypes(cs, cov);
  cov.expect_ran({"split_kv", "tiled", "cuda"});
}

// The options of gpt-oss and Gemma: windows shorter and longer than the context, sinks, scores
// capped hard and gently, alone and together, in decode (short and long), prefill from 0 and
// after a cached prefix, and a varlen batch. The plain kernel takes them; the others refuse.
TEST(CudaOpsAttention, WindowsSinksAndSoftcapAgainstTheReference) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  std::vector<GpuAttnCase> cs;
  struct Options {
    int64_t window;
    bool sinks;
    float softcap;
  };
  for (const Options o : {Options{1, false, 0}, Options{7, false, 0}, Options{128, true, 0}, Options{0, true, 0},
                          Options{0, false, 0.5f}, Options{0, false, 50.0f}, Options{5, true, 2.0f}})
    for (GpuAttnCase c : {GpuAttnCase{1, 8, 2, 64, 64, 700, 699}, GpuAttnCase{1, 4, 2, 256, 256, 5, 4},
                          GpuAttnCase{37, 8, 1, 128, 128, 37, 0}, GpuAttnCase{20, 4, 4, 64, 64, 150, 130},
                          GpuAttnCase{3, 8, 2, 64, 64, 90, 87, false, 4, {{1, 300, 299}, {12, 12, 0}}}}) {
      c.window = o.window;
      c.sinks = o.sinks;
      c.softcap = o.softcap;
      cs.push_back(c);
    }
  run_all_kv_dtypes(cs, cov);
  cov.expect_ran({"cuda"});
}

TEST(CudaOpsAttention, NoTokensWritesNothing) {
  FP_SKIP_WITHOUT_GPU();
  GpuAttnCase c{0, 4, 2, 64, 64, 10, 0};
  const AttnHost h = make_host(c);
  DeviceBuffer dq = upload(h.q), dpos = upload(h.pos), dsi = upload(h.seq_indptr), dpi = upload(h.page_indptr),
               dpid = upload(h.page_ids), dkl = upload(h.kv_len), dk = upload(h.k), dv = upload(h.v);
  const std::vector<float> poison(16, NAN);
  DeviceBuffer dout = upload(poison);
  const AttentionArgs a = args(c, h, dq.as<float>(), dpos.as<int32_t>(), dsi.as<int32_t>(), dk.data(), dv.data(),
                               dpi.as<int32_t>(), dpid.as<int32_t>(), dkl.as<int32_t>(), dout.as<float>());
  for (const auto* k : test::kernels_under_test<AttentionArgs>()) {
    if (!test::refusal(*k, a).empty()) continue;
    EXPECT_EQ(test::run_kernel(*k, a), "") << k->name;
    const auto got = download<float>(dout, poison.size());
    for (float g : got) EXPECT_TRUE(std::isnan(g)) << k->name << " wrote an output for n = 0";
  }
}

}  // namespace
}  // namespace fp
