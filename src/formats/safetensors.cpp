// formats/safetensors.cpp — validated safetensors parsing (header JSON, offsets, sizes),
// sharded index resolution, and a writer.
#include "formats/safetensors.h"

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fp {

namespace {
// A value for messages: json::dump recurses once per nesting level, so a hostile header of deeply
// nested arrays would overflow the stack; structured values longer than a line print their type.
std::string short_dump(const nlohmann::json& j) {
  if (j.is_primitive()) return j.dump();
  if (j.size() <= 8) {
    bool flat = true;
    for (auto& e : j) flat = flat && e.is_primitive();
    if (flat) return j.dump();
  }
  return std::string("(") + j.type_name() + " of " + std::to_string(j.size()) + ")";
}
}  // namespace

bool safetensors_dtype(const std::string& s, DType* out) {
  static const std::map<std::string, DType> m = {
      {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16}, {"F8_E4M3", DType::F8_E4M3},
      {"I8", DType::I8},   {"U8", DType::U8},     {"I16", DType::I16}, {"I32", DType::I32},   {"I64", DType::I64}, {"F64", DType::F64}};
  auto it = m.find(s);
  if (it == m.end()) return false;
  *out = it->second;
  return true;
}

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::I16: return "I16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::F64: return "F64";
    default: fail("safetensors cannot store ", dtype_name(t));
  }
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto mf = MappedFile::open(path);
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->parse_all(mf->data(), mf->size(), path);
  f->file_ = std::move(mf);
  return f;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::parse(const uint8_t* data, size_t size, const std::string& name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->parse_all(data, size, name);
  return f;
}

void SafetensorsFile::parse_all(const uint8_t* data, size_t size, const std::string& name) {
  FP_CHECK(size >= 8, name, ": truncated safetensors file: ", size, " bytes, the header length alone needs 8");
  uint64_t hlen;
  std::memcpy(&hlen, data, 8);
  FP_CHECK(hlen <= size - 8, name, ": header length ", hlen, " exceeds the file size ", size, " (truncated or not safetensors)");
  FP_CHECK(hlen <= (uint64_t{100} << 20), name, ": header length ", hlen, " is implausibly large");
  nlohmann::json h = nlohmann::json::parse(data + 8, data + 8 + hlen, nullptr, /*allow_exceptions=*/false);
  FP_CHECK(!h.is_discarded(), name, ": the header is not valid JSON");
  FP_CHECK(h.is_object(), name, ": the header should be a JSON object");
  const uint8_t* base = data + 8 + hlen;
  uint64_t data_size = size - 8 - hlen;
  for (auto& [key, v] : h.items()) {
    if (key == "__metadata__") {
      FP_CHECK(v.is_object(), name, ": __metadata__ should be an object");
      for (auto& [mk, mv] : v.items()) metadata_[mk] = mv.is_string() ? mv.get<std::string>() : short_dump(mv);
      continue;
    }
    FP_CHECK(v.is_object(), name, ": tensor '", key, "': entry should be an object");
    SafetensorsTensor t;
    t.name = key;
    t.file = name;
    auto dt = v.find("dtype");
    FP_CHECK(dt != v.end() && dt->is_string(), name, ": tensor '", key, "': missing string field 'dtype'");
    FP_CHECK(safetensors_dtype(dt->get<std::string>(), &t.type), name, ": tensor '", key, "': unsupported dtype '",
             dt->get<std::string>(), "'");
    auto sh = v.find("shape");
    FP_CHECK(sh != v.end() && sh->is_array() && sh->size() <= 8, name, ": tensor '", key, "': missing or bad field 'shape'");
    uint64_t numel = 1;
    // span: the product of the dims with 0 counted as 1, times the element size. Tensor views multiply
    // dims in other orders than numel does, so every partial product must stay within int64 even when one dim is 0.
    uint64_t span = static_cast<uint64_t>(dtype_info(t.type).block_bytes);
    for (auto& d : *sh) {
      FP_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), name, ": tensor '", key,
               "': shape entries must be non-negative integers, found ", short_dump(d));
      uint64_t dim = d.get<uint64_t>();
      FP_CHECK(!__builtin_mul_overflow(numel, dim, &numel), name, ": tensor '", key, "': element count overflows");
      FP_CHECK(!__builtin_mul_overflow(span, std::max<uint64_t>(dim, 1), &span) &&
                   span <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
               name, ": tensor '", key, "': shape ", short_dump(*sh), " overflows the tensor size");
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    auto off = v.find("data_offsets");
    FP_CHECK(off != v.end() && off->is_array() && off->size() == 2 && (*off)[0].is_number_unsigned() &&
                 (*off)[1].is_number_unsigned(),
             name, ": tensor '", key, "': field 'data_offsets' should be two non-negative integers");
    uint64_t b = (*off)[0].get<uint64_t>(), e = (*off)[1].get<uint64_t>();
    FP_CHECK(b <= e && e <= data_size, name, ": tensor '", key, "': data_offsets [", b, ", ", e,
             "] point past the end of the data section (", data_size, " bytes): truncated or corrupt");
    uint64_t expect;
    FP_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_info(t.type).block_bytes), &expect), name,
             ": tensor '", key, "': byte size overflows");
    FP_CHECK(e - b == expect, name, ": tensor '", key, "': ", e - b, " bytes for ", numel, " ", dtype_name(t.type),
             " elements (expected ", expect, ")");
    t.data = base + b;
    t.nbytes = e - b;
    tensors_[key] = std::move(t);
  }
}

std::unique_ptr<SafetensorsSet> SafetensorsSet::open_dir(const std::string& dir) {
  auto set = std::make_unique<SafetensorsSet>();
  std::string index_path = dir + "/model.safetensors.index.json";
  std::ifstream idx(index_path);
  if (idx) {
    nlohmann::json j = nlohmann::json::parse(idx, nullptr, false);
    FP_CHECK(!j.is_discarded(), index_path, ": not valid JSON");
    auto wm = j.find("weight_map");
    FP_CHECK(wm != j.end() && wm->is_object(), index_path, ": missing object field 'weight_map'");
    std::map<std::string, size_t> shard_of_file;
    for (auto& [tname, fv] : wm->items()) {
      FP_CHECK(fv.is_string(), index_path, ": weight_map['", tname, "'] should be a file name");
      std::string file = fv.get<std::string>();
      FP_CHECK(file.find('/') == std::string::npos && file.find("..") == std::string::npos, index_path,
               ": weight_map['", tname, "'] names a file outside the directory: '", file, "'");
      if (!shard_of_file.count(file)) {
        shard_of_file[file] = set->shards_.size();
        set->shards_.push_back(SafetensorsFile::open(dir + "/" + file));
        set->files_.push_back(dir + "/" + file);
      }
      const auto& shard = *set->shards_[shard_of_file[file]];
      auto it = shard.tensors().find(tname);
      FP_CHECK(it != shard.tensors().end(), dir, "/", file, ": tensor '", tname,
               "' is listed in model.safetensors.index.json but missing from the shard");
      set->index_[tname] = &it->second;
    }
  } else {
    std::string path = dir + "/model.safetensors";
    set->shards_.push_back(SafetensorsFile::open(path));
    set->files_.push_back(path);
    for (auto& [n, t] : set->shards_.back()->tensors()) set->index_[n] = &t;
  }
  return set;
}

const SafetensorsTensor* SafetensorsSet::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

void SafetensorsWriter::add(const std::string& name, DType type, const std::vector<int64_t>& shape,
                            std::vector<uint8_t> data) {
  int64_t numel = 1;
  for (auto d : shape) numel *= d;
  FP_CHECK(static_cast<int64_t>(data.size()) == numel * dtype_info(type).block_bytes && dtype_info(type).block_elems == 1,
           "safetensors writer: tensor '", name, "': ", data.size(), " bytes do not match its shape and dtype");
  entries_.push_back({name, type, shape, std::move(data)});
}

void SafetensorsWriter::write(const std::string& path) const {
  nlohmann::json h = nlohmann::json::object();
  h["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  for (auto& e : entries_) {
    h[e.name] = {{"dtype", safetensors_dtype_name(e.type)}, {"shape", e.shape}, {"data_offsets", {off, off + e.data.size()}}};
    off += e.data.size();
  }
  std::string hs = h.dump();
  while ((hs.size() + 8) % 8) hs += ' ';
  std::ofstream out(path, std::ios::binary);
  FP_CHECK(out, path, ": cannot open for writing");
  uint64_t hlen = hs.size();
  out.write(reinterpret_cast<const char*>(&hlen), 8);
  out.write(hs.data(), static_cast<std::streamsize>(hs.size()));
  for (auto& e : entries_) out.write(reinterpret_cast<const char*>(e.data.data()), static_cast<std::streamsize>(e.data.size()));
  out.flush();  // a full disk shows here, not in a destructor that cannot report it
  FP_CHECK(out, path, ": write failed: ", std::strerror(errno));
}

}  // namespace fp
