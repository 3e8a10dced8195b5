// parallel/layout_choice.h — the planner choosing the layout a run uses (`--parallel-plan HW.json`):
// of the layouts plan_layouts costs for N devices, those fastpath's runtime runs on N ranks, the
// best for decode at one concurrency, then the best prefill layout that goes with it on the same
// ranks; the sizes they map to, and why (every runnable candidate's prediction, and the planner's
// overall best where the runtime cannot run it).
//
// What the runtime runs on N > 1 ranks (model/model.h, resolve_parallel), as planner layouts:
//   decode   TPN            heads and FFNs (experts by width) split: --tp N (not MLA: its latent
//                           cache has no heads)
//            TPN+EPN        MoE, attention split, experts partitioned: --tp N --ep N (not MLA)
//            DPN-attn+EPN   MLA, each rank its sequences' attention, experts partitioned:
//                           --ep N --data-parallel-attention
//   prefill  the decode layout itself, or
//            CPN            one prompt in N chunks, whole weights on each rank: --pcp N (not with
//                           data-parallel attention)
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "parallel/planner.h"

namespace fp {

struct LayoutChoice {
  int tp = 1, ep = 1, cp = 1;  // the parallel sizes to run with
  bool dp_attention = false;
  const LayoutPlan* prefill = nullptr;  // the planner's figures for the chosen layouts (in `plans`)
  const LayoutPlan* decode = nullptr;
  std::string flags;  // the same as command-line flags, e.g. "--pcp 2 --tp 2"
  std::string why;    // the candidates' predictions and the reason
};

// Chooses among `plans` (plan_layouts for `ranks` devices) at decode concurrency index `ci` of
// the workload. Prefill takes CP over the decode layout only when predicted at least 5% faster
// (a second layout has costs the roofline leaves out; layout_choice.cpp). `moe` / `mla`: what the model has. Throws, listing every candidate's shortfall,
// when no runnable pair fits.
LayoutChoice choose_runtime_layout(const std::vector<LayoutPlan>& plans, int ranks, bool moe, bool mla, size_t ci);

}  // namespace fp
