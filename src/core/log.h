// core/log.h — leveled logging to stderr. stdout belongs to command output only.
#pragma once
#include <sstream>
#include <string>

namespace fp {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3, Off = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_write(LogLevel level, const std::string& msg);
bool stderr_is_terminal();

template <class... Args>
void log_at(LogLevel level, const Args&... args) {
  if (level < log_level()) return;
  std::ostringstream os;
  (os << ... << args);
  log_write(level, os.str());
}
template <class... Args> void log_debug(const Args&... a) { log_at(LogLevel::Debug, a...); }
template <class... Args> void log_info(const Args&... a) { log_at(LogLevel::Info, a...); }
template <class... Args> void log_warn(const Args&... a) { log_at(LogLevel::Warn, a...); }
template <class... Args> void log_error(const Args&... a) { log_at(LogLevel::Error, a...); }

// A progress bar on stderr when it is a terminal; silent otherwise.
class Progress {
 public:
  Progress(std::string label, uint64_t total);
  void update(uint64_t done);
  void finish();
 private:
  std::string label_;
  uint64_t total_;
  int last_pct_ = -1;
  bool active_;
};

}  // namespace fp
