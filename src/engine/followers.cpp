// engine/followers.cpp — rank 0 sends each engine step to the other ranks (see followers.h).
#include "engine/followers.h"

#include <array>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "engine/engine.h"
#include "kernels/registry.h"
#include "parallel/collectives.h"

namespace fp {
namespace {

enum Command : int64_t { kEngine = 1, kStep = 2, kEnd = 3, kExit = 4, kMtp = 5 };
constexpr int kHeaderWords = 8;

void broadcast(Communicator* comm, void* data, int64_t bytes) {
  if (bytes > 0) dispatch(BroadcastArgs{comm, data, bytes, 0});
}

// Headers go by broadcast_idle: followers wait on them between requests without spinning.
void send_header(Communicator* comm, std::initializer_list<int64_t> words) {
  int64_t h[kHeaderWords] = {};
  int i = 0;
  for (int64_t w : words) h[i++] = w;
  comm->broadcast_idle(h, sizeof h, 0);
}

// The batch's arrays back to back, in this order (both sides use it; const or not).
template <class Batch>
auto arrays(Batch& b) {
  return std::array{&b.tokens,     &b.positions,  &b.seq_indptr,      &b.page_indptr, &b.page_ids,
                    &b.kv_len,     &b.logit_rows, &b.window_page_ids, &b.seq_lora};
}

}  // namespace

StepSender::StepSender(Communicator* comm, const KvPool& pool) : comm_(comm) {
  FP_CHECK(comm_->rank() == 0, "the engine runs on rank 0; the other ranks follow (follow_engines)");
  send_header(comm_, {kEngine, pool.n_blocks(), pool.page_size(), static_cast<int64_t>(pool.dtype()), pool.partition().parts,
                      pool.n_window_blocks()});
}

StepSender::~StepSender() {
  try {
    send_header(comm_, {kEnd});
  } catch (const std::exception& e) {
    log_warn("could not tell the other ranks the engine ended: ", e.what());
  }
}

void StepSender::send_step(const ForwardBatch& batch, const std::vector<int32_t>& copies) {
  send_header(comm_, {kStep, batch.n_tokens(), batch.n_seqs(), static_cast<int64_t>(batch.page_ids.size()),
                      static_cast<int64_t>(batch.logit_rows.size()), static_cast<int64_t>(copies.size() / 2),
                      static_cast<int64_t>(batch.window_page_ids.size())});
  std::vector<int32_t> flat(copies);
  for (auto* a : arrays(batch)) flat.insert(flat.end(), a->begin(), a->end());
  broadcast(comm_, flat.data(), static_cast<int64_t>(flat.size() * sizeof(int32_t)));
}

void StepSender::send_mtp(const std::vector<MtpRows>& rows) {
  std::vector<int32_t> flat;  // per sequence row0, n, start, pages, max_draft; then the next tokens, then the pages
  int64_t next = 0, pages = 0;
  for (const MtpRows& r : rows) {
    flat.insert(flat.end(), {static_cast<int32_t>(r.row0), static_cast<int32_t>(r.n), r.start, static_cast<int32_t>(r.n_pages),
                             static_cast<int32_t>(r.max_draft)});
    next += r.n;
    pages += r.n_pages;
  }
  for (const MtpRows& r : rows) flat.insert(flat.end(), r.next, r.next + r.n);
  for (const MtpRows& r : rows) flat.insert(flat.end(), r.pages, r.pages + r.n_pages);
  send_header(comm_, {kMtp, static_cast<int64_t>(rows.size()), next, pages});
  broadcast(comm_, flat.data(), static_cast<int64_t>(flat.size() * sizeof(int32_t)));
}

void follow_engines(Model& model) {
  Communicator* comm = model.tensor_parallel();
  if (!comm || comm->size() == 1) return;
  FP_CHECK(comm->rank() != 0, "follow_engines runs on the ranks other than 0");
  std::unique_ptr<KvPool> pool;
  ForwardBatch b;
  std::vector<int32_t> flat;
  std::vector<float> logits;
  std::unique_ptr<MtpDrafter> mtp;
  std::vector<MtpRows> mtp_rows;
  std::vector<std::vector<int32_t>> drafts;
  for (;;) {
    int64_t h[kHeaderWords] = {};
    comm->broadcast_idle(h, sizeof h, 0);
    switch (h[0]) {
      case kEngine: {
        KvLayout layout = model.kv_layout();
        layout.dtype = static_cast<DType>(h[3]);
        const int parts = static_cast<int>(h[4]);  // partitioned: this rank stores its own blocks
        pool = std::make_unique<KvPool>(window_layout(layout, model.config()), h[2], h[1], model.device(),
                                        KvPartition{parts, parts > 1 ? comm->rank() : 0}, h[5]);
        break;
      }
      case kStep: {
        FP_CHECK(pool, "rank ", comm->rank(), ": a step arrived before its engine");
        const int64_t n = h[1], seqs = h[2], pages = h[3], rows = h[4], copies = h[5], window_pages = h[6];
        const int64_t sizes[] = {n, n, seqs + 1, seqs + 1, pages, seqs, rows, window_pages, seqs};
        int64_t total = 2 * copies;
        for (int64_t s : sizes) total += s;
        flat.resize(static_cast<size_t>(total));
        broadcast(comm, flat.data(), total * static_cast<int64_t>(sizeof(int32_t)));
        const int32_t* p = flat.data();
        for (int64_t i = 0; i < copies; ++i, p += 2) {  // a window block's copy comes as (-1 - src, dst)
          if (p[0] >= 0) pool->copy_block(p[0], p[1]);
          else pool->copy_window_block(-1 - p[0], p[1]);
        }
        int k = 0;
        for (auto* a : arrays(b)) {
          a->assign(p, p + sizes[k]);
          p += sizes[k++];
        }
        logits.resize(static_cast<size_t>(rows * model.config().n_vocab));
        model.forward(b, *pool, logits.data());
        break;
      }
      case kMtp: {
        FP_CHECK(pool, "rank ", comm->rank(), ": draft-layer rows arrived before their engine");
        if (!mtp) mtp = std::make_unique<MtpDrafter>(model);
        const int64_t seqs = h[1], next = h[2], pages = h[3];
        flat.resize(static_cast<size_t>(5 * seqs + next + pages));
        broadcast(comm, flat.data(), static_cast<int64_t>(flat.size() * sizeof(int32_t)));
        mtp_rows.assign(static_cast<size_t>(seqs), MtpRows{});
        const int32_t* nx = flat.data() + 5 * seqs;
        const int32_t* pg = nx + next;
        for (int64_t i = 0; i < seqs; ++i) {
          const int32_t* w = flat.data() + 5 * i;
          MtpRows& r = mtp_rows[static_cast<size_t>(i)];
          r.row0 = w[0], r.n = w[1], r.start = w[2], r.n_pages = w[3], r.max_draft = w[4];
          r.next = nx;
          r.pages = pg;
          nx += r.n;
          pg += r.n_pages;
        }
        mtp->run(mtp_rows, *pool, drafts);
        break;
      }
      case kEnd:
        pool.reset();
        break;
      case kExit:
        return;
      default:
        fail("rank ", comm->rank(), ": unknown command ", h[0], " from rank 0");
    }
  }
}

void release_followers(Model& model) {
  Communicator* comm = model.tensor_parallel();
  if (comm && comm->size() > 1 && comm->rank() == 0) send_header(comm, {kExit});
}

}  // namespace fp
