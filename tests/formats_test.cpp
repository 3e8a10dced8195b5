// tests/formats_test.cpp — valid-file parsing of the three containers: GGUF metadata of every
// value type (nested arrays, alignment), the GGUF writer round trip, sharded safetensors,
// and the llama2.c version-1 header (converted from the legacy stories260K checkpoint).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/llama2c.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "model/synth.h"
#include "test_util.h"

namespace fp {
namespace {

// Little-endian byte builder for hand-made files.
struct ByteWriter {
  std::vector<uint8_t> b;
  template <class T>
  ByteWriter& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  ByteWriter& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
};

TEST(Gguf, ParsesEveryMetadataTypeIncludingNestedArrays) {
  ByteWriter f;
  f.put<uint32_t>(0x46554747).put<uint32_t>(2).put<uint64_t>(1).put<uint64_t>(14);  // v2, 1 tensor, 14 kv
  f.str("u8").put<uint32_t>(0).put<uint8_t>(200);
  f.str("i8").put<uint32_t>(1).put<int8_t>(-5);
  f.str("u16").put<uint32_t>(2).put<uint16_t>(60000);
  f.str("i16").put<uint32_t>(3).put<int16_t>(-30000);
  f.str("u32").put<uint32_t>(4).put<uint32_t>(4000000000u);
  f.str("i32").put<uint32_t>(5).put<int32_t>(-2000000000);
  f.str("f32").put<uint32_t>(6).put<float>(1.5f);
  f.str("bool").put<uint32_t>(7).put<uint8_t>(1);
  f.str("str").put<uint32_t>(8).str("héllo");
  f.str("u64").put<uint32_t>(10).put<uint64_t>(1ull << 40);
  f.str("i64").put<uint32_t>(11).put<int64_t>(-(1ll << 40));
  f.str("f64").put<uint32_t>(12).put<double>(-2.25);
  f.str("strs").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2).str("a").str("");
  // array of 2 arrays: [i16 x2], [f32 x1]
  f.str("nested").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(2);
  f.put<uint32_t>(3).put<uint64_t>(2).put<int16_t>(7).put<int16_t>(-7);
  f.put<uint32_t>(6).put<uint64_t>(1).put<float>(0.5f);
  // one F16 tensor of 3 elements
  f.str("t").put<uint32_t>(1).put<int64_t>(3).put<uint32_t>(1).put<uint64_t>(0);
  while (f.b.size() % 32) f.b.push_back(0);
  for (uint16_t h : {0x3c00, 0x4000, 0xc200}) f.put<uint16_t>(h);

  auto g = GgufFile::parse(f.b.data(), f.b.size(), "mem.gguf");
  EXPECT_EQ(g->version(), 2u);
  EXPECT_EQ(g->get_uint("u8"), 200u);
  EXPECT_EQ(g->find("i8")->i, -5);
  EXPECT_EQ(g->get_uint("u16"), 60000u);
  EXPECT_EQ(g->find("i16")->i, -30000);
  EXPECT_EQ(g->get_uint("u32"), 4000000000u);
  EXPECT_EQ(g->find("i32")->i, -2000000000);
  EXPECT_EQ(g->get_float("f32"), 1.5);
  EXPECT_TRUE(g->get_bool("bool", false));
  EXPECT_EQ(g->get_string("str"), "héllo");
  EXPECT_EQ(g->get_uint("u64"), 1ull << 40);
  EXPECT_EQ(g->find("i64")->i, -(1ll << 40));
  EXPECT_EQ(g->get_float("f64"), -2.25);
  ASSERT_TRUE(g->get_string_array("strs"));
  EXPECT_EQ(*g->get_string_array("strs"), (std::vector<std::string>{"a", ""}));
  const GgufValue* nested = g->find("nested");
  ASSERT_TRUE(nested);
  ASSERT_EQ(nested->arr_nested.size(), 2u);
  EXPECT_EQ(nested->arr_nested[0].arr_num, (std::vector<double>{7, -7}));
  EXPECT_EQ(nested->arr_nested[1].arr_num, (std::vector<double>{0.5}));
  // Typed getters name the key and the type on misuse.
  try {
    g->get_string("u8");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'u8' should be a string"), std::string::npos) << e.what();
  }
  EXPECT_THROW(g->get_uint("missing"), Error);
  EXPECT_THROW(g->get_uint("i32"), Error);  // negative
  const GgufTensorInfo* t = g->find_tensor("t");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->type, DType::F16);
  float vals[3];
  dequantize_row(t->type, t->data, vals, 3);
  EXPECT_EQ(vals[0], 1.0f);
  EXPECT_EQ(vals[1], 2.0f);
  EXPECT_EQ(vals[2], -3.0f);
}

TEST(Gguf, WriterRoundTripWithCustomAlignment) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("a", 7);
  w.set_i32("b", -7);
  w.set_u64("c", 1ull << 33);
  w.set_f32("d", 0.25f);
  w.set_bool("e", true);
  w.set_f32_array("f", {1, 2});
  w.set_i32_array("g", {-1, 5});
  w.set_string_array("h", {"x", "yz"});
  std::vector<float> m(64 * 3);
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(i) / 10;
  std::vector<uint8_t> q(static_cast<size_t>(row_bytes(DType::Q8_0, 64) * 3));
  for (int r = 0; r < 3; ++r) quantize_row(DType::Q8_0, m.data() + r * 64, q.data() + r * row_bytes(DType::Q8_0, 64), 64);
  w.add_tensor("m", DType::Q8_0, {64, 3}, q);
  w.add_tensor("v", DType::F32, {2}, std::vector<uint8_t>(8, 0));
  auto bytes = w.to_bytes(64);
  auto g = GgufFile::parse(bytes.data(), bytes.size(), "rt.gguf");
  EXPECT_EQ(g->alignment(), 64u);
  EXPECT_EQ(g->version(), 3u);
  EXPECT_EQ(g->get_uint("a"), 7u);
  EXPECT_EQ(g->find("b")->i, -7);
  EXPECT_EQ(g->get_uint("c"), 1ull << 33);
  EXPECT_EQ(g->get_float("d"), 0.25);
  EXPECT_TRUE(g->get_bool("e", false));
  EXPECT_EQ(*g->get_number_array("f"), (std::vector<double>{1, 2}));
  EXPECT_EQ(*g->get_number_array("g"), (std::vector<double>{-1, 5}));
  EXPECT_EQ(*g->get_string_array("h"), (std::vector<std::string>{"x", "yz"}));
  const GgufTensorInfo* t = g->find_tensor("m");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->ne, (std::vector<int64_t>{64, 3}));
  EXPECT_EQ(0, std::memcmp(t->data, q.data(), q.size()));
  EXPECT_EQ((t->data - bytes.data()) % 64, 0);
  EXPECT_EQ(g->find_tensor("v")->nbytes, 8u);
}

TEST(Gguf, StoriesMetadata) {
  std::string path = test::testdata("models/stories260K/stories260K.gguf");
  FP_REQUIRE_FILE(path);
  auto g = GgufFile::open(path);
  EXPECT_EQ(g->version(), 3u);
  EXPECT_EQ(g->tensors().size(), 48u);
  EXPECT_EQ(g->get_string("general.architecture"), "llama");
  EXPECT_EQ(g->get_uint("llama.embedding_length"), 64u);
  EXPECT_EQ(g->get_string_array("tokenizer.ggml.tokens")->size(), 512u);
}

TEST(Safetensors, ShardedIndexLoadsLikeOneFile) {
  std::string dir = test::temp_dir("sharded");
  SynthOptions o;
  o.arch = "qwen2";
  o.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"vocab_size", 300}};
  o.out = dir + "/single";
  synth_model(o);
  // Split the single file into two shards with an index.
  auto one = SafetensorsFile::open(o.out + "/model.safetensors");
  std::filesystem::create_directories(dir + "/sharded");
  SafetensorsWriter a, b;
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  int k = 0;
  for (auto& [name, t] : one->tensors()) {
    bool first = k++ % 2 == 0;
    (first ? a : b).add(name, t.type, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
    index["weight_map"][name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  a.write(dir + "/sharded/model-00001-of-00002.safetensors");
  b.write(dir + "/sharded/model-00002-of-00002.safetensors");
  std::ofstream(dir + "/sharded/model.safetensors.index.json") << index.dump();
  std::filesystem::copy_file(o.out + "/config.json", dir + "/sharded/config.json");

  std::vector<int32_t> ids = {1, 2, 3, 250};
  std::vector<float> out[2];
  int i = 0;
  for (const std::string& p : {o.out, dir + "/sharded"}) {
    auto m = load_model(p);
    auto cache = m->new_cache(4);
    std::vector<int32_t> pos = {0, 1, 2, 3};
    out[i].resize(4 * 300);
    m->forward(ids.data(), pos.data(), 4, *cache, out[i].data(), true);
    ++i;
  }
  EXPECT_EQ(out[0], out[1]);
  auto set = SafetensorsSet::open_dir(dir + "/sharded");
  EXPECT_EQ(set->files().size(), 2u);
}

// Writes stories260K.bin in llama2.c's version-1 layout and checks the same logits come out.
TEST(Llama2c, Version1HeaderGivesSameLogitsAsLegacy) {
  std::string legacy = test::testdata("models/stories260K/stories260K.bin");
  FP_REQUIRE_FILE(legacy);
  auto f = Llama2cFile::open(legacy);
  const auto& c = f->config();
  EXPECT_EQ(c.version, 0);
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_TRUE(c.shared_classifier);
  ByteWriter v1;
  v1.put<uint32_t>(0x616b3432).put<int32_t>(1);
  for (int32_t x : {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len}) v1.put(x);
  v1.put<uint8_t>(1);
  v1.b.resize(256, 0);
  auto put_tensor = [&](const std::string& name) {
    const auto& t = f->tensors().at(name);
    int64_t n = 1;
    for (auto d : t.shape) n *= d;
    const auto* p = reinterpret_cast<const uint8_t*>(t.data);
    v1.b.insert(v1.b.end(), p, p + n * 4);
  };
  auto per_layer = [&](const std::string& suffix) {
    for (int l = 0; l < c.n_layers; ++l) put_tensor("blk." + std::to_string(l) + "." + suffix);
  };
  per_layer("attn_norm.weight");
  per_layer("ffn_norm.weight");
  put_tensor("output_norm.weight");
  put_tensor("token_embd.weight");
  for (auto s : {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight", "ffn_down.weight", "ffn_up.weight"})
    per_layer(s);
  std::string dir = test::temp_dir("l2c_v1");
  std::string path = dir + "/stories_v1.bin";
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(v1.b.data()), static_cast<std::streamsize>(v1.b.size()));
  auto g = Llama2cFile::open(path);
  EXPECT_EQ(g->config().version, 1);

  LoadOptions lo;
  lo.tokenizer_path = test::testdata("models/stories260K/tok512.bin");
  std::vector<int32_t> ids = {1, 403, 407, 261, 378};
  std::vector<int32_t> pos = {0, 1, 2, 3, 4};
  std::vector<float> out[2];
  int i = 0;
  for (const std::string& p : {legacy, path}) {
    auto m = load_model(p, lo);
    auto cache = m->new_cache(5);
    out[i].resize(5 * 512);
    m->forward(ids.data(), pos.data(), 5, *cache, out[i].data(), true);
    ++i;
  }
  EXPECT_EQ(out[0], out[1]);
}

}  // namespace
}  // namespace fp
