// tests/loader_corrupt_test.cpp — corrupt model files (GGUF, safetensors, llama2.c, HF config) give an
// fp::Error naming the file and the field or tensor, never a crash: truncations at many offsets,
// flipped header bytes, wrong counts, overflowing sizes, shapes that disagree with the config.
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <typeinfo>

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

LoadOptions no_prefault() {
  LoadOptions o;
  o.prefault = false;
  return o;
}

using Bytes = std::vector<uint8_t>;

Bytes read_bytes(const std::string& path) {
  std::string s = test::read_file(path);
  return Bytes(s.begin(), s.end());
}
void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
void write_text(const std::string& path, const std::string& s) { std::ofstream(path, std::ios::binary) << s; }
template <class T>
void poke(Bytes& b, size_t pos, T v) {
  std::memcpy(b.data() + pos, &v, sizeof(T));
}
template <class T>
T peek(const Bytes& b, size_t pos) {
  T v;
  std::memcpy(&v, b.data() + pos, sizeof(T));
  return v;
}

// Runs f. Passes when f throws fp::Error whose message holds every needle, or (unless must_throw)
// when f returns. Any other exception fails: loaders report corruption as fp::Error only.
testing::AssertionResult outcome(const std::function<void()>& f, bool must_throw, const std::vector<std::string>& needles) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles)
      if (msg.find(n) == std::string::npos) return testing::AssertionFailure() << "message lacks '" << n << "': " << msg;
    return testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return testing::AssertionFailure() << "not an fp::Error (" << typeid(e).name() << "): " << e.what();
  }
  if (must_throw) return testing::AssertionFailure() << "no error thrown";
  return testing::AssertionSuccess();
}
#define EXPECT_LOAD_ERROR(stmt, ...) EXPECT_TRUE(outcome([&] { stmt; }, true, {__VA_ARGS__}))
#define EXPECT_OK_OR_ERROR(stmt, ...) EXPECT_TRUE(outcome([&] { stmt; }, false, {__VA_ARGS__}))

// Counts failures of a sweep and reports only the first few.
struct Sweep {
  std::string what;
  int failures = 0;
  void check(const testing::AssertionResult& r, size_t at) {
    if (r) return;
    if (++failures <= 5) ADD_FAILURE() << what << " at offset " << at << ": " << r.message();
  }
  ~Sweep() {
    if (failures > 5) ADD_FAILURE() << what << ": " << failures << " failures in all";
  }
};

// Parses an exact-size heap copy of the first len bytes, so AddressSanitizer sees any read past the end.
// When parsing succeeds, every tensor must lie inside the buffer.
void parse_gguf(const uint8_t* d, size_t len, const std::string& name) {
  std::unique_ptr<uint8_t[]> buf(new uint8_t[len]);
  if (len) std::memcpy(buf.get(), d, len);
  auto g = GgufFile::parse(buf.get(), len, name);
  for (auto& [k, v] : g->metadata()) (void)v.to_string();
  for (auto& t : g->tensors())
    FP_CHECK(t.data >= buf.get() && t.nbytes <= len && t.data + t.nbytes <= buf.get() + len, "test: tensor ", t.name, " out of bounds");
}
void parse_safetensors(const uint8_t* d, size_t len, const std::string& name) {
  std::unique_ptr<uint8_t[]> buf(new uint8_t[len]);
  if (len) std::memcpy(buf.get(), d, len);
  auto f = SafetensorsFile::parse(buf.get(), len, name);
  for (auto& [n, t] : f->tensors())
    FP_CHECK(t.data >= buf.get() && t.nbytes <= len && t.data + t.nbytes <= buf.get() + len, "test: tensor ", n, " out of bounds");
}
void parse_llama2c(const uint8_t* d, size_t len, const std::string& name) {
  std::unique_ptr<uint8_t[]> buf(new uint8_t[len]);
  if (len) std::memcpy(buf.get(), d, len);
  auto f = Llama2cFile::parse(buf.get(), len, name);
  for (auto& [n, t] : f->tensors()) {
    uint64_t numel = 1;
    for (auto s : t.shape) numel *= static_cast<uint64_t>(s);
    auto* p = reinterpret_cast<const uint8_t*>(t.data);
    FP_CHECK(p >= buf.get() && p + numel * 4 <= buf.get() + len, "test: tensor ", n, " out of bounds");
  }
}

// ---------------------------------------------------------------- GGUF

// Where each field of a GGUF header lies, found by walking it the way the format defines.
struct GgufLayout {
  struct Kv { std::string key; size_t pos, type_pos, value_pos; };
  struct Info { std::string name; size_t pos, dims_pos, type_pos, offset_pos; uint32_t nd; };
  std::vector<Kv> kvs;
  std::vector<Info> infos;
  size_t header_end = 0;   // end of the tensor infos
  size_t data_end = 0;     // end of the last tensor's bytes
};

GgufLayout gguf_layout(const Bytes& b) {
  GgufLayout L;
  size_t p = 24;
  auto str = [&] { uint64_t n = peek<uint64_t>(b, p); std::string s(reinterpret_cast<const char*>(&b[p + 8]), n); p += 8 + n; return s; };
  std::function<void(uint32_t)> skip = [&](uint32_t t) {
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (t == 8) { str(); return; }
    if (t != 9) { p += sz[t]; return; }
    uint32_t et = peek<uint32_t>(b, p);
    uint64_t n = peek<uint64_t>(b, p + 4);
    p += 12;
    for (uint64_t i = 0; i < n; ++i) skip(et);
  };
  uint64_t n_tensors = peek<uint64_t>(b, 8), n_kv = peek<uint64_t>(b, 16);
  for (uint64_t i = 0; i < n_kv; ++i) {
    GgufLayout::Kv kv;
    kv.pos = p;
    kv.key = str();
    kv.type_pos = p;
    uint32_t t = peek<uint32_t>(b, p);
    p += 4;
    kv.value_pos = p;
    skip(t);
    L.kvs.push_back(kv);
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufLayout::Info ti;
    ti.pos = p;
    ti.name = str();
    ti.nd = peek<uint32_t>(b, p);
    ti.dims_pos = p + 4;
    p += 4 + 8 * ti.nd;
    ti.type_pos = p;
    ti.offset_pos = p + 4;
    p += 12;
    L.infos.push_back(ti);
  }
  L.header_end = p;
  auto g = GgufFile::parse(b.data(), b.size(), "layout");
  for (auto& t : g->tensors())
    L.data_end = std::max<size_t>(L.data_end, static_cast<size_t>(t.data - b.data()) + t.nbytes);
  return L;
}

const GgufLayout::Kv& kv_of(const GgufLayout& L, const std::string& key) {
  for (auto& kv : L.kvs)
    if (kv.key == key) return kv;
  throw std::runtime_error("test: no key " + key);
}

// Every truncation before the end of the last tensor fails; offsets: all of [0, dense), then `spread`
// more through the rest of the header and the data.
void sweep_gguf_truncations(const Bytes& b, const std::string& name, size_t dense, size_t spread) {
  GgufLayout L = gguf_layout(b);
  std::vector<size_t> cuts;
  for (size_t c = 0; c < std::min(dense, L.header_end); ++c) cuts.push_back(c);
  for (auto& kv : L.kvs) for (size_t d : {0, 1, 8, 9, 12}) cuts.push_back(kv.pos + d);
  for (auto& ti : L.infos) for (size_t d : {size_t(0), size_t(8), ti.type_pos - ti.pos, ti.offset_pos - ti.pos + 7}) cuts.push_back(ti.pos + d);
  for (size_t k = 0; k < spread; ++k) cuts.push_back(k * (L.data_end / spread));
  cuts.push_back(L.header_end);
  cuts.push_back(L.data_end - 1);
  Sweep s{"truncated " + name};
  for (size_t c : cuts) {
    if (c >= L.data_end) continue;
    s.check(outcome([&] { parse_gguf(b.data(), c, name); }, true, {name}), c);
  }
}

// Flipping any header byte gives a clean error or a file that still parses with tensors in bounds.
void sweep_gguf_flips(Bytes b, const std::string& name, const std::vector<size_t>& positions) {
  Sweep s{"flipped byte in " + name};
  const uint8_t masks[] = {0xff, 0x80, 0x01, 0x40};
  for (size_t i = 0; i < positions.size(); ++i) {
    size_t pos = positions[i];
    uint8_t m = masks[i % 4];
    b[pos] ^= m;
    // parse in place: b is exactly the file's size, so reads past the end still trip ASan
    s.check(outcome([&] {
      auto g = GgufFile::parse(b.data(), b.size(), name);
      for (auto& [k, v] : g->metadata()) (void)v.to_string();
      for (auto& t : g->tensors()) FP_CHECK(t.data + t.nbytes <= b.data() + b.size(), "test: tensor out of bounds");
    }, false, {name}), pos);
    b[pos] ^= m;
  }
}

class GgufRealFiles : public testing::TestWithParam<const char*> {};

TEST_P(GgufRealFiles, TruncationsAndFlips) {
  const std::string path = test::testdata(GetParam());
  FP_REQUIRE_FILE(path);
  const Bytes b = read_bytes(path);
  const GgufLayout L = gguf_layout(b);
  const bool small = L.header_end < 64 * 1024;
  // stories260K: every header offset; llama-tiny-q8 (32000-token vocab, ~1 ms a parse): the first
  // 4 KiB and every field start for truncations; for flips the preamble, each key's length, type and
  // value start, and the fields of every tensor info (all bytes of the first and last two).
  sweep_gguf_truncations(b, path, small ? L.header_end : 4096, 257);
  std::vector<size_t> pos;
  for (size_t i = 0; i < (small ? L.header_end : 24); ++i) pos.push_back(i);
  if (!small) {
    for (auto& kv : L.kvs)
      for (size_t p : {kv.pos, kv.pos + 1, kv.pos + 7, kv.type_pos, kv.value_pos, kv.value_pos + 3, kv.value_pos + 4, kv.value_pos + 11})
        pos.push_back(p);
    for (size_t i = 0; i < L.infos.size(); ++i) {
      const auto& ti = L.infos[i];
      if (i < 2 || i + 2 >= L.infos.size()) {
        for (size_t p = ti.pos; p < ti.offset_pos + 8; ++p) pos.push_back(p);
      } else {
        for (size_t p : {ti.pos, ti.pos + 7, ti.dims_pos - 4, ti.dims_pos, ti.dims_pos + 7, ti.type_pos, ti.offset_pos, ti.offset_pos + 7})
          pos.push_back(p);
      }
    }
  }
  sweep_gguf_flips(b, path, pos);
}

TEST_P(GgufRealFiles, TargetedFields) {
  const std::string path = test::testdata(GetParam());
  FP_REQUIRE_FILE(path);
  const Bytes orig = read_bytes(path);
  const GgufLayout L = gguf_layout(orig);
  ASSERT_NO_THROW(parse_gguf(orig.data(), orig.size(), path));
  auto mutated = [&](auto edit) { Bytes b = orig; edit(b); return b; };
  auto parse = [&](const Bytes& b) { parse_gguf(b.data(), b.size(), path); };

  EXPECT_LOAD_ERROR(parse(mutated([](Bytes& b) { b[0] = 'X'; })), path, "magic");
  for (uint32_t v : {0u, 1u, 4u, 0xffffffffu})
    EXPECT_LOAD_ERROR(parse(mutated([&](Bytes& b) { poke<uint32_t>(b, 4, v); })), path, "version");
  for (uint64_t n : {uint64_t(1) << 40, ~uint64_t(0), uint64_t(1) << 63, uint64_t(orig.size())}) {
    EXPECT_LOAD_ERROR(parse(mutated([&](Bytes& b) { poke<uint64_t>(b, 8, n); })), path, "tensor count");
    EXPECT_LOAD_ERROR(parse(mutated([&](Bytes& b) { poke<uint64_t>(b, 16, n); })), path, "metadata count");
  }
  // One tensor or key more than the file holds: the reader runs into the next field.
  EXPECT_LOAD_ERROR(parse(mutated([&](Bytes& b) { poke<uint64_t>(b, 8, L.infos.size() + 1); })), path);
  EXPECT_LOAD_ERROR(parse(mutated([&](Bytes& b) { poke<uint64_t>(b, 16, L.kvs.size() + 1); })), path);
  // Huge string lengths: the first key, and the first tensor name.
  for (uint64_t n : {uint64_t(1) << 62, ~uint64_t(0), uint64_t(1) << 30, uint64_t(orig.size())}) {
    EXPECT_LOAD_ERROR(parse(mutated([&](Bytes& b) { poke<uint64_t>(b, 24, n); })), path, "metadata key");
    EXPECT_LOAD_ERROR(parse(mutated([&](Bytes& b) { poke<uint64_t>(b, L.infos[0].pos, n); })), path, "tensor name");
  }
  // Unknown value types and array element types.
  EXPECT_LOAD_ERROR(parse(mutated([&](Bytes& b) { poke<uint32_t>(b, L.kvs[0].type_pos, 13); })), path, L.kvs[0].key, "type");
  const auto& tokens = kv_of(L, "tokenizer.ggml.tokens");
  EXPECT_LOAD_ERROR(parse(mutated([&](Bytes& b) { poke<uint32_t>(b, tokens.value_pos, 77); })), path, tokens.key, "element type");
  EXPECT_LOAD_ERROR(parse(mutated([&](Bytes& b) { poke<uint64_t>(b, tokens.value_pos + 4, uint64_t(1) << 40); })), path,
                    tokens.key, "array length");
  EXPECT_LOAD_ERROR(parse(mutated([&](Bytes& b) { poke<uint64_t>(b, tokens.value_pos + 4, uint64_t(1) << 31); })), path);
  // Duplicate keys: rename a key to an earlier one of the same length.
  bool dup_done = false;
  for (size_t i = 0; i < L.kvs.size() && !dup_done; ++i)
    for (size_t j = i + 1; j < L.kvs.size() && !dup_done; ++j)
      if (L.kvs[i].key.size() == L.kvs[j].key.size()) {
        EXPECT_LOAD_ERROR(parse(mutated([&](Bytes& b) { std::memcpy(&b[L.kvs[j].pos + 8], L.kvs[i].key.data(), L.kvs[i].key.size()); })),
                          path, "duplicate metadata key '" + L.kvs[i].key + "'");
        dup_done = true;
      }
  EXPECT_TRUE(dup_done);
  // Tensor infos: dims, type, offsets.
  for (const auto& ti : {L.infos.front(), L.infos.back()}) {
    auto info = [&](auto edit) { return mutated(edit); };
    EXPECT_LOAD_ERROR(parse(info([&](Bytes& b) { poke<uint32_t>(b, ti.dims_pos - 4, 0); })), path, ti.name, "dimensions");
    EXPECT_LOAD_ERROR(parse(info([&](Bytes& b) { poke<uint32_t>(b, ti.dims_pos - 4, 9); })), path, ti.name, "dimensions");
    EXPECT_LOAD_ERROR(parse(info([&](Bytes& b) { poke<int64_t>(b, ti.dims_pos, -32); })), path, ti.name, "negative");
    EXPECT_LOAD_ERROR(parse(info([&](Bytes& b) { poke<uint32_t>(b, ti.type_pos, 99); })), path, ti.name, "type 99");
    EXPECT_LOAD_ERROR(parse(info([&](Bytes& b) { poke<uint32_t>(b, ti.type_pos, 16); })), path, ti.name, "type 16 (IQ2_XXS)");
    EXPECT_LOAD_ERROR(parse(info([&](Bytes& b) { poke<uint64_t>(b, ti.offset_pos, peek<uint64_t>(b, ti.offset_pos) + 4); })),
                      path, ti.name, "alignment");
    for (uint64_t off : {uint64_t(orig.size()) / 32 * 32, uint64_t(1) << 40, ~uint64_t(31)})
      EXPECT_LOAD_ERROR(parse(info([&](Bytes& b) { poke<uint64_t>(b, ti.offset_pos, off); })), path, ti.name, "past the end");
    if (ti.nd >= 2) {
      // Dims whose product overflows, and a 0 dim beside huge ones (0 bytes, but views would overflow).
      EXPECT_LOAD_ERROR(parse(info([&](Bytes& b) { poke<int64_t>(b, ti.dims_pos + 8, int64_t(1) << 62); })), path, ti.name);
      EXPECT_LOAD_ERROR(parse(info([&](Bytes& b) {
                          poke<int64_t>(b, ti.dims_pos, 0);
                          poke<int64_t>(b, ti.dims_pos + 8, int64_t(1) << 62);
                        })),
                        path, ti.name, "overflows");
    }
  }
  // Twice the rows of the tensor stored last: it no longer fits before the end of the file.
  const GgufLayout::Info* last = nullptr;
  uint64_t last_off = 0;
  for (auto& ti : L.infos)
    if (ti.nd >= 2 && peek<uint64_t>(orig, ti.offset_pos) >= last_off) last = &ti, last_off = peek<uint64_t>(orig, ti.offset_pos);
  ASSERT_TRUE(last);
  EXPECT_LOAD_ERROR(parse(mutated([&](Bytes& b) { poke<int64_t>(b, last->dims_pos + 8, 2 * peek<int64_t>(b, last->dims_pos + 8)); })),
                    path, last->name, "past the end");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufRealFiles,
                         testing::Values("models/stories260K/stories260K.gguf", "models/fixtures/llama-tiny-q8.gguf"),
                         [](const testing::TestParamInfo<const char*>& i) { return i.index == 0 ? std::string("stories260K") : std::string("llama_tiny_q8"); });

// Hand-built GGUF bytes, for fields the real files do not exercise.
struct RawGguf {
  Bytes b;
  RawGguf& u8(uint8_t v) { b.push_back(v); return *this; }
  RawGguf& u32(uint32_t v) { b.resize(b.size() + 4); poke(b, b.size() - 4, v); return *this; }
  RawGguf& u64(uint64_t v) { b.resize(b.size() + 8); poke(b, b.size() - 8, v); return *this; }
  RawGguf& str(const std::string& s) { u64(s.size()); b.insert(b.end(), s.begin(), s.end()); return *this; }
  RawGguf& preamble(uint64_t n_tensors, uint64_t n_kv) { return u32(0x46554747).u32(3).u64(n_tensors).u64(n_kv); }
  RawGguf& info(const std::string& name, std::vector<int64_t> ne, uint32_t type, uint64_t off) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (auto d : ne) u64(static_cast<uint64_t>(d));
    return u32(type).u64(off);
  }
  RawGguf& pad(size_t align = 32, size_t extra = 0) { b.resize((b.size() + align - 1) / align * align + extra); return *this; }
};

TEST(GgufCorrupt, HandBuiltFields) {
  const std::string name = "hand.gguf";
  auto parse = [&](const RawGguf& g) { parse_gguf(g.b.data(), g.b.size(), name); };
  // A valid file first.
  EXPECT_NO_THROW(parse(RawGguf().preamble(1, 1).str("general.architecture").u32(8).str("llama")
                            .info("t", {32, 2}, 0, 0).pad(32, 256)));
  EXPECT_NO_THROW(parse(RawGguf().preamble(0, 0)));

  EXPECT_LOAD_ERROR(parse(RawGguf().preamble(0, 1).str("k").u32(7).u8(2)), name, "'k'", "bool");
  EXPECT_LOAD_ERROR(parse(RawGguf().preamble(0, 1).str("k").u32(13).u32(0)), name, "'k'", "unknown value type 13");
  EXPECT_LOAD_ERROR(parse(RawGguf().preamble(0, 2).str("k").u32(4).u32(1).str("k").u32(4).u32(2)), name, "duplicate metadata key 'k'");
  EXPECT_LOAD_ERROR(parse(RawGguf().preamble(0, 1).str("k").u32(9).u32(13).u64(1).u32(0)), name, "'k'", "element type");
  EXPECT_LOAD_ERROR(parse(RawGguf().preamble(0, 1).str("k").u32(9).u32(8).u64(uint64_t(1) << 33)), name, "'k'", "array length");
  EXPECT_LOAD_ERROR(parse(RawGguf().preamble(0, 1).str("k").u32(9).u32(8).u64(1000).u64(0)), name, "truncated", "string array");
  EXPECT_LOAD_ERROR(parse(RawGguf().preamble(0, 1).str("k").u32(9).u32(12).u64(uint64_t(1) << 31)), name, "truncated");
  {
    RawGguf g;
    g.preamble(0, 1).str("deep").u32(9);
    for (int i = 0; i < 12; ++i) g.u32(9).u64(1);  // arrays of arrays of ...
    g.u32(4).u64(0);
    EXPECT_LOAD_ERROR(parse(g), name, "'deep'", "nested");
  }
  for (uint32_t a : {0u, 1u, 3u, 4u, 1u << 20})  // 1 and 4 would allow misaligned f16/f32/block data
    EXPECT_LOAD_ERROR(parse(RawGguf().preamble(0, 1).str("general.alignment").u32(4).u32(a)), name, "general.alignment");
  EXPECT_LOAD_ERROR(parse(RawGguf().preamble(0, 1).str("general.alignment").u32(8).str("32")), name, "general.alignment");

  auto one = [&](std::vector<int64_t> ne, uint32_t type, uint64_t off, size_t data = 256) {
    return RawGguf().preamble(1, 0).info("w", std::move(ne), type, off).pad(32, data);
  };
  EXPECT_LOAD_ERROR(parse(one({}, 0, 0)), name, "'w'", "dimensions");
  EXPECT_LOAD_ERROR(parse(one({1, 1, 1, 1, 1}, 0, 0)), name, "'w'", "dimensions");
  EXPECT_LOAD_ERROR(parse(one({-1}, 0, 0)), name, "'w'", "negative");
  EXPECT_LOAD_ERROR(parse(one({32}, 1000, 0)), name, "'w'", "type 1000");
  EXPECT_LOAD_ERROR(parse(one({33, 1}, 8, 0)), name, "'w'", "block size");       // Q8_0 rows of 33
  EXPECT_LOAD_ERROR(parse(one({32}, 0, 16)), name, "'w'", "alignment");
  EXPECT_LOAD_ERROR(parse(one({32}, 0, 4096)), name, "'w'", "past the end");
  EXPECT_LOAD_ERROR(parse(one({32}, 0, ~uint64_t(31))), name, "'w'", "past the end");  // offset + size wraps
  EXPECT_LOAD_ERROR(parse(one({65}, 0, 0)), name, "'w'", "past the end");            // 260 bytes > 256
  EXPECT_LOAD_ERROR(parse(one({int64_t(1) << 32, int64_t(1) << 32, int64_t(1) << 32}, 0, 0)), name, "'w'", "overflows");
  EXPECT_LOAD_ERROR(parse(one({0, int64_t(1) << 62, int64_t(1) << 62, int64_t(1) << 62}, 0, 0)), name, "'w'", "overflows");
  EXPECT_LOAD_ERROR(parse(one({1, int64_t(1) << 60, 0}, 28, 0)), name, "'w'", "overflows");  // f64: 2^63 bytes before the 0
  EXPECT_LOAD_ERROR(parse(RawGguf().preamble(2, 0).info("w", {8}, 0, 0).info("w", {8}, 0, 32).pad(32, 64)), name,
                    "duplicate tensor name 'w'");
  // The data section would start past the end of the file.
  EXPECT_LOAD_ERROR(parse(RawGguf().preamble(1, 0).info("w", {0}, 0, 0)), name, "data section");
}

// Synth models: GGUF and a safetensors directory with tiny shapes.
nlohmann::json tiny_config() {
  return {{"hidden_size", 32}, {"intermediate_size", 64}, {"num_hidden_layers", 1}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"vocab_size", 64}, {"max_position_embeddings", 64}};
}
std::string synth(const std::string& out, nlohmann::json config = tiny_config()) {
  SynthOptions so;
  so.config = std::move(config);
  so.out = out;
  synth_model(so);
  return out;
}

void load_and_build(const std::string& path) {
  std::shared_ptr<ModelFile> f(load_model_file(path, no_prefault()).release());
  build_model(std::move(f));
}

TEST(GgufCorrupt, ThroughModelLoader) {
  const std::string dir = test::temp_dir("corrupt_gguf_model");
  const std::string good = synth(dir + "/tiny.gguf");
  ASSERT_NO_THROW(load_and_build(good));
  const Bytes orig = read_bytes(good);
  const GgufLayout L = gguf_layout(orig);
  auto variant = [&](const std::string& tag, auto edit) {
    Bytes b = orig;
    edit(b);
    std::string p = dir + "/" + tag + ".gguf";
    write_bytes(p, b);
    return p;
  };
  for (size_t cut : {size_t(3), size_t(100), L.header_end, L.data_end - 1}) {
    std::string p = variant("cut" + std::to_string(cut), [&](Bytes& b) { b.resize(cut); });
    EXPECT_LOAD_ERROR(load_and_build(p), p);
  }
  // A tensor renamed in place (same length): the model misses it.
  for (auto& ti : L.infos) {
    if (ti.name != "blk.0.attn_q.weight") continue;
    std::string p = variant("renamed", [&](Bytes& b) { b[ti.pos + 8 + ti.name.size() - 8] = 'X'; });
    EXPECT_LOAD_ERROR(load_and_build(p), p, "missing tensor 'blk.0.attn_q.weight'");
  }
  // The config disagrees with the tensors, or claims absurd sizes.
  const auto& emb = kv_of(L, "llama.embedding_length");
  const auto& ffn = kv_of(L, "llama.feed_forward_length");
  const auto& heads = kv_of(L, "llama.attention.head_count");
  ASSERT_EQ(peek<uint32_t>(orig, emb.type_pos), 4u);  // u32 values
  std::string p = variant("dim64", [&](Bytes& b) { poke<uint32_t>(b, emb.value_pos, 64); });
  EXPECT_LOAD_ERROR(load_and_build(p), p, "token_embd.weight", "expected [64, 64]");
  p = variant("ffn96", [&](Bytes& b) { poke<uint32_t>(b, ffn.value_pos, 96); });
  EXPECT_LOAD_ERROR(load_and_build(p), p, "ffn_gate.weight", "expected");
  p = variant("heads0", [&](Bytes& b) { poke<uint32_t>(b, heads.value_pos, 0); });
  EXPECT_LOAD_ERROR(load_and_build(p), p, "head_count");
  p = variant("headshuge", [&](Bytes& b) { poke<uint32_t>(b, heads.value_pos, 0xffffffffu); });
  EXPECT_LOAD_ERROR(load_and_build(p), p);
  p = variant("embhuge", [&](Bytes& b) { poke<uint32_t>(b, emb.value_pos, 0x80000000u); });
  EXPECT_LOAD_ERROR(load_and_build(p), p);
  p = variant("badtype", [&](Bytes& b) { poke<uint32_t>(b, emb.type_pos, 8); });  // now a string
  EXPECT_LOAD_ERROR(load_and_build(p), p);
}

// Flipped metadata and tensor-info bytes of a synth model, through the whole loader: either a clean
// error naming the file, or a model that builds and runs a token.
TEST(GgufCorrupt, FlipsThroughModelLoader) {
  const std::string dir = test::temp_dir("corrupt_gguf_flips");
  const std::string good = synth(dir + "/tiny.gguf");
  const Bytes orig = read_bytes(good);
  const GgufLayout L = gguf_layout(orig);
  std::vector<size_t> pos;
  for (auto& kv : L.kvs)
    for (size_t p = kv.type_pos; p < std::min(kv.value_pos + 8, L.header_end); ++p) pos.push_back(p);
  for (auto& ti : L.infos)
    for (size_t p = ti.dims_pos - 4; p < ti.offset_pos + 8; p += 3) pos.push_back(p);
  const std::string path = dir + "/flipped.gguf";
  Sweep s{"flipped byte in " + good + " (as " + path + ")"};
  const uint8_t masks[] = {0xff, 0x80, 0x01, 0x10, 0x02};
  for (size_t i = 0; i < pos.size(); ++i) {
    Bytes b = orig;
    b[pos[i]] ^= masks[i % 5];
    write_bytes(path, b);
    s.check(outcome([&] {
      std::shared_ptr<ModelFile> f(load_model_file(path, no_prefault()).release());
      auto model = build_model(f);
      auto cache = model->new_cache(2);
      std::vector<float> logits(static_cast<size_t>(f->config.n_vocab));
      int32_t tok = 0, p0 = 0;  // 0: a flip may shrink the vocabulary to 1
      model->forward(&tok, &p0, 1, *cache, logits.data(), false);
    }, false, {path}), pos[i]);
  }
}

// ---------------------------------------------------------------- safetensors

Bytes st_bytes(const std::string& header, size_t data_bytes) {
  Bytes b(8 + header.size() + data_bytes, 0);  // sized once: gcc 12 warns falsely on insert/resize here
  poke<uint64_t>(b, 0, header.size());
  std::memcpy(b.data() + 8, header.data(), header.size());
  return b;
}

TEST(SafetensorsCorrupt, TruncationsAndFlips) {
  const std::string dir = synth(test::temp_dir("corrupt_st") + "/m");
  const std::string path = dir + "/model.safetensors";
  const Bytes b = read_bytes(path);
  ASSERT_NO_THROW(parse_safetensors(b.data(), b.size(), path));
  const size_t hend = 8 + peek<uint64_t>(b, 0);
  Sweep trunc{"truncated " + path};
  for (size_t c = 0; c < b.size(); c += (c < hend + 64 ? 1 : (b.size() - hend) / 200 + 1))
    trunc.check(outcome([&] { parse_safetensors(b.data(), c, path); }, true, {path}), c);
  trunc.check(outcome([&] { parse_safetensors(b.data(), b.size() - 1, path); }, true, {path, "past the end"}), b.size() - 1);

  Bytes m = b;
  Sweep flips{"flipped byte in " + path};
  const uint8_t masks[] = {0xff, 0x80, 0x01, 0x20, 0x04};
  for (size_t i = 0; i < hend; ++i) {
    m[i] ^= masks[i % 5];
    flips.check(outcome([&] { parse_safetensors(m.data(), m.size(), path); }, false, {path}), i);
    m[i] ^= masks[i % 5];
  }
  Bytes big = b;
  poke<uint64_t>(big, 0, b.size());
  EXPECT_LOAD_ERROR(parse_safetensors(big.data(), big.size(), path), path, "header length");
  poke<uint64_t>(big, 0, ~uint64_t(0));
  EXPECT_LOAD_ERROR(parse_safetensors(big.data(), big.size(), path), path, "header length");
  poke<uint64_t>(big, 0, 3);
  EXPECT_LOAD_ERROR(parse_safetensors(big.data(), big.size(), path), path, "JSON");
}

TEST(SafetensorsCorrupt, HeaderFields) {
  const std::string name = "hand.safetensors";
  struct Case { std::string header; size_t data; std::vector<std::string> needles; };
  std::string deep_shape = std::string(100000, '[') + std::string(100000, ']');
  std::vector<Case> cases = {
      {"not json", 16, {"not valid JSON"}},
      {"{\"a\": {\"dtype\": \"F32\"", 16, {"not valid JSON"}},
      {"[1, 2]", 16, {"JSON object"}},
      {"{\"a\": 5}", 16, {"'a'", "object"}},
      {R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", 16, {"'a'", "dtype"}},
      {R"({"a": {"dtype": 7, "shape": [1], "data_offsets": [0, 4]}})", 16, {"'a'", "dtype"}},
      {R"({"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}})", 16, {"'a'", "dtype 'Q9'"}},
      {R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})", 16, {"'a'", "shape"}},
      {R"({"a": {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]}})", 16, {"'a'", "shape"}},
      {R"({"a": {"dtype": "F32", "shape": [1,1,1,1,1,1,1,1,1], "data_offsets": [0, 4]}})", 16, {"'a'", "shape"}},
      {R"({"a": {"dtype": "F32", "shape": [1]}})", 16, {"'a'", "data_offsets"}},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 16, {"'a'", "data_offsets"}},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 16, {"'a'", "data_offsets"}},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4.5]}})", 16, {"'a'", "data_offsets"}},
      {R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 16, {"'a'", "non-negative", "-1"}},
      {R"({"a": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 4]}})", 16, {"'a'", "non-negative"}},
      {R"({"a": {"dtype": "F32", "shape": ["4"], "data_offsets": [0, 16]}})", 16, {"'a'", "non-negative"}},
      {R"({"a": {"dtype": "F32", "shape": [)" + deep_shape + R"(], "data_offsets": [0, 4]}})", 16, {"'a'", "non-negative"}},
      {R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 4]}})", 16, {"'a'", "overflows"}},
      {R"({"a": {"dtype": "F32", "shape": [9223372036854775808, 0], "data_offsets": [0, 0]}})", 16, {"'a'", "overflows"}},
      {R"({"a": {"dtype": "F32", "shape": [0, 4611686018427387904, 4611686018427387904], "data_offsets": [0, 0]}})", 16, {"'a'", "overflows"}},
      {R"({"a": {"dtype": "F32", "shape": [99999999999999999999], "data_offsets": [0, 4]}})", 16, {"'a'", "non-negative"}},
      {R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1000]}})", 16, {"'a'", "past the end", "[0, 1000]"}},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [12, 8]}})", 16, {"'a'", "past the end"}},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 18446744073709551615]}})", 16, {"'a'", "past the end"}},
      {R"({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}})", 16, {"'a'", "expected 16"}},
      {R"({"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 16]}})", 16, {"'a'", "expected 8"}},
      {R"({"__metadata__": 5})", 16, {"__metadata__"}},
  };
  for (auto& c : cases) {
    Bytes b = st_bytes(c.header, c.data);
    std::vector<std::string> needles = c.needles;
    needles.push_back(name);
    EXPECT_TRUE(outcome([&] { parse_safetensors(b.data(), b.size(), name); }, true, needles)) << c.header.substr(0, 120);
  }
  // Accepted: lenient metadata, even deeply nested (no recursion blow-up), and an empty header.
  for (std::string h : {std::string(R"({"__metadata__": {"x": )") + deep_shape + "}}", std::string("{}"),
                        std::string(R"({"a": {"dtype": "F32", "shape": [0, 5], "data_offsets": [16, 16]}})")}) {
    Bytes b = st_bytes(h, 16);
    EXPECT_NO_THROW(parse_safetensors(b.data(), b.size(), name)) << h.substr(0, 80);
  }
}

TEST(SafetensorsCorrupt, ShardedIndex) {
  const std::string dir = synth(test::temp_dir("corrupt_st_shards") + "/m");
  const std::string shard = "model-00001-of-00002.safetensors";
  std::filesystem::rename(dir + "/model.safetensors", dir + "/" + shard);
  auto tensors = SafetensorsFile::open(dir + "/" + shard)->tensors();
  auto write_index = [&](const nlohmann::json& wm) { write_text(dir + "/model.safetensors.index.json", nlohmann::json{{"weight_map", wm}}.dump()); };
  nlohmann::json wm = nlohmann::json::object();
  for (auto& [n, t] : tensors) wm[n] = shard;
  write_index(wm);
  ASSERT_NO_THROW(SafetensorsSet::open_dir(dir));
  ASSERT_NO_THROW(load_and_build(dir));
  const std::string index = dir + "/model.safetensors.index.json";

  auto w = wm;
  w["model.norm.weight"] = "model-00002-of-00002.safetensors";
  write_index(w);
  EXPECT_LOAD_ERROR(SafetensorsSet::open_dir(dir), "model-00002-of-00002.safetensors");
  w = wm;
  w["model.layers.7.mlp.up_proj.weight"] = shard;
  write_index(w);
  EXPECT_LOAD_ERROR(SafetensorsSet::open_dir(dir), shard, "model.layers.7.mlp.up_proj.weight", "missing from the shard");
  w = wm;
  w["model.norm.weight"] = "../" + shard;
  write_index(w);
  EXPECT_LOAD_ERROR(SafetensorsSet::open_dir(dir), index, "outside the directory");
  w = wm;
  w["model.norm.weight"] = 3;
  write_index(w);
  EXPECT_LOAD_ERROR(SafetensorsSet::open_dir(dir), index, "model.norm.weight");
  write_text(index, R"({"metadata": {}})");
  EXPECT_LOAD_ERROR(SafetensorsSet::open_dir(dir), index, "weight_map");
  write_text(index, R"({"weight_map": {"a": )");
  EXPECT_LOAD_ERROR(SafetensorsSet::open_dir(dir), index, "JSON");
  // A shard listed for one tensor only: the model misses the rest.
  write_index(nlohmann::json{{"model.norm.weight", shard}});
  EXPECT_LOAD_ERROR(load_and_build(dir), dir, "missing tensor");
}

TEST(SafetensorsCorrupt, ConfigDisagreesWithTensors) {
  const std::string base = test::temp_dir("corrupt_st_config");
  const std::string good = synth(base + "/good");
  ASSERT_NO_THROW(load_and_build(good));
  const std::string cfg_text = test::read_file(good + "/config.json");
  int n = 0;
  // A copy of the model with config.json edited (or replaced by raw text).
  auto with_config = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& raw = "") {
    std::string d = base + "/v" + std::to_string(n++);
    std::filesystem::create_directories(d);
    std::filesystem::copy_file(good + "/model.safetensors", d + "/model.safetensors");
    nlohmann::json j = nlohmann::json::parse(cfg_text);
    if (edit) edit(j);
    write_text(d + "/config.json", raw.empty() ? j.dump() : raw);
    return d;
  };
  std::string d = with_config([](auto& j) { j["hidden_size"] = 64; });
  EXPECT_LOAD_ERROR(load_and_build(d), d, "token_embd.weight", "expected [64, 64]");
  d = with_config([](auto& j) { j["intermediate_size"] = 96; });
  EXPECT_LOAD_ERROR(load_and_build(d), d, "ffn_gate.weight", "expected [96, 32]");
  d = with_config([](auto& j) { j["vocab_size"] = 65; });
  EXPECT_LOAD_ERROR(load_and_build(d), d, "token_embd.weight", "expected [65, 32]");
  d = with_config([](auto& j) { j["num_key_value_heads"] = 4; });
  EXPECT_LOAD_ERROR(load_and_build(d), d, "attn_k.weight", "expected");
  d = with_config([](auto& j) { j["num_hidden_layers"] = 2; });
  EXPECT_LOAD_ERROR(load_and_build(d), d, "missing tensor 'blk.1.");
  d = with_config([](auto& j) { j["num_attention_heads"] = 3; });
  EXPECT_LOAD_ERROR(load_and_build(d), d);
  d = with_config([](auto& j) { j.erase("hidden_size"); });
  EXPECT_LOAD_ERROR(load_and_build(d), d, "missing field 'hidden_size'");
  d = with_config([](auto& j) { j["hidden_size"] = "32"; });
  EXPECT_LOAD_ERROR(load_and_build(d), d, "hidden_size", "integer");
  d = with_config([](auto& j) { j["hidden_size"] = int64_t(1) << 40; });
  EXPECT_LOAD_ERROR(load_and_build(d), d, "hidden size");
  d = with_config([](auto& j) { j["hidden_size"] = uint64_t(1) << 63; });
  EXPECT_LOAD_ERROR(load_and_build(d), d, "hidden size");
  d = with_config([](auto& j) { j["tie_word_embeddings"] = "yes"; });
  EXPECT_LOAD_ERROR(load_and_build(d), d, "tie_word_embeddings");
  d = with_config([](auto& j) { j["rope_scaling"] = {{"rope_type", 3}}; });
  EXPECT_LOAD_ERROR(load_and_build(d), d, "rope_type");
  d = with_config([](auto& j) { j["architectures"] = {"GPT2LMHeadModel"}; });
  EXPECT_LOAD_ERROR(load_and_build(d), d, "GPT2LMHeadModel");
  d = with_config(nullptr, "{\"hidden_size\": 32,");
  EXPECT_LOAD_ERROR(load_and_build(d), d, "config.json", "JSON");
  d = with_config(nullptr, std::string(200000, '[') + std::string(200000, ']'));
  EXPECT_LOAD_ERROR(load_and_build(d), d, "config.json");
  // A deeply nested extra field (raw text: dump() itself would recurse that deep).
  std::string deep = cfg_text.substr(0, cfg_text.rfind('}')) + ", \"deep\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  d = with_config(nullptr, deep);
  EXPECT_NO_THROW(load_and_build(d));

  // A tensor missing from the file, and one with the wrong shape.
  auto f = SafetensorsFile::open(good + "/model.safetensors");
  for (const std::string drop : {"model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight"}) {
    d = with_config(nullptr);
    SafetensorsWriter wr;
    for (auto& [name, t] : f->tensors()) {
      if (name == drop) continue;
      std::vector<int64_t> shape = t.shape;
      wr.add(name, t.type, shape, Bytes(t.data, t.data + t.nbytes));
    }
    wr.write(d + "/model.safetensors");
    EXPECT_LOAD_ERROR(load_and_build(d), d, "missing tensor", drop == "model.embed_tokens.weight" ? "token_embd" : "blk.0.attn_q.weight");
  }
  d = with_config(nullptr);
  SafetensorsWriter wr;
  for (auto& [name, t] : f->tensors()) {
    std::vector<int64_t> shape = t.shape;
    if (name == "model.layers.0.mlp.down_proj.weight") std::swap(shape[0], shape[1]);  // transposed
    wr.add(name, t.type, shape, Bytes(t.data, t.data + t.nbytes));
  }
  wr.write(d + "/model.safetensors");
  EXPECT_LOAD_ERROR(load_and_build(d), d, "blk.0.ffn_down.weight", "[64, 32]", "expected [32, 64]");
}

// GLM-4.5's config fields, each wrong in turn: the error names the field or the tensor.
// A copy of the model directory `from` (one model.safetensors) in `to`, its config.json edited.
std::string copy_with_config(const std::string& from, const std::string& to, const std::function<void(nlohmann::json&)>& edit) {
  std::filesystem::create_directories(to);
  std::filesystem::copy_file(from + "/model.safetensors", to + "/model.safetensors");
  nlohmann::json j = nlohmann::json::parse(test::read_file(from + "/config.json"));
  edit(j);
  write_text(to + "/config.json", j.dump());
  return to;
}

TEST(SafetensorsCorrupt, Glm4MoeConfigFields) {
  const std::string base = test::temp_dir("corrupt_glm");
  SynthOptions so;
  so.arch = "glm4_moe";
  so.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 32},
               {"intermediate_size", 96}, {"num_hidden_layers", 2}, {"vocab_size", 512}, {"n_routed_experts", 4},
               {"num_experts_per_tok", 2}, {"moe_intermediate_size", 32}};
  so.out = base + "/good";
  synth_model(so);
  ASSERT_NO_THROW(load_and_build(so.out));
  int n = 0;
  auto with_config = [&](const std::function<void(nlohmann::json&)>& edit) {
    return copy_with_config(so.out, base + "/v" + std::to_string(n++), edit);
  };
  std::string d = with_config([](auto& j) { j["partial_rotary_factor"] = 1.5; });
  EXPECT_LOAD_ERROR(load_and_build(d), d, "partial_rotary_factor", "1.5");
  d = with_config([](auto& j) { j["partial_rotary_factor"] = 0.3; });  // 9.6 -> 9 dims: odd
  EXPECT_LOAD_ERROR(load_and_build(d), d, "rope dimension count", "9");
  d = with_config([](auto& j) { j["use_qk_norm"] = true; });  // the file has no q/k norms
  EXPECT_LOAD_ERROR(load_and_build(d), d, "missing tensor", "attn_q_norm");
  d = with_config([](auto& j) { j["n_routed_experts"] = 8; });
  EXPECT_LOAD_ERROR(load_and_build(d), d, "ffn_gate_inp", "expected [8, 64]");
  d = with_config([](auto& j) { j["first_k_dense_replace"] = 0; });  // layer 0 has a dense FFN, no router
  EXPECT_LOAD_ERROR(load_and_build(d), d, "missing tensor", "blk.0.ffn_gate_inp");
  d = with_config([](auto& j) { j["n_group"] = 3; });
  EXPECT_LOAD_ERROR(load_and_build(d), d, "expert group count", "3");
}

// gpt-oss: config fields that disagree with the stacked experts (plain and MXFP4), and bad
// layer types, each named.
TEST(SafetensorsCorrupt, GptOssConfigFields) {
  const std::string base = test::temp_dir("corrupt_gpt_oss");
  for (DType type : {DType::F32, DType::MXFP4}) {
    SynthOptions so;
    so.arch = "gpt_oss";
    so.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
                 {"intermediate_size", 32}, {"num_hidden_layers", 2}, {"vocab_size", 512}, {"num_local_experts", 4},
                 {"sliding_window", 4}};
    so.type = type;
    so.out = base + "/good_" + dtype_name(type);
    synth_model(so);
    ASSERT_NO_THROW(load_and_build(so.out));
    int n = 0;
    auto with_config = [&](const std::function<void(nlohmann::json&)>& edit) {
      return copy_with_config(so.out, base + "/" + dtype_name(type) + "_v" + std::to_string(n++), edit);
    };
    const std::string stacked = type == DType::MXFP4 ? "gate_up_proj_blocks" : "gate_up_proj";
    std::string d = with_config([](auto& j) { j["num_local_experts"] = 8; });
    EXPECT_LOAD_ERROR(load_and_build(d), d, stacked, "not the one the config implies");
    d = with_config([](auto& j) { j["intermediate_size"] = 64; });
    EXPECT_LOAD_ERROR(load_and_build(d), d, stacked, "not the one the config implies");
    d = with_config([](auto& j) { j["layer_types"] = {"sliding_attention"}; });
    EXPECT_LOAD_ERROR(load_and_build(d), d, "layer_types", "one type per layer");
    d = with_config([](auto& j) { j["layer_types"] = {"sliding_attention", "local"}; });
    EXPECT_LOAD_ERROR(load_and_build(d), d, "layer_types", "\"local\"");
    d = with_config([](auto& j) { j["swiglu_limit"] = -1.0; });
    EXPECT_LOAD_ERROR(load_and_build(d), d, "swiglu_limit", "-1");
  }
}

TEST(SafetensorsCorrupt, MisalignedTensorDataIsCopied) {
  // Valid but awkward: an odd-length F16 tensor first shifts every F32 tensor off 4-byte alignment.
  const std::string dir = synth(test::temp_dir("st_misaligned") + "/m");
  {
    auto f = SafetensorsFile::open(dir + "/model.safetensors");
    SafetensorsWriter wr;
    wr.add("aaa.extra", DType::F16, {3}, Bytes(6, 0));
    for (auto& [name, t] : f->tensors()) wr.add(name, t.type, t.shape, Bytes(t.data, t.data + t.nbytes));
    f.reset();
    wr.write(dir + "/model.safetensors");
  }
  std::shared_ptr<ModelFile> mf(load_model_file(dir, no_prefault()).release());
  for (auto& [name, t] : mf->tensors) EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 4, 0u) << name;
  auto model = build_model(mf);
  auto cache = model->new_cache(4);
  std::vector<float> logits(static_cast<size_t>(mf->config.n_vocab));
  int32_t tok = 0, pos = 0;
  model->forward(&tok, &pos, 1, *cache, logits.data(), false);  // UBSan checks the loads
}

// ---------------------------------------------------------------- llama2.c

TEST(Llama2cCorrupt, TruncationsFlipsAndTrailingBytes) {
  const std::string path = test::testdata("models/stories260K/stories260K.bin");
  FP_REQUIRE_FILE(path);
  const Bytes b = read_bytes(path);
  ASSERT_NO_THROW(parse_llama2c(b.data(), b.size(), path));
  Sweep trunc{"truncated " + path};
  for (size_t c = 0; c < b.size(); c += (c < 1024 ? 1 : b.size() / 300))
    trunc.check(outcome([&] { parse_llama2c(b.data(), c, path); }, true, {path, "truncated"}), c);
  EXPECT_LOAD_ERROR(parse_llama2c(b.data(), 1000, path), path, "token_embd.weight");
  for (size_t extra : {1, 4, 4096}) {
    Bytes t = b;
    t.resize(b.size() + extra, 0x7f);
    EXPECT_LOAD_ERROR(parse_llama2c(t.data(), t.size(), path), path, "trailing");
  }
  Bytes m = b;
  Sweep flips{"flipped header byte in " + path};
  const uint8_t masks[] = {0xff, 0x80, 0x01, 0x02, 0x40};
  for (size_t i = 0; i < 28; ++i)
    for (uint8_t mask : masks) {
      m[i] ^= mask;
      flips.check(outcome([&] { parse_llama2c(m.data(), m.size(), path); }, false, {path}), i);
      m[i] ^= mask;
    }
}

TEST(Llama2cCorrupt, HeaderFields) {
  const std::string path = test::testdata("models/stories260K/stories260K.bin");
  FP_REQUIRE_FILE(path);
  const Bytes b = read_bytes(path);
  const char* fields[] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
  for (int f = 0; f < 7; ++f)
    for (int32_t v : {0, -1, INT32_MIN, INT32_MAX, -(1 << 24) - 1, 1 << 30}) {
      Bytes m = b;
      poke<int32_t>(m, 4 * f, v);
      // Negative vocab is legal (untied classifier); the file size then disagrees.
      std::vector<std::string> needles = {path};
      if (!(f == 5 && v == -1)) needles.push_back(fields[f]);
      EXPECT_TRUE(outcome([&] { parse_llama2c(m.data(), m.size(), path); }, true, needles)) << fields[f] << " = " << v;
    }
  Bytes m = b;
  poke<int32_t>(m, 12, 3);  // heads do not divide dim 64
  EXPECT_LOAD_ERROR(parse_llama2c(m.data(), m.size(), path), path, "n_heads", "divide");
  m = b;
  poke<int32_t>(m, 16, 3);  // kv heads do not divide 8 heads
  EXPECT_LOAD_ERROR(parse_llama2c(m.data(), m.size(), path), path, "n_kv_heads");

  // Version-1 ("ak42") headers, hand-built: dim 8, hidden 16, 1 layer, 2 heads, vocab 4, seq 4, shared.
  auto v1 = [](int32_t version, uint8_t shared) {
    size_t floats = 8 + 8 + 8 + 4 * 8 + 64 + 64 + 64 + 64 + 128 + 128 + 128 + (shared ? 0 : 32);
    Bytes h(256 + floats * 4, 0);
    poke<uint32_t>(h, 0, 0x616b3432u);
    int32_t fields1[] = {version, 8, 16, 1, 2, 2, 4, 4};
    std::memcpy(&h[4], fields1, sizeof fields1);
    h[36] = shared;
    return h;
  };
  Bytes good = v1(1, 1);
  EXPECT_NO_THROW(parse_llama2c(good.data(), good.size(), path));
  good = v1(1, 0);
  EXPECT_NO_THROW(parse_llama2c(good.data(), good.size(), path));
  Bytes bad = v1(2, 1);
  EXPECT_LOAD_ERROR(parse_llama2c(bad.data(), bad.size(), path), path, "version 2");
  bad = v1(1, 7);
  EXPECT_LOAD_ERROR(parse_llama2c(bad.data(), bad.size(), path), path, "shared_classifier");
  bad = v1(1, 1);
  EXPECT_LOAD_ERROR(parse_llama2c(bad.data(), 255, path), path, "256");
  for (size_t c = 256; c < bad.size(); c += 7) EXPECT_LOAD_ERROR(parse_llama2c(bad.data(), c, path), path, "truncated");
}

TEST(Llama2cCorrupt, ThroughModelLoader) {
  const std::string path = test::testdata("models/stories260K/stories260K.bin");
  FP_REQUIRE_FILE(path);
  const Bytes b = read_bytes(path);
  const std::string dir = test::temp_dir("corrupt_llama2c");
  for (size_t cut : {size_t(0), size_t(2), size_t(27), size_t(5000), b.size() - 4}) {
    std::string p = dir + "/cut" + std::to_string(cut) + ".bin";
    write_bytes(p, Bytes(b.begin(), b.begin() + static_cast<long>(cut)));
    EXPECT_LOAD_ERROR(load_and_build(p), p);
  }
}

}  // namespace
}  // namespace fp
