// engine/scheduler.h — continuous batching: which sequences run this step and how many of
// their tokens. Running sequences come first (a decode token each, or the next chunk of their
// prompt), then waiting ones in arrival order, within a token budget and a sequence cap. When
// blocks run out the newest running sequence is preempted (in a partitioned pool, the newest of
// the same partition): its blocks are freed and it waits to be recomputed, so no request ever
// fails for lack of KV memory. Under the priority policy "newest" and "arrival order" read as
// (priority, arrival). A waiting prompt that shares a prefix with one being computed
// waits for its blocks (computed once, then found in the prefix cache).
#pragma once
#include <cstdint>
#include <deque>
#include <vector>

#include "cache/block_manager.h"
#include "engine/sequence.h"

namespace fp {

// fcfs: arrival order. priority: by Request::priority, then arrival (vLLM's
// --scheduling-policy priority); a waiting sequence that does not fit preempts running ones of a
// lower priority (a larger number), and a running one short of blocks preempts the lowest-priority
// newest one.
enum class SchedulingPolicy { Fcfs, Priority };

struct SchedulerConfig {
  SchedulingPolicy policy = SchedulingPolicy::Fcfs;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 256;
  bool chunked_prefill = true;
  // A waiting sequence whose prompt shares whole blocks with one a running sequence is still
  // computing (the n choices of one request, or requests sent together with one long system
  // prompt) is not admitted until those blocks are in the prefix cache, so the shared prompt is
  // computed once (SGLang's in-batch prefix caching). Needs prefix caching.
  bool wait_for_shared_prefix = true;
};

struct ScheduledSeq {
  Sequence* seq;
  int64_t n_tokens;  // tokens [seq->n_computed, seq->n_computed + n_tokens) run this step
  bool samples;      // the chunk ends the known tokens: a new token is sampled
};

struct SchedulerStats {
  int64_t preemptions = 0;
  int64_t prefix_waits = 0;  // times a waiting sequence was passed over for a prefix being computed
  int64_t priority_preemptions = 0;  // of those preemptions: to admit a waiting sequence of a higher priority
  // Prompt chunks of lower-priority running sequences shrunk (or put off) this step to give its
  // tokens to a waiting sequence of a higher priority.
  int64_t priority_reclaimed_chunks = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& cfg, BlockManager& blocks);
  const SchedulerConfig& config() const { return cfg_; }
  void add(Sequence* s);
  // Removes a sequence (finished or cancelled) from the queues and frees its blocks.
  void remove(Sequence* s);
  std::vector<ScheduledSeq> schedule();
  // After the step ran: advances n_computed and registers full blocks in the prefix cache.
  void commit(const std::vector<ScheduledSeq>& batch);
  bool empty() const { return running_.empty() && waiting_.empty(); }
  int64_t n_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t n_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  const std::vector<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const SchedulerStats& stats() const { return stats_; }

 private:
  void preempt(Sequence* s);
  Sequence* newest_holding_blocks_like(const Sequence* s) const;
  // Whether a runs before b: arrival order, or (priority policy) priority, then arrival.
  bool before(const Sequence* a, const Sequence* b) const;
  // Priority policy: the running sequence of a lower priority than s that would make room for it
  // (of s's partition, the lowest and newest first), or nullptr; preempt_for preempts it.
  Sequence* lower_priority_victim(const Sequence* s) const;
  Sequence* preempt_for(const Sequence* s);
  // Whether a running sequence is still computing whole blocks of s's prompt past the `hit`
  // tokens s found cached.
  bool shares_a_prefix_being_computed(const Sequence* s, int64_t hit) const;
  SchedulerConfig cfg_;
  BlockManager& blocks_;
  std::vector<Sequence*> running_;  // in admission order; the back is the newest
  std::deque<Sequence*> waiting_;   // FCFS; preempted sequences go back to the front
  SchedulerStats stats_;
};

}  // namespace fp
