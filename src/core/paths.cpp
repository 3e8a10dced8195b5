// core/paths.cpp — FASTPATH_TESTDATA lookup and the cache directory.
#include "core/paths.h"

#include <sys/stat.h>

#include <cstdlib>

#ifndef FASTPATH_SOURCE_DIR
#define FASTPATH_SOURCE_DIR "."
#endif

namespace fp {

std::string testdata_dir() {
  if (const char* env = std::getenv("FASTPATH_TESTDATA"); env && *env) return env;
  return std::string(FASTPATH_SOURCE_DIR) + "/../shared/testdata";
}

std::string default_model_path() { return testdata_dir() + "/models/stories260K/stories260K.gguf"; }

std::string fastpath_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/fastpath";
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/tmp") + "/.cache/fastpath";
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace fp
