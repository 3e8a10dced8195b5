// formats/safetensors.h — Hugging Face safetensors: one file (8-byte header length, JSON
// header, data) or a sharded set described by model.safetensors.index.json. Pure format:
// names, dtypes, shapes and bytes; mapping names to a model is model/'s job.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace fp {

struct SafetensorsTensor {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> shape;  // row-major, outermost first (PyTorch order)
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  std::string file;  // which shard holds it
};

class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  // Parses bytes in memory (must outlive the object); `name` is used in errors.
  static std::unique_ptr<SafetensorsFile> parse(const uint8_t* data, size_t size, const std::string& name);
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void parse_all(const uint8_t* data, size_t size, const std::string& name);
  std::shared_ptr<MappedFile> file_;
  std::map<std::string, SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model directory: model.safetensors, or the shards listed by
// model.safetensors.index.json (every listed tensor must be found in the shard named for it).
class SafetensorsSet {
 public:
  static std::unique_ptr<SafetensorsSet> open_dir(const std::string& dir);
  const SafetensorsTensor* find(const std::string& name) const;
  const std::map<std::string, const SafetensorsTensor*>& all() const { return index_; }
  const std::vector<std::string>& files() const { return files_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<std::string> files_;
  std::map<std::string, const SafetensorsTensor*> index_;
};

bool safetensors_dtype(const std::string& s, DType* out);
const char* safetensors_dtype_name(DType t);

// Writer used by synth and tests.
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType type, const std::vector<int64_t>& shape, std::vector<uint8_t> data);
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType type;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
  };
  std::vector<Entry> entries_;
};

}  // namespace fp
