// engine/scheduler.cpp — the per-step scheduling decision and preemption.
#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace fp {

Scheduler::Scheduler(const SchedulerConfig& cfg, BlockManager& blocks) : cfg_(cfg), blocks_(blocks) {
  FP_CHECK(cfg.max_num_batched_tokens > 0, "--max-num-batched-tokens must be positive, got ", cfg.max_num_batched_tokens);
  FP_CHECK(cfg.max_num_seqs > 0, "--max-num-seqs must be positive, got ", cfg.max_num_seqs);
}

bool Scheduler::before(const Sequence* a, const Sequence* b) const {
  if (cfg_.policy == SchedulingPolicy::Priority && a->req.priority != b->req.priority) return a->req.priority < b->req.priority;
  return a->arrival < b->arrival;
}

void Scheduler::add(Sequence* s) {
  s->state = SeqState::Waiting;
  auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](Sequence* w) { return before(s, w); });
  waiting_.insert(it, s);
}

void Scheduler::remove(Sequence* s) {
  running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), s), waiting_.end());
  blocks_.release(s->table);
}

void Scheduler::preempt(Sequence* s) {
  running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
  blocks_.release(s->table);
  // A speculative draft is a guess, not part of the sequence to recompute.
  s->tokens.resize(s->tokens.size() - static_cast<size_t>(s->n_draft));
  s->n_draft = 0;
  s->n_computed = 0;
  s->state = SeqState::Waiting;
  ++s->preemptions;
  ++stats_.preemptions;
  // Back in order among the waiting (it arrived before anything still waiting).
  auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](Sequence* w) { return before(s, w); });
  waiting_.insert(it, s);
}

Sequence* Scheduler::newest_holding_blocks_like(const Sequence* s) const {
  // In a partitioned pool only a sequence of s's partition frees blocks s can use.
  const int part = blocks_.partition_of(s->table);
  Sequence* victim = nullptr;
  for (auto it = running_.rbegin(); it != running_.rend(); ++it)
    if (part < 0 || blocks_.partition_of((*it)->table) == part) {
      if (cfg_.policy == SchedulingPolicy::Fcfs) return *it;
      if (!victim || before(victim, *it)) victim = *it;
    }
  return victim ? victim : running_.back();
}

Sequence* Scheduler::lower_priority_victim(const Sequence* s) const {
  if (cfg_.policy != SchedulingPolicy::Priority || running_.empty()) return nullptr;
  Sequence* victim = newest_holding_blocks_like(s);
  return victim->req.priority > s->req.priority ? victim : nullptr;
}

Sequence* Scheduler::preempt_for(const Sequence* s) {
  Sequence* victim = lower_priority_victim(s);
  if (!victim) return nullptr;
  preempt(victim);
  ++stats_.priority_preemptions;
  return victim;
}

bool Scheduler::shares_a_prefix_being_computed(const Sequence* s, int64_t hit) const {
  // The whole blocks s could take from the prefix cache once they are there (attach_prefix
  // leaves at least one token to compute).
  const int64_t P = blocks_.page_size();
  const int64_t n = static_cast<int64_t>(s->tokens.size()) - 1;
  if (n - hit < P) return false;
  for (const Sequence* t : running_) {
    if (t->table.prefix_key != s->table.prefix_key) continue;  // KV under another adapter
    const int64_t registered = t->table.n_registered * P;
    const int64_t limit = std::min<int64_t>(n, static_cast<int64_t>(t->tokens.size()));
    if (registered >= limit || limit - hit < P) continue;  // it has offered all it could share
    if (t->tokens[static_cast<size_t>(hit)] != s->tokens[static_cast<size_t>(hit)]) continue;  // (a quick miss)
    const int64_t common = std::mismatch(s->tokens.begin(), s->tokens.begin() + limit, t->tokens.begin()).first - s->tokens.begin();
    const int64_t shared_end = common / P * P;  // whole blocks t will compute and register
    if (shared_end - hit >= P && registered < shared_end) return true;
  }
  return false;
}

std::vector<ScheduledSeq> Scheduler::schedule() {
  std::vector<ScheduledSeq> out;
  int64_t budget = cfg_.max_num_batched_tokens;
  // 1. Running sequences, oldest first: a decode token, or the next prompt chunk.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* s = running_[i];
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->n_computed;
    if (remaining == 0) {  // async scheduling: its last token is being sampled by a launched step
      ++i;
      continue;
    }
    const int64_t n = std::min(remaining, budget);
    if (!blocks_.ensure(s->table, s->n_computed, s->n_computed + n)) {
      // Out of blocks: preempt the newest running sequence (perhaps this one) and retry.
      Sequence* victim = newest_holding_blocks_like(s);
      preempt(victim);
      if (victim == s) continue;  // s is gone; running_[i] is the next one (or the end)
      continue;
    }
    out.push_back({s, n, s->n_computed + n == static_cast<int64_t>(s->tokens.size())});
    budget -= n;
    ++i;
  }
  // A preemption above may have removed sequences already placed in `out`.
  out.erase(std::remove_if(out.begin(), out.end(), [](const ScheduledSeq& x) { return x.seq->state != SeqState::Running; }),
            out.end());
  // 2. Waiting sequences in arrival order, while budget, sequence slots and blocks last. One whose
  // prompt a running sequence is still computing waits for those blocks instead of computing
  // them again (it is passed over; the ones behind it may go). Under the priority policy a
  // sequence short of a slot or of blocks preempts running ones of a lower priority.
  auto make_room_for = [&](const Sequence* s) {
    Sequence* victim = preempt_for(s);
    if (!victim) return false;
    // (A victim of a lower priority waits behind s, so s is retried, not the victim admitted.)
    FP_CHECK(before(s, victim), "priority preemption put the victim before the sequence it made room for");
    for (auto it = out.begin(); it != out.end(); ++it)
      if (it->seq == victim) {
        budget += it->n_tokens;
        out.erase(it);
        break;
      }
    return true;
  };
  // Priority policy, chunked prefill: a waiting sequence may also take the step's tokens from
  // the prompt chunks of running sequences of a lower priority placed above (shrunk, the lowest
  // priority and newest first), so a long low-priority prefill does not delay a higher-priority
  // arrival by a step. Those sequences compute the rest in later steps, as any chunked prompt.
  auto lower_priority_chunk = [&](const ScheduledSeq& x, const Sequence* s) {
    return x.seq->req.priority > s->req.priority && x.seq->n_draft == 0 && x.n_tokens > 1;
  };
  // Once a waiting sequence was passed over for a prefix a running one is computing, nothing more
  // is reclaimed this step: the chunk that computes that prefix may be among those placed.
  bool prefix_skipped = false;
  auto reclaimable_for = [&](const Sequence* s) {
    int64_t n = 0;
    if (cfg_.policy == SchedulingPolicy::Priority && cfg_.chunked_prefill && !prefix_skipped)
      for (const ScheduledSeq& x : out)
        if (lower_priority_chunk(x, s)) n += x.n_tokens;
    return n;
  };
  auto reclaim_for = [&](const Sequence* s, int64_t need) {
    while (need > 0) {
      ScheduledSeq* from = nullptr;
      for (ScheduledSeq& x : out)
        if (lower_priority_chunk(x, s) && (!from || before(from->seq, x.seq))) from = &x;
      FP_CHECK(from != nullptr, "priority scheduling: ", need, " tokens of the step's budget could not be reclaimed");
      const int64_t take = std::min(need, from->n_tokens);
      from->n_tokens -= take;
      from->samples = false;  // the chunk no longer reaches the end of the known tokens
      // Its blocks past the shrunk chunk go back (all or none of them were computed into).
      blocks_.truncate(from->seq->table, from->seq->n_computed + from->n_tokens);
      budget += take;
      need -= take;
      ++stats_.priority_reclaimed_chunks;
      if (from->n_tokens == 0) out.erase(out.begin() + (from - out.data()));
    }
  };
  for (size_t i = 0; i < waiting_.size() && (budget > 0 || cfg_.policy == SchedulingPolicy::Priority);) {
    Sequence* s = waiting_[i];
    const int64_t available = budget + reclaimable_for(s);
    if (available <= 0) break;  // (the ones behind s have no higher priority)
    const bool full = static_cast<int64_t>(running_.size()) >= cfg_.max_num_seqs;
    if (full && !lower_priority_victim(s)) break;
    if (s->table.blocks.empty() && s->n_computed == 0) {
      const int64_t hit = blocks_.attach_prefix(s->table, s->tokens.data(), static_cast<int64_t>(s->tokens.size()));
      s->n_computed = hit;
      if (!s->admitted_once) s->cached_tokens = hit;
      if (cfg_.wait_for_shared_prefix && blocks_.prefix_caching() && shares_a_prefix_being_computed(s, hit)) {
        blocks_.release(s->table);
        s->n_computed = 0;
        ++stats_.prefix_waits;
        prefix_skipped = true;
        ++i;
        continue;
      }
    }
    if (full) {
      make_room_for(s);
      continue;  // (the victim waits behind s; s keeps its prefix hit)
    }
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->n_computed;
    int64_t n = std::min(remaining, available);
    const bool fits_budget = cfg_.chunked_prefill || remaining <= budget;
    bool fits_blocks = fits_budget && blocks_.ensure(s->table, s->n_computed, s->n_computed + n);
    if (fits_budget && !fits_blocks && n > budget && budget > 0) {
      n = std::min(remaining, budget);  // without reclaimed tokens the chunk may still fit
      fits_blocks = blocks_.ensure(s->table, s->n_computed, s->n_computed + n);
    }
    if (!fits_blocks) {
      // It does not fit this step: give back the prefix blocks (they stay cached) and wait.
      blocks_.release(s->table);
      s->n_computed = 0;
      if (fits_budget && make_room_for(s)) continue;  // blocks freed: try again
      break;
    }
    if (n > budget) reclaim_for(s, n - budget);
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
    s->state = SeqState::Running;
    s->admitted_once = true;
    running_.push_back(s);
    out.push_back({s, n, s->n_computed + n == static_cast<int64_t>(s->tokens.size())});
    budget -= n;
  }
  return out;
}

void Scheduler::commit(const std::vector<ScheduledSeq>& batch) {
  for (const ScheduledSeq& x : batch) {
    x.seq->n_computed += x.n_tokens;
    blocks_.register_computed(x.seq->table, x.seq->tokens.data(), x.seq->n_computed);
  }
}

}  // namespace fp
