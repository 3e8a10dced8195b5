// engine/engine.cpp — capacity planning and the engine step.
#include "engine/engine.h"

#include <algorithm>
#include <limits>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/token_constraint.h"
#include "kernels/ledger.h"
#include "tokenizer/tokenizer.h"

namespace fp {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
std::string gib_text(int64_t bytes) {
  std::ostringstream os;
  os.precision(3);
  os << static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30) << " GiB";
  return os.str();
}
}  // namespace

std::string KvCapacity::describe() const {
  std::ostringstream os;
  const int64_t per_rank = n_blocks / partitions;
  if (n_window_blocks > 0) {
    os << "KV cache: " << gib_text(n_blocks * page_size * main_bytes_per_token + n_window_blocks * page_size * window_bytes_per_token)
       << " " << dtype_name(dtype) << "; full-attention layers " << n_blocks << " blocks of " << page_size << " tokens ("
       << tokens() << " tokens, " << main_bytes_per_token << " B/token); sliding-window layers (window " << window << ") "
       << n_window_blocks << " blocks of their own (" << gib_text(n_window_blocks * page_size * window_bytes_per_token) << ", "
       << window_bytes_per_token << " B/token, given back as the window slides; " << bytes_per_token
       << " B/token untrimmed); " << seqs_at_max_len << " sequences of max-model-len " << max_model_len << " at once, "
       << seqs_at_reference_len << " of " << reference_len << " tokens";
    return os.str();
  }
  os << "KV cache: " << gib_text(per_rank * page_size * bytes_per_token) << " " << dtype_name(dtype) << " = " << per_rank
     << " blocks of " << page_size << " tokens (" << per_rank * page_size << " tokens, " << bytes_per_token << " B/token)";
  if (partitions > 1)
    os << " per rank; data-parallel attention: " << partitions << " ranks hold " << n_blocks << " blocks (" << tokens()
       << " tokens)";
  os << "; " << seqs_at_max_len << " sequences of max-model-len " << max_model_len << " at once";
  return os.str();
}

KvLayout window_layout(KvLayout layout, const ModelConfig& c) {
  layout.windowed.assign(static_cast<size_t>(layout.n_layers), false);
  layout.window = 0;
  for (int64_t l = 0; l < c.n_layers && l < layout.n_layers; ++l)
    // A chunked layer (Llama 4) sees at most `chunk` positions back: trimmed as a window that long.
    if (const int64_t w = std::max(c.window_of(l), c.chunk_of(l)); w > 0) {
      layout.windowed[static_cast<size_t>(l)] = true;
      layout.window = std::max(layout.window, w);
    }
  if (layout.window == 0) layout.windowed.clear();
  return layout;
}

namespace {
constexpr int64_t kReferenceLen = 4096;  // the sequence length the window / main split is balanced for

// A plan's given quantities (the blocks are the planner's to fill in).
KvCapacity capacity_of(const KvLayout& layout, int64_t page_size, int64_t budget_bytes, int64_t max_model_len) {
  KvCapacity c;
  c.dtype = layout.dtype;
  c.bytes_per_token = layout.bytes_per_token();
  c.page_size = page_size;
  c.budget_bytes = budget_bytes;
  c.max_model_len = max_model_len;
  return c;
}
}  // namespace

KvCapacity plan_window_kv_cache(const KvLayout& layout, int64_t page_size, int64_t budget_bytes, int64_t max_model_len,
                                int64_t max_num_seqs, int64_t max_num_batched_tokens) {
  auto plain = [&] { return plan_kv_cache(layout, page_size, budget_bytes, max_model_len, max_num_seqs); };
  const int64_t windowed = layout.n_windowed();
  if (windowed == 0 || layout.window <= 0) return plain();
  FP_CHECK(valid_page_size(page_size), "--page-size ", page_size, " is not one of ", page_sizes_text());
  FP_CHECK(max_model_len > 0, "--max-model-len must be positive, got ", max_model_len);
  const int64_t lb = layout.layer_bytes_per_token(), P = page_size;
  const int64_t main_bpt = (layout.n_layers - windowed) * lb, window_bpt = windowed * lb;
  const int64_t per_seq = (max_model_len + P - 1) / P, seqs = std::max<int64_t>(1, max_num_seqs);
  // A sequence holds the blocks of its last window of positions and the one being written; a
  // step's prompt chunks hold up to max_num_batched_tokens more positions between them.
  const int64_t per_window = (layout.window + P - 1) / P + 2, chunks = (max_num_batched_tokens + P - 1) / P;
  if (per_window + chunks >= per_seq) return plain();  // a window as long as a sequence: nothing to trim
  // The split: the window blocks run out at the same number of sequences as the main blocks do
  // when sequences are kReferenceLen tokens long (shorter ones leave main blocks over, longer
  // ones window blocks): (nw - chunks) / per_window = main blocks / blocks of kReferenceLen.
  // No more than max_num_seqs windows, and the main blocks keep one sequence of max_model_len.
  const int64_t ref = (std::min(max_model_len, kReferenceLen) + P - 1) / P;
  const double B = static_cast<double>(budget_bytes), f = static_cast<double>(main_bpt), w = static_cast<double>(window_bpt);
  const double pw = static_cast<double>(per_window), ch = static_cast<double>(chunks), pd = static_cast<double>(P);
  int64_t nw = static_cast<int64_t>((pw * B + ch * pd * f * static_cast<double>(ref)) / (pd * (f * static_cast<double>(ref) + pw * w)));
  nw = std::min(nw, std::min(seqs * per_window + chunks, seqs * per_seq));
  if (main_bpt > 0) nw = std::min(nw, (budget_bytes - per_seq * P * main_bpt) / (P * window_bpt));
  nw = std::max(nw, per_window + chunks) + 1;  // one sequence's window, whatever the budget; the zero block
  const int64_t left = budget_bytes - nw * P * window_bpt;
  KvCapacity c = capacity_of(layout, P, budget_bytes, max_model_len);
  c.n_window_blocks = nw;
  c.window = layout.window;
  c.main_bytes_per_token = main_bpt;
  c.window_bytes_per_token = window_bpt;
  c.n_blocks = main_bpt > 0 ? std::max<int64_t>(0, left) / (P * main_bpt) : per_seq * seqs;
  FP_CHECK(c.n_blocks >= per_seq, "the KV cache budget of ", budget_bytes, " bytes (", gib_text(budget_bytes),
           ") leaves ", c.n_blocks, " blocks of ", P, " tokens for the full-attention layers after ", nw,
           " blocks for the sliding-window layers, but one sequence of --max-model-len ", max_model_len, " needs ", per_seq,
           "; raise --kv-cache-memory or lower --max-model-len");
  c.n_blocks = std::min(c.n_blocks, per_seq * seqs);
  c.seqs_at_max_len = std::min(c.n_blocks / per_seq, (nw - 1 - chunks) / per_window);
  c.reference_len = std::min(max_model_len, kReferenceLen);
  c.seqs_at_reference_len = std::min(c.n_blocks / ref, (nw - 1 - chunks) / per_window);
  // Trimmed, the same budget holds at least as many full-length positions (usually far more),
  // or the same in less memory when max_num_seqs full sequences fit either way; else the plain plan.
  const int64_t plain_blocks = std::min(budget_bytes / (P * c.bytes_per_token), per_seq * seqs);
  if (c.n_blocks < plain_blocks) return plain();
  return c;
}

KvCapacity plan_kv_cache(const KvLayout& layout, int64_t page_size, int64_t budget_bytes, int64_t max_model_len,
                         int64_t max_num_seqs, int64_t partitions) {
  FP_CHECK(partitions >= 1, "KV pool partitions must be >= 1, got ", partitions);
  FP_CHECK(valid_page_size(page_size), "--page-size ", page_size, " is not one of ", page_sizes_text());
  FP_CHECK(max_model_len > 0, "--max-model-len must be positive, got ", max_model_len);
  FP_CHECK(valid_kv_dtype(layout.dtype), "--kv-cache-dtype ", dtype_name(layout.dtype), " is not one of ", kv_dtypes_text());
  KvCapacity c = capacity_of(layout, page_size, budget_bytes, max_model_len);
  FP_CHECK(c.bytes_per_token > 0, "the model stores nothing in the KV cache (0 bytes per token)");
  const int64_t block_bytes = c.bytes_per_token * page_size;
  const int64_t per_seq = (max_model_len + page_size - 1) / page_size;
  c.n_blocks = budget_bytes / block_bytes;
  FP_CHECK(c.n_blocks >= per_seq, "the KV cache budget of ", budget_bytes, " bytes (", gib_text(budget_bytes), ") holds ",
           c.n_blocks, " blocks of ", page_size, " tokens x ", c.bytes_per_token, " B/token = ", c.n_blocks * page_size,
           " tokens, but one sequence of --max-model-len ", max_model_len, " needs ", per_seq, " blocks (",
           per_seq * block_bytes, " bytes); raise --kv-cache-memory or lower --max-model-len");
  // More than every sequence at full length could use is wasted (a rank's partition holds its
  // share of the sequences).
  const int64_t seqs_per_rank = (std::max<int64_t>(1, max_num_seqs) + partitions - 1) / partitions;
  c.n_blocks = std::min(c.n_blocks, per_seq * seqs_per_rank);
  c.seqs_at_max_len = c.n_blocks / per_seq * partitions;
  c.n_blocks *= partitions;
  c.partitions = partitions;
  return c;
}

int64_t parse_bytes(const std::string& text) {
  size_t end = 0;
  double v = 0;
  try {
    v = std::stod(text, &end);
  } catch (const std::exception&) {
    fail("cannot read a byte count from '", text, "' (examples: 8GiB, 512MiB, 1000000)");
  }
  std::string unit = text.substr(end);
  double mul = 1;
  if (unit.empty() || unit == "B") mul = 1;
  else if (unit == "K" || unit == "KiB" || unit == "KB") mul = 1024.0;
  else if (unit == "M" || unit == "MiB" || unit == "MB") mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB" || unit == "GB") mul = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TiB" || unit == "TB") mul = 1024.0 * 1024 * 1024 * 1024;
  else fail("unknown byte unit '", unit, "' in '", text, "' (use B, KiB, MiB, GiB or TiB)");
  FP_CHECK(std::isfinite(v) && v >= 0 && v * mul < 9e18, "byte count '", text, "' is out of range");
  return static_cast<int64_t>(v * mul);
}

Engine::Engine(Model& model, const EngineConfig& cfg) : model_(model), cfg_(cfg) {
  const ModelConfig& mc = model.config();
  if (cfg_.max_model_len <= 0) cfg_.max_model_len = mc.max_context;
  FP_CHECK(cfg_.max_model_len <= mc.max_context, "--max-model-len ", cfg_.max_model_len, " exceeds the model's context of ",
           mc.max_context, " tokens");
  FP_CHECK(cfg_.scheduler.chunked_prefill || cfg_.scheduler.max_num_batched_tokens >= cfg_.max_model_len,
           "without chunked prefill --max-num-batched-tokens (", cfg_.scheduler.max_num_batched_tokens,
           ") must be at least --max-model-len (", cfg_.max_model_len, ")");
  KvLayout layout = model.kv_layout();
  layout.dtype = cfg_.kv_dtype;
  int64_t budget = cfg_.kv_cache_bytes;
  if (budget <= 0) {
    // A fraction of what is free where the cache will live: host RAM, or the GPU's memory after
    // the weights were uploaded (--gpu-memory-utilization, like vLLM's).
    const int64_t avail = model.device() == Device::CPU ? available_memory_bytes()
                                                        : static_cast<int64_t>(device_memory(model.device()).free_bytes());
    FP_CHECK(avail > 0, "cannot read the free memory of the ", device_name(model.device()), "; pass --kv-cache-memory");
    budget = static_cast<int64_t>(static_cast<double>(avail) * cfg_.kv_cache_fraction);
  }
  // Data-parallel attention: each rank stores only its own sequences' KV rows, so the pool is
  // partitioned by rank and the ranks together hold `dp` times one budget (cache/kv_pool.h).
  const int dp = model.parallel().dp;
  // Window trimming: where the model has sliding-window layers, on the CPU (the models with
  // such layers run there), with the KV cache not partitioned (data-parallel attention) nor
  // every head on every rank (context-parallel prefill).
  layout = window_layout(layout, mc);
  const bool trim = cfg_.window_trim && layout.n_windowed() > 0 && dp == 1 && model.parallel().cp <= 1 &&
                    model.device() == Device::CPU;
  capacity_ = trim ? plan_window_kv_cache(layout, cfg_.page_size, budget, cfg_.max_model_len, cfg_.scheduler.max_num_seqs,
                                          cfg_.scheduler.max_num_batched_tokens)
                   : plan_kv_cache(layout, cfg_.page_size, budget, cfg_.max_model_len, cfg_.scheduler.max_num_seqs, dp);
  pool_ = std::make_unique<KvPool>(layout, cfg_.page_size, capacity_.n_blocks, model.device(), KvPartition{dp, 0},
                                   capacity_.n_window_blocks);
  // Prefix caching: one prefix tree per partition (a cached block serves the sequences of the
  // rank storing it), and a new sequence goes to the rank holding its longest cached prefix.
  blocks_ = std::make_unique<BlockManager>(*pool_, cfg_.prefix_caching);
  scheduler_ = std::make_unique<Scheduler>(cfg_.scheduler, *blocks_);
  const Communicator* comm = model.tensor_parallel();
  FP_CHECK(!(cfg_.async_scheduling == AsyncScheduling::On && comm && comm->size() > 1),
           "--async-scheduling on: a model split across ranks runs each step when the one before has finished (its "
           "followers are sent each step's tokens; overlapped steps are not built for them); use auto or off");
  if (comm && comm->size() > 1) {
    followers_ = std::make_unique<StepSender>(model.tensor_parallel(), *pool_);  // the same pool on every rank
    pool_->record_copies(true);
  }
  cfg_.speculative.check();
  FP_CHECK(!(cfg_.async_scheduling == AsyncScheduling::On && cfg_.speculative.enabled()),
           "--async-scheduling on: with speculative decoding each step's tokens depend on how much of the draft before "
           "was kept, so steps run one at a time; use auto or off");
  async_ = cfg_.async_scheduling == AsyncScheduling::On ||
           (cfg_.async_scheduling == AsyncScheduling::Auto && !followers_ && model.device() != Device::CPU &&
            !cfg_.speculative.enabled());
  if (cfg_.speculative.mtp()) mtp_ = std::make_unique<MtpDrafter>(model_);
  if (cfg_.speculative.enabled()) log_info(cfg_.speculative.describe());
  if (async_) log_info("async scheduling: each step is scheduled and launched while the model runs the one before");
}

Engine::~Engine() {
  if (!launched_.empty()) model_.abandon_steps();  // the device may still write the pool
}

int64_t Engine::add_request(const Request& req) {
  const ModelConfig& mc = model_.config();
  FP_CHECK(!req.prompt.empty(), "the prompt has no tokens (BOS at least is needed)");
  FP_CHECK(static_cast<int64_t>(req.prompt.size()) <= cfg_.max_model_len, "the prompt has ", req.prompt.size(),
           " tokens, more than --max-model-len ", cfg_.max_model_len);
  FP_CHECK(req.max_new_tokens >= 0, "max_new_tokens must be >= 0, got ", req.max_new_tokens);
  for (int32_t t : req.prompt)
    FP_CHECK(t >= 0 && t < mc.n_vocab, "prompt token id ", t, " is outside the vocabulary [0, ", mc.n_vocab, ")");
  for (int32_t t : req.stop_token_ids)
    FP_CHECK(t >= 0 && t < mc.n_vocab, "stop token id ", t, " is outside the vocabulary [0, ", mc.n_vocab, ")");
  for (const auto& [t, bias] : req.logit_bias)
    FP_CHECK(t >= 0 && t < mc.n_vocab && std::isfinite(bias), "logit_bias: token id ", t, " (bias ", bias,
             ") is outside the vocabulary [0, ", mc.n_vocab, ") or not finite");
  FP_CHECK(req.min_tokens >= 0 && req.min_tokens <= req.max_new_tokens, "min_tokens ", req.min_tokens,
           " must be between 0 and max_new_tokens ", req.max_new_tokens);
  FP_CHECK(req.min_tokens == 0 || !req.constraint, "min_tokens with a constrained output (the grammar decides where it ends)");
  FP_CHECK(model_.has_lora(req.lora), "LoRA adapter ", req.lora, " is not loaded (", model_.n_loras(), " ids handed out)");
  auto s = std::make_unique<Sequence>();
  s->id = next_id_++;
  s->req = req;
  s->table.prefix_key = req.lora;
  s->tokens = req.prompt;
  s->n_prompt = static_cast<int64_t>(req.prompt.size());
  s->sampler = std::make_unique<Sampler>(req.sampling);
  if (req.constraint) s->grammar = req.constraint->start();
  s->arrival = s->id;
  s->t_arrival = now_seconds();
  Sequence* raw = s.get();
  seqs_[s->id] = std::move(s);
  stats_.prompt_tokens += raw->n_prompt;
  if (req.max_new_tokens == 0) {  // nothing to do; finished at once
    raw->state = SeqState::Finished;
    raw->finish_reason = "length";
    ++stats_.finished;
    return raw->id;
  }
  scheduler_->add(raw);
  return raw->id;
}

int64_t Engine::requests_with_lora(int32_t lora) const {
  int64_t n = 0;
  for (const auto& [id, s] : seqs_) n += s->state != SeqState::Finished && s->req.lora == lora;
  return n;
}

const Sequence* Engine::sequence(int64_t id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

void Engine::drop(int64_t id) {
  auto it = seqs_.find(id);
  if (it != seqs_.end() && it->second->state == SeqState::Finished) seqs_.erase(it);
}

bool Engine::cancel(int64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second->state == SeqState::Finished) return false;
  Sequence& s = *it->second;
  scheduler_->remove(&s);
  s.tokens.resize(s.tokens.size() - static_cast<size_t>(s.n_draft));  // a draft left by a failed step
  s.n_draft = 0;
  while (static_cast<int64_t>(s.tokens.size()) > s.n_prompt && s.tokens.back() < 0) s.tokens.pop_back();  // being sampled
  s.state = SeqState::Finished;
  s.finish_reason = "cancelled";
  ++stats_.cancelled;
  return true;
}

void Engine::finish(Sequence& s, const std::string& reason, std::vector<StepOutput>& out) {
  scheduler_->remove(&s);
  s.state = SeqState::Finished;
  s.finish_reason = reason;
  ++stats_.finished;
  if (!out.empty() && out.back().id == s.id) {
    out.back().finished = true;
    out.back().finish_reason = reason;
  } else {
    out.push_back({s.id, -1, true, reason, 0.0f, {}, -1});
  }
}

std::vector<const Sequence*> Engine::sequences() const {
  std::vector<const Sequence*> out;
  for (auto& [id, s] : seqs_) out.push_back(s.get());
  return out;
}

double Engine::kv_usage() const {
  const int64_t total = pool_->n_blocks();
  double used = total ? static_cast<double>(total - blocks_->n_available()) / static_cast<double>(total) : 0.0;
  if (pool_->trims_windows()) {  // the fuller of the main and the window blocks
    int64_t main_free = blocks_->n_free();
    if (PrefixCache* pc = blocks_->prefix_cache()) main_free += pc->n_evictable();
    const auto nw = static_cast<double>(pool_->n_window_blocks());
    used = std::max(static_cast<double>(total - main_free) / static_cast<double>(std::max<int64_t>(total, 1)),
                    (nw - static_cast<double>(blocks_->n_window_available())) / nw);
  }
  return used;
}

// A token being sampled by a launched step, in its sequence until it is known: the logit row
// whose sampled id it is, encoded below -1 (never a vocabulary id).
namespace {
constexpr int32_t placeholder(int32_t row) { return -2 - row; }
constexpr int32_t placeholder_row(int32_t token) { return -2 - token; }
}  // namespace

std::vector<ScheduledSeq> Engine::schedule() {
  std::vector<ScheduledSeq> sched = scheduler_->schedule();
  // The rows of one LoRA adapter side by side: each adapter's update is then one run of rows
  // (model/lora.h), its matrices read once per step however the requests interleave.
  if (model_.n_loras() > 0)
    std::stable_sort(sched.begin(), sched.end(),
                     [](const ScheduledSeq& a, const ScheduledSeq& b) { return a.seq->req.lora < b.seq->req.lora; });
  stats_.last_step_tokens = 0;
  stats_.last_step_seqs = static_cast<int64_t>(sched.size());
  for (const ScheduledSeq& x : sched) stats_.last_step_tokens += x.n_tokens;
  if (!sched.empty()) ++stats_.steps;
  return sched;
}

void Engine::build_batch(const std::vector<ScheduledSeq>& sched) {
  batch_.clear();
  bool fed = false;
  for (const ScheduledSeq& x : sched) {
    Sequence& s = *x.seq;
    if (!s.admitted_once || s.n_computed < s.n_prompt) stats_.computed_prompt_tokens += std::min(x.n_tokens, std::max<int64_t>(0, s.n_prompt - s.n_computed));
    batch_.add_sequence(s.tokens.data() + s.n_computed, x.n_tokens, s.n_computed, s.table.blocks.data(),
                        static_cast<int64_t>(s.table.blocks.size()), x.samples, x.samples && s.n_draft > 0,
                        pool_->trims_windows() ? s.table.window.data() : nullptr);
    batch_.seq_lora.back() = s.req.lora;
    stats_.batched_tokens += x.n_tokens;
    for (int64_t i = 0; i < x.n_tokens; ++i) fed |= s.tokens[static_cast<size_t>(s.n_computed + i)] < 0;
  }
  if (fed) {  // tokens the launched step is sampling: taken from its rows where they are
    batch_.feed_rows.assign(batch_.tokens.size(), -1);
    for (size_t i = 0; i < batch_.tokens.size(); ++i)
      if (batch_.tokens[i] < 0) {
        batch_.feed_rows[i] = placeholder_row(batch_.tokens[i]);
        batch_.tokens[i] = 0;
      }
  }
  // Rows whose request has no penalties and wants no log-probabilities are sampled by the model
  // where the logits are (a model on a device sends back their ids instead of their logits).
  row_sampling_.clear();
  for (const ScheduledSeq& x : sched) {
    if (!x.samples) continue;
    Sampler& sampler = *x.seq->sampler;
    // A draft's rows too, each under the sampler's next draw (those of rows after a refusal are
    // taken back once judged, Sampler::rewind).
    RowSampling row;
    row.here = samples_anywhere(*x.seq);
    if (row.here && x.seq->n_draft > 0) sampler.mark();
    for (int64_t r = 0; r < rows_of(x); ++r) {
      if (row.here) row.settings = sampler.next_row();
      row_sampling_.push_back(row);
    }
  }
}

bool Engine::launchable(const std::vector<ScheduledSeq>& sched) const {
  for (const ScheduledSeq& x : sched)
    if (x.samples && !samples_anywhere(*x.seq)) return false;
  return true;
}

void Engine::take_token(Sequence& s, int32_t id, int64_t token_at, const float* lg, std::vector<StepOutput>& out) {
  const int64_t V = model_.config().n_vocab;
  const Tokenizer* tok = model_.tokenizer();
  const double t = now_seconds();
  const bool first = s.t_first_token == 0;
  if (first) {
    s.t_first_token = t;
    if (s.cached_tokens) stats_.cached_prompt_tokens += s.cached_tokens;
  }
  s.t_last_token = t;
  const auto& stop_ids = s.req.stop_token_ids;
  const bool eog = tok && tok->is_eog(id);
  // A constrained text ends at the end-of-generation token even under ignore_eos (the grammar
  // allows it only where the text is complete).
  if ((eog && (s.req.stop_at_eog || s.req.constraint)) || std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) {
    if (token_at >= 0) s.tokens.resize(static_cast<size_t>(token_at));  // its placeholder, and any after it
    finish(s, "stop", out);
    return;
  }
  if (token_at >= 0) s.tokens[static_cast<size_t>(token_at)] = id;
  else s.tokens.push_back(id);
  if (s.req.constraint)
    FP_CHECK(s.req.constraint->accept(s.grammar, id), "request ", s.id, ": sampled token ", id,
             " is outside its ", s.req.constraint->what(), " grammar");
  const int64_t len = token_at >= 0 ? token_at + 1 : static_cast<int64_t>(s.tokens.size());
  ++stats_.generated_tokens;
  out.push_back({s.id, id, false, "", 0.0f, {}, first ? s.cached_tokens : -1});
  if (s.req.logprobs >= 0) {  // from the model's logits, before penalties and temperature
    raw_.assign(lg, lg + V);
    const float mx = *std::max_element(raw_.begin(), raw_.end());
    double sum = 0;
    for (float v : raw_) sum += std::exp(static_cast<double>(v - mx));
    const double lse = mx + std::log(sum);
    StepOutput& o = out.back();
    o.logprob = static_cast<float>(raw_[static_cast<size_t>(id)] - lse);
    const int64_t k = std::min<int64_t>(s.req.logprobs, V);
    std::vector<int32_t> idx(static_cast<size_t>(V));
    for (int64_t i = 0; i < V; ++i) idx[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
      return raw_[static_cast<size_t>(a)] > raw_[static_cast<size_t>(b)] || (raw_[static_cast<size_t>(a)] == raw_[static_cast<size_t>(b)] && a < b);
    });
    for (int64_t i = 0; i < k; ++i)
      o.top_logprobs.push_back({idx[static_cast<size_t>(i)], static_cast<float>(raw_[static_cast<size_t>(idx[static_cast<size_t>(i)])] - lse)});
  }
  if (len - s.n_prompt >= s.req.max_new_tokens || len >= cfg_.max_model_len) finish(s, "length", out);
  else if (s.req.constraint && s.req.constraint->only_end(s.grammar)) finish(s, "stop", out);  // the text is complete
}

float* Engine::adjusted_rows(const Sequence& s, float* rows, int64_t n_rows, const int32_t* draft) {
  if (!s.req.constraint && s.req.logit_bias.empty() && !holds_the_end(s)) return rows;
  const int64_t V = model_.config().n_vocab;
  masked_.assign(rows, rows + n_rows * V);
  for (int64_t r = 0; r < n_rows; ++r)
    for (const auto& [id, bias] : s.req.logit_bias) masked_[static_cast<size_t>(r * V + id)] += bias;
  // Row r samples generated token (n_generated - n_draft) + r: before min_tokens, no end.
  const Tokenizer* tok = model_.tokenizer();
  for (int64_t r = 0; r < n_rows && s.n_generated() - s.n_draft + r < s.req.min_tokens; ++r) {
    float* row = masked_.data() + r * V;
    if (tok)
      for (int32_t id : tok->eog_ids())
        if (id >= 0 && id < V) row[id] = -std::numeric_limits<float>::infinity();
    for (int32_t id : s.req.stop_token_ids) row[id] = -std::numeric_limits<float>::infinity();
  }
  if (s.req.constraint) s.req.constraint->mask_draft_rows(s.grammar, draft, n_rows - 1, masked_.data(), V);
  return masked_.data();
}

void Engine::run_now(const std::vector<ScheduledSeq>& sched, std::vector<StepOutput>& out) {
  build_batch(sched);
  FP_CHECK(batch_.feed_rows.empty(), "a step run now has tokens still being sampled");
  const int64_t V = model_.config().n_vocab;
  logits_.resize(batch_.logit_rows.size() * static_cast<size_t>(V));
  sampled_ids_.resize(row_sampling_.size());
  if (followers_) followers_->send_step(batch_, pool_->take_copies());
  model_.forward_sampled(batch_, *pool_, logits_.data(), row_sampling_, sampled_ids_.data());
  // Drafts are judged before the commit, so that only the kept tokens count as computed and
  // reach the prefix cache (a refused token's KV slot is written over by the next step).
  std::vector<ScheduledSeq> done = sched;
  std::vector<DraftVerdict> verdicts(done.size());
  std::vector<int64_t> rows_at(done.size());  // each sequence's logit rows this step
  size_t row = 0;
  for (size_t i = 0; i < done.size(); ++i) {
    ScheduledSeq& x = done[i];
    Sequence& s = *x.seq;
    const int64_t rows = rows_at[i] = rows_of(x);
    if (rows > 1) {
      const size_t first = s.tokens.size() - static_cast<size_t>(s.n_draft);
      if (row_sampling_[row].here) {
        verdicts[i] = judge_sampled_draft(sampled_ids_.data() + row, s.tokens.data() + first, s.n_draft);
        s.sampler->rewind(verdicts[i].accepted + 1);
      } else {
        float* rows_here = adjusted_rows(s, logits_.data() + row * static_cast<size_t>(V), rows, s.tokens.data() + first);
        verdicts[i] = verify_draft(*s.sampler, rows_here, V, s.tokens.data(), first, s.n_draft, static_cast<size_t>(s.n_prompt));
      }
      ++stats_.speculative.drafts;
      stats_.speculative.draft_tokens += s.n_draft;
      stats_.speculative.accepted_tokens += verdicts[i].accepted;
      s.draft_length = next_draft_length(s.draft_length, s.n_draft, verdicts[i].accepted, cfg_.speculative);
      s.tokens.resize(first + static_cast<size_t>(verdicts[i].accepted));
      s.n_draft = 0;
      x.n_tokens = 1 + verdicts[i].accepted;
    }
    row += static_cast<size_t>(rows);
  }
  scheduler_->commit(done);
  // A refused draft's blocks go back (what the next token needs stays).
  for (size_t i = 0; i < done.size(); ++i)
    if (rows_at[i] > 1) blocks_->truncate(done[i].seq->table, done[i].seq->n_computed + 1);
  // Postprocess: sample, append, finish.
  row = 0;
  for (size_t i = 0; i < done.size(); ++i) {
    const ScheduledSeq& x = done[i];
    Sequence& s = *x.seq;
    const int64_t rows = rows_at[i];
    float* lg = logits_.data() + row * static_cast<size_t>(V);
    row += static_cast<size_t>(rows);
    if (rows == 0) continue;
    if (rows > 1) {  // the kept draft tokens (already in place), then the model's next token
      const DraftVerdict& v = verdicts[i];
      const int64_t first = s.n_computed - v.accepted;
      for (int64_t j = 0; j < v.accepted && s.state != SeqState::Finished; ++j)
        take_token(s, s.tokens[static_cast<size_t>(first + j)], first + j, lg + j * V, out);
      if (s.state != SeqState::Finished) take_token(s, v.next, -1, lg + v.accepted * V, out);
      continue;
    }
    int32_t id = -1;
    if (row_sampling_[row - 1].here) {
      id = sampled_ids_[row - 1];
    } else {  // (a bias or a grammar works on a copy: log-probabilities come from the model's row)
      id = s.sampler->sample(adjusted_rows(s, lg, 1, nullptr), V, s.tokens, static_cast<size_t>(s.n_prompt));
    }
    take_token(s, id, -1, lg, out);
  }
  if (mtp_) run_mtp(done, rows_at);
}

void Engine::run_mtp(const std::vector<ScheduledSeq>& done, const std::vector<int64_t>& rows_at) {
  const SpeculativeConfig& c = cfg_.speculative;
  std::vector<MtpRows> rows;
  std::vector<Sequence*> of;
  for (size_t i = 0; i < done.size(); ++i) {
    Sequence& s = *done[i].seq;
    const int64_t n = done[i].n_tokens;  // the kept rows (a refused draft's are not)
    const int64_t start = s.n_computed - n;
    // The token after each kept row must be known: the prompt's next, a kept draft token, or the
    // one just sampled (not there when the sequence finished with this step).
    if (s.state != SeqState::Running || n <= 0 || static_cast<int64_t>(s.tokens.size()) <= s.n_computed) continue;
    MtpRows r;
    r.row0 = batch_.seq_indptr[i];
    r.n = n;
    r.next = s.tokens.data() + start + 1;
    r.start = static_cast<int32_t>(start);
    r.pages = s.table.blocks.data();
    r.n_pages = static_cast<int64_t>(s.table.blocks.size());
    // A draft for a sequence that decodes next (its last token is the one just sampled).
    const int64_t len = static_cast<int64_t>(s.tokens.size());
    if (rows_at[i] > 0 && len - s.n_computed == 1)
      r.max_draft = std::max<int64_t>(0, std::min<int64_t>({s.draft_length > 0 ? s.draft_length : c.num_tokens,
                                                            s.req.max_new_tokens - s.n_generated() - 1, cfg_.max_model_len - len - 1}));
    rows.push_back(r);
    of.push_back(&s);
  }
  if (rows.empty()) return;
  std::vector<std::vector<int32_t>> drafts;
  if (followers_) followers_->send_mtp(rows);
  mtp_->run(rows, *pool_, drafts);
  for (size_t i = 0; i < of.size(); ++i) {
    of[i]->mtp_draft = std::move(drafts[i]);
    of[i]->mtp_draft_at = static_cast<int64_t>(of[i]->tokens.size());
  }
}

void Engine::add_drafts() {
  const SpeculativeConfig& c = cfg_.speculative;
  std::vector<int32_t> draft;
  // A draft takes only the token budget and blocks that work which is certain leaves: the running
  // sequences' next tokens and prompt chunks, then the prompts waiting for a slot (whose partition
  // is not chosen yet: counted against every partition). So a guess never preempts a sequence.
  // In a partitioned pool (data-parallel attention) a sequence's blocks come from its own
  // partition, so blocks are counted per partition.
  const int parts = pool_->partition().parts;
  std::vector<int64_t> spare(static_cast<size_t>(parts));
  for (int p = 0; p < parts; ++p) spare[static_cast<size_t>(p)] = blocks_->n_available(p);
  int64_t budget = cfg_.scheduler.max_num_batched_tokens;
  for (const Sequence* s : scheduler_->running()) {
    const int64_t n = std::min(budget, static_cast<int64_t>(s->tokens.size()) - s->n_computed);
    budget -= n;
    spare[static_cast<size_t>(std::max(0, blocks_->partition_of(s->table)))] -=
        std::max<int64_t>(1, blocks_->blocks_needed(s->table, s->n_computed, s->n_computed + n));
  }
  int64_t slots = cfg_.scheduler.max_num_seqs - scheduler_->n_running();
  for (auto it = scheduler_->waiting().begin(); it != scheduler_->waiting().end() && slots > 0 && budget > 0; ++it, --slots) {
    const int64_t n = std::min(budget, static_cast<int64_t>((*it)->tokens.size()) - (*it)->n_computed);
    budget -= n;
    for (int64_t& sp : spare) sp -= blocks_->blocks_for(n);
  }
  for (Sequence* s : scheduler_->running()) {
    if (budget <= 0) break;
    const int64_t n = static_cast<int64_t>(s->tokens.size());
    if (s->n_draft != 0 || n - s->n_computed != 1 || s->n_generated() < 1) continue;  // not decoding
    const int64_t room =
        std::min<int64_t>({s->draft_length > 0 ? s->draft_length : c.num_tokens, budget,
                           s->req.max_new_tokens - s->n_generated() - 1, cfg_.max_model_len - n - 1});
    int64_t k = 0;
    if (!mtp_) {
      k = propose_ngram_draft(s->tokens.data(), n, c, room, draft);
    } else if (s->mtp_draft_at == n) {  // the draft layer's guess after this sequence's last step
      draft = s->mtp_draft;
      k = std::min<int64_t>(room, static_cast<int64_t>(draft.size()));
    }
    if (s->req.constraint) k = s->req.constraint->accepted_prefix(s->grammar, draft.data(), k);  // the grammar's part of it
    const int64_t base = blocks_->blocks_needed(s->table, s->n_computed, n);
    int64_t& free_here = spare[static_cast<size_t>(std::max(0, blocks_->partition_of(s->table)))];
    while (k > 0 && blocks_->blocks_needed(s->table, s->n_computed, n + k) - base > std::max<int64_t>(free_here, 0)) --k;
    if (k == 0) continue;
    free_here -= blocks_->blocks_needed(s->table, s->n_computed, n + k) - base;
    budget -= k;
    s->tokens.insert(s->tokens.end(), draft.begin(), draft.begin() + k);
    s->n_draft = k;
  }
}

void Engine::fit_drafts(std::vector<ScheduledSeq>& sched) {
  for (ScheduledSeq& x : sched) {
    Sequence& s = *x.seq;
    if (s.n_draft == 0) continue;
    // The token budget ran out inside the draft: keep what the step runs (the fed token is first).
    const int64_t keep = std::min(s.n_draft, x.n_tokens - 1);
    s.tokens.resize(s.tokens.size() - static_cast<size_t>(s.n_draft - keep));
    s.n_draft = keep;
    x.samples = true;
  }
  // Sequences the step does not run (out of budget, or preempted) give their drafts back.
  for (auto& [id, s] : seqs_) {
    if (s->n_draft == 0) continue;
    const bool runs = std::any_of(sched.begin(), sched.end(), [&](const ScheduledSeq& x) { return x.seq == s.get(); });
    if (runs) continue;
    s->tokens.resize(s->tokens.size() - static_cast<size_t>(s->n_draft));
    s->n_draft = 0;
  }
}

void Engine::launch(const std::vector<ScheduledSeq>& sched) {
  build_batch(sched);
  model_.launch_step(batch_, *pool_, row_sampling_);
  LaunchedStep step;
  step.rows = static_cast<int64_t>(row_sampling_.size());
  int32_t row = 0;
  for (const ScheduledSeq& x : sched) {
    Sequence& s = *x.seq;
    s.n_computed += x.n_tokens;  // as the scheduler's commit; blocks are registered once the tokens are known
    LaunchedSeq ls;
    ls.id = s.id;
    ls.computed_end = s.n_computed;
    ls.preemptions = s.preemptions;
    if (x.samples) {
      ls.row = row++;
      // The next step computes this token before it is known, unless it is the sequence's last.
      const bool last = s.n_generated() + 1 >= s.req.max_new_tokens ||
                        static_cast<int64_t>(s.tokens.size()) + 1 >= cfg_.max_model_len;
      if (!last) {
        ls.token_at = static_cast<int64_t>(s.tokens.size());
        s.tokens.push_back(placeholder(ls.row));
      }
    }
    step.seqs.push_back(ls);
  }
  launched_.push_back(std::move(step));
}

void Engine::finish_oldest(std::vector<StepOutput>& out) {
  LaunchedStep step = std::move(launched_.front());
  launched_.pop_front();
  sampled_ids_.resize(static_cast<size_t>(step.rows));
  model_.finish_step(sampled_ids_.data());
  for (const LaunchedSeq& ls : step.seqs) {
    auto it = seqs_.find(ls.id);
    if (it == seqs_.end()) continue;  // dropped while the step ran
    Sequence& s = *it->second;
    if (s.state == SeqState::Finished) continue;  // cancelled, or stopped by the step before
    if (s.preemptions == ls.preemptions) blocks_->register_computed(s.table, s.tokens.data(), ls.computed_end);
    if (ls.row >= 0) take_token(s, sampled_ids_[static_cast<size_t>(ls.row)], ls.token_at, nullptr, out);
  }
}

void Engine::take_scheduler_stats() {
  stats_.preemptions = scheduler_->stats().preemptions;
  stats_.prefix_waits = scheduler_->stats().prefix_waits;
  stats_.priority_preemptions = scheduler_->stats().priority_preemptions;
  stats_.priority_reclaimed_chunks = scheduler_->stats().priority_reclaimed_chunks;
}

void Engine::abandon_launched() {
  model_.abandon_steps();
  for (const LaunchedStep& step : launched_)
    for (const LaunchedSeq& ls : step.seqs) {
      auto it = seqs_.find(ls.id);
      if (it == seqs_.end()) continue;
      auto& toks = it->second->tokens;
      while (static_cast<int64_t>(toks.size()) > it->second->n_prompt && toks.back() < 0) toks.pop_back();
    }
  launched_.clear();
}

std::vector<StepOutput> Engine::step() {
  std::vector<StepOutput> out;
  if (!async_) {
    if (cfg_.speculative.enabled()) add_drafts();
    std::vector<ScheduledSeq> sched = schedule();
    if (cfg_.speculative.enabled()) fit_drafts(sched);
    if (!sched.empty()) run_now(sched, out);
    take_scheduler_stats();
    return out;
  }
  try {
    if (launched_.empty()) {
      const std::vector<ScheduledSeq> sched = schedule();
      if (sched.empty()) return out;
      if (!launchable(sched)) {
        ++stats_.steps_waited;
        Ledger::global().note_engine_step("now: a row is sampled on the host (penalties, log-probabilities or a grammar)");
        run_now(sched, out);
        take_scheduler_stats();
        return out;
      }
      launch(sched);
      Ledger::global().note_engine_step("launched, nothing running");
    }
    // A step runs: schedule the next one and launch it behind it, then finish the running one.
    std::vector<ScheduledSeq> next = schedule();
    const bool ahead = !next.empty() && launchable(next);
    if (ahead) {
      launch(next);
      ++stats_.steps_ahead;
      Ledger::global().note_engine_step("launched while the step before ran");
    }
    finish_oldest(out);
    if (!next.empty() && !ahead) {
      // It waited for the step before (a row is sampled on the host): run it now, without the
      // sequences that step finished.
      next.erase(std::remove_if(next.begin(), next.end(), [](const ScheduledSeq& x) { return x.seq->state != SeqState::Running; }),
                 next.end());
      ++stats_.steps_waited;
      Ledger::global().note_engine_step("after the step before: a row is sampled on the host (penalties, log-probabilities or a grammar)");
      if (!next.empty()) run_now(next, out);
    }
  } catch (...) {
    abandon_launched();
    throw;
  }
  take_scheduler_stats();
  return out;
}

}  // namespace fp
