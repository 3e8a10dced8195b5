// core/mapped_file.cpp — mmap/munmap with errors that name the file.
#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/log.h"

namespace fp {

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FP_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file");
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail(path, ": mmap failed: ", std::strerror(e));
    }
    f->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::prefault(const std::string& label) const {
  if (!data_) return;
  madvise(const_cast<uint8_t*>(data_), size_, MADV_WILLNEED);
  Progress bar(label, size_);
  const size_t page = 4096, step = size_t{1} << 24;
  volatile uint8_t sink = 0;
  for (size_t off = 0; off < size_; off += page) {
    sink = static_cast<uint8_t>(sink + data_[off]);
    if (off % step == 0) bar.update(off);
  }
  bar.update(size_);
  bar.finish();
}

}  // namespace fp
