// core/thread_pool.cpp — see thread_pool.h. Workers spin briefly on the job counter before
// sleeping on the condition variable: a decode step issues a few hundred short parallel
// regions, and a futex wake-up per region costs more than the region's own work.
#include "core/thread_pool.h"

#include "core/cpu_affinity.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <memory>

namespace fp {

namespace {
// True on a thread while it runs a chunk of a parallel_for: a parallel_for issued from there
// runs inline on that thread (the pool does not nest), so a kernel can hand whole work items
// (an MoE expert each) to threads and still call ops that parallelize on their own elsewhere.
thread_local bool t_in_region = false;

struct RegionFlag {
  bool saved = t_in_region;
  RegionFlag() { t_in_region = true; }
  ~RegionFlag() { t_in_region = saved; }
};

constexpr int kSpinIterations = 20000;  // ~50-100 us of pause loops before sleeping

inline void chunk_range(int64_t n, int64_t chunks, int64_t c, int64_t* b, int64_t* e) {
  *b = n * c / chunks;
  *e = n * (c + 1) / chunks;
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    for (int spin = 0; spin < kSpinIterations && generation_.load(std::memory_order_acquire) == seen; ++spin) _mm_pause();
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_) return;
    const int64_t n = job_n_, chunks = job_chunks_;
    if (index < chunks) {
      int64_t b, e;
      chunk_range(n, chunks, index, &b, &e);
      try {
        RegionFlag in_region;
        (*job_)(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  int64_t chunks = std::min<int64_t>(n_threads_, (n + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1));
  if (chunks <= 1 || t_in_region) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunks_ = chunks;
    error_ = nullptr;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  std::exception_ptr mine;
  int64_t b, e;
  chunk_range(n, chunks, 0, &b, &e);
  try {
    RegionFlag in_region;
    fn(b, e);
  } catch (...) {
    mine = std::current_exception();
  }
  for (int spin = 0; spin < kSpinIterations && pending_.load(std::memory_order_acquire) != 0; ++spin) _mm_pause();
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  job_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

namespace {
std::unique_ptr<ThreadPool>& pool_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
}  // namespace

// The CPUs this process may run on (its affinity mask), not the machine's count: threads beyond
// the mask would only take turns on it.
int default_num_threads() { return std::max(1, thread_cpus().count()); }

ThreadPool& thread_pool() {
  auto& p = pool_slot();
  if (!p) p = std::make_unique<ThreadPool>(default_num_threads());
  return *p;
}

void set_num_threads(int n) {
  auto& p = pool_slot();
  if (p && p->size() == n) return;
  p = std::make_unique<ThreadPool>(n > 0 ? n : default_num_threads());
}

}  // namespace fp
