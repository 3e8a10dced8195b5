// core/mapped_file.h — a read-only memory-mapped file (the zero-copy source of every loader).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace fp {

class MappedFile {
 public:
  // Maps the whole file read-only; throws fp::Error naming the path on failure.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Touches every page so later reads do not fault; reports progress on a terminal.
  void prefault(const std::string& label) const;

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fp
