// tests/test_util.cpp — see test_util.h.
#include "test_util.h"

#include "core/cpu_features.h"
#include "model/model.h"
#include "model/synth.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <sys/wait.h>

namespace fp::test {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<float> read_f32_file(const std::string& path) {
  std::string bytes = read_file(path);
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

std::string run_command(const std::string& cmd, int* exit_code) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    *exit_code = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

std::vector<float> all_position_logits(const std::string& model_path, const std::vector<int32_t>& ids) {
  LoadOptions lo;
  lo.prefault = false;
  auto m = load_model(model_path, lo);
  int64_t n = static_cast<int64_t>(ids.size()), V = m->config().n_vocab;
  auto cache = m->new_cache(n);
  std::vector<float> out(static_cast<size_t>(n * V));
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  m->forward(ids.data(), pos.data(), n, *cache, out.data(), true);
  return out;
}

std::string write_synth_case(const nlohmann::json& c, const std::string& out) {
  SynthOptions o;
  o.arch = c["arch"];
  o.config = c["config"];
  o.seed = c["seed"].get<uint64_t>();
  if (c.contains("type")) {
    EXPECT_TRUE(dtype_from_name(c["type"].get<std::string>(), &o.type)) << c["type"];
  }
  o.out = out;
  synth_model(o);
  return out;
}

namespace {

// The directories temp_dir() made in this process, removed when it exits. CTest runs every test
// in a process of its own, so without this each run left its models behind (hundreds of
// directories, enough to fill a small /tmp). Only the process that made them removes them: a
// forked child that exits must not take its parent's files.
class TempDirs {
 public:
  void add(const std::filesystem::path& dir) {
    std::lock_guard<std::mutex> lock(mu_);
    dirs_.push_back(dir);
  }
  ~TempDirs() {
    if (getpid() != owner_) return;
    std::error_code ec;
    for (const auto& d : dirs_) std::filesystem::remove_all(d, ec);
  }
 private:
  std::mutex mu_;
  std::vector<std::filesystem::path> dirs_;
  pid_t owner_ = getpid();
};

TempDirs& temp_dirs() {
  static TempDirs dirs;
  return dirs;
}

}  // namespace

std::string temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("fastpath_test_" + std::to_string(getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  temp_dirs().add(dir);
  return dir.string();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double err = 0, mx = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(got[i] - ref[i])));
    mx = std::max(mx, static_cast<double>(std::fabs(ref[i])));
  }
  return err / mx;
}

bool cpu_has_avx2() { return cpu_features().missing({"avx2", "fma", "f16c"}).empty(); }

}  // namespace fp::test
