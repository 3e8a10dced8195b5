// tests/deepseek_fixture_test.cpp — the deepseek2 forward (MLA + MoE) against llama.cpp's logits
// for the ds3-tiny (V3 style) and ds2lite-tiny (V2-Lite style, YaRN) fixtures in
// ../shared/testdata/models/fixtures (semantics in that folder's README): in one batch (the
// expanded MLA form), token by token (the absorbed form), and with the absorbed form forced on
// the whole batch. Tolerance: 1e-3 of the largest reference logit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <sstream>

#include "kernels/registry.h"
#include "model/model.h"
#include "test_util.h"

namespace fp {
namespace {

struct Fixture {
  std::vector<int32_t> ids;
  std::vector<float> ref;
};

Fixture read_fixture(const std::string& name) {
  Fixture f;
  std::istringstream in(test::read_file(test::testdata("models/fixtures/" + name + ".tokens.txt")));
  for (int32_t v; in >> v;) f.ids.push_back(v);
  f.ref = test::read_f32_file(test::testdata("models/fixtures/" + name + ".logits.f32"));
  return f;
}

std::vector<float> token_by_token(Model& m, const std::vector<int32_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size()), V = m.config().n_vocab;
  auto cache = m.new_cache(n, 16);
  std::vector<float> out(static_cast<size_t>(n * V));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t pos = static_cast<int32_t>(i);
    m.forward(&ids[static_cast<size_t>(i)], &pos, 1, *cache, out.data() + i * V, false);
  }
  return out;
}

class DeepseekFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(DeepseekFixture, MatchesLlamaCppBatchAndIncremental) {
  const std::string name = GetParam();
  const std::string path = test::testdata("models/fixtures/" + name + ".gguf");
  FP_REQUIRE_FILE(path);
  Fixture f = read_fixture(name);
  LoadOptions lo;
  lo.prefault = false;
  auto m = load_model(path, lo);
  ASSERT_EQ(m->config().arch, "deepseek2");
  ASSERT_EQ(f.ref.size(), f.ids.size() * static_cast<size_t>(m->config().n_vocab));
  EXPECT_EQ(m->kv_layout().k_width, m->config().mla.kv_lora_rank + m->config().rot_dim);
  EXPECT_EQ(m->kv_layout().v_width, 0);

  auto batch = test::all_position_logits(path, f.ids);
  EXPECT_LT(test::rel_err(batch, f.ref), 1e-3) << name << " batch";
  auto inc = token_by_token(*m, f.ids);
  EXPECT_LT(test::rel_err(inc, f.ref), 1e-3) << name << " token by token";
  std::printf("%s: batch %.3g, token by token %.3g (relative to max |logit|)\n", name.c_str(), test::rel_err(batch, f.ref),
              test::rel_err(inc, f.ref));

  // The absorbed form on the whole batch equals the expanded form (prefill) to 1e-4.
  KernelOverrides::global().force("mla_attention", "absorbed");
  invalidate_all_dispatch();
  auto absorbed = test::all_position_logits(path, f.ids);
  KernelOverrides::global().clear();
  invalidate_all_dispatch();
  EXPECT_LT(test::rel_err(absorbed, batch), 1e-4) << name << " absorbed vs expanded";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DeepseekFixture, ::testing::Values("ds3-tiny", "ds2lite-tiny"));

}  // namespace
}  // namespace fp
