// core/log.cpp — stderr logging and the terminal progress bar.
#include "core/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace fp {
namespace {
LogLevel initial_level() {
  const char* env = std::getenv("FASTPATH_LOG");
  if (!env) return LogLevel::Info;
  std::string s(env);
  if (s == "debug") return LogLevel::Debug;
  if (s == "warn") return LogLevel::Warn;
  if (s == "error") return LogLevel::Error;
  if (s == "off") return LogLevel::Off;
  return LogLevel::Info;
}
std::atomic<int> g_level{static_cast<int>(initial_level())};
std::mutex g_mu;
}  // namespace

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }
bool stderr_is_terminal() { return isatty(STDERR_FILENO) != 0; }

void log_write(LogLevel level, const std::string& msg) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(stderr, "[fastpath %s] %s\n", names[static_cast<int>(level)], msg.c_str());
}

Progress::Progress(std::string label, uint64_t total)
    : label_(std::move(label)), total_(total), active_(stderr_is_terminal() && log_level() <= LogLevel::Info) {}

void Progress::update(uint64_t done) {
  if (!active_ || total_ == 0) return;
  int pct = static_cast<int>(done * 100 / total_);
  if (pct == last_pct_) return;
  last_pct_ = pct;
  int filled = pct * 30 / 100;
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(stderr, "\r%s [%.*s%*s] %3d%%", label_.c_str(), filled, "==============================",
               30 - filled, "", pct);
  std::fflush(stderr);
}

void Progress::finish() {
  if (!active_ || last_pct_ < 0) return;
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

}  // namespace fp
