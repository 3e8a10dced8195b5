// engine/followers.h — the serving engine across ranks (tensor / expert / context parallel):
// rank 0 owns the scheduler (and, for `serve`, the HTTP server); every step it sends the
// step's batch and the KV block copies it made (copy-on-write) to the other ranks, which run the
// same forward call on their share of the model and a KV pool of the same blocks. The ranks stay
// in step because every forward's collectives are matched on all of them.
//
// Protocol (broadcasts from rank 0): a header of int64 words, then for a step one int32 array.
//   engine <blocks> <page size> <kv dtype>   a new Engine: followers build a pool of those blocks
//   step <tokens> <seqs> <pages> <logit rows> <block copies>, then the batch's arrays
//   mtp <seqs> <next tokens> <pages>, then each sequence's rows for the draft layer (MtpRows),
//     their next tokens and block tables: after a step, followers run the same draft steps
//   end                                       that Engine is gone: followers drop the pool
//   exit                                      rank 0 is done: follow_engines returns
#pragma once
#include <cstdint>
#include <vector>

#include "cache/kv_pool.h"
#include "engine/mtp_drafter.h"
#include "model/model.h"

namespace fp {

// Rank 0's side, owned by an Engine whose model is split across ranks.
class StepSender {
 public:
  StepSender(Communicator* comm, const KvPool& pool);  // sends "engine"
  ~StepSender();                                      // sends "end"
  StepSender(const StepSender&) = delete;
  StepSender& operator=(const StepSender&) = delete;
  // Sends one step: the block copies (src, dst pairs, already made on rank 0) and the batch.
  void send_step(const ForwardBatch& batch, const std::vector<int32_t>& copies);
  // Sends the draft layer's rows after a step (--speculative-method mtp): the followers run
  // MtpDrafter::run on the same rows (its chained steps follow from logits every rank holds).
  void send_mtp(const std::vector<MtpRows>& rows);

 private:
  Communicator* comm_;
};

// On ranks other than 0: runs every Engine rank 0 builds, step by step, until rank 0 calls
// release_followers. Returns at once on one rank.
void follow_engines(Model& model);
// On rank 0: no more engines; the followers return from follow_engines. Nothing on one rank.
void release_followers(Model& model);

}  // namespace fp
