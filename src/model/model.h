// model/model.h — the interface every architecture implements (a forward over a varlen batch
// of sequences with a paged KV cache), the one-sequence cache, and the architecture registry.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cache/kv_pool.h"
#include "kernels/ops.h"
#include "model/model_file.h"
#include "model/placement.h"
#include "model/vocab_parallel.h"
#include "parallel/communicator.h"

namespace fp {

// How forward_sampled treats one logit row: sampled where the logits are (here, under
// settings), or its logits sent back to the caller.
struct RowSampling {
  bool here = false;
  SampleRow settings;
};

// A flattened varlen batch: the tokens of n_seqs sequences, each sequence's tokens contiguous.
// Sequence s owns tokens [seq_indptr[s], seq_indptr[s+1]); its KV cache is the block table
// page_ids[page_indptr[s] .. page_indptr[s+1]) in a KvPool, holding kv_len[s] positions after
// this step (the blocks must cover them). Token i is written to its slot at positions[i].
// Logits are computed for the token rows listed in logit_rows, in that order. feed_rows is
// empty, or per token the logit row of the step launched just before whose sampled id is this
// token (-1: tokens[i] itself); see Model::launch_step.
struct ForwardBatch {
  std::vector<int32_t> tokens, positions;
  std::vector<int32_t> feed_rows;
  std::vector<int32_t> seq_indptr{0};
  std::vector<int32_t> page_indptr{0};
  std::vector<int32_t> page_ids;
  // Window trimming (KvPool::trims_windows): the windowed layers' block tables, entry for entry
  // beside page_ids (same page_indptr); blocks given back are KvPool::kZeroWindowBlock there
  // (no query sees their positions; a kernel reading keys before a window reads zeros).
  // Empty otherwise.
  std::vector<int32_t> window_page_ids;
  std::vector<int32_t> kv_len;
  std::vector<int32_t> logit_rows;
  // Per sequence: the LoRA adapter its rows run with (Model::add_lora's id; 0: the base model alone).
  std::vector<int32_t> seq_lora;
  int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t n_seqs() const { return static_cast<int64_t>(kv_len.size()); }
  // Appends a sequence: its new tokens at positions start.., its block table, and whether the
  // last token's logits (want_logits) or every token's (all_logits) are wanted.
  // window_pages: its window block table (n_pages entries, -1 for blocks given back), with window trimming.
  void add_sequence(const int32_t* toks, int64_t n, int64_t start, const int32_t* pages, int64_t n_pages,
                    bool want_logits, bool all_logits = false, const int32_t* window_pages = nullptr);
  void clear();
  // This batch becomes tokens [t0, t1) of `from`: each sequence's tokens inside the range, with
  // its whole block table and kv_len ending at its last token here (attention is causal); no
  // logit rows. What context-parallel runs and overlapped micro-batches run.
  void assign_tokens(const ForwardBatch& from, int64_t t0, int64_t t1);
  // Appends tokens [t0, t1) of `from` the same way (a sequence already here appears again).
  void append_tokens(const ForwardBatch& from, int64_t t0, int64_t t1);
  // The KV slot of every token (block table lookup at its position), for pages of page_size.
  void slots(int64_t page_size, std::vector<int64_t>& out) const;
  // The same through window_page_ids (empty when there are none).
  void window_slots(int64_t page_size, std::vector<int64_t>& out) const;
  // Copies the rows of x ([n_tokens, dim]) listed in logit_rows to out, in order; returns how many.
  int64_t gather_logit_rows(const float* x, int64_t dim, float* out) const;
};

// A single sequence's cache: a private pool and the blocks covering `capacity` positions. What
// `generate`, `logits` and the tests of one sequence use; the engine shares one pool instead.
struct KvCache {
  int64_t capacity = 0;
  int64_t len = 0;  // positions written so far
  std::unique_ptr<KvPool> pool;
  std::vector<int32_t> pages;
};

struct LoraAdapterWeights;

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return file_->config; }
  const ModelFile& file() const { return *file_; }
  const Tokenizer* tokenizer() const { return file_->tokenizer.get(); }
  // The ranks this model's weights are split across (tensor and/or expert parallel, see
  // parallel()); null when not split. Every rank runs the same forward calls; each holds its
  // slice of the weights (and, with attention split, of the KV heads).
  Communicator* tensor_parallel() const { return tp_.get(); }
  // Where the weights, activations and the caches this model makes live, and its ops run.
  Device device() const { return file_->device; }
  int tp_size() const { return tp_ ? tp_->size() : 1; }
  // How the ranks split the model (tensor / expert / prefill context parallel; all 1 on one rank).
  ParallelSizes parallel() const { return file_->parallel; }

  // What one token stores in the KV cache per layer (GQA K/V, or MLA's latent vector), in F32;
  // the cache's owner picks the stored dtype (KvLayout::dtype).
  virtual KvLayout kv_layout() const;
  // Runs a varlen batch, writing K/V into `pool`; logits [batch.logit_rows.size(), n_vocab].
  virtual void forward(const ForwardBatch& batch, KvPool& pool, float* logits) = 0;

  // One sequence: a private cache for `capacity` positions (pages of `page_size`, 0: automatic),
  // storing K/V as kv_dtype (F32, F16 or BF16).
  std::unique_ptr<KvCache> new_cache(int64_t capacity, int64_t page_size = 0, DType kv_dtype = DType::F32) const;
  // Feeds tokens[0..n) at positions pos[0..n) into the cache. Writes logits for every
  // position ([n, n_vocab]) when all_logits, else only for the last one ([n_vocab]).
  void forward(const int32_t* tokens, const int32_t* pos, int64_t n, KvCache& cache, float* logits, bool all_logits);
  // forward, for a caller that samples: each logit row r with rows[r].here is sampled where the
  // logits are, under rows[r].settings (the sample op; greedy rows the argmax), into ids[r], and
  // its logits need not be written; the other rows' logits are. A model on a device samples
  // there and copies back just the ids and the rows still wanted; on the CPU it is forward, then
  // the ops per flagged row.
  void forward_sampled(const ForwardBatch& batch, KvPool& pool, float* logits, const std::vector<RowSampling>& rows,
                       int32_t* ids);
  // The one-sequence forward (the last position's logits) for a caller that samples: as above
  // for its one row.
  void forward_sampled(const int32_t* tokens, const int32_t* pos, int64_t n, KvCache& cache, float* logits,
                       const RowSampling& row, int32_t* id);

  // forward_sampled in two halves, so that a caller can prepare the next step while this one
  // runs (the engine's overlapped scheduling). launch_step queues a step whose every logit row
  // is sampled where the logits are (rows[r].here) and returns: on a device before the step has
  // run, on the CPU after running it. finish_step waits for the oldest launched step and writes
  // its rows' ids. A batch's tokens named by batch.feed_rows are the ids sampled by the step
  // launched just before it (taken on the device, no trip to the host), so a step can go before
  // the previous one's tokens are known. At most kMaxLaunched steps are unfinished at once.
  static constexpr int kMaxLaunched = 2;
  void launch_step(const ForwardBatch& batch, KvPool& pool, const std::vector<RowSampling>& rows);
  void finish_step(int32_t* ids);
  int launched_steps() const { return n_launched_; }
  // Forgets the launched steps after an error (waits for the device first).
  void abandon_steps();

  // Multi-token prediction (DeepSeek-V3, GLM-4.5; LoadOptions::mtp): the checkpoint's own draft
  // layer. When loaded, the KV layout has one more layer (the draft layer's, last) and every
  // forward keeps its rows' final hidden states. On the CPU, on one rank or split across ranks by
  // heads and experts (every rank runs the same draft steps).
  bool has_mtp() const { return mtp_; }
  // After a forward with the draft layer loaded: every token row's final hidden state (after the
  // output norm), [n_tokens, dim] in the batch's order, what the draft layer reads.
  const float* final_hidden() const { return final_hidden_.data(); }
  // The draft layer over `batch`: row i continues the state hidden[i] ([n_tokens, dim]: the
  // model's final hidden state at that position, or the draft layer's own output there) with
  // batch.tokens[i], the token that follows it; positions and block tables as the model's (its KV
  // goes to the pool's last layer). Writes logits for batch.logit_rows (the next token's,
  // predicted) and every row's output state to out_hidden [n_tokens, dim] (what a further draft
  // step continues).
  virtual void mtp_forward(const ForwardBatch& batch, KvPool& pool, const float* hidden, float* logits, float* out_hidden);

  // Hidden-state output (embeddings, engine/embedder.h): with it on, every forward writes each
  // wanted row's final hidden state (after the output norm), [rows, dim] packed, where the
  // logits would go, and no logits. On the CPU; the samplers must not run on such rows.
  void set_hidden_output(bool on);
  bool hidden_output() const;

  // LoRA adapters (model/lora.h): adds one, cut to this rank's share, and returns its id for
  // ForwardBatch::seq_lora (1, 2, ...). The architectures that take adapters override it; the
  // others refuse by name.
  virtual int32_t add_lora(const LoraAdapterWeights& adapter);
  // Unloads adapter `id` (serve --allow-runtime-lora): its matrices are freed; ids are never
  // handed out again, so KV cached under it can never be matched.
  void remove_lora(int32_t id);
  int32_t n_loras() const { return n_loras_; }  // ids handed out (1..n_loras)
  bool has_lora(int32_t id) const;               // 0 (none) or a loaded adapter
  // The adapter the one-sequence forward runs with (generate, logits --lora; 0: none).
  void set_single_lora(int32_t id);

 protected:
  VocabParallelOutput* output_head_ = nullptr;  // the architecture's output projection (set_hidden_output)
  explicit Model(std::shared_ptr<ModelFile> file) : file_(std::move(file)) {}
  // Checks the batch against the pool and the vocabulary (every architecture calls it first).
  void check_batch(const ForwardBatch& batch, const KvPool& pool) const;
  std::shared_ptr<ModelFile> file_;
  std::shared_ptr<Communicator> tp_;  // set by architectures that split across ranks
  ForwardBatch single_;  // scratch for the one-sequence forward

  // A device step's logits [rows, n_vocab] (device_logits, on the model's device) to the host:
  // every row, or under forward_sampled the sampled rows' ids and only the rows it still wants
  // (under launch_step: the ids queued for finish_step).
  void deliver_logits(const float* device_logits, int64_t rows, float* logits);
  // Where a device step's fed tokens come from (BatchStager::stage): the last sampled ids.
  const int32_t* fed_ids() const { return device_ids_.as<int32_t>(); }
  // With the draft layer loaded: checks where it can run (the CPU; not context parallel or with
  // data-parallel attention) and sets has_mtp().
  void enable_mtp();
  // An architecture's mtp_forward starts here: fails without the draft layer, checks the batch
  // against the pool, returns its token count.
  int64_t begin_mtp(const ForwardBatch& batch, const KvPool& pool) const;
  // With the draft layer loaded, keeps the rows x [n, dim] normalised by `norm` as final_hidden().
  void keep_final_hidden(const float* x, int64_t n, const float* norm);
  bool mtp_ = false;
  std::vector<float> final_hidden_;
  int32_t n_loras_ = 0;  // adapters added (add_lora)
  std::vector<bool> lora_removed_;  // per id - 1
  // An architecture's add_lora ends here: the new adapter's id.
  int32_t lora_added() {
    lora_removed_.push_back(false);
    return ++n_loras_;
  }
  // The architecture's half of remove_lora: frees the adapter's matrices.
  virtual void drop_lora(int32_t id);
  // What an architecture's add_lora checks first: the CPU, no context-parallel prefill, and
  // matrices of this model's shapes.
  void check_lora_runs_here(const LoraAdapterWeights& ad, bool context_parallel) const;

 private:
  void forward_one(const int32_t* tokens, const int32_t* pos, int64_t n, KvCache& cache, float* logits, bool all_logits,
                   const RowSampling* sample, int32_t* id);

 private:
  const std::vector<RowSampling>* sampling_ = nullptr;  // forward_sampled's request, until delivered
  int32_t* sampled_ids_ = nullptr;
  std::vector<SampleRow> settings_;  // staged for the device
  DeviceBuffer device_ids_, device_settings_;
  std::unique_ptr<UploadRing> settings_uploads_;
  // Launched steps, oldest first, in a ring: their ids (copied back, queued) and the fence after.
  struct LaunchedStep {
    PinnedBuffer ids;
    int64_t rows = 0;
    uint64_t fence = 0;
  };
  LaunchedStep launched_[kMaxLaunched + 1];
  int head_ = 0, n_launched_ = 0;
  LaunchedStep* launching_ = nullptr;  // the step deliver_logits queues its ids for
  int64_t feed_source_rows_ = -1;      // rows of the last launched step (what a fed token may name)
  std::vector<int32_t> last_ids_;      // on the CPU: that step's ids
  std::vector<float> launch_logits_;   // on the CPU: the logits a launched step samples from
  ForwardBatch fed_;                   // on the CPU: the batch with its fed tokens filled in
  int32_t single_lora_ = 0;            // set_single_lora
};

// Attention arguments with the batch's index view (tokens, sequences, block tables, lengths)
// filled in; the caller sets heads, dims, strides, scale, pools and output.
AttentionArgs paged_attention_args(const ForwardBatch& b, const KvPool& pool);
AttentionArgs paged_attention_args(const StagedBatch& b, const KvPool& pool);

// The sizes a model on `ranks` ranks is split by (see ParallelSizes): 0s filled in, checked
// (each 1 or ranks; expert parallel only for models with routed experts).
ParallelSizes resolve_parallel(ParallelSizes requested, int ranks, const ModelConfig& config);

using ArchitectureFactory = std::function<std::unique_ptr<Model>(std::shared_ptr<ModelFile>)>;
// Dispatches `norm`. When every weight in `ws` dots Q8_0 activations (Q8_0, Q8_0_X8, Q4_0 or Q4_0_X8 weights),
// the norm also writes its rows quantized to Q8_0 into `blocks` and the result points at them,
// for MatMulArgs::xq — the matmuls that share the normalised input quantize it once (issue 3's
// fused rmsnorm + quantize). Otherwise returns null and the matmuls quantize as usual.
const BlockQ8_0* rmsnorm_for(RmsNormArgs norm, std::initializer_list<const Tensor*> ws, std::vector<BlockQ8_0>& blocks);

bool register_architecture(const std::string& arch, ArchitectureFactory factory);
// An architecture that can split itself across the ranks of `tp` (tensor parallel).
using ShardedArchitectureFactory =
    std::function<std::unique_ptr<Model>(std::shared_ptr<ModelFile>, std::shared_ptr<Communicator> tp)>;
// runs_on_cuda: the architecture places itself on Device::CUDA when its file asks for it.
bool register_sharded_architecture(const std::string& arch, ShardedArchitectureFactory factory, bool runs_on_cuda = false);
std::vector<std::string> registered_architectures();
// Builds the model for file->config.arch, checking every tensor's shape against the config.
// With a communicator of more than one rank, this rank's tensor-parallel slice (an error for
// architectures that cannot be split yet).
std::unique_ptr<Model> build_model(std::shared_ptr<ModelFile> file, std::shared_ptr<Communicator> tp = nullptr);
// load_model_file + build_model.
std::unique_ptr<Model> load_model(const std::string& path, const LoadOptions& opts = {},
                                  std::shared_ptr<Communicator> tp = nullptr);

}  // namespace fp
