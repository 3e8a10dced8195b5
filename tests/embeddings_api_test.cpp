// tests/embeddings_api_test.cpp — the /v1/embeddings response pieces: base64 against RFC 4648's
// test vectors, and `dimensions` cutting a vector and normalising it again.
#include <gtest/gtest.h>

#include "server/embeddings_api.h"

namespace fp {
namespace {

TEST(EmbeddingsApi, Base64IsRfc4648) {
  for (auto [in, want] : {std::pair{"", ""}, std::pair{"f", "Zg=="}, std::pair{"fo", "Zm8="}, std::pair{"foo", "Zm9v"},
                          std::pair{"foob", "Zm9vYg=="}, std::pair{"fooba", "Zm9vYmE="}, std::pair{"foobar", "Zm9vYmFy"}})
    EXPECT_EQ(base64_encode(in, std::string(in).size()), want) << in;
  const unsigned char high[] = {0xff, 0xfe, 0x00};
  EXPECT_EQ(base64_encode(high, 3), "//4A");
}

TEST(EmbeddingsApi, DimensionsCutAndNormaliseAgain) {
  EmbeddingRequest req;
  req.inputs = {{1, 2, 3}, {4}};
  req.dimensions = 2;
  const auto r = embedding_response(req, {{0.3f, 0.4f, 0.866f}, {0.0f, -2.0f, 1.0f}}, "m", true);
  EXPECT_EQ(r["model"], "m");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 4);
  const auto a = r["data"][0]["embedding"].get<std::vector<float>>(), b = r["data"][1]["embedding"].get<std::vector<float>>();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_NEAR(a[0], 0.6f, 1e-6);
  EXPECT_NEAR(a[1], 0.8f, 1e-6);
  EXPECT_NEAR(b[1], -1.0f, 1e-6);
  req.dimensions = 0;  // whole vectors, as given
  const auto whole = embedding_response(req, {{0.3f, 0.4f, 0.866f}, {0.0f, -2.0f, 1.0f}}, "m", true);
  EXPECT_EQ(whole["data"][1]["embedding"].get<std::vector<float>>(), (std::vector<float>{0.0f, -2.0f, 1.0f}));
}

}  // namespace
}  // namespace fp
