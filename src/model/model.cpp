// model/model.cpp — architecture registry and the shared KV cache allocation.
#include "model/model.h"

#include "model/lora.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "kernels/registry.h"
#include "parallel/collectives.h"

namespace fp {

namespace {
struct Architecture {
  ShardedArchitectureFactory make;
  bool sharded = false;  // can split across tensor-parallel ranks
  bool cuda = false;     // can run on Device::CUDA
};
std::map<std::string, Architecture>& registry() {
  static std::map<std::string, Architecture> r;
  return r;
}
}  // namespace

bool register_architecture(const std::string& arch, ArchitectureFactory factory) {
  registry()[arch] = {[f = std::move(factory)](std::shared_ptr<ModelFile> file, std::shared_ptr<Communicator>) {
                        return f(std::move(file));
                      },
                      false};
  return true;
}

bool register_sharded_architecture(const std::string& arch, ShardedArchitectureFactory factory, bool runs_on_cuda) {
  registry()[arch] = {std::move(factory), true, runs_on_cuda};
  return true;
}

std::vector<std::string> registered_architectures() {
  std::vector<std::string> out;
  for (auto& [k, v] : registry()) out.push_back(k);
  return out;
}

ParallelSizes resolve_parallel(ParallelSizes p, int ranks, const ModelConfig& c) {
  if (p.dp == 0) p.dp = 1;
  FP_CHECK(p.dp == 1 || (p.dp == ranks && p.ep == ranks && p.tp <= 1 && p.cp <= 1), "--data-parallel-attention on ", ranks,
           " ranks runs with --expert-parallel-size ", ranks, " only (not with --tensor-parallel-size or "
           "--prefill-context-parallel-size): the expert layers are what the ranks split");
  if (p.tp == 0 && p.ep == 0 && p.cp == 0) return ParallelSizes{ranks, 1, 1, 1};  // tensor parallel, the dense default
  if (p.tp == 0) p.tp = 1;
  if (p.ep == 0) p.ep = 1;
  if (p.cp == 0) p.cp = 1;
  auto ok = [&](int v) { return v == 1 || v == ranks; };
  FP_CHECK(ok(p.tp) && ok(p.ep) && ok(p.cp) && std::max({p.tp, p.ep, p.cp}) == ranks, "--tensor-parallel-size ", p.tp,
           ", --expert-parallel-size ", p.ep, " and --prefill-context-parallel-size ", p.cp, " on ", ranks,
           " ranks: each must be 1 or the number of ranks, and one of them the number of ranks");
  FP_CHECK(p.ep == 1 || c.moe.n_experts > 0, "--expert-parallel-size ", p.ep, ": the model has no routed experts (",
           c.arch, ")");
  return p;
}

std::unique_ptr<Model> build_model(std::shared_ptr<ModelFile> file, std::shared_ptr<Communicator> tp) {
  auto it = registry().find(file->config.arch);
  if (it == registry().end()) {
    std::string known;
    for (auto& a : registered_architectures()) known += (known.empty() ? "" : ", ") + a;
    fail(file->path, ": no architecture '", file->config.arch, "' (registered: ", known, ")");
  }
  FP_CHECK(!file->mtp || file->config.arch == "deepseek2" || file->config.arch == "glm4moe", file->path,
           ": --speculative-method mtp drafts with the model's multi-token-prediction layer, which DeepSeek-V3 and "
           "GLM-4.5 models (deepseek2, glm4moe) have; this one is ", file->config.arch, " (--speculative-method ngram "
           "drafts by prompt lookup instead)");
  if (file->device != Device::CPU) {
    const std::string why = device_unavailable(file->device);
    FP_CHECK(why.empty(), "--device ", device_name(file->device), ": ", why);
    FP_CHECK(it->second.cuda, file->path, ": architecture '", file->config.arch, "' does not run on ",
             device_name(file->device), " yet (llama, qwen2, qwen3, qwen3moe, mixtral, glm4moe and deepseek2 do); use --device cpu");
    if (tp && tp->size() > 1) {  // the collectives run on device buffers: NCCL's kernels
      const std::string refused = refusals(AllReduceArgs{tp.get(), nullptr, 0}, backend_of(file->device));
      FP_CHECK(refused.empty(), "--device ", device_name(file->device), " on ", tp->size(),
               " ranks needs the NCCL communicator, not ", tp->backend(), " (", refused, ")");
    }
  }
  if (tp && tp->size() > 1) {
    if (!it->second.sharded) {
      std::string can;
      for (auto& [name, entry] : registry())
        if (entry.sharded) can += (can.empty() ? "" : ", ") + name;
      fail(file->path, ": splitting across ranks is not implemented for architecture '", file->config.arch, "' yet (",
           tp->size(), " ranks); these can be split: ", can);
    }
    file->parallel = resolve_parallel(file->parallel, tp->size(), file->config);
    return it->second.make(std::move(file), std::move(tp));
  }
  file->parallel = ParallelSizes{1, 1, 1, 1};
  return it->second.make(std::move(file), nullptr);
}

std::unique_ptr<Model> load_model(const std::string& path, const LoadOptions& opts, std::shared_ptr<Communicator> tp) {
  std::shared_ptr<ModelFile> f(load_model_file(path, opts).release());
  log_info("loaded ", path, ": ", f->format, ", ", f->tensors.size(), " tensors, ",
           static_cast<double>(f->file_bytes) / (1 << 20), " MiB in ", f->load_seconds * 1000, " ms");
  return build_model(std::move(f), std::move(tp));
}

void ForwardBatch::add_sequence(const int32_t* toks, int64_t n, int64_t start, const int32_t* pages, int64_t n_pages,
                                bool want_logits, bool all_logits, const int32_t* window_pages) {
  FP_CHECK(window_pages ? window_page_ids.size() == page_ids.size() : window_page_ids.empty(),
           "a forward batch mixes sequences with and without window block tables");
  if (window_pages)
    for (int64_t i = 0; i < n_pages; ++i) window_page_ids.push_back(window_pages[i] >= 0 ? window_pages[i] : KvPool::kZeroWindowBlock);
  const int32_t first = static_cast<int32_t>(tokens.size());
  for (int64_t i = 0; i < n; ++i) {
    tokens.push_back(toks[i]);
    positions.push_back(static_cast<int32_t>(start + i));
  }
  seq_indptr.push_back(static_cast<int32_t>(tokens.size()));
  seq_lora.push_back(0);
  page_ids.insert(page_ids.end(), pages, pages + n_pages);
  page_indptr.push_back(static_cast<int32_t>(page_ids.size()));
  kv_len.push_back(static_cast<int32_t>(start + n));
  if (all_logits)
    for (int64_t i = 0; i < n; ++i) logit_rows.push_back(first + static_cast<int32_t>(i));
  else if (want_logits && n > 0)
    logit_rows.push_back(first + static_cast<int32_t>(n - 1));
}

void ForwardBatch::assign_tokens(const ForwardBatch& from, int64_t t0, int64_t t1) {
  clear();
  append_tokens(from, t0, t1);
}

void ForwardBatch::append_tokens(const ForwardBatch& from, int64_t t0, int64_t t1) {
  for (int64_t s = 0; s < from.n_seqs(); ++s) {
    const int64_t lo = std::max<int64_t>(from.seq_indptr[s], t0), hi = std::min<int64_t>(from.seq_indptr[s + 1], t1);
    if (lo >= hi) continue;
    const int32_t p0 = from.page_indptr[s], p1 = from.page_indptr[s + 1];
    add_sequence(from.tokens.data() + lo, hi - lo, from.positions[lo], from.page_ids.data() + p0, p1 - p0, false, false,
                 from.window_page_ids.empty() ? nullptr : from.window_page_ids.data() + p0);
    if (static_cast<size_t>(s) < from.seq_lora.size()) seq_lora.back() = from.seq_lora[static_cast<size_t>(s)];
  }
}

void ForwardBatch::clear() {
  tokens.clear();
  feed_rows.clear();
  positions.clear();
  seq_indptr.assign(1, 0);
  page_indptr.assign(1, 0);
  page_ids.clear();
  window_page_ids.clear();
  kv_len.clear();
  logit_rows.clear();
  seq_lora.clear();
}

namespace {
void slots_through(const ForwardBatch& b, const std::vector<int32_t>& ids, int64_t page_size, std::vector<int64_t>& out) {
  out.resize(ids.empty() ? 0 : b.tokens.size());
  if (ids.empty()) return;
  for (size_t s = 0; s + 1 < b.seq_indptr.size(); ++s)
    for (int32_t i = b.seq_indptr[s]; i < b.seq_indptr[s + 1]; ++i) {
      const int64_t t = b.positions[static_cast<size_t>(i)];
      out[static_cast<size_t>(i)] =
          static_cast<int64_t>(ids[static_cast<size_t>(b.page_indptr[s] + t / page_size)]) * page_size + t % page_size;
    }
}
}  // namespace

void ForwardBatch::slots(int64_t page_size, std::vector<int64_t>& out) const { slots_through(*this, page_ids, page_size, out); }

void ForwardBatch::window_slots(int64_t page_size, std::vector<int64_t>& out) const {
  slots_through(*this, window_page_ids, page_size, out);
}

int64_t ForwardBatch::gather_logit_rows(const float* x, int64_t dim, float* out) const {
  for (size_t r = 0; r < logit_rows.size(); ++r)
    std::memcpy(out + static_cast<int64_t>(r) * dim, x + static_cast<int64_t>(logit_rows[r]) * dim, static_cast<size_t>(dim) * 4);
  return static_cast<int64_t>(logit_rows.size());
}

AttentionArgs paged_attention_args(const StagedBatch& b, const KvPool& pool) {
  AttentionArgs a{};
  a.pos = b.positions;
  a.n = b.n;
  a.n_seqs = b.n_seqs;
  a.seq_indptr = b.seq_indptr;
  a.page_size = pool.page_size();
  a.kv_dtype = pool.dtype();
  a.page_indptr = b.page_indptr;
  a.page_ids = b.page_ids;
  a.kv_len = b.kv_len;
  return a;
}

AttentionArgs paged_attention_args(const ForwardBatch& b, const KvPool& pool) {
  return paged_attention_args(host_view(b), pool);
}

KvLayout Model::kv_layout() const {
  const ModelConfig& c = config();
  return KvLayout{c.n_layers, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.v_head_dim};
}

void Model::check_batch(const ForwardBatch& b, const KvPool& pool) const {
  const ModelConfig& c = config();
  const int64_t n = b.n_tokens(), ns = b.n_seqs(), ps = pool.page_size();
  FP_CHECK(static_cast<int64_t>(b.positions.size()) == n && static_cast<int64_t>(b.seq_indptr.size()) == ns + 1 &&
               static_cast<int64_t>(b.page_indptr.size()) == ns + 1 && b.seq_indptr[0] == 0 && b.seq_indptr[ns] == n &&
               b.page_indptr[0] == 0 && b.page_indptr[ns] == static_cast<int32_t>(b.page_ids.size()),
           "malformed forward batch (", n, " tokens, ", ns, " sequences)");
  for (int64_t i = 0; i < n; ++i)
    FP_CHECK(b.tokens[i] >= 0 && b.tokens[i] < c.n_vocab, "token id ", b.tokens[i], " is outside the vocabulary [0, ",
             c.n_vocab, ")");
  for (int32_t p : b.page_ids) FP_CHECK(p >= 0 && p < pool.n_blocks(), "KV block ", p, " is outside the pool (", pool.n_blocks(), " blocks)");
  FP_CHECK(b.window_page_ids.empty() || (pool.trims_windows() && b.window_page_ids.size() == b.page_ids.size()),
           "a forward batch with window block tables (", b.window_page_ids.size(), " entries for ", b.page_ids.size(),
           " blocks) for a pool ", pool.trims_windows() ? "" : "without window blocks");
  FP_CHECK(!pool.trims_windows() || b.window_page_ids.size() == b.page_ids.size(),
           "the KV pool keeps windowed layers in blocks of their own, but the batch has no window block tables");
  for (int32_t p : b.window_page_ids)
    FP_CHECK(p >= 0 && p < pool.n_window_blocks(), "KV window block ", p, " is outside the pool (", pool.n_window_blocks(),
             " window blocks)");
  FP_CHECK(pool.partition().parts == 1 || pool.partition().parts == parallel().dp, "a KV pool partitioned over ",
           pool.partition().parts, " ranks needs data-parallel attention over as many ranks (the model's is ",
           parallel().dp, ")");
  for (int64_t s = 0; s < ns; ++s) {
    const int64_t pages = b.page_indptr[s + 1] - b.page_indptr[s];
    FP_CHECK(b.seq_indptr[s + 1] >= b.seq_indptr[s] && b.kv_len[s] >= 0 && b.kv_len[s] <= pages * ps,
             "sequence ", s, ": KV length ", b.kv_len[s], " does not fit its ", pages, " blocks of ", ps, " tokens");
    for (int64_t i = b.seq_indptr[s]; i < b.seq_indptr[s + 1]; ++i)
      FP_CHECK(b.positions[i] >= 0 && b.positions[i] < b.kv_len[s], "position ", b.positions[i],
               " is outside the KV cache (capacity ", b.kv_len[s], " tokens)");
  }
  for (int32_t r : b.logit_rows) FP_CHECK(r >= 0 && r < n, "logit row ", r, " is outside the batch of ", n, " tokens");
}

std::unique_ptr<KvCache> Model::new_cache(int64_t capacity, int64_t page_size, DType kv_dtype) const {
  auto kv = std::make_unique<KvCache>();
  kv->capacity = capacity;
  if (page_size <= 0)  // the smallest power of two holding the sequence, at most 256
    for (page_size = 1; page_size < 256 && page_size < capacity;) page_size *= 2;
  const int64_t n_pages = (capacity + page_size - 1) / page_size;
  KvLayout layout = kv_layout();
  layout.dtype = kv_dtype;
  kv->pool = std::make_unique<KvPool>(layout, page_size, n_pages, device());
  for (int64_t p = 0; p < n_pages; ++p) kv->pages.push_back(kv->pool->blocks().allocate());
  return kv;
}

void Model::forward(const int32_t* tokens, const int32_t* pos, int64_t n, KvCache& cache, float* logits, bool all_logits) {
  forward_one(tokens, pos, n, cache, logits, all_logits, nullptr, nullptr);
}

void Model::set_hidden_output(bool on) {
  FP_CHECK(output_head_, file_->path, ": ", config().arch, " has no hidden-state output");
  FP_CHECK(!on || device() == Device::CPU, file_->path, ": hidden-state output (embeddings) runs on the CPU only, not on ",
           device_name(device()));
  FP_CHECK(!on || config().dim <= config().n_vocab, file_->path, ": a hidden state of ", config().dim,
           " values does not fit a logit row of ", config().n_vocab);
  output_head_->hidden_rows = on;
}

int32_t Model::add_lora(const LoraAdapterWeights&) {
  fail(file_->path, ": ", config().arch,
           " does not take LoRA adapters here (the Llama family and the GQA MoE models do: llama, qwen2, qwen3, phi3, glm4, granite, gemma, qwen3moe, mixtral ...)");
}

bool Model::has_lora(int32_t id) const {
  return id == 0 || (id >= 1 && id <= n_loras_ && !lora_removed_[static_cast<size_t>(id - 1)]);
}

void Model::remove_lora(int32_t id) {
  FP_CHECK(id > 0 && has_lora(id), "LoRA adapter ", id, " is not loaded");
  drop_lora(id);
  lora_removed_[static_cast<size_t>(id - 1)] = true;
  if (single_lora_ == id) single_lora_ = 0;
}

void Model::drop_lora(int32_t) {}

void Model::check_lora_runs_here(const LoraAdapterWeights& ad, bool context_parallel) const {
  FP_CHECK(device() == Device::CPU, file_->path, ": LoRA adapters run on the CPU here (not on ", device_name(device()), ")");
  FP_CHECK(!context_parallel, file_->path, ": LoRA adapters do not run with prefill context parallel yet");
  check_lora_fits(ad, config(), file_->path);
}

void Model::set_single_lora(int32_t id) {
  FP_CHECK(has_lora(id), "LoRA adapter ", id, " is not loaded (", n_loras_, " are)");
  single_lora_ = id;
}

bool Model::hidden_output() const { return output_head_ && output_head_->hidden_rows; }

void Model::forward_one(const int32_t* tokens, const int32_t* pos, int64_t n, KvCache& cache, float* logits,
                        bool all_logits, const RowSampling* sample, int32_t* id) {
  if (n <= 0) return;
  for (int64_t i = 0; i < n; ++i)
    FP_CHECK(pos[i] >= 0 && pos[i] < cache.capacity, "position ", pos[i], " is outside the KV cache (capacity ",
             cache.capacity, " tokens)");
  int64_t kv_len = cache.len;
  for (int64_t i = 0; i < n; ++i) kv_len = std::max<int64_t>(kv_len, pos[i] + 1);
  ForwardBatch& b = single_;
  b.clear();
  b.add_sequence(tokens, n, 0, cache.pages.data(), static_cast<int64_t>(cache.pages.size()), !all_logits, all_logits);
  for (int64_t i = 0; i < n; ++i) b.positions[static_cast<size_t>(i)] = pos[i];  // callers may pass any positions
  b.kv_len[0] = static_cast<int32_t>(kv_len);
  b.seq_lora[0] = single_lora_;
  if (sample) forward_sampled(b, *cache.pool, logits, {*sample}, id);
  else forward(b, *cache.pool, logits);
  cache.len = kv_len;
}

void Model::forward_sampled(const int32_t* tokens, const int32_t* pos, int64_t n, KvCache& cache, float* logits,
                            const RowSampling& row, int32_t* id) {
  forward_one(tokens, pos, n, cache, logits, false, &row, id);
}

void Model::forward_sampled(const ForwardBatch& batch, KvPool& pool, float* logits, const std::vector<RowSampling>& rows,
                            int32_t* ids) {
  const auto n_rows = static_cast<int64_t>(batch.logit_rows.size());
  FP_CHECK(static_cast<int64_t>(rows.size()) == n_rows, "forward_sampled: ", rows.size(), " row settings for ", n_rows,
           " logit rows");
  sampling_ = device() == Device::CPU ? nullptr : &rows;
  sampled_ids_ = ids;
  if (!launching_) feed_source_rows_ = -1;  // the sample below overwrites the ids a fed token could name
  if (sampling_) {  // the settings go up before the forward (queued ahead of its work)
    // Every row goes through one sample call (the rows sent back run as greedy, their id unused).
    settings_.assign(rows.size(), SampleRow{});
    for (size_t r = 0; r < rows.size(); ++r)
      if (rows[r].here) settings_[r] = rows[r].settings;
    if (device_settings_.device() != device()) device_settings_ = DeviceBuffer(device());
    device_settings_.reserve(std::max<size_t>(settings_.size(), 1) * sizeof(SampleRow));
    if (!settings_uploads_) settings_uploads_ = std::make_unique<UploadRing>(device());
    settings_uploads_->upload(device_settings_.data(), settings_.data(), settings_.size() * sizeof(SampleRow));
  }
  try {
    forward(batch, pool, logits);
  } catch (...) {
    sampling_ = nullptr;
    throw;
  }
  if (sampling_ == nullptr && device() != Device::CPU) return;  // delivered on the device
  sampling_ = nullptr;
  const int64_t V = config().n_vocab;  // every row's logits are here: sample the flagged rows
  for (int64_t r = 0; r < n_rows; ++r) {
    const RowSampling& row = rows[static_cast<size_t>(r)];
    if (!row.here) continue;
    if (row.settings.temperature > 0.0f) dispatch(SampleArgs{logits + r * V, 1, V, &row.settings, ids + r});
    else dispatch(ArgmaxArgs{logits + r * V, 1, V, ids + r});
  }
}

void Model::launch_step(const ForwardBatch& batch, KvPool& pool, const std::vector<RowSampling>& rows) {
  FP_CHECK(n_launched_ < kMaxLaunched, "launch_step: ", n_launched_, " steps are launched and unfinished already (at most ",
           kMaxLaunched, ")");
  for (const RowSampling& r : rows) FP_CHECK(r.here, "launch_step: every logit row must be sampled where the logits are");
  const int64_t n = batch.n_tokens(), n_rows = static_cast<int64_t>(rows.size());
  const bool fed = !batch.feed_rows.empty();
  if (fed) {
    FP_CHECK(static_cast<int64_t>(batch.feed_rows.size()) == n, "launch_step: ", batch.feed_rows.size(),
             " feed rows for a batch of ", n, " tokens");
    for (int32_t r : batch.feed_rows)
      FP_CHECK(r == -1 || (r >= 0 && r < feed_source_rows_), "launch_step: a token fed from row ", r, " of a step of ",
               std::max<int64_t>(feed_source_rows_, 0), " rows (the step launched before it)");
  }
  LaunchedStep& step = launched_[(head_ + n_launched_) % (kMaxLaunched + 1)];
  if (step.ids.bytes() == 0) step.ids = PinnedBuffer(device());
  step.rows = n_rows;
  step.fence = 0;
  if (device() == Device::CPU) {
    // The step runs now; its fed tokens are the ids the last one sampled, on the host.
    const ForwardBatch* b = &batch;
    if (fed) {
      fed_ = batch;
      fed_.feed_rows.clear();
      dispatch(TokenFeedArgs{fed_.tokens.data(), batch.feed_rows.data(), last_ids_.data(), n});
      b = &fed_;
    }
    launch_logits_.resize(static_cast<size_t>(n_rows * config().n_vocab));
    last_ids_.resize(static_cast<size_t>(n_rows));
    forward_sampled(*b, pool, launch_logits_.data(), rows, last_ids_.data());
    step.ids.reserve(std::max<size_t>(last_ids_.size(), 1) * sizeof(int32_t));
    std::copy(last_ids_.begin(), last_ids_.end(), step.ids.as<int32_t>());
  } else {
    launching_ = &step;
    try {
      forward_sampled(batch, pool, nullptr, rows, nullptr);
    } catch (...) {
      launching_ = nullptr;
      throw;
    }
    launching_ = nullptr;
    step.fence = device_fence(device());
  }
  feed_source_rows_ = n_rows;
  ++n_launched_;
}

void Model::finish_step(int32_t* ids) {
  FP_CHECK(n_launched_ > 0, "finish_step: no step was launched");
  LaunchedStep& step = launched_[head_];
  wait_device_fence(device(), step.fence);
  if (step.rows > 0) std::copy(step.ids.as<int32_t>(), step.ids.as<int32_t>() + step.rows, ids);
  head_ = (head_ + 1) % (kMaxLaunched + 1);
  --n_launched_;
}

void Model::mtp_forward(const ForwardBatch&, KvPool&, const float*, float*, float*) {
  FP_CHECK(false, file_->path, ": ", config().arch, " has no multi-token-prediction layer to draft with");
}

void Model::enable_mtp() {
  const ModelConfig& c = config();
  FP_CHECK(c.mtp_layers > 0, file_->path, ": --speculative-method mtp needs the model's multi-token-prediction layer, ",
           "and this file declares none (num_nextn_predict_layers = 0)");
  const std::string first = "blk." + std::to_string(c.n_layers) + ".";
  FP_CHECK(file_->find(first + "nextn.eh_proj.weight") && file_->find(first + "attn_norm.weight"), file_->path,
           ": --speculative-method mtp: the file declares ", c.mtp_layers, " multi-token-prediction layer(s) but holds no ",
           first, "nextn.eh_proj / ", first, "attn_norm (the conversion dropped them)");
  FP_CHECK(device() == Device::CPU, file_->path, ": --speculative-method mtp runs on the CPU for now (not --device ",
           device_name(device()), ")");
  FP_CHECK(parallel().cp <= 1 && parallel().dp <= 1, file_->path, ": --speculative-method mtp runs on one rank or split by ",
           "heads and experts (--tensor-parallel-size, --expert-parallel-size), not with --prefill-context-parallel-size or ",
           "--data-parallel-attention");
  FP_CHECK(file_->micro_batch_overlap == 0, file_->path, ": --speculative-method mtp does not run with --micro-batch-overlap");
  mtp_ = true;
}

int64_t Model::begin_mtp(const ForwardBatch& b, const KvPool& pool) const {
  FP_CHECK(mtp_, file_->path, ": ", config().arch, " was loaded without its multi-token-prediction layer (LoadOptions::mtp)");
  check_batch(b, pool);
  return b.n_tokens();
}

void Model::keep_final_hidden(const float* x, int64_t n, const float* norm) {
  if (!mtp_ || n <= 0) return;
  const ModelConfig& c = config();
  if (static_cast<int64_t>(final_hidden_.size()) < n * c.dim) final_hidden_.resize(static_cast<size_t>(n * c.dim));
  dispatch(RmsNormArgs{x, norm, n, c.dim, c.rms_eps, final_hidden_.data()});
}

void Model::abandon_steps() {
  if (n_launched_ == 0) return;
  if (device() != Device::CPU) {
    try {
      device_memory(device()).synchronize();
    } catch (const std::exception&) {
      // the error that got us here is reported by the caller
    }
  }
  n_launched_ = 0;
  feed_source_rows_ = -1;
}

void Model::deliver_logits(const float* device_logits, int64_t rows, float* logits) {
  const int64_t V = config().n_vocab;
  const auto row_bytes = static_cast<size_t>(V) * sizeof(float);
  if (rows <= 0) return;
  if (!sampling_) {
    copy_bytes(Device::CPU, logits, device(), device_logits, static_cast<size_t>(rows) * row_bytes);
    return;
  }
  const std::vector<RowSampling>& req = *sampling_;
  sampling_ = nullptr;  // delivered
  FP_CHECK(static_cast<size_t>(rows) == req.size(), "forward_sampled: ", rows, " logit rows delivered for ", req.size(),
           " requested");
  if (device_ids_.device() != device()) device_ids_ = DeviceBuffer(device());
  device_ids_.reserve(static_cast<size_t>(rows) * sizeof(int32_t));
  {
    DeviceScope scope(device());
    dispatch(SampleArgs{device_logits, rows, V, device_settings_.as<SampleRow>(), device_ids_.as<int32_t>()});
  }
  if (launching_) {  // launch_step: queued, finish_step waits for it
    launching_->ids.reserve(static_cast<size_t>(rows) * sizeof(int32_t));
    copy_bytes_async(Device::CPU, launching_->ids.data(), device(), device_ids_.data(),
                     static_cast<size_t>(rows) * sizeof(int32_t));
    return;  // every row was sampled here (launch_step checks)
  }
  copy_bytes(Device::CPU, sampled_ids_, device(), device_ids_.data(), static_cast<size_t>(rows) * sizeof(int32_t));
  for (int64_t r = 0; r < rows;) {  // the rows still wanted, a run at a time
    if (req[static_cast<size_t>(r)].here) {
      ++r;
      continue;
    }
    int64_t e = r;
    while (e < rows && !req[static_cast<size_t>(e)].here) ++e;
    copy_bytes(Device::CPU, logits + r * V, device(), device_logits + r * V, static_cast<size_t>(e - r) * row_bytes);
    r = e;
  }
}

const BlockQ8_0* rmsnorm_for(RmsNormArgs norm, std::initializer_list<const Tensor*> ws, std::vector<BlockQ8_0>& blocks) {
  bool q8 = norm.d % QK8_0 == 0 && ws.size() > 0 && current_device() == Device::CPU;
  for (const Tensor* w : ws)
    q8 = q8 && w && !w->block_scale && (w->dtype == DType::Q8_0 || w->dtype == DType::Q4_0 || w->dtype == DType::Q8_0_X8 ||
                                            w->dtype == DType::Q4_0_X8 || w->dtype == DType::IQ4_NL || w->dtype == DType::IQ4_XS ||
                                            w->dtype == DType::IQ4_NL_X8 || w->dtype == DType::IQ4_XS_X8 ||
                                            w->dtype == DType::MXFP4 || w->dtype == DType::MXFP4_X8);
  if (!q8) {
    dispatch(norm);
    return nullptr;
  }
  const auto need = static_cast<size_t>(norm.n * (norm.d / QK8_0));
  if (blocks.size() < need) blocks.resize(need);
  norm.q8 = blocks.data();
  dispatch(norm);
  return blocks.data();
}

}  // namespace fp
