// tests/cuda_ops_moe_test.cpp — the CUDA kernels of the MoE and MLA ops (moe_route, moe_ffn,
// mla_attention) against the CPU reference (harness: cuda_ops.h): random logits and expert
// weights over many shapes, every weight dtype the kernels read, with and without a shared
// expert, expert-parallel ranges, decode (16-row tiles) and prefill (64-row tiles) sizes, FP8
// block scales; MLA over paged latent caches of F32 / F16 / BF16, prefill chunks and decode,
// contexts long enough for several splits.
//
// moe_ffn has two forms, both covered: GEMV for at most 8 tokens with x 16-byte aligned, tiles
// otherwise (more tokens, or x unaligned).
//
// Tolerances: routing ids exactly (random logits leave no near ties), weights 1e-5; the FFN
// 1e-4 normalised L2 (f32 sums of exactly decoded weights in another order, through two
// matmuls and SiLU); MLA 1e-4 (the same values summed in another order and an online softmax).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/dtype.h"
#include "cuda_ops.h"
#include "kernels/ops_moe.h"

namespace fp {
namespace {

using test::Coverage;
using test::download;
using test::l2_error;
using test::random_floats;
using test::upload;
using test::upload_into;

// ---------------------------------------------------------------------------------------------
// routing

struct RouteCase {
  int64_t n, E, k;
  MoeScoring scoring = MoeScoring::Softmax;
  bool bias = false, norm = false;
  int64_t groups = 1, topk_group = 1;
  MoeGroupScore gscore = MoeGroupScore::Max;
  float masked = 0.0f;
};

void check_route(const RouteCase& c, Coverage& cov) {
  SCOPED_TRACE("route n=" + std::to_string(c.n) + " E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) +
               (c.scoring == MoeScoring::Sigmoid ? " sigmoid" : " softmax") + (c.bias ? " +bias" : "") +
               (c.norm ? " norm" : "") + " groups=" + std::to_string(c.groups) + "/" + std::to_string(c.topk_group));
  const uint32_t seed = static_cast<uint32_t>(c.n * 131 + c.E * 7 + c.k + c.groups * 1000);
  const auto logits = random_floats(static_cast<size_t>(c.n * c.E), seed, 2.0f);
  auto bias = random_floats(static_cast<size_t>(c.E), seed + 1, 0.1f);
  MoeRouteArgs a;
  a.n = c.n, a.n_expert = c.E, a.k = c.k, a.scoring = c.scoring;
  a.n_group = c.groups, a.topk_group = c.topk_group, a.group_score = c.gscore, a.masked = c.masked;
  a.norm_topk = c.norm, a.norm_eps = c.norm ? 1e-20f : 0.0f, a.scale = c.norm ? 2.5f : 1.0f;
  std::vector<int32_t> want_ids(static_cast<size_t>(c.n * c.k), -7);
  std::vector<float> want_w(want_ids.size(), NAN);
  MoeRouteArgs ra = a;
  ra.logits = logits.data();
  ra.bias = c.bias ? bias.data() : nullptr;
  ra.ids = want_ids.data();
  ra.weights = want_w.data();
  const auto* ref = test::find_kernel<MoeRouteArgs>(Backend::CPU, "ref");
  ASSERT_TRUE(ref);
  ref->run(ra);

  DeviceBuffer dl = upload(logits), db = upload(bias);
  const std::vector<int32_t> poison_ids(want_ids.size(), -7);
  const std::vector<float> poison_w(want_w.size(), NAN);
  DeviceBuffer di = upload(poison_ids), dw = upload(poison_w);
  a.logits = dl.as<float>();
  a.bias = c.bias ? db.as<float>() : nullptr;
  a.ids = di.as<int32_t>();
  a.weights = dw.as<float>();
  for (const auto* k : test::kernels_under_test<MoeRouteArgs>()) {
    if (!test::refusal(*k, a).empty()) continue;
    upload_into(di, poison_ids);
    upload_into(dw, poison_w);
    const std::string err = test::run_kernel(*k, a);
    EXPECT_EQ(err, "") << "kernel " << k->name;
    if (!err.empty()) continue;
    EXPECT_EQ(download<int32_t>(di, want_ids.size()), want_ids) << "kernel " << k->name;
    EXPECT_LE(l2_error(download<float>(dw, want_w.size()), want_w), 1e-5) << "kernel " << k->name;
    ++cov.ran[k->name];
  }
}

TEST(CudaOps, MoeRouteAgainstTheReference) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  for (int64_t n : {1, 3, 4, 5, 37})
    for (int64_t E : {4, 8, 60, 64, 128, 256}) {
      check_route({n, E, std::min<int64_t>(E, 8), MoeScoring::Softmax, false, true}, cov);   // Qwen3-MoE
      check_route({n, E, 1, MoeScoring::Softmax}, cov);                                     // top-1, unnormalised
      check_route({n, E, std::min<int64_t>(E, 6), MoeScoring::Sigmoid, true, true}, cov);    // V3 without groups
      if (E % 8 == 0)  // V3: 8 groups, best 4 by the sum of their top two, masked -inf
        check_route({n, E, std::min<int64_t>(E / 2, 8), MoeScoring::Sigmoid, true, true, 8, 4, MoeGroupScore::Top2Sum,
                     -INFINITY},
                    cov);
      if (E % 4 == 0)  // V2: groups by their best expert, masked 0
        check_route({n, E, 2, MoeScoring::Softmax, false, false, 4, 2, MoeGroupScore::Max, 0.0f}, cov);
    }
  check_route({2, 1024, 8, MoeScoring::Softmax, false, true}, cov);  // the most experts the kernel takes
  check_route({0, 64, 6}, cov);                                       // no tokens
  cov.expect_ran({"cuda"});
}

// ---------------------------------------------------------------------------------------------
// expert FFN

struct FfnCase {
  DType type;
  int64_t n, E, k, dim, ff;
  int64_t shared_ff = 0;
  int64_t begin = 0, end = -1;  // expert-parallel range
  bool scaled = false;          // FP8 128x128 block scales
  bool offset_x = false;        // x one float into its buffer (decode then takes the tiled path)
};

std::string label(const FfnCase& c) {
  return std::string(dtype_name(c.type)) + " n=" + std::to_string(c.n) + " E=" + std::to_string(c.E) + " k=" +
         std::to_string(c.k) + " dim=" + std::to_string(c.dim) + " ff=" + std::to_string(c.ff) +
         (c.shared_ff ? " shared=" + std::to_string(c.shared_ff) : "") +
         (c.end >= 0 ? " experts " + std::to_string(c.begin) + ".." + std::to_string(c.end - 1) : "") +
         (c.scaled ? " block-scaled" : "") + (c.offset_x ? " x+4B" : "");
}

// E matrices [rows, cols] of one dtype, one after another in one buffer (as a GGUF stack),
// with their FP8 block scales one after another too.
struct HostStack {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  int64_t rows, cols, mat_bytes, mat_scales = 0;
  HostStack(DType t, int64_t E, int64_t r, int64_t c, bool scaled, uint32_t seed) : rows(r), cols(c) {
    const int64_t rb = row_bytes(t, c);
    mat_bytes = rb * r;
    bytes.resize(static_cast<size_t>(mat_bytes * E));
    const auto f = random_floats(static_cast<size_t>(E * r * c), seed, 1.0f / std::sqrt(static_cast<float>(c)));
    for (int64_t i = 0; i < E * r; ++i) quantize_row(t, f.data() + i * c, bytes.data() + i * rb, c);
    if (scaled) {
      mat_scales = ((r + 127) / 128) * ((c + 127) / 128);
      scales = random_floats(static_cast<size_t>(mat_scales * E), seed + 1);
      for (auto& s : scales) s = std::fabs(s) + 0.1f;
    }
  }
  // Per-expert views of `data` / `scale` (host or device copies of bytes / scales); experts
  // outside [begin, end) stay empty Tensors, as a rank's non-local experts are.
  std::vector<Tensor> views(DType t, const uint8_t* data, const float* scale, int64_t begin, int64_t end, Device d) const {
    std::vector<Tensor> v(static_cast<size_t>(bytes.size() / static_cast<size_t>(mat_bytes)));
    for (int64_t e = begin; e < end; ++e) {
      Tensor& x = v[static_cast<size_t>(e)];
      x = Tensor::view(data + e * mat_bytes, t, {rows, cols});
      x.device = d;
      if (scale) {
        x.block_scale = scale + e * mat_scales;
        x.scale_block = 128;
      }
    }
    return v;
  }
};

void check_ffn(const FfnCase& c, Coverage& cov) {
  SCOPED_TRACE(label(c));
  const uint32_t seed = static_cast<uint32_t>(c.n * 97 + c.E * 13 + c.dim + c.ff * 3 + static_cast<int>(c.type));
  const int64_t end = c.end < 0 ? c.E : c.end;
  HostStack g(c.type, c.E, c.ff, c.dim, c.scaled, seed), u(c.type, c.E, c.ff, c.dim, c.scaled, seed + 10),
      dn(c.type, c.E, c.dim, c.ff, c.scaled, seed + 20);
  const int64_t sh = c.shared_ff, sh_width = sh ? sh : QK_K;  // an unused stand-in without a shared expert
  HostStack sg(c.type, 1, sh_width, c.dim, c.scaled, seed + 30), su(c.type, 1, sh_width, c.dim, c.scaled, seed + 40),
      sd(c.type, 1, c.dim, sh_width, c.scaled, seed + 50);
  const auto x = random_floats(static_cast<size_t>(c.n * c.dim), seed + 60);
  // Distinct experts per token (as routing gives), weights in (0, 1).
  std::vector<int32_t> ids(static_cast<size_t>(c.n * c.k));
  std::vector<float> w(ids.size());
  std::mt19937 rng(seed + 70);
  std::vector<int32_t> perm(static_cast<size_t>(c.E));
  for (int64_t i = 0; i < c.n; ++i) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < c.k; ++j) {
      ids[static_cast<size_t>(i * c.k + j)] = perm[static_cast<size_t>(j)];
      w[static_cast<size_t>(i * c.k + j)] = std::uniform_real_distribution<float>(0.05f, 1.0f)(rng);
    }
  }

  auto args = [&](const std::vector<Tensor>& gv, const std::vector<Tensor>& uv, const std::vector<Tensor>& dv,
                  const Tensor* shg, const Tensor* shu, const Tensor* shd) {
    MoeFfnArgs a;
    a.n = c.n, a.dim = c.dim, a.k = c.k, a.n_expert = c.E, a.ff = c.ff;
    a.gate = gv.data(), a.up = uv.data(), a.down = dv.data();
    if (sh) {
      a.shared_gate = shg, a.shared_up = shu, a.shared_down = shd, a.shared_ff = sh;
    }
    a.expert_begin = c.begin, a.expert_end = c.end;
    return a;
  };
  // The reference on the host.
  const auto hg = g.views(c.type, g.bytes.data(), c.scaled ? g.scales.data() : nullptr, c.begin, end, Device::CPU);
  const auto hu = u.views(c.type, u.bytes.data(), c.scaled ? u.scales.data() : nullptr, c.begin, end, Device::CPU);
  const auto hd = dn.views(c.type, dn.bytes.data(), c.scaled ? dn.scales.data() : nullptr, c.begin, end, Device::CPU);
  const auto hsg = sg.views(c.type, sg.bytes.data(), c.scaled ? sg.scales.data() : nullptr, 0, 1, Device::CPU);
  const auto hsu = su.views(c.type, su.bytes.data(), c.scaled ? su.scales.data() : nullptr, 0, 1, Device::CPU);
  const auto hsd = sd.views(c.type, sd.bytes.data(), c.scaled ? sd.scales.data() : nullptr, 0, 1, Device::CPU);
  MoeFfnArgs ra = args(hg, hu, hd, &hsg[0], &hsu[0], &hsd[0]);
  std::vector<float> want(static_cast<size_t>(c.n * c.dim), NAN);
  ra.x = x.data(), ra.ids = ids.data(), ra.weights = w.data(), ra.out = want.data();
  const auto* ref = test::find_kernel<MoeFfnArgs>(Backend::CPU, "ref");
  ASSERT_TRUE(ref);
  ref->run(ra);

  const Device d = test::test_device();
  DeviceBuffer dg = upload(g.bytes), du = upload(u.bytes), dd = upload(dn.bytes), dsg = upload(sg.bytes),
               dsu = upload(su.bytes), dsd = upload(sd.bytes);
  DeviceBuffer cg = upload(g.scales), cu = upload(u.scales), cd = upload(dn.scales), csg = upload(sg.scales),
               csu = upload(su.scales), csd = upload(sd.scales);
  auto scale = [&](DeviceBuffer& b) { return c.scaled ? b.as<float>() : nullptr; };
  const auto tg = g.views(c.type, dg.as<uint8_t>(), scale(cg), c.begin, end, d);
  const auto tu = u.views(c.type, du.as<uint8_t>(), scale(cu), c.begin, end, d);
  const auto td = dn.views(c.type, dd.as<uint8_t>(), scale(cd), c.begin, end, d);
  const auto tsg = sg.views(c.type, dsg.as<uint8_t>(), scale(csg), 0, 1, d);
  const auto tsu = su.views(c.type, dsu.as<uint8_t>(), scale(csu), 0, 1, d);
  const auto tsd = sd.views(c.type, dsd.as<uint8_t>(), scale(csd), 0, 1, d);
  std::vector<float> xbuf(x.size() + 1, 0.0f);
  std::copy(x.begin(), x.end(), xbuf.begin() + (c.offset_x ? 1 : 0));
  DeviceBuffer dx = upload(xbuf), di = upload(ids), dw = upload(w);
  const std::vector<float> poison(want.size(), NAN);
  DeviceBuffer dy = upload(poison);
  MoeFfnArgs a = args(tg, tu, td, &tsg[0], &tsu[0], &tsd[0]);
  a.x = dx.as<float>() + (c.offset_x ? 1 : 0), a.ids = di.as<int32_t>(), a.weights = dw.as<float>(), a.out = dy.as<float>();
  for (const auto* k : test::kernels_under_test<MoeFfnArgs>()) {
    const std::string why = test::refusal(*k, a);
    if (!test::cuda_tests_on_cpu()) {
      EXPECT_EQ(why, "") << "kernel " << k->name << " refused";
    }
    if (!why.empty()) continue;
    upload_into(dy, poison);
    const std::string err = test::run_kernel(*k, a);
    EXPECT_EQ(err, "") << "kernel " << k->name;
    if (!err.empty()) continue;
    const auto got = download<float>(dy, want.size());
    EXPECT_LE(l2_error(got, want), 1e-4) << "kernel " << k->name << ", first unwritten element "
                                         << test::first_unwritten(got, want);
    ++cov.ran[k->name];
  }
}

TEST(CudaOps, MoeFfnAgainstTheReference) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::F8_E4M3}) {
    const int64_t blk = dtype_info(t).block_elems;
    // ff: a column tail of the 64-wide tiles and, as down's K, whole quant blocks.
    const int64_t dim = blk == QK_K ? 256 : 96, ff = blk == QK_K ? 512 : blk == QK8_0 ? 160 : 72;
    for (int64_t n : {1, 2, 5, 33, 100}) {  // 16-row tiles (decode) up to 64-row tiles (prefill)
      check_ffn({t, n, 8, 2, dim, ff}, cov);
      check_ffn({t, n, 16, 4, dim, ff, 2 * ff}, cov);          // with a shared expert twice as wide
      check_ffn({t, n, 16, 4, dim, ff, 0, 4, 12}, cov);        // expert parallel: a rank's 8 of 16
      check_ffn({t, n, 16, 4, dim, ff, ff, 12, 16}, cov);      // the last rank's, with its shared share
    }
    check_ffn({t, 1, 8, 2, 1024, 768}, cov);  // larger K, decode
    check_ffn({t, 3, 16, 4, dim, ff, ff, 0, -1, false, true}, cov);  // decode with x unaligned: the tiled form
  }
  // FP8 with 128x128 block scales (DeepSeek-V3): partial scale tiles in both dimensions.
  for (int64_t n : {1, 7, 70}) {
    check_ffn({DType::F8_E4M3, n, 8, 2, 384, 200, 0, 0, -1, true}, cov);
    check_ffn({DType::F8_E4M3, n, 8, 3, 256, 136, 136, 2, 6, true}, cov);
  }
  check_ffn({DType::BF16, 300, 4, 4, 64, 64}, cov);  // every token to every expert: runs of whole tiles
  check_ffn({DType::F16, 0, 8, 2, 64, 64, 64}, cov);  // no tokens
  cov.expect_ran({"grouped"});
}

// ---------------------------------------------------------------------------------------------
// MLA attention

struct MlaCase {
  DType wtype, kv;
  int64_t H, nope, rope, v, L, page;
  std::vector<int32_t> seq_indptr, pos, kv_len;  // per token / per sequence
};

void check_mla(const MlaCase& c, Coverage& cov) {
  const int64_t n = c.seq_indptr.back(), S = static_cast<int64_t>(c.kv_len.size()), qd = c.nope + c.rope, lw = c.L + c.rope;
  SCOPED_TRACE(std::string("mla w=") + dtype_name(c.wtype) + " kv=" + dtype_name(c.kv) + " H=" + std::to_string(c.H) +
               " L=" + std::to_string(c.L) + " rope=" + std::to_string(c.rope) + " n=" + std::to_string(n) +
               " kv_len[0]=" + std::to_string(c.kv_len[0]));
  const uint32_t seed = static_cast<uint32_t>(n * 7 + c.L + c.H * 31 + c.kv_len[0]);
  // Per-head W_UK [nope, L] and W_UV [v, L], each one stack (as the loader's views of kv_b).
  HostStack wk(c.wtype, c.H, c.nope, c.L, false, seed), wv(c.wtype, c.H, c.v, c.L, false, seed + 1);
  // Pages: each sequence its own run of pages, handed out in a shuffled order.
  std::vector<int32_t> page_indptr{0}, page_ids;
  for (int64_t s = 0; s < S; ++s) page_indptr.push_back(page_indptr.back() + static_cast<int32_t>((c.kv_len[static_cast<size_t>(s)] + c.page - 1) / c.page));
  page_ids.resize(static_cast<size_t>(page_indptr.back()));
  std::iota(page_ids.begin(), page_ids.end(), 0);
  std::shuffle(page_ids.begin(), page_ids.end(), std::mt19937(seed + 2));
  const auto pool_f = random_floats(static_cast<size_t>(page_ids.size() * static_cast<size_t>(c.page * lw)), seed + 3);
  std::vector<uint8_t> pool(pool_f.size() * static_cast<size_t>(dtype_info(c.kv).block_bytes));
  quantize_row(c.kv, pool_f.data(), pool.data(), static_cast<int64_t>(pool_f.size()));
  const auto q = random_floats(static_cast<size_t>(n * c.H * qd), seed + 4);

  auto args = [&](const void* latent, const float* qp, const int32_t* pos, const int32_t* sip, const int32_t* pip,
                  const int32_t* pid, const int32_t* kvl, const Tensor* twk, const Tensor* twv, float* out) {
    MlaAttentionArgs a;
    a.q = qp, a.pos = pos, a.n = n, a.n_seqs = S, a.seq_indptr = sip;
    a.n_heads = c.H, a.nope = c.nope, a.rope = c.rope, a.v_dim = c.v, a.kv_lora = c.L;
    a.latent_pool = latent, a.latent_stride = lw, a.kv_dtype = c.kv, a.page_size = c.page;
    a.page_indptr = pip, a.page_ids = pid, a.kv_len = kvl;
    a.wk = twk, a.wk_t = nullptr, a.wv = twv;
    a.scale = 1.0f / std::sqrt(static_cast<float>(qd));
    a.out = out;
    return a;
  };
  const auto hk = wk.views(c.wtype, wk.bytes.data(), nullptr, 0, c.H, Device::CPU);
  const auto hv = wv.views(c.wtype, wv.bytes.data(), nullptr, 0, c.H, Device::CPU);
  std::vector<float> want(static_cast<size_t>(n * c.H * c.v), NAN);
  const auto* ref = test::find_kernel<MlaAttentionArgs>(Backend::CPU, "ref");
  ASSERT_TRUE(ref);
  ref->run(args(pool.data(), q.data(), c.pos.data(), c.seq_indptr.data(), page_indptr.data(), page_ids.data(),
                c.kv_len.data(), hk.data(), hv.data(), want.data()));

  const Device d = test::test_device();
  DeviceBuffer dk = upload(wk.bytes), dv = upload(wv.bytes), dpool = upload(pool), dq = upload(q), dpos = upload(c.pos),
               dsip = upload(c.seq_indptr), dpip = upload(page_indptr), dpid = upload(page_ids), dkvl = upload(c.kv_len);
  const auto tk = wk.views(c.wtype, dk.as<uint8_t>(), nullptr, 0, c.H, d);
  const auto tv = wv.views(c.wtype, dv.as<uint8_t>(), nullptr, 0, c.H, d);
  const std::vector<float> poison(want.size(), NAN);
  DeviceBuffer dout = upload(poison);
  const MlaAttentionArgs a = args(dpool.data(), dq.as<float>(), dpos.as<int32_t>(), dsip.as<int32_t>(), dpip.as<int32_t>(),
                                  dpid.as<int32_t>(), dkvl.as<int32_t>(), tk.data(), tv.data(), dout.as<float>());
  for (const auto* k : test::kernels_under_test<MlaAttentionArgs>()) {
    if (!test::refusal(*k, a).empty()) continue;
    upload_into(dout, poison);
    const std::string err = test::run_kernel(*k, a);
    EXPECT_EQ(err, "") << "kernel " << k->name;
    if (!err.empty()) continue;
    const auto got = download<float>(dout, want.size());
    EXPECT_LE(l2_error(got, want), 1e-4) << "kernel " << k->name << ", first unwritten element "
                                         << test::first_unwritten(got, want);
    ++cov.ran[k->name];
  }
}

TEST(CudaOps, MlaAttentionAgainstTheReference) {
  FP_SKIP_WITHOUT_GPU();
  Coverage cov;
  for (DType kv : {DType::F32, DType::F16, DType::BF16})
    for (DType w : {DType::F32, DType::BF16, DType::Q8_0}) {
      // A prefill chunk after 5 cached positions and a fresh prompt; small odd widths.
      check_mla({w, kv, 4, 16, 8, 16, 64, 4, {0, 5, 8}, {5, 6, 7, 8, 9, 0, 1, 2}, {10, 3}}, cov);
      // Decode of three sequences, one long enough for many 64-position tiles per split.
      check_mla({w, kv, 3, 32, 8, 24, 96, 16, {0, 1, 2, 3}, {700, 6, 40}, {701, 7, 41}}, cov);
    }
  // DeepSeek-V2-Lite's widths (16 heads, nope 128, rope 64, v 128, kv_lora 512), decode at 1K;
  // a 24-token prefill chunk over 4 of the heads (the reference's cost grows with heads x
  // positions x (nope + v) x kv_lora); page size 64.
  check_mla({DType::BF16, DType::BF16, 16, 128, 64, 128, 512, 64, {0, 1, 2}, {1023, 300}, {1024, 301}}, cov);
  std::vector<int32_t> pos(24);
  std::iota(pos.begin(), pos.end(), 40);
  check_mla({DType::BF16, DType::F16, 4, 128, 64, 128, 512, 64, {0, 24}, pos, {64}}, cov);
  // Prefill big enough that (token, head) blocks fill the GPU: the fused kernel, no splits (on a
  // GPU of up to 160 SMs); two sequences, one continuing a cached prefix.
  std::vector<int32_t> pos2(100);
  std::iota(pos2.begin(), pos2.begin() + 60, 20);
  std::iota(pos2.begin() + 60, pos2.end(), 0);
  for (DType w : {DType::F32, DType::Q8_0})
    check_mla({w, DType::BF16, 4, 16, 8, 16, 64, 16, {0, 60, 100}, pos2, {80, 40}}, cov);
  cov.expect_ran({"absorbed"});
}

}  // namespace
}  // namespace fp
