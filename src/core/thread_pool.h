// core/thread_pool.h — a persistent pool of worker threads running parallel_for over index
// ranges. The calling thread takes part, so a pool of N threads has N-1 workers.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fp {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Splits [0, n) into contiguous chunks of at least `grain` items, one per thread at most,
  // and calls fn(begin, end) on each; returns when all are done. The first exception is rethrown.
  // Called from inside fn (on any thread of the region), it runs fn(0, n) inline instead.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);
  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunks_ = 0;
  std::atomic<uint64_t> generation_{0};  // bumped once per job (and at shutdown)
  std::atomic<int> pending_{0};          // workers still to finish the current job
  bool stop_ = false;
  std::exception_ptr error_;
};

// The process-wide pool used by kernels. Sized by set_num_threads (default: the CPUs of the
// calling thread's affinity mask, core/cpu_affinity.h); new workers inherit that thread's mask.
ThreadPool& thread_pool();
void set_num_threads(int n);
int default_num_threads();

}  // namespace fp
