// parallel/layout_choice.cpp — see layout_choice.h.
#include "parallel/layout_choice.h"

#include <cstdio>

#include "core/error.h"

namespace fp {

namespace {

const LayoutPlan* find(const std::vector<LayoutPlan>& plans, const std::string& name) {
  for (const LayoutPlan& p : plans)
    if (p.layout.name == name) return &p;
  return nullptr;
}

std::string tps(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

// How a candidate reads in the explanation: "TP2 45.1 tok/s (memory bandwidth)" or why it cannot run.
std::string describe(const LayoutPlan* p, const std::string& name, bool decode, size_t ci) {
  if (!p) return name + ": not costed";
  if (!p->fits) return name + ": does not fit (" + p->why_not + ")";
  if (decode && p->decode.size() <= ci) return name + ": no decode figure";
  const PhaseCost& c = decode ? p->decode[ci] : p->prefill;
  return name + " " + tps(c.tokens_per_s) + " tok/s (" + c.bottleneck + ")";
}

// A second layout for prefill (CP beside TP decode) costs what the roofline does not count: the
// cache keeps every KV head on every rank (KV capacity not divided by the ranks) and the whole
// weights and the TP slices share their bytes, so neither is repacked. It is taken only when
// predicted this much faster; below, the margin is within the cost model's resolution (measured:
// a 0.5% predicted gain was a 2-3% loss, bench/RESULTS.md).
constexpr double kSwitchMargin = 1.05;

}  // namespace

LayoutChoice choose_runtime_layout(const std::vector<LayoutPlan>& plans, int ranks, bool moe, bool mla, size_t ci) {
  FP_CHECK(ranks >= 1, "--parallel-plan: ", ranks, " ranks");
  LayoutChoice out;
  const std::string n = std::to_string(ranks);
  if (ranks == 1) {  // one rank: the whole model, nothing to choose
    out.prefill = out.decode = find(plans, "TP1");
    FP_CHECK(out.decode && out.decode->fits, "--parallel-plan: the model does not fit one device",
             out.decode ? " (" + out.decode->why_not + ")" : std::string());
    out.why = "one rank: the whole model";
    return out;
  }
  struct Candidate {
    std::string name;
    int tp, ep;
    bool dp;
  };
  std::vector<Candidate> decode_layouts;
  if (!mla) decode_layouts.push_back({"TP" + n, ranks, 1, false});
  if (moe && !mla) decode_layouts.push_back({"TP" + n + "+EP" + n, ranks, ranks, false});
  if (moe && mla) decode_layouts.push_back({"DP" + n + "-attn+EP" + n, 1, ranks, true});
  FP_CHECK(!decode_layouts.empty(), "--parallel-plan: no layout of this runtime splits this model over ", ranks, " ranks");

  // Decode: the runnable layout with the most output tokens/s at the concurrency.
  const Candidate* best = nullptr;
  std::string decode_lines, shortfalls;
  for (const Candidate& c : decode_layouts) {
    const LayoutPlan* p = find(plans, c.name);
    decode_lines += "\n    " + describe(p, c.name, true, ci);
    if (!p || !p->fits || p->decode.size() <= ci) {
      shortfalls += "\n  " + c.name + ": " + (p ? p->why_not : std::string("not costed"));
      continue;
    }
    if (!out.decode || p->decode[ci].tokens_per_s > out.decode->decode[ci].tokens_per_s) {
      out.decode = p;
      best = &c;
    }
  }
  FP_CHECK(out.decode, "--parallel-plan: no layout this runtime runs on ", ranks, " ranks fits:", shortfalls);
  out.tp = best->tp;
  out.ep = best->ep;
  out.dp_attention = best->dp;

  // Prefill on the same ranks: the decode layout itself, or context parallel (whole weights).
  std::string prefill_lines = "\n    " + describe(out.decode, out.decode->layout.name, false, ci);
  out.prefill = out.decode;
  if (!best->dp) {
    const std::string cp_name = "CP" + n;
    const LayoutPlan* cp = find(plans, cp_name);
    prefill_lines += "\n    " + describe(cp, cp_name, false, ci);
    if (cp && cp->fits && cp->prefill.tokens_per_s >= kSwitchMargin * out.prefill->prefill.tokens_per_s) {
      out.prefill = cp;
      out.cp = ranks;
    } else if (cp && cp->fits && cp->prefill.tokens_per_s > out.prefill->prefill.tokens_per_s) {
      prefill_lines += " — less than " + tps(100 * (kSwitchMargin - 1)) + "% ahead: not worth a second layout";
    }
  }

  // The planner's best overall, where this runtime cannot run it.
  std::string beyond;
  const LayoutPlan* any_decode = best_decode(plans, ci);
  const LayoutPlan* any_prefill = best_prefill(plans);
  if (any_decode && any_decode != out.decode) {
    const Layout& l = any_decode->layout;
    beyond += "\n  the planner's best decode layout, " + l.name + " (" + tps(any_decode->decode[ci].tokens_per_s) +
              " tok/s), is not one this runtime runs on " + n + " ranks";
    if (l.tp == 1 && l.ep == 1 && !l.cp)  // replicas with their own sequences: separate processes
      beyond += " (as " + std::to_string(l.groups) + " replicas: that many separate servers behind a load balancer)";
  }
  if (any_prefill && any_prefill != out.prefill)
    beyond += "\n  the planner's best prefill layout, " + any_prefill->layout.name + " (" +
              tps(any_prefill->prefill.tokens_per_s) + " tok/s), is not one this runtime runs with that decode layout";

  if (out.tp > 1) out.flags += " --tp " + std::to_string(out.tp);
  if (out.ep > 1) out.flags += " --ep " + std::to_string(out.ep);
  if (out.cp > 1) out.flags += " --pcp " + std::to_string(out.cp);
  if (out.dp_attention) out.flags += " --data-parallel-attention";
  out.flags = out.flags.substr(1);
  out.why = "decode " + out.decode->layout.name + ", prefill " + out.prefill->layout.name + " (" + out.flags +
            ")\n  decode candidates:" + decode_lines + "\n  prefill candidates with " + out.decode->layout.name +
            " decode:" + prefill_lines + beyond;
  return out;
}

}  // namespace fp
