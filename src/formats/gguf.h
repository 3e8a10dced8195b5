// formats/gguf.h — GGUF v2/v3 container parser: metadata of every value type (arrays,
// nested arrays), tensor infos, alignment. Pure file format: no model semantics here.
// Every malformed input throws fp::Error naming the file, the key or tensor, and the value.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace fp {

enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_type_name(GgufType t);

struct GgufValue {
  GgufType type = GgufType::U8;
  // Scalars: integers in i (signed) or u (unsigned), floats in f, bools in b, strings in s.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  bool b = false;
  std::string s;
  // Arrays: elem_type and exactly one of the vectors below, by element kind.
  GgufType elem_type = GgufType::U8;
  std::vector<std::string> arr_str;
  std::vector<double> arr_num;      // every numeric/bool element, converted
  std::vector<GgufValue> arr_nested;  // arrays of arrays
  uint64_t arr_len = 0;

  bool is_integer() const;
  bool is_number() const { return is_integer() || type == GgufType::F32 || type == GgufType::F64; }
  std::string to_string(size_t max_items = 8) const;  // for inspect
};

struct GgufTensorInfo {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> ne;  // GGUF order: ne[0] is the contiguous dimension
  uint64_t offset = 0;      // relative to the data section
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  int64_t n_elements() const;
};

class GgufFile {
 public:
  // Maps and parses a file.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // Parses bytes already in memory (not copied; they must outlive the object). `name` is used in errors.
  static std::unique_ptr<GgufFile> parse(const uint8_t* data, size_t size, const std::string& name);

  const std::string& path() const { return name_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  size_t file_size() const { return size_; }

  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  // Typed getters: the one-argument forms throw when the key is missing or has the wrong type.
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& def) const;
  uint64_t get_uint(const std::string& key) const;
  uint64_t get_uint(const std::string& key, uint64_t def) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double def) const;
  bool get_bool(const std::string& key, bool def) const;
  // Array getters: nullptr when the key is missing; throw when it is not an array of that kind.
  const std::vector<std::string>* get_string_array(const std::string& key) const;
  const std::vector<double>* get_number_array(const std::string& key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;

 private:
  GgufFile() = default;
  void parse_all();
  std::shared_ptr<MappedFile> file_;
  std::string name_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// A GGUF writer used by `synth` and tests: collects metadata and tensors, writes v3.
class GgufWriter {
 public:
  void set_string(const std::string& key, const std::string& v);
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string_array(const std::string& key, const std::vector<std::string>& v);
  void set_f32_array(const std::string& key, const std::vector<float>& v);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& v);
  // ne in GGUF order; data holds row_bytes(type, ne[0]) * (product of the other dims) bytes.
  void add_tensor(const std::string& name, DType type, const std::vector<int64_t>& ne, std::vector<uint8_t> data);
  void write(const std::string& path, uint32_t alignment = 32) const;
  std::vector<uint8_t> to_bytes(uint32_t alignment = 32) const;

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;
  };
  std::vector<std::pair<std::string, std::vector<uint8_t>>> kv_;  // key, encoded type+value
  std::vector<Tensor> tensors_;
};

}  // namespace fp
