// engine/engine.h — the serving engine: requests in, tokens out, many sequences at once.
// One step is schedule -> run -> postprocess:
//   batch  = scheduler.schedule()          which sequences, how many tokens each
//   logits = model.forward(batch)          one varlen forward over all of them
//   sample, append, finish, free            per sequence
// With async scheduling (a model on a device) the run is split in launch and finish, and the
// next step is scheduled and launched while this one runs: its decode tokens are the ones this
// step is sampling, taken on the device (Model::launch_step), so the device never waits for
// the host between steps. A sequence that stops on an end-of-generation token has one wasted
// step; a step with a row sampled on the host (penalties, log-probabilities) waits.
// The KV pool is sized by capacity planning (plan_kv_cache) from a memory budget. With a model
// split across ranks the engine runs on rank 0 and the others follow (engine/followers.h).
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cache/block_manager.h"
#include "engine/followers.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/mtp_drafter.h"
#include "engine/speculative.h"
#include "model/model.h"

namespace fp {

// Whether the engine schedules the next step while the model runs this one (see above). Auto:
// on for a model on a device (on the CPU the forward runs on the host thread itself, so
// nothing overlaps), off for a model split across ranks (not built for followers yet).
enum class AsyncScheduling { Auto, On, Off };

struct EngineConfig {
  int64_t page_size = 16;
  AsyncScheduling async_scheduling = AsyncScheduling::Auto;
  DType kv_dtype = kDefaultKvDtype;  // what the KV pool stores: F32, F16 or BF16
  int64_t kv_cache_bytes = 0;        // 0: kv_cache_fraction of available memory
  double kv_cache_fraction = 0.25;   // of MemAvailable, when kv_cache_bytes is 0
  int64_t max_model_len = 0;         // 0: the model's context length
  bool prefix_caching = true;
  // Sliding-window layers keep only the blocks their window still sees (KvPool::trims_windows;
  // on the CPU, one rank or tensor parallel); false keeps every position (--no-window-trim).
  bool window_trim = true;
  SchedulerConfig scheduler;
  // Drafts (prompt lookup, or the model's MTP layer: engine/mtp_drafter.h) verified in the step
  // (engine/speculative.h). Steps then run one at a time (no async scheduling): a step's tokens
  // depend on how much of the draft before was kept.
  SpeculativeConfig speculative;
};

// Capacity planning: how many blocks a budget buys and what they hold.
struct KvCapacity {
  DType dtype = DType::F32;
  int64_t bytes_per_token = 0, page_size = 0, n_blocks = 0, budget_bytes = 0;
  int64_t tokens() const { return n_blocks * page_size; }
  int64_t max_model_len = 0;
  int64_t seqs_at_max_len = 0;  // whole sequences of max_model_len that fit at once
  // Data-parallel attention: the pool is split into this many partitions, one per rank, each
  // rank storing n_blocks / partitions of them (the budget is per rank).
  int64_t partitions = 1;
  // Window trimming: the sliding-window layers' own blocks (0: none; they share n_blocks), and
  // the bytes per token of the main blocks (the other layers) and of the window blocks.
  int64_t n_window_blocks = 0, main_bytes_per_token = 0, window_bytes_per_token = 0, window = 0;
  int64_t reference_len = 0, seqs_at_reference_len = 0;  // sequences of the split's reference length at once
  std::string describe() const;
};
// Blocks for `budget_bytes` (never more than max_num_seqs full-length sequences need), at the
// layout's dtype (F16/BF16 hold twice the tokens of F32). Fails with the numbers when one
// sequence of max_model_len cannot fit. With partitions > 1 (data-parallel attention) the
// budget is each rank's and every sequence must fit in one rank's partition; the pool has
// `partitions` times the blocks.
KvCapacity plan_kv_cache(const KvLayout& layout, int64_t page_size, int64_t budget_bytes, int64_t max_model_len,
                         int64_t max_num_seqs, int64_t partitions = 1);
// With window trimming (layout.windowed marks some layers): the windowed layers get blocks of
// their own, each sequence's window taking ceil(window / page) + 2 and a step's prompt chunks
// (max_num_batched_tokens) more; the split of the budget lets as many sequences of 4096 tokens
// (or max_model_len, if shorter) hold windows as hold main blocks, up to max_num_seqs, keeping
// one sequence of max_model_len in the main blocks. The other layers get the rest as n_blocks. n_window_blocks stays 0 (the plain plan) when the
// main blocks would then hold fewer positions than the plain plan's, when a window and a step's
// chunks span a whole sequence, or when no layer is windowed.
KvCapacity plan_window_kv_cache(const KvLayout& layout, int64_t page_size, int64_t budget_bytes, int64_t max_model_len,
                                int64_t max_num_seqs, int64_t max_num_batched_tokens);
// The model's layout with its sliding-window layers marked (KvLayout::windowed / window).
KvLayout window_layout(KvLayout layout, const ModelConfig& c);
// Parses "8GiB", "512MiB", "1.5G", "1000000" (bytes) -> bytes; fails naming the text.
int64_t parse_bytes(const std::string& text);

// What a step produced for one sequence.
struct StepOutput {
  int64_t id;
  int32_t token = -1;         // the new token, -1 when none (prefill chunk, or finished on EOG)
  bool finished = false;
  std::string finish_reason;  // "stop" / "length" / "cancelled"
  float logprob = 0;          // of `token` under the model's distribution (Request::logprobs >= 0)
  std::vector<std::pair<int32_t, float>> top_logprobs;  // most likely tokens first
  int64_t cached_tokens = -1;  // with the sequence's first token: its prompt tokens the prefix cache held
};

struct EngineStats {
  int64_t steps = 0, prompt_tokens = 0, computed_prompt_tokens = 0, generated_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens reused from the prefix cache at admission
  int64_t preemptions = 0, finished = 0, cancelled = 0;
  int64_t prefix_waits = 0;          // admissions put off for a shared prompt being computed (scheduler.h)
  int64_t priority_preemptions = 0;  // of the preemptions: for a waiting request of a higher priority
  int64_t priority_reclaimed_chunks = 0;  // lower-priority prompt chunks shrunk for a higher-priority arrival
  int64_t batched_tokens = 0;        // tokens through the model, all steps
  int64_t last_step_tokens = 0, last_step_seqs = 0;
  // Async scheduling: steps launched while the step before still ran, and steps that waited
  // for it because a row is sampled on the host.
  int64_t steps_ahead = 0, steps_waited = 0;
  SpeculativeStats speculative;
};

class Engine {
 public:
  Engine(Model& model, const EngineConfig& cfg);
  ~Engine();
  const KvCapacity& capacity() const { return capacity_; }
  const EngineConfig& config() const { return cfg_; }
  Model& model() { return model_; }

  // Queues a request; returns its id. Fails (fp::Error) on an empty or too long prompt.
  int64_t add_request(const Request& req);
  // Finishes a request now ("cancelled"), freeing its blocks; false when unknown or finished.
  bool cancel(int64_t id);
  bool has_work() const { return !scheduler_->empty() || !launched_.empty(); }
  // Whether this engine schedules a step ahead (EngineConfig::async_scheduling, resolved).
  bool async_scheduling() const { return async_; }
  // One engine step; returns what each scheduled or finished sequence produced.
  std::vector<StepOutput> step();
  // The sequence (prompt + tokens so far) of a live or finished request; nullptr once dropped.
  const Sequence* sequence(int64_t id) const;
  // Requests not finished (waiting, running or preempted) that run with LoRA adapter `lora`.
  int64_t requests_with_lora(int32_t lora) const;
  // Forgets a finished request.
  void drop(int64_t id);

  const EngineStats& stats() const { return stats_; }
  const Scheduler& scheduler() const { return *scheduler_; }
  // Every sequence the engine still tracks (for tests and metrics).
  std::vector<const Sequence*> sequences() const;
  BlockManager& blocks() { return *blocks_; }
  KvPool& pool() { return *pool_; }
  // Used / total blocks (cached-but-unreferenced blocks count as free).
  double kv_usage() const;

 private:
  // A step launched on the model and not finished yet (async scheduling): per sequence, where
  // its computed tokens end after the step, its preemption count then, and for a sampling row
  // the row and the index of the placeholder token (-1: the token will be appended, it is the
  // sequence's last).
  struct LaunchedSeq {
    int64_t id = 0, computed_end = 0, preemptions = 0, token_at = -1;
    int32_t row = -1;
  };
  struct LaunchedStep {
    std::vector<LaunchedSeq> seqs;
    int64_t rows = 0;
  };
  std::vector<ScheduledSeq> schedule();
  // Fills batch_ and row_sampling_ (drawing each device-sampled row's uniform) for `sched`.
  void build_batch(const std::vector<ScheduledSeq>& sched);
  // Every sampling row of sched can be sampled where the logits are (no host postprocessing).
  bool launchable(const std::vector<ScheduledSeq>& sched) const;
  // A row the model may sample where its logits are: no penalties, no log-probabilities, no grammar.
  static bool samples_anywhere(const Sequence& s) {
    return s.sampler->penalties_off() && s.req.logprobs < 0 && !s.req.constraint && s.req.logit_bias.empty() && !holds_the_end(s);
  }
  // min_tokens: the sequence's next row may not end it yet.
  static bool holds_the_end(const Sequence& s) { return s.n_generated() - s.n_draft < s.req.min_tokens; }
  // A sequence's logit rows as its sampler must see them: a copy with its logit_bias added, the
  // ends min_tokens holds back masked, and its grammar's masks (row i of a draft check under the
  // state draft[0..i) reaches), or `rows` itself when it has none of them.
  float* adjusted_rows(const Sequence& s, float* rows, int64_t n_rows, const int32_t* draft);
  void run_now(const std::vector<ScheduledSeq>& sched, std::vector<StepOutput>& out);
  void launch(const std::vector<ScheduledSeq>& sched);
  void finish_oldest(std::vector<StepOutput>& out);
  void take_scheduler_stats();  // preemptions and prefix waits into stats_
  void abandon_launched();
  // A sampled token for s: appended (or written at token_at), then stop / length checks.
  void take_token(Sequence& s, int32_t id, int64_t token_at, const float* logits, std::vector<StepOutput>& out);
  void finish(Sequence& s, const std::string& reason, std::vector<StepOutput>& out);
  // Speculative decoding: appends a prompt-lookup draft to every decoding sequence (before the
  // scheduler places them), then, once scheduled, trims each draft to the tokens the step runs
  // and takes back the drafts of the sequences it does not run.
  void add_drafts();
  // --speculative-method mtp, after a step's tokens were taken: the draft layer over each
  // sequence's kept rows, and its next draft (Sequence::mtp_draft).
  void run_mtp(const std::vector<ScheduledSeq>& done, const std::vector<int64_t>& rows_at);
  void fit_drafts(std::vector<ScheduledSeq>& sched);
  // The logit rows a scheduled sequence has this step: its draft's and one, 1, or 0 (a prompt
  // chunk that samples nothing).
  static int64_t rows_of(const ScheduledSeq& x) { return x.samples ? 1 + x.seq->n_draft : 0; }
  Model& model_;
  EngineConfig cfg_;
  KvCapacity capacity_;
  std::unique_ptr<KvPool> pool_;
  std::unique_ptr<StepSender> followers_;  // a model split across ranks: sends each step to the others
  std::unique_ptr<MtpDrafter> mtp_;        // --speculative-method mtp: the model's draft layer
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<int64_t, std::unique_ptr<Sequence>> seqs_;
  int64_t next_id_ = 0;
  ForwardBatch batch_;
  std::vector<float> logits_, raw_, masked_;
  std::vector<RowSampling> row_sampling_;  // per logit row of the step: sampled by the model, or here
  std::vector<int32_t> sampled_ids_;       // the tokens the model sampled (Model::forward_sampled)
  bool async_ = false;
  std::deque<LaunchedStep> launched_;
  EngineStats stats_;
};

}  // namespace fp
